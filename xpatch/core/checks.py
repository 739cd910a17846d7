"""Argument checks shared by the core modules; each raises with the fix in the message."""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Sequence

from xpatch.core.errors import DimensionError, OptionError


def check_choice(argument: str, value: object, choices: Sequence[str]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise listing them.

    Examples
    --------
    >>> check_choice("boundary", "pad", ("shift", "pad"))
    'pad'
    """
    if value not in choices:
        raise OptionError(
            f"{argument}={value!r} is not a known {argument}; choose one of "
            f"{', '.join(map(repr, choices))}."
        )
    return value  # type: ignore[return-value]


def check_patched_dims(
    argument: str,
    given: Iterable[Hashable],
    dims: Collection[Hashable],
    error: type[Exception] = DimensionError,
) -> None:
    """Raise if ``given`` names a dim that is not among the patched ``dims``."""
    unknown = [d for d in given if d not in dims]
    if unknown:
        raise error(
            f"{argument} names dimension(s) {unknown!r} that are not patched; "
            f"the patched dimensions are {list(dims)!r}."
        )
