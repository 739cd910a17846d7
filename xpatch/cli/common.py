"""What the commands of the ``xpatch`` command line share.

The argument types of integer options, the way a command reports invalid options
or inputs (a message on stderr, exit status 2) and the way dim sizes are printed
in a command's summary. :mod:`xpatch.cli.command` (the parser, ``xpatch demo``) and
:mod:`xpatch.cli.apply` (``xpatch apply``) both use them.
"""

from __future__ import annotations

import argparse
import ast
import re
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
    print(f"xpatch {command}: error: {in_cli_terms(message)}", file=sys.stderr)
    return 2


def format_sizes(sizes: dict) -> str:
    """Render dim sizes as ``"y: 4, x: 6"``.

    Examples
    --------
    >>> format_sizes({"y": 4, "x": 6})
    'y: 4, x: 6'
    """
    return ", ".join(f"{dim}: {n}" for dim, n in sizes.items())


#: Python arguments named in xpatch's messages, and the ``xpatch apply`` flags that set
#: them: the CLI's user never typed ``overwrite=True``.
_FLAGS = (
    (r"\boverwrite=True", "--restart"),
    (r"\bbreak_lock=True", "--break-lock"),
    (r"\bresume=['\"]force['\"]", "--force-resume"),
    (r"\bpad_batch=True", "--pad-batch"),
    (r"\bout_dtype=", "--out-dtype "),
    (r"\bdtype=", "--dtype "),
    (r"\bbatch_size=", "--batch-size "),
    (r"\btask_memory=", "--task-memory "),
    (r"\bhalo=", "--halo "),
    (r"\bpad_mode=", "--pad-mode "),
    (r"\bboundary=", "--boundary "),
    (r"\bwindow=", "--window "),
    (r"\bscale=", "--scale "),
    (r"\bstride=", "--stride "),
    (r"\breduce=", "--reduce "),
    (r"\bnodata=", "--nodata "),
)


def in_cli_terms(message: str) -> str:
    """Return ``message`` with the Python arguments it names spelled as ``xpatch apply`` flags.

    A hint already in CLI terms (``overwrite=True (xpatch apply --restart)``)
    keeps the flag only; ``output_dims={'class': 5}`` becomes
    ``--output-dims class=5``; a quoted value loses its quotes.

    Examples
    --------
    >>> in_cli_terms("pass overwrite=True (xpatch apply --restart) or dtype='float32'")
    'pass --restart or --dtype float32'
    >>> in_cli_terms("name them: output_dims={'class': 5} (or {} for none)")
    'name them: --output-dims class=5 (or {} for none)'
    >>> print(in_cli_terms("declare output_dims={'seg': {'class': 3}, 'unc': {}}"))
    declare --output-dims "seg:class=3;unc:"
    """
    message = re.sub(r"\b\w+=\S+?\s+\(xpatch apply (--[\w-]+)\)", r"\1", message)
    message = re.sub(r"\boutput_dims=(\{(?:[^{}]|\{[^{}]*\})*\})", _dims_flag, message)
    message = re.sub(r"\boutput_dims=", "--output-dims ", message)
    for argument, flag in _FLAGS:
        message = re.sub(argument, flag, message)
    return re.sub(r"(--[\w-]+ )'([^']*)'", r"\1\2", message)


def _dims_flag(match: re.Match) -> str:
    """``output_dims={...}`` as ``--output-dims`` takes it (as written, when no literal)."""
    try:
        dims = ast.literal_eval(match.group(1))
    except (ValueError, SyntaxError):
        return f"--output-dims {match.group(1)}"

    def flat(sizes: dict) -> str:
        return ",".join(f"{dim}={size}" for dim, size in sizes.items())

    if dims and all(isinstance(v, dict) or v is None for v in dims.values()):
        per_output = ";".join(f"{name}:{flat(sizes or {})}" for name, sizes in dims.items())
        return f'--output-dims "{per_output}"'
    return f"--output-dims {flat(dims)}" if dims else '--output-dims ""'


class DefaultsOnceFormatter(argparse.HelpFormatter):
    """Append ``(default: X)`` to an option's help unless its help already says its default.

    ``argparse.ArgumentDefaultsHelpFormatter`` appends it to every option, so a
    help that explains its default said it twice, and flags said ``(default: None)``.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        if (
            "default" in help_text.lower()
            or any(action.default is nothing for nothing in (None, False, argparse.SUPPRESS))
            or not action.option_strings
        ):
            return help_text
        return f"{help_text} (default: %(default)s)"
