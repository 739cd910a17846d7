"""Blending windows that never give a covered cell zero total weight.

A symmetric Hann window is 0 at both ends, so the outermost row of the whole array
would receive no weight at all (NaN after normalising). xpatch evaluates windows at
half-sample positions ``(k + 1/2) / n`` instead, where they are strictly positive;
a half-sample Hann still sums to a constant at 50 % overlap.
"""

from __future__ import annotations

import math
import os
from collections.abc import Hashable, Mapping, Sequence
from functools import reduce
from typing import Any, NamedTuple, TypeAlias

import numpy as np

from xpatch.core.checks import check_patched_dims
from xpatch.core.errors import GeometryError, OptionError

WindowSpec: TypeAlias = str | tuple[Any, ...] | float | np.ndarray

_HINT = (
    "Use 'boxcar', 'hann', 'triangular', 'tukey' or ('tukey', alpha), ('gaussian', sigma), "
    "any scipy.signal.get_window spec such as 'hamming' or ('kaiser', 8.0), "
    "a mapping {dim: spec}, or an array of the patch shape with positive values."
)


def _half_sample_positions(n: int) -> np.ndarray:
    return (np.arange(n) + 0.5) / n


def _tukey(n: int, alpha: float) -> np.ndarray:
    if not 0.0 <= alpha <= 1.0:
        raise OptionError(f"window=('tukey', {alpha!r}): alpha must lie in [0, 1].")
    t = _half_sample_positions(n)
    edge = np.minimum(t, 1.0 - t)
    if alpha == 0.0:
        return np.ones(n)
    return np.where(edge < alpha / 2, 0.5 * (1.0 - np.cos(2.0 * np.pi * edge / alpha)), 1.0)


def _scipy_window(spec: WindowSpec, n: int) -> np.ndarray:
    # Imported here, not with xpatch: scipy.signal adds ~45 MiB of resident memory
    # (and a third of a second) to every process, and the usual windows need numpy only.
    import scipy.signal

    try:
        window = scipy.signal.get_window(spec, n, fftbins=False)
        if np.all(window > 0):
            return window
        # The odd samples of a periodic window of length 2n are its values at the
        # half-sample positions of a length-n window: positive for every window
        # that is zero only at its ends (hann, blackman, bartlett, ...).
        return scipy.signal.get_window(spec, 2 * n, fftbins=True)[1::2]
    except (ValueError, TypeError) as error:
        raise OptionError(
            f"window={spec!r} is not a window xpatch knows ({error}). {_HINT}"
        ) from None


def window_1d(spec: WindowSpec, n: int) -> np.ndarray:
    """Return the 1-D window ``spec`` of length ``n``, strictly positive, float64.

    Parameters
    ----------
    spec
        ``"boxcar"``, ``"hann"`` (half-sample), ``"triangular"`` (half-sample),
        ``"tukey"`` / ``("tukey", alpha)`` (half-sample, alpha 0.5 by default),
        ``("gaussian", sigma)`` (sigma in cells), any other
        :func:`scipy.signal.get_window` spec, or a 1-D array of length ``n``.
    n
        Window length (the patch size along the axis).

    Examples
    --------
    >>> window_1d("hann", 4).round(3)
    array([0.146, 0.854, 0.854, 0.146])
    >>> (window_1d("hann", 4)[:2] + window_1d("hann", 4)[2:]).tolist()  # 50 % overlap
    [1.0, 1.0]
    """
    if isinstance(spec, np.ndarray | list):
        return check_window_array(np.asarray(spec), (n,))
    name, params = (spec[0], tuple(spec[1:])) if isinstance(spec, tuple) and spec else (spec, ())
    if name == "boxcar" and not params:
        window = np.ones(n)
    elif name == "hann" and not params:
        window = np.sin(np.pi * _half_sample_positions(n)) ** 2
    elif name == "triangular" and not params:
        window = 1.0 - np.abs(2.0 * _half_sample_positions(n) - 1.0)
    elif name == "tukey" and len(params) <= 1:
        window = _tukey(n, float(params[0]) if params else 0.5)
    elif name == "gaussian":
        if len(params) != 1:
            raise OptionError(
                f"window={spec!r}: a Gaussian window needs its width in cells; "
                "pass ('gaussian', sigma), for example ('gaussian', 64.0)."
            )
        import scipy.signal.windows

        window = scipy.signal.windows.gaussian(n, std=float(params[0]), sym=True)
    else:
        window = _scipy_window(spec, n)
    return check_window_array(window, (n,), spec)


def check_window_array(
    window: np.ndarray, shape: tuple[int, ...], spec: object = "window array"
) -> np.ndarray:
    """Return a read-only copy of a window with the patch shape and strictly positive values.

    A copy in C order: the caller may change their array afterwards, and graphs
    built on the window (named by a hash of its memory) must not change with it.
    """
    window = np.array(window, dtype=np.float64, order="C")
    if window.shape != shape:
        raise OptionError(f"window has shape {window.shape}; it must have the patch shape {shape}.")
    if not np.all(np.isfinite(window)) or not np.all(window > 0):
        raise OptionError(
            f"window={spec if not isinstance(spec, np.ndarray) else 'array'} has zero, negative "
            "or non-finite values; every weight must be > 0 so that no covered cell ends up "
            "with zero total weight. Clamp it to a small floor, e.g. np.maximum(w, 1e-3)."
        )
    window.setflags(write=False)
    return window


def physical_memory() -> int:
    """Return this machine's memory in bytes (16 GiB where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return 16 * 2**30


def check_patch_fits(dims: Sequence[Hashable], shape: tuple[int, ...]) -> None:
    """Refuse a patch whose float64 window would take over half of this machine's memory.

    Patches are cut, run and blended whole, each with a window of its shape:
    without this check ``y=x=10**9`` asked numpy for 7 GiB, then for exabytes,
    and the kernel killed the process.

    Examples
    --------
    >>> check_patch_fits(["y", "x"], (512, 512))
    >>> check_patch_fits(["y", "x"], (10**9, 10**9))
    Traceback (most recent call last):
    ...
    xpatch.core.errors.GeometryError: size (y: 1000000000, x: 1000000000) is 1e+18 cells ...
    """
    cells = math.prod(shape)
    limit = physical_memory() // 2
    if cells * 8 <= limit:
        return
    sizes = ", ".join(f"{d}: {n}" for d, n in zip(dims, shape))
    raise GeometryError(
        f"size ({sizes}) is {cells:.3g} cells a patch: its blending window alone would take "
        f"{cells * 8 / 2**30:.3g} GiB (float64), over half of this machine's "
        f"{physical_memory() / 2**30:.3g} GiB, before any patch is cut. Patches are held "
        f"whole in memory: choose a size of at most {limit // 8:.3g} cells a patch (a "
        "512 x 512 patch is 262144)."
    )


def make_window(
    spec: WindowSpec | Mapping[Hashable, WindowSpec],
    dims: Sequence[Hashable],
    size: Sequence[int],
) -> np.ndarray:
    """Build the N-D blending window over the patched dims (a separable product).

    Parameters
    ----------
    spec
        One 1-D spec for every dim, a ``{dim: spec}`` mapping (dims left out use
        ``"boxcar"``), or an N-D array of the patch shape.
    dims, size
        Patched dims and patch size, in the same order.

    Examples
    --------
    >>> make_window("hann", ["y", "x"], [2, 3]).shape
    (2, 3)
    >>> make_window({"x": "hann"}, ["y", "x"], [2, 2]).round(2).tolist()
    [[0.5, 0.5], [0.5, 0.5]]
    """
    shape = tuple(int(s) for s in size)
    check_patch_fits(dims, shape)
    if isinstance(spec, np.ndarray):
        if spec.ndim == len(shape):
            return check_window_array(spec, shape)
        if not (spec.ndim == 1 and len(shape) == 1):
            raise OptionError(
                f"window array has {spec.ndim} dimension(s); give one with the patch shape "
                f"{shape} or a mapping {{dim: 1-D spec}}."
            )
    if isinstance(spec, Mapping):
        check_patched_dims("window", spec, dims, OptionError)
        per_axis = [window_1d(spec.get(d, "boxcar"), n) for d, n in zip(dims, shape)]
    else:
        per_axis = [window_1d(spec, n) for n in shape]
    return reduce(np.multiply.outer, per_axis) if per_axis else np.ones(())


def separable_factors(window: np.ndarray) -> tuple[np.ndarray, ...] | None:
    """Return 1-D factors whose outer product is ``window``, or None if it has none.

    Windows built from specs are separable by construction; a user's array may be
    too. The factors let overlap-add compute the total weight per axis (a few
    vectors) instead of summing a full window per patch.

    The factors are the window's lines through its first cell, divided by that
    cell but for the first (a whole window whose first cell divides it has whole
    factors, which integer sums need). Where that cell is zero, so small that a
    factor would overflow float32 (a 45-cell gaussian's is 1e-47), or subnormal
    (its factors rebuild the window inexactly), the lines through the largest cell
    are taken instead.

    Examples
    --------
    >>> w = np.multiply.outer([1.0, 2.0], [1.0, 3.0, 1.0])
    >>> [f.tolist() for f in separable_factors(w)]
    [[1.0, 2.0], [1.0, 3.0, 1.0]]
    >>> [f.tolist() for f in separable_factors(np.multiply.outer([0.0, 2.0], [1.0, 4.0]))]
    [[0.0, 8.0], [0.25, 1.0]]
    >>> separable_factors(np.array([[1.0, 2.0], [2.0, 1.0]])) is None
    True
    """
    window = np.asarray(window, dtype=np.float64)
    if window.ndim == 0 or window.size == 0:
        return None
    largest = np.unravel_index(int(np.argmax(np.abs(window))), window.shape)
    for pivot in ((0,) * window.ndim, largest):
        factors = _lines_through(window, tuple(int(i) for i in pivot))
        if factors is None or any(np.abs(f).max() > np.finfo(np.float32).max for f in factors):
            continue
        rebuilt = reduce(np.multiply.outer, factors)
        if np.allclose(rebuilt, window, rtol=1e-12, atol=0.0):
            return tuple(factors)
    return None


def _lines_through(window: np.ndarray, pivot: tuple[int, ...]) -> list[np.ndarray] | None:
    """Return the lines of ``window`` through ``pivot``, all but the first over its value."""
    value = window[pivot]
    if value == 0 and window.ndim > 1:
        return None
    factors = []
    for axis in range(window.ndim):
        index: list[Any] = list(pivot)
        index[axis] = slice(None)
        line = window[tuple(index)]
        with np.errstate(over="ignore"):  # a tiny value: the caller turns to another pivot
            factors.append(line if axis == 0 else line / value)
    return factors


def marginal_window(window: np.ndarray, keep: Sequence[int]) -> np.ndarray:
    """Return the window of a variable with only the patched axes ``keep``: summed over the rest.

    A prediction without some patched axis stands for the whole patch along it,
    so it weighs what the window weighs over that axis. For a separable window
    this is the window over ``keep`` times a constant.

    Examples
    --------
    >>> marginal_window(np.outer([1.0, 2.0], [1.0, 3.0]), [1]).tolist()
    [3.0, 9.0]
    """
    drop = tuple(ax for ax in range(window.ndim) if ax not in keep)
    return window.sum(axis=drop) if drop else window


class BlendWindow(NamedTuple):
    """A blending window and, when it is separable, its 1-D factors.

    Built once per patcher and put into a dask graph once, so block tasks do not
    refactor the window each time.
    """

    values: np.ndarray
    factors: tuple[np.ndarray, ...] | None

    @classmethod
    def of(cls, window: np.ndarray | BlendWindow) -> BlendWindow:
        """Wrap a window array (a BlendWindow is returned as is)."""
        if isinstance(window, BlendWindow):
            return window
        window = np.asarray(window)
        return cls(window, separable_factors(window))
