"""Exceptions and warnings raised by xpatch.

Every error is a :class:`ValueError` subclass, so ``except ValueError`` keeps
working, and every message names the argument, the value given and the fix.
"""

import sys
import warnings


class XPatchError(ValueError):
    """Base class of every error xpatch raises on bad input."""


class DimensionError(XPatchError):
    """A dimension named by the caller is unknown, repeated or missing."""


class GeometryError(XPatchError):
    """Patch size, stride, boundary or anchors do not fit the array."""


class OptionError(XPatchError):
    """An option (window, boundary, reduction, sampler) is unknown or invalid."""


class PredictionError(XPatchError):
    """Predictions handed to ``reconstruct`` do not match the patch layout."""


class OutputError(OptionError):
    """An output cannot be written as asked: it holds another run, or its record is damaged."""


class OutputExistsError(OutputError, FileExistsError):
    """The output exists (complete, or an unfinished run) and the call would replace it."""


class OutputLockedError(OutputError):
    """Another writer holds the output's lock, or a killed writer left it behind."""


class MissingDependencyError(XPatchError, ImportError):
    """An optional dependency this call needs is missing; the message says what to install."""


class UncoveredCellsWarning(UserWarning):
    """Some cells of the array are covered by no patch and reconstruct to NaN."""


class NodataCollisionWarning(UserWarning):
    """Valid results hold the output's nodata value: they would read as missing."""


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """Warn about ``message`` at the caller's line, the first frame outside xpatch.

    A fixed ``stacklevel`` points into xpatch whenever the call depth changes (a
    method called from another entry point); the caller's line is what a user
    can act on.

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn("the earlier run wrote nothing")
    >>> str(caught[0].message)
    'the earlier run wrote nothing'
    """
    frame, level = sys._getframe(1), 2  # stacklevel 1 is this function
    while frame is not None and frame.f_globals.get("__name__", "").startswith("xpatch."):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
