"""The ``xpatch`` command: its entry point and its parser.

:func:`main` (the ``xpatch`` console script, and ``python -m xpatch``) parses the
command line with :func:`build_parser` and runs the command.

``xpatch apply INPUT OUTPUT --fn module:function ...`` runs sliding-window
inference out of core: it opens a GeoTIFF, zarr store or netCDF file lazily, runs
the function over overlapping patches in batches, blends the results with weighted
overlap-add and streams them to a tiled GeoTIFF or a zarr store, block by block,
with a progress bar; an interrupted run started again redoes only the blocks it
had not written. Its options and implementation live in :mod:`xpatch.cli.apply`,
and with a glob INPUT (``'scenes/*.tif'``: one output per match into the folder
OUTPUT) in :mod:`xpatch.cli.scenes`; what the commands share (argument types,
usage errors) in :mod:`xpatch.cli.common`.

``xpatch demo`` runs the whole story on a synthetic scene built in memory (no
download): :mod:`xpatch.cli.demo`.

A new command is a module here with an ``add_..._command(commands)`` that adds its
parser and a ``run_...(args)`` that returns the exit status, and two lines below.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from xpatch.cli.apply import add_apply_command, run_apply
from xpatch.cli.common import in_cli_terms
from xpatch.cli.demo import add_demo_command, run_demo_command
from xpatch.cli.scenes import is_scene_pattern, run_apply_scenes
from xpatch.version import VERSION


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``xpatch`` command."""
    parser = argparse.ArgumentParser(
        prog="xpatch",
        description="Lazy N-D patches of xarray objects and exact weighted overlap-add.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_demo_command(commands)
    add_apply_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``xpatch`` command.

    Parameters
    ----------
    argv
        Arguments without the program name; default ``sys.argv[1:]``.

    Returns
    -------
    int
        Exit status: 0 on success, 1 if the demo's checks fail, 2 on invalid options
        or inputs (``argparse`` usage errors exit with 2 through :class:`SystemExit`),
        130 when interrupted with Ctrl-C (an output resumes at the next run).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            if args.command == "apply":
                if is_scene_pattern(args.input):
                    return run_apply_scenes(args)
                return run_apply(args)
            return run_demo_command(args)
        except KeyboardInterrupt:
            # A traceback of the thread Ctrl-C happened to stop says nothing to a user.
            resume = " Run the same command again to resume: the blocks written are kept."
            print(
                f"\nxpatch: interrupted.{resume if args.command == 'apply' else ''}",
                file=sys.stderr,
            )
            return 130


def _show_warning(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
    """Print a warning as the command's own line, not as a source line of xpatch."""
    print(f"xpatch: warning: {in_cli_terms(str(message))}", file=sys.stderr)
