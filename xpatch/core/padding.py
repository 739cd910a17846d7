"""Padding modes of ``boundary="pad"``: which input cell a cell past the edge repeats.

``pad_mode="constant"`` fills the cells past an axis's end with ``pad_value``.
The other modes copy input cells, with :func:`numpy.pad`'s meanings relative to
the whole array's edges (not to a chunk's): :func:`source_indices` maps every
position of a patch to the input cell it shows, and :func:`index_runs` splits
those cells into contiguous runs, so that a reader fetches only the chunks that
hold them (for ``"wrap"``, the array's first cells).

Patches start inside the array (anchors are never negative), so only the end
of an axis is ever padded; for that case the formulas below equal
:func:`numpy.pad` exactly, including its repeated reflection when the pad is
longer than the array.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Literal, get_args

import numpy as np

from xpatch.core.errors import OptionError

#: How ``boundary="pad"`` fills the cells past the array's edge (numpy.pad's modes).
PadMode = Literal["constant", "reflect", "symmetric", "edge", "wrap"]
PAD_MODES: tuple[str, ...] = get_args(PadMode)


def check_pad_mode(pad_mode: object, boundary: str, pad_value: object) -> PadMode:
    """Return ``pad_mode`` if it goes with ``boundary`` and ``pad_value``, or raise naming the fix.

    Examples
    --------
    >>> check_pad_mode("reflect", "pad", None)
    'reflect'
    >>> check_pad_mode("reflect", "shift", None)
    Traceback (most recent call last):
    ...
    xpatch.core.errors.OptionError: pad_mode='reflect' needs boundary='pad' ...
    """
    if not isinstance(pad_mode, str) or pad_mode not in PAD_MODES:
        raise OptionError(
            f"pad_mode={pad_mode!r} is not a padding mode; choose one of {list(PAD_MODES)} "
            "(numpy.pad's meanings)."
        )
    if pad_mode != "constant" and boundary != "pad":
        raise OptionError(
            f"pad_mode={pad_mode!r} needs boundary='pad' (got boundary={boundary!r}): only "
            "padded patches have cells to fill. Pass boundary='pad', or leave pad_mode out."
        )
    if pad_mode != "constant" and pad_value is not None:
        raise OptionError(
            f"pad_value={pad_value!r} is only used by pad_mode='constant'; pad_mode={pad_mode!r} "
            "copies input cells. Leave pad_value out, or pass pad_mode='constant'."
        )
    return pad_mode  # type: ignore[return-value]


def source_indices(start: int, stop: int, n: int, mode: PadMode) -> np.ndarray:
    """Input index shown at each position of ``[start, stop)`` along an axis of length ``n``.

    Positions past ``n`` follow ``mode`` as :func:`numpy.pad` does with
    ``pad_width=(0, stop - n)`` (``"constant"`` has no input cell there: -1).

    Examples
    --------
    >>> source_indices(2, 9, 4, "reflect").tolist()
    [2, 3, 2, 1, 0, 1, 2]
    >>> source_indices(2, 9, 4, "wrap").tolist()
    [2, 3, 0, 1, 2, 3, 0]
    """
    i = np.arange(start, stop, dtype=np.int64)
    if mode == "edge":
        return np.minimum(i, n - 1)
    if mode == "wrap":
        return i % n
    if mode == "symmetric":
        j = i % (2 * n)
        return np.where(j < n, j, 2 * n - 1 - j)
    if mode == "reflect":
        if n == 1:  # nothing to reflect about: numpy repeats the one cell
            return np.zeros_like(i)
        period = 2 * (n - 1)
        j = i % period
        return np.where(j < n, j, period - j)
    return np.where(i < n, i, -1)


def index_runs(indices: np.ndarray) -> list[tuple[int, int]]:
    """Return the distinct values of ``indices`` as sorted ``[start, stop)`` runs.

    Examples
    --------
    >>> index_runs(np.array([5, 6, 7, 6, 0, 1]))
    [(0, 2), (5, 8)]
    """
    values = np.unique(indices)
    if not len(values):
        return []
    breaks = np.flatnonzero(np.diff(values) > 1) + 1
    return [(int(run[0]), int(run[-1]) + 1) for run in np.split(values, breaks)]


def gather(indices: np.ndarray, runs: Sequence[tuple[int, int]]) -> np.ndarray:
    """Positions of ``indices`` in the concatenation of ``runs`` (which must hold them all).

    Examples
    --------
    >>> gather(np.array([5, 6, 0]), [(0, 2), (5, 8)]).tolist()
    [2, 3, 0]
    """
    starts = np.array([a for a, _ in runs])
    offsets = np.concatenate([[0], np.cumsum([b - a for a, b in runs])[:-1]])
    run = np.searchsorted(starts, indices, side="right") - 1
    return offsets[run] + indices - starts[run]


def pad_numpy(
    array: np.ndarray, axes: Sequence[int], box: Sequence[tuple[int, int]], mode: PadMode
) -> np.ndarray:
    """Return the cells of ``box`` (``[start, stop)`` per patched axis) padded in ``mode``.

    Examples
    --------
    >>> pad_numpy(np.arange(4), [0], [(1, 7)], "symmetric").tolist()
    [1, 2, 3, 3, 2, 1]
    """
    for ax, (lo, hi) in zip(axes, box):
        n = array.shape[ax]
        if hi <= n:  # a view: no copy for the axes that stay inside
            index = [slice(None)] * array.ndim
            index[ax] = slice(lo, hi)
            array = array[tuple(index)]
        else:
            array = np.take(array, source_indices(lo, hi, n, mode), axis=ax)
    return array


def fill_padded(
    out: np.ndarray,
    axes: Sequence[int],
    anchor: Sequence[int],
    extents: Sequence[int],
    mode: PadMode,
    read: Callable[[list[tuple[int, int]]], np.ndarray],
) -> np.ndarray:
    """Fill the patch ``out`` at ``anchor`` in ``mode``, reading input boxes with ``read``.

    ``read(box)`` returns the input cells of ``box`` (``[start, stop)`` per
    patched axis, inside the array) with every other axis whole. It is called
    once per combination of the runs of cells the patch shows (one box for a
    patch inside the array; two along an axis that ``"wrap"`` continues from
    the start), so a chunked reader fetches only the chunks that hold them.

    Examples
    --------
    >>> a = np.arange(6)
    >>> fill_padded(np.empty(4, int), [0], [4], [6], "wrap", lambda b: a[b[0][0]:b[0][1]]).tolist()
    [4, 5, 0, 1]
    """
    sources = [
        source_indices(a, a + out.shape[ax], n, mode) for ax, a, n in zip(axes, anchor, extents)
    ]
    for box in itertools.product(*(index_runs(s) for s in sources)):
        values = read(list(box))
        to: list[np.ndarray] = [np.arange(n) for n in out.shape]
        take: list[np.ndarray] = [np.arange(n) for n in values.shape]
        for ax, s, (lo, hi) in zip(axes, sources, box):
            to[ax] = np.flatnonzero((s >= lo) & (s < hi))
            take[ax] = s[to[ax]] - lo
        out[np.ix_(*to)] = values[np.ix_(*take)]
    return out
