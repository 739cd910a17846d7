"""The patch plan: which patches each task handles and where their results land.

A :class:`Plan` is compiled once per patcher from the anchors and the chunk grid
of the input (numpy only, frozen, picklable, tokenizable). Every lazy path reads
it: extraction (one task per group), ``apply``, overlap-add (a partial per group,
combined per output block), the Grain source (cache keys, chunk-local shuffle)
and the writers. Nothing else derives chunk starts or groups.

Two orders matter:

- the **user's order**, the order of ``p.anchors()``, ``p[i]`` and of the
  ``"patch"`` axis of ``p.patches()`` and of predictions;
- the **chunk order**, in which the patches anchored in one input chunk are
  consecutive. ``plan.order`` maps a chunk-order position to the user's index.

A **group** is a run of the chunk order whose anchors lie in one chunk (long
runs are split to bound a task's bytes): for every sampler the graph has a
bounded number of tasks per input chunk, and a group's **box** (the cells its
patches cover) is one chunk plus the patch overhang.
"""

from __future__ import annotations

import functools
import itertools
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from dask.base import tokenize

from xpatch.core.padding import PadMode, read_bounds

#: Upper bound of the bytes of the patches of one group (one task). Dask's own
#: default chunk is 128 MiB; the patches of one chunk are larger than the chunk
#: wherever patches overlap, so this is larger still.
GROUP_BYTES = 256 * 2**20


def max_group_size(patch_bytes: int) -> int:
    """Return how many patches of ``patch_bytes`` fit in :data:`GROUP_BYTES` (at least 1).

    Examples
    --------
    >>> max_group_size(2**20)
    256
    """
    return max(GROUP_BYTES // max(int(patch_bytes), 1), 1)


def chunk_starts(chunks: Sequence[int]) -> tuple[int, ...]:
    """Start of every chunk along one axis, and the axis length at the end.

    The one place where chunk sizes become offsets.

    Examples
    --------
    >>> chunk_starts((4, 4, 2))
    (0, 4, 8, 10)
    """
    return tuple(itertools.accumulate((int(c) for c in chunks), initial=0))


def block_regions(chunks: Sequence[Sequence[int]]):
    """Yield every block index of a chunked array with its slices, in C order.

    Examples
    --------
    >>> [(index, region[0]) for index, region in block_regions([(2, 1)])]
    [((0,), slice(0, 2, None)), ((1,), slice(2, 3, None))]
    """
    starts = [chunk_starts(c) for c in chunks]
    for index in itertools.product(*(range(len(c)) for c in chunks)):
        yield index, tuple(slice(starts[a][b], starts[a][b + 1]) for a, b in enumerate(index))


@dataclass(frozen=True)
class ChunkGrid:
    """The chunk boundaries of an array along its patched axes.

    Parameters
    ----------
    starts
        Per patched axis, the start of every chunk and the axis length at the end
        (``len(chunks) + 1`` values).

    Examples
    --------
    >>> grid = ChunkGrid.from_chunks([(4, 4, 2)])
    >>> grid.touched([3], [4])
    [(0,), (1,)]
    >>> grid.region((1,))
    (slice(4, 8, None),)
    """

    starts: tuple[tuple[int, ...], ...]

    @classmethod
    def from_chunks(cls, chunks: Sequence[Sequence[int]]) -> ChunkGrid:
        """Grid from dask-style chunk sizes per patched axis."""
        return cls(tuple(chunk_starts(c) for c in chunks))

    @property
    def chunks(self) -> tuple[tuple[int, ...], ...]:
        """Chunk sizes per axis, as dask gives them."""
        return tuple(tuple(int(d) for d in np.diff(s)) for s in self.starts)

    @property
    def shape(self) -> tuple[int, ...]:
        """Extent of each axis."""
        return tuple(s[-1] for s in self.starts)

    @property
    def numblocks(self) -> tuple[int, ...]:
        """Number of chunks along each axis."""
        return tuple(len(s) - 1 for s in self.starts)

    @property
    def count(self) -> int:
        """Number of chunks."""
        return int(np.prod(self.numblocks, dtype=np.int64))

    def split(self, parts: Sequence[int], multiples: Sequence[int] | None = None) -> ChunkGrid:
        """Return the grid in blocks ``parts[axis]`` times shorter than its longest chunk.

        Along an axis with ``parts`` > 1 the blocks are all ``ceil(longest / parts)``
        long (rounded up to a multiple of ``multiples[axis]``) but the last, as zarr
        requires of the chunks of an output, and line up with the chunks wherever
        ``parts`` divides them; other axes keep their chunks.

        Examples
        --------
        >>> ChunkGrid.from_chunks([(8, 8, 3), (6,)]).split([2, 1]).chunks
        ((4, 4, 4, 4, 3), (6,))
        >>> ChunkGrid.from_chunks([(10, 10)]).split([4], [4]).chunks
        ((4, 4, 4, 4, 4),)
        """
        chunks = []
        multiples = multiples or [1] * len(parts)
        for sizes, n, m in zip(self.chunks, parts, multiples):
            if n == 1:
                chunks.append(sizes)
                continue
            block = -(-max(sizes) // int(n))
            block = -(-block // int(m)) * int(m)
            total = sum(sizes)
            chunks.append((block,) * (total // block) + ((total % block,) if total % block else ()))
        return ChunkGrid.from_chunks(chunks)

    def touched(self, anchor: Sequence[int], size: Sequence[int]) -> list[tuple[int, ...]]:
        """Block indices of the chunks that the patch at ``anchor`` overlaps."""
        ranges = []
        for starts, lo, extent in zip(self.starts, anchor, size):
            hi = min(int(lo) + int(extent), starts[-1])
            lo = max(int(lo), 0)  # a halo's window starts before the array
            # bisect on the tuple of starts: a few microseconds, a fraction of numpy's call.
            ranges.append(range(bisect_right(starts, lo) - 1, bisect_left(starts, hi)))
        return list(itertools.product(*ranges))

    def overlapping(self, origin: Sequence[int], shape: Sequence[int]) -> list[range]:
        """Per axis, the range of blocks that the box ``[origin, origin + shape)`` overlaps."""
        return [
            range(bisect_right(s, int(lo)) - 1, bisect_left(s, int(lo) + int(n)))
            for s, lo, n in zip(self.starts, origin, shape)
        ]

    def region(self, block: Sequence[int]) -> tuple[slice, ...]:
        """Slices of the chunk ``block`` along the patched axes."""
        return tuple(slice(s[b], s[b + 1]) for s, b in zip(self.starts, block))

    def origin(self, block: Sequence[int]) -> list[int]:
        """Start of the chunk ``block`` along each axis."""
        return [s[b] for s, b in zip(self.starts, block)]

    def extent(self, block: Sequence[int]) -> list[int]:
        """Shape of the chunk ``block``."""
        return [s[b + 1] - s[b] for s, b in zip(self.starts, block)]

    def blocks(self) -> itertools.product:
        """Every block index, in C order."""
        return itertools.product(*(range(n) for n in self.numblocks))

    def block_ids(self, anchors: np.ndarray) -> np.ndarray:
        """Flat (C-order) index of the chunk that holds each anchor.

        Examples
        --------
        >>> grid = ChunkGrid.from_chunks([(5, 5), (5, 5)])
        >>> grid.block_ids(np.array([[0, 7], [6, 0]])).tolist()
        [1, 2]
        """
        if len(anchors) == 0:
            return np.empty(0, dtype=np.int64)
        per_axis = []
        for j, s in enumerate(self.starts):
            block = np.searchsorted(s[1:], anchors[:, j], side="right")
            per_axis.append(np.minimum(block, len(s) - 2, out=block))
        return np.ravel_multi_index(per_axis, self.numblocks).astype(np.int64, copy=False)

    def spans(
        self, anchors: np.ndarray, size: Sequence[int]
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per axis, the first and the last block each patch overlaps (vectorised ``touched``).

        ``size`` is one per axis, or ``(n, axes)``: one per patch and axis.

        Examples
        --------
        >>> first, last = ChunkGrid.from_chunks([(4, 4)]).spans(np.array([[0], [2]]), [4])
        >>> first[0].tolist(), last[0].tolist()
        ([0, 0], [0, 1])
        """
        firsts, lasts = [], []
        sizes = np.broadcast_to(np.asarray(size, dtype=np.int64), np.shape(anchors))
        for j, s in enumerate(self.starts):
            a = np.asarray(anchors[:, j], dtype=np.int64) if len(anchors) else np.zeros(0, int)
            stop = np.minimum(a + sizes[:, j], s[-1])
            blocks = len(s) - 2
            firsts.append(np.clip(np.searchsorted(s, a, side="right") - 1, 0, blocks))
            lasts.append(np.clip(np.searchsorted(s, stop, side="left") - 1, 0, blocks))
        return firsts, lasts

    def touched_ids(
        self,
        anchors: np.ndarray,
        size: Sequence[int],
        pad_modes: Sequence[PadMode] | None = None,
    ) -> np.ndarray:
        """``(n, m)`` flat (C-order) indices of the chunks each patch reads, -1 padded.

        ``pad_modes`` says, per axis, which cells a window reads before the start or
        past the end (default ``"constant"``: none). Along an axis that wraps
        (``"wrap"``: a periodic dim) they are the other end's, and so are their
        chunks. Along an axis padded by mirroring (``"reflect"``, ``"symmetric"``,
        ``"edge"``) they are cells near the edge, whose chunk the window may not
        overlap (:func:`~xpatch.core.padding.read_bounds`). A chunk is listed once
        per patch.

        Examples
        --------
        >>> grid = ChunkGrid.from_chunks([(4, 4, 4)])
        >>> grid.touched_ids(np.array([[0], [2], [6]]), [4]).tolist()
        [[0, -1], [0, 1], [1, 2]]
        >>> grid.touched_ids(np.array([[10], [-2]]), [4], pad_modes=["wrap"]).tolist()
        [[2, 0], [2, 0]]
        >>> last = np.array([[11]])  # its cells past the end mirror 6 to 10
        >>> grid.touched_ids(last, [6]).tolist(), grid.touched_ids(last, [6], ["reflect"])
        ([[2]], array([[1, 2]]))
        """
        n = len(anchors)
        firsts, lasts, numblocks = [], [], []
        for j, starts in enumerate(self.starts):
            mode = pad_modes[j] if pad_modes is not None else "constant"
            a = np.asarray(anchors[:, j], dtype=np.int64) if n else np.zeros(0, np.int64)
            extent = starts[-1]
            if mode != "wrap":
                low, high = read_bounds(a, int(size[j]), extent, mode)
                first, last = ChunkGrid((starts,)).spans(low[:, None], (high - low)[:, None])
                firsts.append(first[0])
                lasts.append(last[0])
                numblocks.append(len(starts) - 1)
                continue
            # The axis tiled as often as the windows reach past it: blocks of the tiles
            # are the chunks again (their index modulo the chunks' count).
            before = max(0, -int(a.min())) if n else 0
            after = max(0, int((a + size[j]).max()) - extent) if n else 0
            tiles_before, tiles_after = -(-before // extent), -(-after // extent)
            tiled = [
                s + t * extent for t in range(-tiles_before, tiles_after + 1) for s in starts[:-1]
            ] + [extent * (tiles_after + 1)]
            shift = np.asarray(a) + tiles_before * extent
            origin = tiled[0]
            tiled = tuple(s - origin for s in tiled)
            first, last = ChunkGrid((tiled,)).spans(shift[:, None], [size[j]])
            firsts.append(first[0])
            lasts.append(last[0])
            numblocks.append(len(starts) - 1)
        spans = [int((b - a).max()) + 1 if n else 1 for a, b in zip(firsts, lasts)]
        columns = []
        for offsets in itertools.product(*(range(m) for m in spans)):
            index = [a + o for a, o in zip(firsts, offsets)]
            valid = np.logical_and.reduce([i <= b for i, b in zip(index, lasts)])
            clipped = [np.minimum(i, b) % m for i, b, m in zip(index, lasts, numblocks)]
            flat = np.ravel_multi_index(clipped, self.numblocks) if n else np.zeros(0, np.int64)
            columns.append(np.where(valid, flat, -1))
        touched = np.stack(columns, axis=1).astype(np.int64)
        if pad_modes is not None and "wrap" in pad_modes and touched.shape[1] > 1:
            for k in range(1, touched.shape[1]):  # a window longer than a turn: once each
                repeated = (touched[:, :k] == touched[:, k : k + 1]).any(axis=1)
                touched[repeated, k] = -1
        return touched

    def project(self, axes: Sequence[int]) -> ChunkGrid:
        """Return the grid along some of its axes."""
        return ChunkGrid(tuple(self.starts[j] for j in axes))


def auto_grid(shape: Sequence[int], carried: int, dtype: np.dtype) -> ChunkGrid:
    """Return the chunk grid that dask's ``"auto"`` chunking gives an array in memory.

    ``carried`` is the number of cells along the axes that are not patched (kept
    whole in every chunk). Numpy input is planned on this grid, so that a lazy
    reconstruction of its predictions has blocks of a bounded size too.

    Examples
    --------
    >>> auto_grid([100, 120], 3, np.dtype("float32")).chunks
    ((100,), (120,))
    """
    # In-memory input only: a zarr read without dask is planned on its own chunks.
    from dask.array.core import normalize_chunks

    chunks = normalize_chunks(
        (-1, *("auto",) * len(shape)), (max(int(carried), 1), *shape), dtype=np.dtype(dtype)
    )
    return ChunkGrid.from_chunks(chunks[1:])


def chunk_order(block_ids: np.ndarray, count: int) -> np.ndarray:
    """Stable permutation that sorts elements by the chunk id ``block_ids``.

    Examples
    --------
    >>> chunk_order(np.array([1, 0, 1, 0]), 2).tolist()
    [1, 3, 0, 2]
    """
    if count <= np.iinfo(np.uint16).max:
        block_ids = block_ids.astype(np.uint16)  # numpy sorts 16-bit keys stably by radix: O(n)
    return np.argsort(block_ids, kind="stable")


def column_bounds(anchors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per column of ``(n, k)`` ``anchors`` (n > 0), the smallest and largest value.

    ``anchors.min(axis=0)`` and ``.max(axis=0)``, column by column: numpy reduces
    a C-order ``(n, 2)`` array along its first axis a pair of values at a time
    (57 against 4 us for 4,032 anchors, paid per group by every graph and task).

    Examples
    --------
    >>> [b.tolist() for b in column_bounds(np.array([[3, 0], [1, 5]]))]
    [[1, 0], [3, 5]]
    """
    columns = [anchors[:, j] for j in range(anchors.shape[1])]
    return (
        np.array([c.min() for c in columns], dtype=anchors.dtype),
        np.array([c.max() for c in columns], dtype=anchors.dtype),
    )


def reaching(
    anchors: np.ndarray, size: Sequence[int], lo: Sequence[int], hi: Sequence[int]
) -> np.ndarray:
    """Which patches of ``size`` at ``(n, k)`` ``anchors`` reach into the box ``[lo, hi)``.

    Column by column, for the reason :func:`column_bounds` gives (8x faster).

    Examples
    --------
    >>> reaching(np.array([[0, 0], [4, 0], [0, 6]]), [2, 2], [1, 0], [5, 5]).tolist()
    [True, True, False]
    """
    reach = np.ones(len(anchors), dtype=bool)
    for j, (n, low, high) in enumerate(zip(size, lo, hi)):
        column = anchors[:, j]
        reach &= (column < high) & (column > low - n)
    return reach


def frozen_array(array: np.ndarray, dtype=np.int64) -> np.ndarray:
    """Return a read-only copy of ``array``, as a plan holds its arrays."""
    array = np.array(array, dtype=dtype, order="C")
    array.setflags(write=False)
    return array


def frozen_in_place(array: np.ndarray) -> np.ndarray:
    """Return ``array`` (int64, made by the caller) read-only, without copying it."""
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class Plan:
    """Anchors in chunk order, their groups and boxes, over a chunk grid.

    Build it with :meth:`Plan.compile`. Read-only, picklable and tokenizable
    (dask names graphs built from it deterministically).

    Attributes
    ----------
    grid
        The chunk grid along the patched axes (the input's, or dask's auto grid
        for input in memory); output blocks of a lazy reconstruction follow it.
    size
        Patch size per patched axis.
    anchors
        ``(n, k)`` int64 anchors in the user's order.
    order
        ``(n,)`` the user's index of each chunk-order position:
        ``anchors[order]`` are the anchors in chunk order.
    groups
        ``(start, stop)`` runs of the chunk order, each within one chunk.

    Examples
    --------
    >>> grid = ChunkGrid.from_chunks([(5, 5)])
    >>> plan = Plan.compile(np.array([[7], [1], [6], [0]]), grid, [2], keep_order=True)
    >>> plan.order.tolist(), plan.groups
    ([1, 3, 0, 2], ((0, 2), (2, 4)))
    >>> plan.boxes
    (((0,), (3,)), ((6,), (3,)))
    """

    grid: ChunkGrid
    size: tuple[int, ...]
    anchors: np.ndarray
    order: np.ndarray
    groups: tuple[tuple[int, int], ...]

    @classmethod
    def compile(
        cls,
        anchors: np.ndarray,
        grid: ChunkGrid,
        size: Sequence[int],
        *,
        keep_order: bool,
        max_group: int | None = None,
    ) -> Plan:
        """Group ``anchors`` by the chunk of ``grid`` that holds them.

        Parameters
        ----------
        anchors
            ``(n, k)`` anchors as the sampler gave them.
        grid
            The chunk grid along the ``k`` patched axes.
        size
            Patch size per patched axis.
        keep_order
            Keep the sampler's order as the user's order (explicit anchors, or
            input in memory); otherwise the user's order is the chunk order.
        max_group
            Largest number of patches in a group (default: no limit).
        """
        # A plan's arrays take 24 bytes a patch; building them takes no more than
        # twice that again (there are millions of small patches in a large output).
        given = anchors
        # In C order whatever the caller's layout (pandas hands out columns in Fortran
        # order): the token hashes the memory, and a resumed write must find the same.
        anchors = np.ascontiguousarray(anchors, dtype=np.int64).reshape(-1, len(grid.starts))
        ids = grid.block_ids(anchors)
        order = chunk_order(ids, grid.count)
        sorted_ids = ids[order]
        del ids
        if not keep_order:
            anchors = anchors[order]
            order = np.arange(len(anchors))
        n = len(anchors)
        change = np.flatnonzero(np.diff(sorted_ids) != 0) + 1
        del sorted_ids
        starts = np.concatenate([[0], change]).astype(np.int64) if n else np.empty(0, np.int64)
        stops = np.concatenate([change, [n]]).astype(np.int64) if n else np.empty(0, np.int64)
        step = max(int(max_group), 1) if max_group else max(n, 1)
        groups = tuple(
            (s, min(s + step, stop))
            for start, stop in zip(starts.tolist(), stops.tolist())
            for s in range(start, stop, step)
        )
        owned = isinstance(given, np.ndarray) and not np.may_share_memory(anchors, given)
        anchors = frozen_in_place(anchors) if owned else frozen_array(anchors)
        order = frozen_in_place(order.astype(np.int64, copy=False))
        return cls(grid, tuple(int(s) for s in size), anchors, order, groups)

    def __setstate__(self, state: dict) -> None:
        # Unpickled arrays come back writeable; a plan's stay read-only (views of them
        # are handed out by group_anchors).
        for name in ("anchors", "order"):
            if isinstance(state.get(name), np.ndarray):
                state[name] = frozen_in_place(state[name])
        self.__dict__.update(state)

    def __len__(self) -> int:
        return len(self.anchors)

    def __dask_tokenize__(self) -> str:
        return self.token

    @functools.cached_property
    def token(self) -> str:
        """Dask's token of the plan, hashed once: every graph built on it is named by it."""
        return tokenize(self.grid.starts, self.size, self.anchors, self.order, self.groups)

    @property
    def ndim(self) -> int:
        """Number of patched axes."""
        return len(self.size)

    @functools.cached_property
    def position(self) -> np.ndarray:
        """The chunk-order position of each patch (the inverse of :attr:`order`)."""
        position = np.empty(len(self.order), dtype=np.int64)
        position[self.order] = np.arange(len(self.order))
        return frozen_in_place(position)

    @functools.cached_property
    def in_chunk_order(self) -> bool:
        """Whether the user's order is the chunk order (checked once: the order is frozen)."""
        return bool((self.order == np.arange(len(self.order))).all())

    def group_anchors(self, group: int) -> np.ndarray:
        """Anchors of one group, in chunk order.

        A view of the plan's anchors when the user's order is the chunk order (samplers
        on dask input, and input in memory held in one chunk), else gathered at each
        call: a copy of all anchors in chunk order, kept, would add 16 bytes a patch
        to every plan (64 MiB for the 4.2 million 16x16 patches of a 4 GiB output).
        """
        start, stop = self.groups[group]
        if self.in_chunk_order:
            return self.anchors[start:stop]
        return self.anchors[self.order[start:stop]]

    def group_members(self, group: int) -> np.ndarray:
        """Return the user's indices of one group's patches, in chunk order."""
        start, stop = self.groups[group]
        return self.order[start:stop]

    @functools.cached_property
    def boxes(self) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
        """Per group, ``(origin, shape)`` of the cells its patches cover (on the grid)."""
        limits = np.asarray(self.grid.shape)
        boxes = []
        for g in range(len(self.groups)):
            anchors = self.group_anchors(g)
            lo, top = column_bounds(anchors)
            hi = np.minimum(top + np.asarray(self.size), limits)
            boxes.append((tuple(lo.tolist()), tuple((hi - lo).tolist())))
        return tuple(boxes)

    @functools.cached_property
    def reach(self) -> tuple[tuple[tuple[int, ...], tuple[tuple[int, ...], ...]], ...]:
        """Per group, its home block (which holds its anchors) and the blocks it overhangs."""
        out = []
        for origin, shape in self.boxes:
            ranges = self.grid.overlapping(origin, shape)
            home = tuple(r[0] for r in ranges)
            others = tuple(b for b in itertools.product(*ranges) if b != home)
            out.append((home, others))
        return tuple(out)

    def pieces(self) -> dict[tuple[int, ...], list[int]]:
        """Output block -> the groups whose boxes reach it (home groups first)."""
        mapping: dict[tuple[int, ...], list[int]] = {}
        for g, (home, _) in enumerate(self.reach):
            mapping.setdefault(home, []).append(g)
        for g, (_, others) in enumerate(self.reach):
            for block in others:
                mapping.setdefault(block, []).append(g)
        return mapping

    def chunk_of_patch(self) -> np.ndarray:
        """Return the flat index of the chunk holding each anchor, in the user's order."""
        return self.grid.block_ids(self.anchors)

    def project(self, axes: Sequence[int]) -> Plan:
        """Return the plan along some patched axes (for a variable lacking the others).

        The groups stay those of the whole plan; their boxes shrink to the axes.
        """
        axes = list(axes)
        return Plan(
            self.grid.project(axes),
            tuple(self.size[j] for j in axes),
            frozen_in_place(self.anchors[:, axes]),  # a fancy index: a copy
            self.order,
            self.groups,
        )


def locate_rows(rows: np.ndarray, chunks: Sequence[int]) -> list:
    """Find ``rows`` of an array chunked ``chunks`` along its first axis.

    For each chunk that holds some of ``rows``: ``(chunk, positions, local_rows)``,
    so that ``out[positions] = chunk_values[local_rows]`` gathers them in the
    order of ``rows``.

    Examples
    --------
    >>> [(c, p.tolist(), r.tolist()) for c, p, r in locate_rows(np.array([3, 0]), [2, 2])]
    [(0, [1], [0]), (1, [0], [1])]
    """
    starts = np.asarray(chunk_starts(chunks))
    chunk = np.searchsorted(starts, rows, side="right") - 1
    out = []
    for c in np.unique(chunk).tolist():
        positions = np.flatnonzero(chunk == c)
        out.append((int(c), positions, rows[positions] - starts[c]))
    return out
