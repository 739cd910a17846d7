"""``python -m xpatch``: the same as the ``xpatch`` command."""

from xpatch.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
