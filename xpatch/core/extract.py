"""Cut patches out of numpy and dask arrays.

Layout convention of the core: the patched axes of the input are given by
position; the stacked output has a leading patch axis and otherwise keeps the
input's axis order, with each patched axis shortened to the patch size.
"""

from __future__ import annotations

import itertools
import math
import operator
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph
from numpy.lib.stride_tricks import sliding_window_view

from xpatch.core.errors import OptionError
from xpatch.core.padding import (
    PadMode,
    axis_modes,
    gather,
    index_runs,
    padded_box,
    source_indices,
)
from xpatch.core.plan import Plan, chunk_starts, column_bounds
from xpatch.core.regroup import take_rows

if TYPE_CHECKING:
    import dask.array as da


def default_pad_value(dtype: np.dtype) -> float | int | bool:
    """NaN for inexact dtypes, 0 (False) for integer and boolean ones.

    Examples
    --------
    >>> default_pad_value(np.dtype("float32")), default_pad_value(np.dtype("int16"))
    (nan, 0)
    """
    if np.issubdtype(dtype, np.inexact):
        return np.nan
    if np.issubdtype(dtype, np.bool_):
        return False
    return 0


def check_pad_value(value: object, dtype: np.dtype) -> object:
    """Return a pad value that ``dtype`` can hold, or raise naming the fix."""
    if value is None:
        return default_pad_value(dtype)
    with np.errstate(invalid="ignore"):
        converted = np.asarray(value).astype(dtype)
    if not np.array_equal(converted, np.asarray(value), equal_nan=True):
        raise OptionError(
            f"pad_value={value!r} cannot be stored in the array's dtype {dtype}; pass a value "
            f"of that dtype, or cast the array first (e.g. da.astype('float32'))."
        )
    return converted.item()


def extract_numpy(
    array: np.ndarray,
    axes: Sequence[int],
    anchors: np.ndarray,
    size: Sequence[int],
    pad_value: object = None,
    pad_mode: PadMode | Sequence[PadMode] = "constant",
) -> np.ndarray:
    """Stack the patches of a numpy array (a copy; the input is untouched).

    Parameters
    ----------
    array
        The input.
    axes
        Positions of the patched axes; ``anchors`` and ``size`` follow their order.
    anchors
        ``(n, len(axes))`` start indices; a window may start before an axis
        (a halo) or end past it.
    size
        Patch size per patched axis.
    pad_value
        Fill of ``"constant"`` positions outside the array.
    pad_mode
        How positions outside the array are filled, once or per patched axis:
        ``"constant"`` with ``pad_value``, or :func:`numpy.pad`'s other modes
        relative to ``array``'s edges (``"wrap"`` for a periodic axis).

    Examples
    --------
    >>> a = np.arange(12).reshape(3, 4)
    >>> extract_numpy(a, [1], np.array([[0], [2]]), [2]).tolist()
    [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [10, 11]]]
    >>> extract_numpy(np.arange(4), [0], np.array([[2]]), [4], pad_mode="reflect").tolist()
    [[2, 3, 2, 1]]
    >>> extract_numpy(np.arange(4), [0], np.array([[-1]]), [3], pad_mode="wrap").tolist()
    [[3, 0, 1]]
    """
    patch_shape = list(array.shape)
    for ax, s in zip(axes, size):
        patch_shape[ax] = s
    if len(anchors) == 0:
        return np.empty((0, *patch_shape), dtype=array.dtype)
    # Only the box the patches span is cut (and padded where it leaves the array).
    lo, top = column_bounds(anchors)
    hi = top + np.asarray(size)
    box = list(zip(lo.tolist(), hi.tolist()))
    array = padded_box(array, axes, box, axis_modes(pad_mode, len(axes)), pad_value)
    anchors = anchors - lo
    k = len(axes)
    front = np.moveaxis(array, list(axes), list(range(k)))
    views = sliding_window_view(front, tuple(size), axis=tuple(range(k)))
    # views: (*starts, *carried, *window) -> (n, *carried, *window)
    stacked = views[tuple(anchors[:, j] for j in range(k))]
    carried = [ax for ax in range(array.ndim) if ax not in axes]
    # Position of each original axis in `stacked` (axis 0 is the patch axis).
    source = {ax: 1 + i for i, ax in enumerate(carried)}
    source.update({ax: 1 + len(carried) + j for j, ax in enumerate(axes)})
    order = [0] + [source[ax] for ax in range(array.ndim)]
    return np.ascontiguousarray(stacked.transpose(order))


def join_blocks(nested: list, crops: Sequence[Sequence[slice]]) -> np.ndarray:
    """Concatenate nested blocks, each cut to ``crops[axis][position]`` first.

    Only the part of each block that the patches need is copied: a group reads
    thin strips of its neighbours' chunks, not the whole chunks.
    """

    def cut(item, depth: int, index: tuple) -> Any:
        if isinstance(item, list):
            return [cut(sub, depth + 1, (*index, i)) for i, sub in enumerate(item)]
        return _cut_piece(item, crops, index)

    from dask.array.core import concatenate3  # a task of a dask graph: dask.array is loaded

    return concatenate3(cut(nested, 0, ()))


def _cut_pieces(item, crops, index: tuple = ()) -> Iterator[tuple[tuple, np.ndarray]]:
    """Each piece of ``nested`` with its position along every axis, cut to ``crops``."""
    # A module-level generator, not a closure calling itself: such a closure is a
    # reference cycle, and it would keep the input chunks alive until a gc pass.
    if isinstance(item, list):
        for i, sub in enumerate(item):
            yield from _cut_pieces(sub, crops, (*index, i))
    else:
        yield index, _cut_piece(item, crops, index)


def _cut_piece(item, crops, index: tuple) -> np.ndarray:
    """Return the cells of one piece that a read needs: its crop, or a Strip's cells."""
    if isinstance(item, Strip):  # cut already, by the block's strips task
        return item.cells
    return item[tuple(crops[axis][i] for axis, i in enumerate(index))]


def cut_from_pieces(nested: list, crops, axes, anchors: np.ndarray, size) -> np.ndarray | None:
    """``extract_numpy(join_blocks(nested, crops), axes, anchors, size)``, without the join.

    Each patch is copied from the pieces it overlaps, so a task that runs ``fn``
    in several batches holds no joined copy of its input beside the pieces (a
    chunk's worth of memory per thread). None if a patch reaches past the pieces.
    """
    pieces = list(_cut_pieces(nested, crops))
    ndim = pieces[0][1].ndim
    lengths: list[dict[int, int]] = [{} for _ in range(ndim)]
    for index, cells in pieces:
        for axis, i in enumerate(index):
            lengths[axis][i] = cells.shape[axis]
    starts = [np.cumsum([0] + [n[i] for i in range(len(n))]).tolist() for n in lengths]
    extent = [s[-1] for s in starts]
    anchors = np.asarray(anchors)
    inside = [extent[axis] for axis in axes]
    if not len(anchors) or (anchors < 0).any() or (anchors + size > inside).any():
        return None
    shape = list(extent)
    for axis, n in zip(axes, size):
        shape[axis] = n
    out = np.empty((len(anchors), *shape), dtype=pieces[0][1].dtype)
    for p, row in enumerate(anchors.tolist()):
        lo, hi = [0] * ndim, list(extent)
        for axis, start, n in zip(axes, row, size):
            lo[axis], hi[axis] = start, start + n
        for index, cells in pieces:
            begin = [starts[axis][i] for axis, i in enumerate(index)]
            first = [max(a, b) for a, b in zip(lo, begin)]
            last = [min(a, b + n) for a, b, n in zip(hi, begin, cells.shape)]
            if all(f < e for f, e in zip(first, last)):
                source = tuple(slice(f - b, e - b) for f, e, b in zip(first, last, begin))
                target = tuple(slice(f - low, e - low) for f, e, low in zip(first, last, lo))
                out[(p, *target)] = cells[source]
    return out


def join_input(nested: list, crops, takes=()) -> np.ndarray:
    """Join the input pieces a group reads (:func:`join_blocks`), padded as ``takes`` say.

    ``takes`` (from :func:`group_reads`) lays out the cells that a padding mode
    other than ``"constant"`` copies past the array's end.
    """
    joined = join_blocks(nested, crops)
    for ax, index in takes:
        joined = np.take(joined, index, axis=ax)
    return joined


def extract_task(nested: list, crops, axes, anchors, size, pad_value, takes=()) -> np.ndarray:
    """Join the input pieces a group reads and cut its patches out (a graph task)."""
    return extract_numpy(join_input(nested, crops, takes), axes, anchors, size, pad_value)


class Strip(NamedTuple):
    """The part of an input block that one read needs, cut (and copied) already."""

    cells: np.ndarray


def cut_strips(block: np.ndarray, crops: dict) -> dict:
    """Copy out of ``block`` each read's part: ``crops`` maps a read to its index.

    Copies, so that the block itself is freed once its strips are cut.
    """
    return {read: Strip(block[index].copy()) for read, index in crops.items()}


def strip_reads(
    reads: list, array: da.Array, name: str, layer: dict, own_cuts: bool = False
) -> list:
    """Let the reads of :func:`group_reads` take thin parts of blocks from strips tasks.

    A group reads its home block nearly whole and thin strips of its neighbours.
    Read directly, every neighbour block stays in memory (and, on a cluster, is
    sent whole to the group's worker) until the group runs; instead one
    ``{name}-strips`` task per block cuts the strips that groups need (at most
    half the block each) and the block is freed at once. Adds those tasks to
    ``layer``; returns ``reads`` with the nested keys of such parts replaced by
    the tasks that pick them (the values are the same, cut earlier).

    With ``own_cuts`` (groups of working blocks smaller than the chunks) every
    read of less than a whole block is cut by a task of that group's own
    (``{name}-strips`` keyed by block and read): a computation of a few groups
    then cuts only their parts, and frees the block once they are cut.
    """
    parts: dict[tuple, dict[tuple, tuple]] = {}

    def swap(item, index: tuple, number: int, crops) -> Any:
        if isinstance(item, list):
            return [swap(sub, (*index, i), number, crops) for i, sub in enumerate(item)]
        cut = tuple(crops[axis][i] for axis, i in enumerate(index))
        block = [array.chunks[axis][b] for axis, b in enumerate(item[1:])]
        cells = [len(range(*c.indices(n))) for c, n in zip(cut, block)]
        whole = cells == block if own_cuts else 2 * math.prod(cells) > math.prod(block)
        if whole:
            return item  # the block, or most of it: read it whole
        # A read may take two parts of one block (padding that wraps around).
        task = (*item[1:], number) if own_cuts else item[1:]
        parts.setdefault((item, task), {})[(number, *index)] = cut
        return (operator.getitem, (f"{name}-strips", *task), (number, *index))

    out = [
        (g, index, swap(nested, (), number, crops), crops, local, takes)
        for number, (g, index, nested, crops, local, takes) in enumerate(reads)
    ]
    for (key, task), crops in parts.items():
        layer[(f"{name}-strips", *task)] = (cut_strips, key, crops)
    return out


def group_reads(
    array: da.Array,
    axes: Sequence[int],
    plan: Plan,
    whole_axes: Sequence[int] = (),
    pad_mode: PadMode | Sequence[PadMode] = "constant",
) -> Iterator[tuple[int, tuple[int, ...], list, list, np.ndarray, tuple]]:
    """For each group of the plan, the input blocks it reads.

    ``plan`` covers the patched ``axes`` of ``array``, in their order (a
    projected plan for a variable that lacks some patched dims).

    Yields ``(group, out_index, nested_keys, crops, local_anchors, takes)``: the group's
    position; the block index of its patches in the stacked output, over all the
    input's axes (the block along the carried axes that are not whole, 0
    elsewhere); the keys of the input blocks its patches touch (nested
    as :func:`dask.array.core.concatenate3` takes them), the part of each block
    they need (per axis, one slice per block), the anchors relative to the
    region those parts cover, and ``takes``: ``(axis, index)`` pairs that
    rearrange the joined parts into the padded region.

    Windows may start before an axis and end past it. Along a ``"constant"``
    axis (``pad_mode`` is one mode or one per patched axis) the parts are the
    region clipped to the array (the task fills the rest; local anchors may be
    negative). Along an axis of another mode, a group whose patches leave the
    array also reads the cells they repeat
    (:func:`~xpatch.core.padding.source_indices`), from whichever chunks hold them
    (the other end's for ``"wrap"``), and ``takes`` places them.
    """
    axes = [int(a) for a in axes]
    carried = [ax for ax in range(array.ndim) if ax not in axes]
    split = [ax for ax in carried if ax not in whole_axes]
    starts = [chunk_starts(c) for c in array.chunks]
    size = np.asarray(plan.size)
    modes = axis_modes(pad_mode, len(axes))
    for g in range(len(plan.groups)):
        anchors = plan.group_anchors(g)
        low, top = column_bounds(anchors)
        runs: dict[int, list[tuple[int, int]]] = {}
        takes = []
        first = []
        for ax, lo, hi, mode in zip(axes, low.tolist(), (top + size).tolist(), modes):
            n = array.shape[ax]
            if (lo >= 0 and hi <= n) or mode == "constant":
                # The cells inside the array; the task fills the rest with the pad value.
                # Windows that all miss the array still read one cell (shown by none).
                start = min(max(lo, 0), n - 1)
                runs[ax] = [(start, max(min(hi, n), start + 1))]
                first.append(start)
                continue
            source = source_indices(lo, hi, n, mode)
            runs[ax] = index_runs(source)
            takes.append((ax, gather(source, runs[ax])))
            first.append(lo)
        local = anchors - np.asarray(first, dtype=anchors.dtype)
        ranges: list[Sequence[int]] = []
        crops: list[list[slice]] = []
        for ax in range(array.ndim):
            if ax not in runs:
                ranges.append(range(len(array.chunks[ax])))
                crops.append([slice(None)] * len(array.chunks[ax]))
                continue
            s = starts[ax]
            blocks, cuts = [], []
            for lo, hi in runs[ax]:
                for b in range(bisect_right(s, lo) - 1, bisect_left(s, hi)):
                    blocks.append(b)
                    cuts.append(slice(max(lo - s[b], 0), min(hi, s[b + 1]) - s[b]))
            ranges.append(blocks)
            crops.append(cuts)
        for carried_block in itertools.product(*(ranges[ax] for ax in split)):
            reads = list(ranges)
            out_index = [0] * array.ndim
            block_crops = list(crops)
            for ax, b in zip(split, carried_block):
                reads[ax] = range(b, b + 1)
                out_index[ax] = b
                block_crops[ax] = [slice(None)]
            nested = _nested_keys(array.name, reads)
            yield g, tuple(out_index), nested, block_crops, local, tuple(takes)


def extract_dask(
    array: da.Array,
    axes: Sequence[int],
    plan: Plan,
    pad_value: object = None,
    pad_mode: PadMode | Sequence[PadMode] = "constant",
) -> da.Array:
    """Stack the patches of a dask array lazily, one task per group of the plan.

    Each task reads the input chunks its patches touch, and only those, and cuts
    the patches out in numpy: the graph has one task per group (and per chunk of
    the carried axes), so its size follows the number of chunks, not of patches.
    The result is in the user's order of the plan; when that is not the chunk
    order, one more task per group gathers the patches into it
    (:func:`~xpatch.core.regroup.take_rows`).

    Parameters
    ----------
    array, axes, pad_value, pad_mode
        As for :func:`extract_numpy`.
    plan
        The plan over the patched ``axes``, in their order.
    """
    import dask.array as da

    size = list(plan.size)
    patch_shape = list(array.shape)
    for ax, s in zip(axes, size):
        patch_shape[ax] = s
    if not plan.groups:
        return da.empty((0, *patch_shape), dtype=array.dtype, chunks=-1)
    axes = [int(a) for a in axes]
    # The mode enters the name only when it is not the default, so that graphs
    # (and resumed writes) of constant padding keep the names they had.
    modes = axis_modes(pad_mode, len(axes))
    padding = pad_value if set(modes) == {"constant"} else (pad_value, modes)
    token = tokenize(array, axes, plan, padding)
    name = f"xpatch-patches-{token}"
    layer: dict = {}
    for g, out_index, nested, crops, local, takes in group_reads(
        array, axes, plan, pad_mode=pad_mode
    ):
        task = (extract_task, nested, crops, axes, local, size, pad_value, takes)
        layer[(name, g, *out_index)] = task
    chunks = [tuple(stop - start for start, stop in plan.groups)]
    for ax in range(array.ndim):
        chunks.append((patch_shape[ax],) if ax in axes else array.chunks[ax])
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[array])
    meta = np.empty((0,) * (array.ndim + 1), dtype=array.dtype)
    stacked = da.Array(graph, name, tuple(chunks), meta=meta)
    if plan.in_chunk_order:
        return stacked
    return take_rows(stacked, plan.position, chunks[0])


def _nested_keys(name: str, ranges: Sequence[Sequence[int]], prefix: tuple = ()) -> list | tuple:
    """Nested lists of block keys over ``ranges``, as :func:`concatenate3` takes them."""
    if len(prefix) == len(ranges):
        return (name, *prefix)
    return [_nested_keys(name, ranges, (*prefix, b)) for b in ranges[len(prefix)]]
