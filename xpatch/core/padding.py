"""Padding modes: which input cell a position outside an axis shows.

A read window may start before an axis (a halo) and end past it (a halo, or a
patch of ``boundary="pad"``). ``pad_mode="constant"`` fills those positions with
``pad_value``. The other modes copy input cells, with :func:`numpy.pad`'s
meanings relative to the whole array's edges (not to a chunk's); a periodic dim
reads as ``"wrap"``. :func:`source_indices` maps every position of a window to
the input cell it shows, and :func:`index_runs` splits those cells into
contiguous runs, so that a reader fetches only the chunks that hold them (for
``"wrap"``, the cells at the other end).

The formulas equal :func:`numpy.pad` exactly on both sides, including its
repeated reflection when the pad is longer than the array. A mode is given once
for every axis, or per patched axis (:func:`axis_modes`).
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


def axis_modes(pad_mode: PadMode | Sequence[PadMode], k: int) -> tuple[PadMode, ...]:
    """Return ``pad_mode`` as one mode per patched axis (``k`` of them).

    Examples
    --------
    >>> axis_modes("edge", 2), axis_modes(("wrap", "constant"), 2)
    (('edge', 'edge'), ('wrap', 'constant'))
    """
    if isinstance(pad_mode, str):
        return (pad_mode,) * k  # type: ignore[return-value]
    modes = tuple(pad_mode)
    if len(modes) != k:
        raise ValueError(f"pad_mode={pad_mode!r} gives {len(modes)} modes for {k} patched axes")
    return modes


def source_indices(start: int, stop: int, n: int, mode: PadMode) -> np.ndarray:
    """Input index shown at each position of ``[start, stop)`` along an axis of length ``n``.

    Positions before 0 and past ``n`` follow ``mode`` as :func:`numpy.pad` does
    with ``pad_width=(-start, stop - n)`` (``"constant"`` has no input cell
    there: -1).

    Examples
    --------
    >>> source_indices(2, 9, 4, "reflect").tolist()
    [2, 3, 2, 1, 0, 1, 2]
    >>> source_indices(-3, 6, 4, "wrap").tolist()
    [1, 2, 3, 0, 1, 2, 3, 0, 1]
    >>> source_indices(-2, 5, 4, "constant").tolist()
    [-1, -1, 0, 1, 2, 3, -1]
    """
    i = np.arange(start, stop, dtype=np.int64)
    if mode == "edge":
        return np.clip(i, 0, n - 1)
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
    return np.where((i >= 0) & (i < n), i, -1)


def read_bounds(
    starts: np.ndarray, size: int, n: int, mode: PadMode
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``[low, high)`` of the input cells windows ``[start, start + size)`` read.

    Along an axis of ``n`` cells padded by ``mode``. Mirrored modes
    (``"reflect"``, ``"symmetric"``, ``"edge"``) read cells near the edge for the
    cells past it, which may lie outside the window; other modes give the windows
    as they are (``"wrap"`` reads the far end: see
    :meth:`~xpatch.core.plan.ChunkGrid.touched_ids`).

    Examples
    --------
    >>> low, high = read_bounds(np.array([0, 6, 8]), 4, 10, "reflect")
    >>> low.tolist(), high.tolist()
    ([0, 6, 7], [4, 10, 10])
    """
    starts = np.asarray(starts, dtype=np.int64)
    low, high = starts.copy(), starts + size
    if mode not in ("reflect", "symmetric", "edge"):
        return low, high
    outside = (starts < 0) | (starts + size > n)
    for start in np.unique(starts[outside]).tolist():
        cells = source_indices(start, start + size, n, mode)
        at = starts == start
        low[at], high[at] = cells.min(), cells.max() + 1
    return low, high


def index_runs(indices: np.ndarray) -> list[tuple[int, int]]:
    """Return the distinct input cells of ``indices`` as sorted ``[start, stop)`` runs.

    -1 (a constant fill, no input cell) is left out.

    Examples
    --------
    >>> index_runs(np.array([5, 6, 7, 6, 0, 1, -1]))
    [(0, 2), (5, 8)]
    """
    values = np.unique(indices)
    values = values[values >= 0]
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


def padded_box(
    array: np.ndarray,
    axes: Sequence[int],
    box: Sequence[tuple[int, int]],
    modes: Sequence[PadMode],
    fill: object = None,
) -> np.ndarray:
    """Return the cells of ``box`` (``[start, stop)`` per patched axis), padded per axis.

    Positions outside the array show the cell ``modes[j]`` says, or ``fill``
    for ``"constant"``. Axes that stay inside are sliced (a view).

    Examples
    --------
    >>> padded_box(np.arange(4), [0], [(1, 7)], ["symmetric"]).tolist()
    [1, 2, 3, 3, 2, 1]
    >>> padded_box(np.arange(4), [0], [(-2, 3)], ["constant"], fill=9).tolist()
    [9, 9, 0, 1, 2]
    """
    for ax, (lo, hi), mode in zip(axes, box, modes):
        n = array.shape[ax]
        index = [slice(None)] * array.ndim
        if lo >= 0 and hi <= n:  # a view: no copy for the axes that stay inside
            index[ax] = slice(lo, hi)
            array = array[tuple(index)]
        elif mode == "constant":
            index[ax] = slice(max(lo, 0), min(hi, n))
            widths = [(0, 0)] * array.ndim
            widths[ax] = (min(max(-lo, 0), hi - lo), min(max(hi - n, 0), hi - lo))
            array = np.pad(array[tuple(index)], widths, constant_values=fill)
        else:
            array = np.take(array, source_indices(lo, hi, n, mode), axis=ax)
    return array


def fill_padded(
    out: np.ndarray,
    axes: Sequence[int],
    anchor: Sequence[int],
    extents: Sequence[int],
    mode: PadMode | Sequence[PadMode],
    read: Callable[[list[tuple[int, int]]], np.ndarray],
) -> np.ndarray:
    """Fill the patch ``out`` at ``anchor`` as ``mode`` says, reading input boxes with ``read``.

    ``read(box)`` returns the input cells of ``box`` (``[start, stop)`` per
    patched axis, inside the array) with every other axis whole. It is called
    once per combination of the runs of cells the patch shows (one box for a
    patch inside the array; two along an axis that ``"wrap"`` continues from
    the other end), so a chunked reader fetches only the chunks that hold them.
    Positions of a ``"constant"`` axis outside the array are left as ``out``
    holds them (the caller fills ``out`` with the pad value first).

    Examples
    --------
    >>> a = np.arange(6)
    >>> read = lambda box: a[box[0][0] : box[0][1]]
    >>> fill_padded(np.empty(4, int), [0], [4], [6], "wrap", read).tolist()
    [4, 5, 0, 1]
    >>> fill_padded(np.full(4, 9), [0], [-2], [6], "constant", read).tolist()
    [9, 9, 0, 1]
    """
    modes = axis_modes(mode, len(axes))
    sources = [
        source_indices(a, a + out.shape[ax], n, m)
        for ax, a, n, m in zip(axes, anchor, extents, modes)
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
