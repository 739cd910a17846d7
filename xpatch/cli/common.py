"""What the commands of the ``xpatch`` command line share.

The argument types of integer options, the way a command reports invalid options
or inputs (a message on stderr, exit status 2) and the way dim sizes are printed
in a command's summary. :mod:`xpatch.cli.command` (the parser, ``xpatch demo``) and
:mod:`xpatch.cli.apply` (``xpatch apply``) both use them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


def int_at_least(minimum: int) -> Callable[[str], int]:
    """Return an ``argparse`` type that accepts integers ``>= minimum``.

    Parameters
    ----------
    minimum
        The smallest value accepted.

    Returns
    -------
    callable
        Parses an option's text; raises :class:`argparse.ArgumentTypeError` for
        text that is not an integer, or is one below ``minimum``.

    Examples
    --------
    >>> int_at_least(1)("3")
    3
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
        return value

    return parse


#: ``argparse`` type of options that take an integer >= 1.
positive_int = int_at_least(1)
#: ``argparse`` type of options that take an integer >= 0.
non_negative_int = int_at_least(0)


def usage_error(command: str, message: str) -> int:
    """Print ``xpatch COMMAND: error: MESSAGE`` on stderr and return exit status 2.

    Parameters
    ----------
    command
        The command's name, such as ``"apply"``.
    message
        What is wrong with the options or the input.

    Returns
    -------
    int
        2, the exit status of invalid options or inputs.
    """
    print(f"xpatch {command}: error: {message}", file=sys.stderr)
    return 2


def format_sizes(sizes: dict) -> str:
    """Render dim sizes as ``"y: 4, x: 6"``.

    Examples
    --------
    >>> format_sizes({"y": 4, "x": 6})
    'y: 4, x: 6'
    """
    return ", ".join(f"{dim}: {n}" for dim, n in sizes.items())
