"""Frames: the edges of a chunk that patches straddling into it need.

A chunk-shuffled epoch visits a patch that straddles chunk borders with the
last of its chunks (:func:`xpatch.core.shuffle.chunk_local_permutation`). By
then its other chunks were visited, often long before, and reading one of them
again for a few rows would cost a whole chunk. When such a chunk leaves the
cache, its frame is kept instead: per patched axis, the slab at its low edge
that patches from the chunk before reach into, and the slab at its high edge
that patches starting in it leave through. A frame is a fraction of the chunk
(two slabs of ``size - stride``-ish cells per axis), and the piece of a
straddling patch that falls in the chunk lies within one of its slabs.

Depths are measured per chunk border from the plan's anchors, so a layout
whose patches never cross a border keeps no slab there.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from xpatch.core.padding import PadMode, read_bounds
from xpatch.core.plan import ChunkGrid

#: A frame is kept only if it is smaller than this share of its chunk. Under a sweep a
#: frame of one side per axis replaces a read of the chunk: any frame smaller pays.
FRAME_SHARE_OF_CHUNK = 0.75
SWEPT_FRAME_SHARE_OF_CHUNK = 1.0

#: A slab: its slices along the patched axes, and each variable's values there.
Slab = tuple[tuple[slice, ...], dict[Hashable, np.ndarray]]


@dataclass(frozen=True)
class FrameLayout:
    """How deep patches reach across each chunk border, per patched axis.

    Attributes
    ----------
    low
        Per axis, per block: cells from the block's low edge that patches
        starting in an earlier block reach (0 when none does).
    high
        Per axis, per block: cells before the block's high edge from which
        patches start and leave the block (0 when none does).

    Examples
    --------
    >>> grid = ChunkGrid.from_chunks([(10, 10)])
    >>> layout = FrameLayout.measure(grid, np.array([[0], [8], [12]]), [4])
    >>> layout.low, layout.high
    (((0, 2),), ((2, 0),))
    """

    low: tuple[tuple[int, ...], ...]
    high: tuple[tuple[int, ...], ...]

    @classmethod
    def measure(
        cls,
        grid: ChunkGrid,
        anchors: np.ndarray,
        size: Sequence[int],
        pad_modes: Sequence[PadMode] | None = None,
    ) -> FrameLayout:
        """Measure the depths from the anchors of a plan on ``grid``.

        Along an axis padded by mirroring (``pad_modes``), a window's cells are those
        it reads (:func:`~xpatch.core.padding.read_bounds`).
        """
        low, high = [], []
        bounds = []
        for j, starts in enumerate(grid.starts):
            a = np.asarray(anchors[:, j], dtype=np.int64) if len(anchors) else np.zeros(0, int)
            mode = pad_modes[j] if pad_modes is not None else "constant"
            bounds.append(read_bounds(a, int(size[j]), int(starts[-1]), mode))
        begin = np.stack([b[0] for b in bounds], axis=1)
        firsts, lasts = grid.spans(begin, np.stack([b[1] - b[0] for b in bounds], axis=1))
        for j, (starts, first, last) in enumerate(zip(grid.starts, firsts, lasts)):
            s = np.asarray(starts, dtype=np.int64)
            lo = np.zeros(len(s) - 1, dtype=np.int64)
            hi = np.zeros(len(s) - 1, dtype=np.int64)
            a, stop = bounds[j]
            stop = np.minimum(stop, s[-1])
            if pad_modes is not None and pad_modes[j] == "wrap":
                # A window across the seam (given once at each end, a turn apart) reads
                # the first block's low cells and the last block's high cells: the rest
                # of the window is the far end's, and the patch another block's.
                reach = stop[a < 0] - s[0]
                if len(reach):
                    lo[0] = max(lo[0], int(min(reach.max(), s[1] - s[0])))
                reach = s[-1] - a[bounds[j][1] > s[-1]]
                if len(reach):
                    hi[-1] = max(hi[-1], int(min(reach.max(), s[-1] - s[-2])))
            a = np.maximum(a, 0)  # a halo's window starts before the array: its cells are not
            cross = last > first
            # The block after the first and the first: the two a patch straddles.
            after, then = first[cross] + 1, np.minimum(stop[cross], s[first[cross] + 2])
            np.maximum.at(lo, after, then - s[after])
            np.maximum.at(hi, first[cross], s[first[cross] + 1] - a[cross])
            # A patch spanning three blocks or more needs the middle ones whole.
            wide = last - first >= 2
            for b_first, b_last, end in zip(first[wide], last[wide], stop[wide]):
                for b in range(b_first + 1, b_last + 1):
                    lo[b] = max(lo[b], min(end, s[b + 1]) - s[b])
                for b in range(b_first + 1, b_last):
                    hi[b] = max(hi[b], s[b + 1] - s[b])
            low.append(tuple(int(v) for v in lo))
            high.append(tuple(int(v) for v in hi))
        return cls(tuple(low), tuple(high))

    def any(self) -> bool:
        """Whether any patch crosses a chunk border."""
        return any(any(d) for d in (*self.low, *self.high))

    def largest_share(self, grid: ChunkGrid) -> float:
        """Return an upper bound of any frame's cells over its chunk's cells."""
        share = 0.0
        for low, high, starts in zip(self.low, self.high, grid.starts):
            extent = np.diff(np.asarray(starts))
            share += float(np.max((np.asarray(low) + np.asarray(high)) / extent))
        return share

    def swept_share(self, grid: ChunkGrid) -> float:
        """Return the mean share of a chunk a sweep's frame keeps: one side per axis.

        Per axis, the larger of the mean depths at the low and at the high edge,
        over the mean chunk extent, summed over the axes.

        Examples
        --------
        >>> grid = ChunkGrid.from_chunks([(10, 10, 10)])
        >>> layout = FrameLayout.measure(grid, np.array([[0], [8], [18]]), [4])
        >>> layout.low, layout.high, round(layout.swept_share(grid), 3)
        (((0, 2, 2),), ((2, 2, 0),), 0.133)
        """
        share = 0.0
        for low, high, starts in zip(self.low, self.high, grid.starts):
            extent = float(np.mean(np.diff(np.asarray(starts))))
            share += max(float(np.mean(low)), float(np.mean(high))) / extent
        return share

    def total_cells(self, grid: ChunkGrid) -> int:
        """Count the cells of every chunk's frame together (corners counted twice)."""
        lengths = [int(s[-1]) for s in grid.starts]
        total = 0
        for j, (low, high) in enumerate(zip(self.low, self.high)):
            others = int(np.prod([n for i, n in enumerate(lengths) if i != j], dtype=np.int64))
            total += (sum(low) + sum(high)) * others
        return total

    def slabs(
        self, grid: ChunkGrid, block: Sequence[int], toward: Sequence[bool | None] | None = None
    ) -> list[tuple[slice, ...]]:
        """Return the slab regions of ``block``'s frame (slices along the patched axes).

        Empty when the frame would not be much smaller than the chunk. ``toward``
        keeps, per axis, only the slab at the low edge (True) or at the high edge
        (False): a sweep visits the neighbour on that side later; both where it is
        None. Then any frame smaller than the chunk is kept.

        Examples
        --------
        >>> grid = ChunkGrid.from_chunks([(10, 10, 10)])
        >>> layout = FrameLayout.measure(grid, np.array([[0], [8], [18]]), [4])
        >>> layout.slabs(grid, (1,)), layout.slabs(grid, (1,), toward=(False,))
        ([(slice(10, 12, None),), (slice(18, 20, None),)], [(slice(18, 20, None),)])
        """
        region = grid.region(block)
        extent = [sl.stop - sl.start for sl in region]
        slabs, cells = [], 0
        chunk_cells = int(np.prod(extent))
        for j, b in enumerate(block):
            for depth, at_low in ((self.low[j][b], True), (self.high[j][b], False)):
                if toward is not None and toward[j] is not None and at_low != toward[j]:
                    continue
                depth = min(depth, extent[j])
                if depth == 0:
                    continue
                lo = region[j].start if at_low else region[j].stop - depth
                slab = list(region)
                slab[j] = slice(lo, lo + depth)
                slabs.append(tuple(slab))
                cells += chunk_cells // extent[j] * depth
        limit = FRAME_SHARE_OF_CHUNK if toward is None else SWEPT_FRAME_SHARE_OF_CHUNK
        if cells >= limit * chunk_cells:
            return []
        return slabs


def cut_frame(
    region: Sequence[slice],
    slab_regions: Sequence[tuple[slice, ...]],
    values: Mapping[Hashable, np.ndarray],
    columns: Mapping[Hashable, Sequence[tuple[int, int]]],
) -> list[Slab]:
    """Copy the slabs out of one chunk's values.

    Parameters
    ----------
    region
        The chunk's slices along the patched axes.
    slab_regions
        From :meth:`FrameLayout.slabs`.
    values
        The chunk of each variable.
    columns
        For each variable, ``(axis, column)`` pairs: its axis that is patched axis
        ``column`` of the grid. A variable lacking an axis is kept whole along it.

    Examples
    --------
    >>> chunk = {"v": np.arange(10).reshape(2, 5)}
    >>> (sl, cut), = cut_frame([slice(5, 10)], [(slice(8, 10),)], chunk, {"v": [(1, 0)]})
    >>> sl, cut["v"].tolist()
    ((slice(8, 10, None),), [[3, 4], [8, 9]])
    """
    frame = []
    for slab in slab_regions:
        cut = {}
        for name, chunk in values.items():
            index = [slice(None)] * chunk.ndim
            for axis, column in columns[name]:
                offset = region[column].start
                index[axis] = slice(slab[column].start - offset, slab[column].stop - offset)
            cut[name] = chunk[tuple(index)].copy()
            cut[name].setflags(write=False)
        frame.append((tuple(slab), cut))
    return frame


def covering_slab(frame: Sequence[Slab], box: Sequence[slice]) -> Slab | None:
    """Return the slab of ``frame`` holding all of ``box`` (slices along patched axes), or None.

    Examples
    --------
    >>> frame = [((slice(0, 2), slice(0, 8)), {}), ((slice(0, 8), slice(6, 8)), {})]
    >>> covering_slab(frame, (slice(3, 8), slice(7, 8)))[0]
    (slice(0, 8, None), slice(6, 8, None))
    >>> covering_slab(frame, (slice(3, 8), slice(5, 8))) is None
    True
    """
    for slab in frame:
        if all(s.start <= b.start and b.stop <= s.stop for s, b in zip(slab[0], box)):
            return slab
    return None


def frame_bytes(frame: Sequence[Slab]) -> int:
    """Bytes held by a frame's slabs."""
    return sum(int(v.nbytes) for _, cut in frame for v in cut.values())
