"""The ``xpatch`` command line: ``xpatch demo`` and ``xpatch apply``."""

from xpatch.cli.command import main

__all__ = ["main"]
