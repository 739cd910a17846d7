"""How :class:`~xpatch.grain.PatchSource` reads one patch: chunks, frames, padding, weights.

One :class:`VariablePlan` per served variable says which of the layout's patched
dims the variable has, where, and how its patches are shaped and padded.
:class:`PatchReader` holds what reading needs of one patched object (its
variables' plans, chunk grid, patch size, pad mode and window) and a chunk
cache. It copies a patch out of the cached chunks it touches; a patch that
straddles into a chunk the cache no longer holds whole is served from that
chunk's frame (:mod:`xpatch.core.chunk_frames`) when frames are on, as they are
under a chunk shuffle.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Literal

import numpy as np
import xarray as xr

from xpatch.core.chunk_cache import ChunkCache, assemble_patch, read_region, stored_array
from xpatch.core.chunk_frames import (
    FRAME_SHARE_OF_CHUNK,
    SWEPT_FRAME_SHARE_OF_CHUNK,
    FrameLayout,
    covering_slab,
    cut_frame,
    frame_bytes,
)
from xpatch.core.extract import check_pad_value
from xpatch.core.malloc import bound_arenas, reuse_freed_blocks
from xpatch.core.padding import PadMode, axis_modes, fill_padded
from xpatch.core.plan import ChunkGrid
from xpatch.core.sweep import chunk_uses
from xpatch.grain.readahead import max_reads
from xpatch.grain.store_wait import RoundTrips
from xpatch.grain.zarr_chunks import (
    ChunkReadError,
    ZarrChunks,
    error_text,
    side_by_side,
    where_in,
)
from xpatch.xarray.variables import is_dask_backed, zarr_array_under

#: Chunks read in one call of the store when patches are read in index order: the chunk
#: a patch needs and the next ones along the last patched axis, decoded side by side
#: (by :class:`~xpatch.grain.zarr_chunks.ZarrChunks`, or by zarr itself). Patches of a
#: 1 GiB zarr of 512² chunks read in index order: 0.7-0.9x the time of zarr decoding
#: each chunk once, one after another; 1.2x reading chunk by chunk, on 2 cores.
RUN_CHUNKS = 4

#: At most this share of the cache goes to one run, so that a small cache is not
#: flushed by chunks read ahead of their patches.
RUN_SHARE_OF_CACHE = 0.25

#: Loads at once from a store that keeps reads waiting (an object store, a slow
#: disk) at least: waiting costs no core, and the sweep's late reads hide the wait.
WAITING_READS = 8
#: Chunks whose stored bytes ``fetch_ahead("auto")`` (the default) may fetch at most, from
#: a store that keeps reads waiting. On ``benchmarks/bench_storage.py``'s 1 GiB zarr at
#: 20 ms a read, 8 and 16 fixed fetches took an epoch of ``BatchSource`` from 3.0-3.1 s
#: to 2.5-2.7 s; 50 ms a read takes 16 (Little's law: 2 cores decoding 2 MiB chunks in
#: ~8 ms each keep ~14 fetches of 50 ms out).
AUTO_FETCH_CHUNKS = 16

#: Positions read one after another before the reader takes the reads to be in index
#: order (a shuffled order, or Grain's threads, rarely give three in a row).
IN_ORDER_STREAK = 2


class VariablePlan:
    """How to cut one variable's patches: its patched axes, patch shape and pad value."""

    __slots__ = (
        "axes",
        "columns",
        "dask",
        "dtype",
        "extents",
        "lazy",
        "name",
        "pad_value",
        "patch_shape",
        "patch_size",
        "stored",
        "var",
    )

    def __init__(
        self, name: Hashable, var: xr.Variable, dims: Sequence[Hashable], size, pad_value
    ) -> None:
        self.name = name
        self.var = var
        # The patched axes the variable has, in its own order, and for each the
        # column of the patcher's anchors (which follow the patcher's dim order).
        present = [j for j in range(len(dims)) if dims[j] in var.dims]
        self.columns = sorted(present, key=lambda j: var.dims.index(dims[j]))
        self.axes = [var.dims.index(dims[j]) for j in self.columns]
        shape = list(var.shape)
        for ax, j in zip(self.axes, self.columns):
            shape[ax] = size[j]
        self.patch_shape = tuple(shape)
        self.patch_size = [shape[ax] for ax in self.axes]
        self.extents = [var.shape[ax] for ax in self.axes]
        self.dtype = var.dtype
        self.pad_value = check_pad_value(pad_value, var.dtype)
        #: Whether the values are a dask array.
        self.dask = is_dask_backed(var)
        #: What the dask chunks are sliced from, when they are that unchanged (a store).
        self.stored = stored_array(var.data) if self.dask else None
        if self.stored is not None:
            zarr_array = zarr_array_under(self.stored)
            chunks = ZarrChunks.of(zarr_array) if zarr_array is not None else None
            self.stored = self.stored if chunks is None else chunks
        elif not self.dask and not getattr(var, "_in_memory", True):
            # A zarr opened without dask chunks is read by its own chunks too: through
            # xarray, every patch decoded each chunk it touches again (an ERA5 epoch of
            # single time steps from chunks of 8: 7.6 s, against 0.8 s by chunks).
            zarr_array = zarr_array_under(var._data)
            self.stored = ZarrChunks.of(zarr_array) if zarr_array is not None else None
        #: Whether patches are cut from chunks held in the cache (dask's, or a zarr's
        #: own), not read from the variable one by one.
        self.lazy = self.dask or self.stored is not None


def variable_index(plan: VariablePlan, region: Sequence[slice], clip: bool = False) -> tuple:
    """Index of ``plan.var`` for ``region`` (slices in the patcher's dim order)."""
    index: list[slice] = [slice(None)] * plan.var.ndim
    for ax, j in zip(plan.axes, plan.columns):
        sl = region[j]
        index[ax] = slice(sl.start, min(sl.stop, plan.var.shape[ax])) if clip else sl
    return tuple(index)


class PatchReader:
    """Read patches of one patched object through a chunk cache.

    Parameters
    ----------
    plans
        One per served variable.
    grid
        The chunk grid along the patched axes, or None for input without dask chunks.
    anchors
        ``(n, dims)`` every patch's start: the frames are measured on them.
    size, shape
        Patch size and array extent per patched dim.
    pad_mode
        How cells outside the array are filled: one mode, or one per patched dim
        (``"wrap"`` along a periodic dim).
    window
        The blending window, float32, of the patch's shape.
    cache_bytes
        Byte limit of the chunk cache (built per process: see :meth:`__getstate__`).
    """

    def __init__(
        self,
        plans: Sequence[VariablePlan],
        grid: ChunkGrid | None,
        anchors: np.ndarray,
        size: Sequence[int],
        shape: Sequence[int],
        pad_mode: PadMode | Sequence[PadMode],
        window: np.ndarray,
        cache_bytes: int,
    ) -> None:
        self.plans = list(plans)
        self.grid = grid
        self.size = list(size)
        self.shape = list(shape)
        self.pad_mode = axis_modes(pad_mode, len(self.size))
        #: Per patched dim, whether cells outside it are the other end's (periodic, "wrap").
        self.wraps = tuple(mode == "wrap" for mode in self.pad_mode)
        self.window = window
        self.cache_bytes = int(cache_bytes)
        self.frames: FrameLayout | None = None  # set when frames are kept
        #: Per axis, the one frame side a sweep keeps (low: True), or None for both.
        self.toward: tuple[bool, ...] | None = None
        self._anchors = anchors
        self._layout: FrameLayout | None = None
        self.cache = ChunkCache(self.cache_bytes)
        # Before the read threads start: each would otherwise keep a heap of its own.
        bound_arenas()
        reuse_freed_blocks(self.cache_bytes)
        #: Chunk loads at once, whatever the caller's threads (None: :meth:`reads_at_once`).
        self.max_reads: int | None = None
        #: Chunks whose stored bytes a sweep may fetch beyond those it reads ahead, from
        #: a store that keeps reads waiting (:meth:`fetch_depth`); 0: none; "auto": up
        #: to AUTO_FETCH_CHUNKS, as many as the store answers without queueing them.
        self.fetch_ahead_chunks: int | Literal["auto"] = "auto"
        self._reads_gate: threading.BoundedSemaphore | None = None
        #: Cache keys are ``(prefix, block)`` under a prefix (a cache shared by scenes).
        self.prefix: int | None = None
        # Positions read one after another (IN_ORDER_STREAK of them): the reader then reads
        # the chunks that follow in the same call (RUN_CHUNKS) and, when the data passes
        # the cache, drops each chunk after the last position that uses it.
        self._last_position = -2
        self._streak = 0
        self._in_order = False
        #: Whether a sweep reads ahead and drops the chunks (:meth:`set_sweep_direction`).
        self.swept = False
        self._last_uses: dict[int, list[int]] | None = None
        # Most patches lie inside one chunk and inside the array: they take a
        # short path (one cache lookup, one slice copy) found here for all at once.
        self._alone = np.full(len(anchors), -1, dtype=np.int64)
        self._blocks: list[tuple[int, ...]] = []
        self.share_round_trips(RoundTrips())
        if grid is not None and len(anchors) and all(plan.lazy for plan in self.plans):
            touched = grid.touched_ids(anchors, size, self.pad_mode)
            inside = np.all(anchors >= 0, axis=1) & np.all(
                anchors + np.asarray(size) <= np.asarray(shape), axis=1
            )
            alone = inside & np.all(touched[:, 1:] < 0, axis=1)
            self._alone[alone] = touched[alone, 0]
            self._blocks = [tuple(int(i) for i in b) for b in grid.blocks()]

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["cache"]
        state["_reads_gate"] = None  # a lock: each process bounds its own loads
        return state

    def __setstate__(self, state: dict) -> None:
        # Readers pickled before the in-order reads lack their (per-process) state.
        state = {"_last_position": -2, "_streak": 0, "_in_order": False, **state}
        state = {"max_reads": None, "fetch_ahead_chunks": "auto", **state, "_reads_gate": None}
        bound_arenas()  # in each worker process, before its read threads start
        reuse_freed_blocks(state["cache_bytes"])
        state["pad_mode"] = axis_modes(state["pad_mode"], len(state["size"]))
        state["wraps"] = tuple(mode == "wrap" for mode in state["pad_mode"])
        state["_last_uses"] = state.get("_last_uses")
        self.__dict__.update(state)
        self.cache = ChunkCache(self.cache_bytes, self.frame_of if self.frames else None)

    def share_round_trips(self, trips: RoundTrips) -> None:
        """Time the fetches of every variable whose store keeps reads waiting in ``trips``.

        Shared by the variables of a dataset (and the scenes of a list): they wait on
        one store, and the fetches out are all of theirs.
        """
        plans = self._fetching_plans()
        for plan in plans:
            plan.stored.round_trips = trips
        # On 4 variables at 20 ms a read, counted in fetches, a quarter of the fetches
        # out seemed to queue (the event loop's own delays, times 4): auto sent 1 ahead.
        trips.fetches_per_chunk = max(trips.fetches_per_chunk, len(plans))

    def share_cache(self, cache: ChunkCache, prefix: int) -> None:
        """Read through ``cache``, shared with other readers, under keys ``(prefix, block)``.

        The owner of a shared cache sets its ``shrink`` (see :meth:`frame_of`).
        """
        self.cache = cache
        self.prefix = int(prefix)

    def _key(self, block: tuple[int, ...]) -> tuple:
        return block if self.prefix is None else (self.prefix, block)

    def frames_fit(self) -> bool:
        """Whether patches cross chunk borders and every chunk's frame fits in the cache.

        The frames of all chunks together, plus the largest chunk, must fit, and
        no frame may come near its chunk's size: then a chunk-shuffled epoch reads
        each chunk once.
        """
        costs = self.frame_costs()
        return costs is not None and costs[0] > 0 and sum(costs) <= self.cache_bytes

    def frame_costs(self) -> tuple[int, int] | None:
        """``(bytes of every chunk's frame, bytes of the largest chunk)``, or None.

        None when some frame comes near its chunk's size (frames would not pay);
        ``(0, 0)`` for input without dask chunks, whose patches are read directly.
        """
        if self.grid is None:
            return 0, 0
        layout = self._frame_layout()
        if layout.any() and layout.largest_share(self.grid) >= FRAME_SHARE_OF_CHUNK:
            return None
        cell_bytes = self._cell_bytes()
        return layout.total_cells(self.grid) * cell_bytes, self._largest_chunk_bytes()

    def block_of(self, chunk: int) -> tuple[int, ...]:
        """Return the block index of the chunk with flat (C-order) index ``chunk``."""
        return tuple(int(i) for i in np.unravel_index(int(chunk), self.grid.numblocks))

    def read_ahead(self, chunk: int, wanted: Callable[[], bool] | None = None) -> None:
        """Load the chunk with flat index ``chunk`` into the cache before a patch asks for it.

        ``wanted`` is asked before the load starts (see :meth:`ChunkCache.get`).
        """
        if self.grid is not None and any(plan.lazy for plan in self.plans):
            block = self.block_of(chunk)
            load = lambda: self._load(block)  # noqa: E731
            self.cache.get(self._key(block), load, ahead=True, wanted=wanted)

    def release(self, chunk: int, keep_frame: bool) -> None:
        """Drop the chunk with flat index ``chunk``, keeping its frame or not (see the cache).

        Its bytes fetched ahead and not decoded go too.
        """
        if self.grid is not None:
            block = self.block_of(chunk)
            self.cache.release(self._key(block), keep_frame)
            for plan in self._fetching_plans():
                plan.stored.forget(self._stored_index(plan, self.grid.region(block)))

    def fetch_depth(self) -> int:
        """Chunks whose stored bytes a sweep may fetch beyond those it reads ahead (0: none).

        :attr:`fetch_ahead_chunks` when a variable's store keeps reads waiting (an
        object store) and fetches a chunk's bytes apart from decoding them; else 0.
        A sweep then fetches the bytes of the chunks after those it reads ahead
        (:meth:`fetch_chunk_bytes`): they hold stored (compressed) bytes, outside
        ``cache_bytes``, until the reads ahead decode them into the cache. With
        "auto", :data:`AUTO_FETCH_CHUNKS`: how many go out is then set as they land
        (:meth:`fetch_round_trips`).
        """
        if not self._fetching_plans():
            return 0
        if self.fetch_ahead_chunks == "auto":
            return AUTO_FETCH_CHUNKS
        return int(self.fetch_ahead_chunks)

    def fetch_round_trips(self) -> RoundTrips | None:
        """Return the fetches whose queueing sets how many go out ahead (None: as asked).

        With ``fetch_ahead_chunks="auto"``, the round trips the variables whose store
        keeps reads waiting share (:meth:`share_round_trips`).
        """
        plans = self._fetching_plans()
        if self.fetch_ahead_chunks != "auto" or not plans:
            return None
        return getattr(plans[0].stored, "round_trips", None)

    def fetch_chunk_bytes(self, chunk: int) -> None:
        """Start fetching the stored bytes of the chunk with flat index ``chunk`` (no decoding)."""
        if self.grid is not None:
            region = self.grid.region(self.block_of(chunk))
            for plan in self._fetching_plans():
                plan.stored.fetch_ahead(self._stored_index(plan, region))

    def _fetching_plans(self) -> list[VariablePlan]:
        return [
            plan
            for plan in self.plans
            if plan.lazy
            and getattr(plan.stored, "waits_on_store", False)
            and hasattr(plan.stored, "fetch_ahead")
        ]

    def sweep_costs(self) -> tuple[int, float]:
        """``(bytes of the largest chunk, bytes a waiting chunk keeps / its bytes)``.

        A chunk waiting for its neighbours' straddling patches keeps its frame when
        frames pay, else the whole chunk. ``(0, 0.0)`` without dask chunks.
        """
        if self.grid is None or not any(plan.lazy for plan in self.plans):
            return 0, 0.0
        share = self._frame_layout().swept_share(self.grid)
        return self._largest_chunk_bytes(), min(share, 1.0)

    def set_sweep_direction(self, reversed_axes: Sequence[bool]) -> None:
        """Keep, of an evicted chunk, only the frame sides facing the chunks a sweep visits later.

        Per axis, the low side when the sweep runs from high to low, else the high side.
        The sweep reads ahead and drops chunks itself: reads are never taken to be in
        index order from then on.
        """
        self.toward = tuple(bool(r) for r in reversed_axes)
        self.swept, self._in_order = True, False

    def _cell_bytes(self) -> int:
        # Bytes of one cell of the patched axes, over every variable read from chunks.
        cell_bytes = 0
        for plan in self.plans:
            if plan.lazy:
                others = [n for ax, n in enumerate(plan.var.shape) if ax not in plan.axes]
                cell_bytes += plan.dtype.itemsize * int(np.prod(others, dtype=np.int64))
        return cell_bytes

    def _largest_chunk_bytes(self) -> int:
        largest = int(np.prod([max(np.diff(s)) for s in self.grid.starts], dtype=np.int64))
        return largest * self._cell_bytes()

    def keep_frames(self) -> None:
        """Keep the frames of evicted chunks from now on (a chunk shuffle asks for it).

        A cache of its own then shrinks evicted chunks to their frames; a shared
        cache's owner routes evictions to :meth:`frame_of` by prefix.
        """
        if self.grid is None or self.frames is not None:
            return
        self.frames = self._frame_layout()
        if self.prefix is None:
            self.cache.shrink = self.frame_of

    def _frame_layout(self) -> FrameLayout:
        # Measured once: the fingerprint and every epoch's order ask whether frames fit.
        if self._layout is None:
            self._layout = FrameLayout.measure(
                self.grid, self._wrapped_anchors(), self.size, self.pad_mode
            )
        return self._layout

    def _wrapped_anchors(self) -> np.ndarray:
        """Return the anchors, and a turn away those of windows that run past a wrapping dim.

        A window past the end reads the first cells: its copy a turn back says which
        (a frame keeps them); one before the start reads the last cells.
        """
        anchors = self._anchors
        for j, wraps in enumerate(self.wraps):
            if not wraps or not len(anchors):
                continue
            n, s = self.shape[j], self.size[j]
            past = anchors[anchors[:, j] + s > n]
            before = anchors[anchors[:, j] < 0]
            moved = [past - np.eye(len(self.size), dtype=np.int64)[j] * n]
            moved.append(before + np.eye(len(self.size), dtype=np.int64)[j] * n)
            anchors = np.concatenate([anchors, *moved])
        return anchors

    # -- one patch ----------------------------------------------------------------------

    def read(
        self,
        position: int,
        anchor: tuple[int, ...],
        into: dict[Hashable, np.ndarray] | None = None,
    ) -> dict[Hashable, np.ndarray]:
        """Each variable's patch ``position``, at ``anchor``.

        With ``into`` (an array of the patch's shape per variable), each patch is
        written there and those arrays are returned: a batch's rows take a patch that
        straddles chunks without a patch-sized copy between (on
        ``benchmarks/bench_storage.py``'s zarr, 6 in 10 patches straddle).
        """
        # A heuristic shared by threads: a race only reads a run more or less, or drops
        # a chunk that the next read loads again. A sweep plans its own reads and drops:
        # runs read beside them loaded chunks twice.
        if not self.swept:
            self._streak = self._streak + 1 if position == self._last_position + 1 else 0
            self._last_position = position
            self._in_order = self._streak >= IN_ORDER_STREAK
        flat = self._alone[position]
        if flat >= 0:
            block = self._blocks[flat]
            chunk = self._chunk(block)
            item = {}
            for plan in self.plans:
                if into is None:
                    item[plan.name] = self._slice(plan, anchor, block, chunk)
                else:
                    item[plan.name] = into[plan.name]
                    item[plan.name][...] = self._window(plan, anchor, block, chunk)
        else:
            held: list[list] = []

            def pieces() -> list:
                # Read once for the variables that cut from them; a patch padded by
                # repetition reads its boxes instead (its window would load a chunk
                # whole where only an edge is in it: the far end of a periodic dim).
                if not held:
                    held.append(self._pieces(anchor) if self.grid is not None else [])
                return held[0]

            rows = into or {}
            item = {
                plan.name: self._cut(plan, anchor, pieces, rows.get(plan.name))
                for plan in self.plans
            }
        if self._in_order:
            for chunk_id in self._done_in_order(position):
                self.cache.release(self._key(self.block_of(chunk_id)))
        return item

    def _done_in_order(self, position: int) -> list[int]:
        """Return the chunks no position after ``position`` uses, if the data passes the cache.

        Read in index order, a chunk past its last use would only wait in an LRU cache
        smaller than the data for its eviction; dropped, its memory serves the next
        chunks (the first epoch of a fresh process took 1.7-1.9x the read floor
        holding them, 1.1-1.2x dropping them).
        """
        if self._last_uses is None:
            last_uses: dict[int, list[int]] = {}
            whole = self.grid is not None and (
                self.grid.count * self._largest_chunk_bytes() > self.cache_bytes
            )
            if whole and all(plan.lazy for plan in self.plans):
                touched = self.grid.touched_ids(self._anchors, self.size, self.pad_mode)
                order = np.arange(len(self._anchors))
                _, last = chunk_uses(order, touched, self.grid.count)
                for chunk_id in np.flatnonzero(last >= 0).tolist():
                    last_uses.setdefault(int(last[chunk_id]), []).append(chunk_id)
            self._last_uses = last_uses
        return self._last_uses.get(position, [])

    def _slice(self, plan: VariablePlan, anchor, block, chunk: dict) -> np.ndarray:
        return self._window(plan, anchor, block, chunk).copy()

    def _window(self, plan: VariablePlan, anchor, block, chunk: dict) -> np.ndarray:
        # A view of the patch in the chunk that holds it whole.
        values = chunk[plan.name]
        index = [slice(None)] * values.ndim
        for ax, j, s in zip(plan.axes, plan.columns, plan.patch_size):
            start = anchor[j] - self.grid.starts[j][block[j]]
            index[ax] = slice(start, start + s)
        return values[tuple(index)]

    def weights(self, anchor: tuple[int, ...]) -> np.ndarray:
        """Return the window, 0 on cells past the array's edge; a fresh array each call."""
        # Fresh: consumers such as torch's collate want to own what they get.
        weights = self.window.copy()
        for j, (a, s, n) in enumerate(zip(anchor, self.size, self.shape)):
            if a + s > n:
                index = [slice(None)] * weights.ndim
                index[j] = slice(n - a, None)
                weights[tuple(index)] = 0
        return weights

    def _pieces(self, anchor: Sequence[int], size: Sequence[int] | None = None) -> list:
        # (region, values) pairs, one per touched chunk: the chunk, or a slab of its frame.
        # A box of a wrapped read (size given) is a chunk's edge: its frame may hold it.
        blocks = self.grid.touched(anchor, self.size if size is None else size)
        size = self.size if size is None else size
        if self.frames is None or (len(blocks) == 1 and size is self.size):
            return [(self.grid.region(b), self._chunk(b)) for b in blocks]
        pieces = []
        for block in blocks:
            region = self.grid.region(block)
            box = tuple(
                slice(max(a, r.start), min(a + s, r.stop)) for a, s, r in zip(anchor, size, region)
            )
            whole, value = self.cache.get_or_frame(
                self._key(block),
                lambda frame, box=box: covering_slab(frame, box),
                lambda b=block: self._load_next(b),
            )
            pieces.append((region, value) if whole else value)
        return pieces

    def _chunk(self, block: tuple[int, ...]) -> dict[Hashable, np.ndarray]:
        return self.cache.get(self._key(block), lambda: self._load_next(block))

    def alone_chunks(self) -> np.ndarray:
        """For every patch, the flat index of the one chunk holding it whole, else -1.

        -1 also for a patch reaching past the array, and for every patch when a
        variable is not read from chunks: those take :meth:`read`.
        """
        return self._alone

    def chunk(self, chunk: int) -> dict[Hashable, np.ndarray]:
        """Return chunk ``chunk`` (a flat index): each variable's values, read-only, via the cache.

        A batch gathers its patches of one chunk from it at once
        (:class:`~xpatch.grain.batches.BatchSource`).
        """
        return self._chunk(self.block_of(chunk))

    def _load_next(self, block: tuple[int, ...]) -> dict[Hashable, np.ndarray]:
        """Load ``block``; in index order, with the chunks after it not held, in one read."""
        run = self._run_from(block) if self._in_order else [block]
        if len(run) == 1:
            return self._load(block)
        last = len(block) - 1
        region = list(self.grid.region(block))
        region[last] = slice(region[last].start, self.grid.region(run[-1])[last].stop)
        loaded = self._load_region(region)
        pieces = []
        for b in run:
            piece = {}
            for plan in self.plans:
                if plan.name not in loaded:
                    continue
                values = loaded[plan.name]
                if last in plan.columns:
                    cut = self.grid.region(b)[last]
                    index = [slice(None)] * values.ndim
                    start = cut.start - region[last].start
                    index[plan.axes[plan.columns.index(last)]] = slice(
                        start, start + cut.stop - cut.start
                    )
                    values = values[tuple(index)]
                piece[plan.name] = values
            pieces.append(piece)
        # The pieces are views of one read: its memory goes with the last of them, so
        # while a run's pieces leave the cache at different times it holds up to
        # RUN_CHUNKS - 1 chunks more than it counts (read in index order, they go together).
        for b, piece in zip(run[1:], pieces[1:]):
            self.cache.offer(self._key(b), piece)
        return pieces[0]

    def _run_from(self, block: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Return ``block`` and the chunks after it along the last axis that one read takes."""
        if not all(plan.stored is not None for plan in self.plans if plan.lazy):
            return [block]  # computed by dask: a larger region is no cheaper per chunk
        per_chunk = max(self._largest_chunk_bytes(), 1)
        longest = min(RUN_CHUNKS, int(RUN_SHARE_OF_CACHE * self.cache_bytes // per_chunk))
        last = len(block) - 1
        run = [block]
        while len(run) < longest:
            following = (*block[:last], run[-1][last] + 1)
            if following[last] >= self.grid.numblocks[last]:
                break
            if self.cache.holds(self._key(following)):
                break
            run.append(following)
        return run

    def reads_at_once(self) -> int:
        """Return how many chunk loads run at once in this process, whatever the threads asking.

        :attr:`max_reads` if set; else the cores this process may use
        (:func:`~xpatch.grain.readahead.max_reads`), or :data:`WAITING_READS` if more
        and a variable's store keeps reads waiting. Grain's 16 read threads then
        decode no more chunks at once than the cores can, and hold no more.
        """
        if self.max_reads is not None:
            return int(self.max_reads)
        waits = any(getattr(plan.stored, "waits_on_store", False) for plan in self.plans)
        return max(max_reads(), WAITING_READS) if waits else max_reads()

    def _load(self, block: tuple[int, ...]) -> dict[Hashable, np.ndarray]:
        return self._load_region(self.grid.region(block))

    def _load_region(self, region: Sequence[slice]) -> dict[Hashable, np.ndarray]:
        """Each variable read from chunks over ``region`` (a box of whole chunks), read-only."""
        gate = self._reads_gate
        if gate is None:  # a race makes two gates once: each bounds its own loads
            gate = self._reads_gate = threading.BoundedSemaphore(self.reads_at_once())
        with gate:
            return self._read_region(region)

    def _read_region(self, region: Sequence[slice]) -> dict[Hashable, np.ndarray]:
        lazy = [plan for plan in self.plans if plan.lazy]
        waiting = [plan for plan in lazy if getattr(plan.stored, "waits_on_store", False)]
        if len(waiting) < 2:
            # The calling thread computes: Grain's read threads and worker processes
            # are the parallelism; a nested thread pool would contend.
            return {plan.name: self._read_variable(plan, region) for plan in lazy}
        # Variables on an object store wait for bytes side by side, not one after another.
        reads = [lambda plan=plan: self._read_variable(plan, region) for plan in waiting]
        fetched = dict(zip([plan.name for plan in waiting], side_by_side(reads, "fetch")))
        return {  # in the plans' order, as read one after another
            plan.name: fetched[plan.name]
            if plan.name in fetched
            else self._read_variable(plan, region)
            for plan in lazy
        }

    def _read_variable(self, plan: VariablePlan, region: Sequence[slice]) -> np.ndarray:
        slices = [region[j] for j in plan.columns]
        try:
            if plan.stored is not None:
                value = np.asarray(plan.stored[self._stored_index(plan, region)])
            else:
                value = read_region(plan.var.data, plan.axes, slices)
        except MemoryError:
            raise
        except Exception as error:
            # The store's and codecs' errors name no variable, chunk or file.
            raise ChunkReadError(_read_failure(plan, slices, error)) from error
        # A view: the block may be the one the caller's dask graph holds.
        value = value.view()
        value.setflags(write=False)
        return value

    @staticmethod
    def _stored_index(plan: VariablePlan, region: Sequence[slice]) -> tuple[slice, ...]:
        # The variable's slices of the region (a box over the patched axes), all of the rest.
        index = [slice(None)] * plan.var.ndim
        for ax, j in zip(plan.axes, plan.columns):
            index[ax] = region[j]
        return tuple(index)

    def frame_of(self, key: tuple, chunk: dict) -> list | None:
        """Return the frame to keep of the evicted chunk under cache key ``key``, or None."""
        if self.frames is None:
            return None
        block = key if self.prefix is None else key[1]
        slabs = self.frames.slabs(self.grid, block, self._sides_kept(block))
        if not slabs:
            return None
        columns = {plan.name: list(zip(plan.axes, plan.columns)) for plan in self.plans}
        frame = cut_frame(self.grid.region(block), slabs, chunk, columns)
        whole = sum(v.nbytes for v in chunk.values())
        # A variable lacking a patched axis is copied whole into each slab along it.
        limit = FRAME_SHARE_OF_CHUNK if self.toward is None else SWEPT_FRAME_SHARE_OF_CHUNK
        return frame if frame_bytes(frame) < limit * whole else None

    def _sides_kept(self, block: Sequence[int]) -> tuple[bool | None, ...] | None:
        # Along a wrapping axis the windows across the seam read the chunks near both
        # ends, the sweep's first ones among them, for patches it visits last: those
        # chunks keep both sides, not only the side facing their next neighbour (one
        # side reread them whole: 10 loads for 9 chunks).
        if self.toward is None or not any(self.wraps):
            return self.toward
        sides: list[bool | None] = list(self.toward)
        for j, region in enumerate(self.grid.region(block)):
            reach = self.size[j] - 1
            if self.wraps[j] and (region.start < reach or region.stop > self.shape[j] - reach):
                sides[j] = None
        return tuple(sides)

    def _cut(
        self,
        plan: VariablePlan,
        anchor: tuple[int, ...],
        pieces: Callable[[], list],
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        # ``out``: where the patch goes (a fresh array if None).
        local = [anchor[j] for j in plan.columns]
        inside = all(0 <= a and a + s <= n for a, s, n in zip(local, plan.patch_size, plan.extents))
        modes = [self.pad_mode[j] for j in plan.columns]
        if out is None:
            out = np.empty(plan.patch_shape, plan.dtype)
        if not inside and (min(local) < 0 or any(m != "constant" for m in modes)):
            # A halo before the array, or cells repeated (wrapped) from the input.
            if any(m == "constant" for m in modes):
                out[...] = plan.pad_value
            read = lambda box: self._read_box(plan, anchor, box)  # noqa: E731
            return fill_padded(out, plan.axes, local, plan.extents, modes, read)
        if not inside:
            out[...] = plan.pad_value
        if plan.lazy:
            parts = [
                (tuple(region[j] for j in plan.columns), values[plan.name])
                for region, values in pieces()
            ]
            return assemble_patch(out, plan.axes, local, parts)
        window = variable_index(
            plan, [slice(a, a + s) for a, s in zip(anchor, self.size)], clip=True
        )
        values = plan.var[window].values
        target = [slice(None)] * len(plan.patch_shape)
        for ax in plan.axes:
            target[ax] = slice(0, values.shape[ax])
        out[tuple(target)] = values
        return out

    def _read_box(self, plan: VariablePlan, anchor, box: list[tuple[int, int]]) -> np.ndarray:
        # The input cells of `box` (one [start, stop) per column of `plan`), whatever
        # chunks hold them: a patch padded by repetition reads them from far away.
        lo, size = list(anchor), list(self.size)
        for j, (a, b) in zip(plan.columns, box):
            lo[j], size[j] = a, b - a
        region = [slice(a, a + n) for a, n in zip(lo, size)]
        if not plan.lazy:
            return np.asarray(plan.var[variable_index(plan, region)].values)
        shape = list(plan.patch_shape)
        for ax, (a, b) in zip(plan.axes, box):
            shape[ax] = b - a
        pieces = [
            (tuple(region[j] for j in plan.columns), values[plan.name])
            for region, values in self._pieces(lo, size)
        ]
        return assemble_patch(
            np.empty(shape, plan.dtype), plan.axes, [lo[j] for j in plan.columns], pieces
        )


def _read_failure(plan: VariablePlan, slices: Sequence[slice], error: Exception) -> str:
    """Say which variable, region and store a failed read of ``plan`` was for."""
    dims = [plan.var.dims[ax] for ax in plan.axes]
    region = ", ".join(f"{d}={sl.start}:{sl.stop}" for d, sl in zip(dims, slices))
    if isinstance(error, ChunkReadError):  # it names the chunk and the store
        return f"could not read variable {plan.name!r} at {region}: {error}"
    where = ""
    stored = plan.stored.array if isinstance(plan.stored, ZarrChunks) else None
    if stored is None and plan.stored is not None:
        stored = zarr_array_under(plan.stored)
    if stored is not None:  # zarr read it: which chunks, in which store
        index = [slice(None)] * plan.var.ndim
        for ax, sl in zip(plan.axes, slices):
            index[ax] = sl
        where = f" ({where_in(stored, index)})"
    elif plan.var.encoding.get("source"):
        where = f" (from {plan.var.encoding['source']})"
    return f"could not read variable {plan.name!r} at {region}{where}: {error_text(error)}"
