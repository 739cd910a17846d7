"""Whole batches as items: Python work per chunk a batch touches, not per sample.

Grain's ``MapDataset.batch`` asks a source for one sample per Python call, so a
batch of 16 costs 16 trips through the source, each a cache lookup, a slice and
a few small arrays. :class:`BatchSource` serves batch ``k`` of a chunk-shuffled
epoch as one item: for a :class:`~xpatch.grain.PatchSource`, the patches of the
batch that lie whole inside one chunk (most of them) are gathered from that
chunk in one vectorized copy per variable into one preallocated ``(batch, ...)``
array; only the patches that straddle chunks or reach past the array take the
per-patch read.

It needs only numpy; :meth:`BatchSource.dataset` and
:meth:`BatchSource.with_fingerprint` import Grain.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Hashable, Sequence
from typing import Any, Literal

import numpy as np
from dask.base import tokenize
from numpy.lib.stride_tricks import sliding_window_view

from xpatch.core.chunk_cache import CacheStats
from xpatch.core.errors import OptionError
from xpatch.core.shuffle import check_count, check_seed
from xpatch.core.sweep import key_chunks, sweep_ranks
from xpatch.grain.base import Source, mark_absl_flags_parsed, require_grain
from xpatch.grain.readahead import (
    due_in_first_use_order,
    fetch_chunks_bytes,
    late_reads_of,
    max_reads,
    read_ahead_timed,
)
from xpatch.grain.reader import PatchReader, VariablePlan
from xpatch.grain.source import PatchSource
from xpatch.grain.threads import IdlePool, closing
from xpatch.xarray.georef import patch_transforms
from xpatch.xarray.layout import layout_of

#: Epoch orders a process keeps: two are live at an epoch's boundary under prefetching.
KEPT_EPOCHS = 2

#: A batch waits for the batches before it while they make progress, never longer than this.
MAX_WAIT_SECONDS = 2.0
#: Batches seen after the first, all a multiple of one step from it, before a process
#: takes that step as Grain's mp_prefetch workers. Grain's 16 threads start batches in
#: any order: three of them once came as 3, 5, 7, and the process took the even ones
#: for another worker's, let go of their chunks and read them again (2.1 loads per
#: chunk that epoch). Eight out of sixteen started at once share a step by chance
#: once in some 6,000 epochs; a worker told its share by Grain (BatchMapDataset.slice)
#: knows it at once.
STEP_SIGHTINGS = 8
#: An epoch whose first batch asked for is one of its first this many starts at its
#: first batch: Grain's 16 read threads start batches 0 to 15 in any order. Started
#: at batch 14, the sweep let go of chunks batches 0 to 13 still needed (2.26 loads
#: per chunk in one epoch of the 1 GiB zarr with 20 ms per read). A state restored at
#: one of those batches starts there after START_GRACE_SECONDS.
FIRST_BATCHES = 16
#: An epoch started at its first batch whose first batches are still not asked for this
#: long after it began was restored further on (Grain asks for batches k, k + 1, ...):
#: its sweep starts at the first batch asked for. Grain's threads ask for the first 16
#: within milliseconds; one asked later still moves the sweep back.
START_GRACE_SECONDS = 0.25

#: Patches of one chunk in a batch from which one vectorized gather beats a slice copy
#: each (a window view and a fancy index cost about as much as 8 slice copies).
GATHER_ROWS = 8


class BatchSource:
    """Batches of a source's items in its chunk-shuffled order: item ``k`` is batch ``k``.

    Epoch ``e`` is ``source.chunk_shuffled_order(seed, e, order, mix)`` cut into
    runs of ``batch_size``; item ``i`` is batch ``i % len(self)`` of epoch
    ``i // len(self)`` (as :meth:`~xpatch.grain.base.Source.chunk_shuffle` counts
    epochs after ``.repeat()``: use :meth:`dataset`, since
    ``grain.MapDataset.source`` wraps indices into the first epoch). An item is a
    dict like the source's items with a leading batch axis on every array, equal
    to ``np.stack`` of the items it holds (nested dicts, as a forecast's
    ``"inputs"``, stacked key by key).

    How a batch is assembled:

    - :class:`~xpatch.grain.PatchSource`: vectorized. The patches lying whole
      inside one chunk are copied out of it by one gather per chunk and variable
      into a preallocated ``(batch, ...)`` array; the others (straddling chunks,
      past the array, or data without dask chunks) are read one by one as
      ``src[i]`` reads them. Chunks come through the source's own cache (each
      process its own).
    - Any other source (:class:`~xpatch.forecast.source.ForecastSource`,
      :class:`~xpatch.scenes.SceneSource`, :class:`~xpatch.tree.TreeSource`):
      one ``source[i]`` per sample, stacked (correct, not faster); items of
      different shapes (scenes of other variables) cannot be stacked and raise.

    A :class:`PatchSource` batch's ``"weights"`` are read-only (copy them to write):
    batches of patches inside the array share one array of windows, as much
    memory as one batch's data of a one-variable float32 source.

    The chunks of a batch that the cache does not hold are read side by side (a
    thread per core). Under the sweep, the chunks the next batches use first are
    read ahead, in that order, as far as the cache has room for (more while a slow
    store's reads land late, as for items: :class:`~xpatch.grain.readahead.LateReads`);
    each process drops a chunk after the last batch that touches it and
    keeps only its frame after the last batch keyed to it, and holds a batch back
    while it runs more batches ahead of the oldest one in flight than the cache
    has room for (Grain's 16 read threads would otherwise flush a small cache):
    each chunk is read once per epoch within the budget ``chunk_shuffle`` needs.

    Parameters
    ----------
    source
        The source of the items (an :class:`~xpatch.grain.base.Source`).
    batch_size
        Items per batch, an int >= 1.
    seed
        The seed of the chunk-shuffled order, ``0 <= seed < 2**32``.
    drop_remainder
        Leave out the last batch of an epoch when it is short (default: serve it
        with fewer items).
    order, mix
        As :meth:`~xpatch.grain.base.Source.chunk_shuffled_order` takes them.
    worker_count
        The ``mp_prefetch`` workers, each serving every ``worker_count``-th batch
        and letting go of a chunk once its own batches are done with it: a first
        guess, which the batches a process is asked for correct. The batches are
        the same whatever it is.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xpatch
    >>> from xpatch.grain import BatchSource
    >>> da_ = xr.DataArray(np.arange(4096.0).reshape(64, 64), dims=("y", "x")).chunk(16)
    >>> src = da_.patch(y=8, x=8, stride=6).to_grain()
    >>> batches = BatchSource(src, 16, seed=0)
    >>> len(src), len(batches), batches[0]["data"].shape, batches[0]["anchor"].shape
    (121, 8, (16, 8, 8), (16, 2))
    >>> order = src.chunk_shuffled_order(seed=0)
    >>> bool(np.array_equal(batches[0]["data"], np.stack([src[i]["data"] for i in order[:16]])))
    True
    """

    def __init__(
        self,
        source: Source,
        batch_size: int,
        *,
        seed: int,
        drop_remainder: bool = False,
        order: Literal["sweep", "chunk"] = "sweep",
        mix: int | None = None,
        worker_count: int = 1,
    ) -> None:
        if not isinstance(source, Source):
            raise OptionError(
                f"source={type(source).__name__} is not an xpatch source; pass one built "
                "with .to_grain(), e.g. BatchSource(da.patch(y=64, x=64).to_grain(), 16, seed=0)."
            )
        self._batch_size = check_count("batch_size", batch_size)
        self._seed = check_seed(seed)
        if not isinstance(drop_remainder, bool | np.bool_):
            raise OptionError(f"drop_remainder={drop_remainder!r} must be True or False.")
        if order not in ("sweep", "chunk"):
            raise OptionError(f"order={order!r} is not one of ('sweep', 'chunk').")
        self._mix = None if mix is None else check_count("mix", mix)
        self._workers = check_count("worker_count", worker_count)
        self._order = order
        self._drop = bool(drop_remainder)
        n = len(source)
        count = n // self._batch_size if self._drop else -(-n // self._batch_size)
        if count == 0:
            raise OptionError(
                f"batch_size={batch_size} with drop_remainder=True leaves no batch of the "
                f"{n} items; lower batch_size or pass drop_remainder=False."
            )
        self._source = source
        self._count = count
        self._fingerprint: str | None = None
        self._per_process()

    def _per_process(self) -> None:
        # Rebuilt in every process: orders are recomputed, the plan of reads measured once.
        self._lock = threading.Lock()
        self._orders: dict[int, np.ndarray] = {}
        self._gather: _PatchGather | None = None
        self._releases: _Releases | None = None
        self._dealt_workers: int | None = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for key in ("_lock", "_orders", "_gather", "_releases", "_dealt_workers"):
            del state[key]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._per_process()
        mark_absl_flags_parsed()

    # -- protocol -------------------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Batch ``index % len(self)`` of epoch ``index // len(self)`` (see the class docstring)."""
        if isinstance(index, bool) or not isinstance(index, int | np.integer):
            raise TypeError(f"batch index {index!r} must be an int.")
        if index < 0:
            raise IndexError(f"batch index {index} must be >= 0 (epoch after epoch).")
        index = int(index)
        positions = self.positions(index)
        if self._order != "sweep":
            return self.batch(positions)
        releases = self._tracking()
        epoch, k = divmod(index, self._count)
        releases.started(epoch, k)
        try:
            return self.batch(positions)
        finally:
            releases.finished(epoch, k)

    def _tracking(self) -> _Releases:
        if self._releases is None:
            with self._lock:
                if self._releases is None:
                    self._releases = _Releases(self)
        return self._releases

    def positions(self, index: int) -> np.ndarray:
        """Return the source's item indices in batch ``index`` (epoch after epoch), in order.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> src = xr.DataArray(np.zeros((8, 8)), dims=("y", "x")).patch(y=4, x=4).to_grain()
        >>> batches = xpatch.grain.BatchSource(src, 3, seed=0)
        >>> sorted(np.concatenate([batches.positions(k) for k in range(2)]).tolist())
        [0, 1, 2, 3]
        """
        epoch, k = divmod(int(index), self._count)
        order = self.epoch_order(epoch)
        return order[k * self._batch_size : (k + 1) * self._batch_size]

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Return the items' order in epoch ``epoch`` (``source.chunk_shuffled_order``)."""
        with self._lock:
            order = self._orders.get(epoch)
        if order is None:
            order = self._source.chunk_shuffled_order(self._seed, epoch, self._order, self._mix)
            with self._lock:
                if len(self._orders) >= KEPT_EPOCHS:
                    self._orders.pop(min(self._orders))
                self._orders[epoch] = order
        return order

    def batch(self, positions: Sequence[int]) -> dict[str, Any]:
        """Return the items ``positions`` of the source as one batch (arrays stacked).

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> src = xr.DataArray(np.zeros((8, 8)), dims=("y", "x")).patch(y=4, x=4).to_grain()
        >>> xpatch.grain.BatchSource(src, 2, seed=0).batch([3, 1])["index"].tolist()
        [3, 1]
        """
        positions = np.asarray(positions, dtype=np.int64)
        if isinstance(self._source, PatchSource) and len(positions):
            if self._gather is None:
                self._gather = _PatchGather(self._source)
            return self._gather.batch(positions)
        return stack_items([self._source[int(i)] for i in positions])

    def __repr__(self) -> str:
        return (
            f"xpatch.BatchSource({self._count} batches of {self._batch_size} from "
            f"{self._source!r}, seed={self._seed}, fingerprint={self.fingerprint})"
        )

    # -- information ------------------------------------------------------------------

    @property
    def source(self) -> Source:
        """The source whose items are batched."""
        return self._source

    @property
    def mix(self) -> int | None:
        """``mix`` of the chunk-shuffled order (None: as the cache allows)."""
        return self._mix

    @property
    def dealt_workers(self) -> int | None:
        """The ``mp_prefetch`` workers Grain deals this process's batches among, if it said.

        Set in a worker process when Grain gives it every W-th batch of
        :meth:`dataset` (:meth:`deal`); None elsewhere (the process infers it from
        the batches it is asked for).
        """
        return self._dealt_workers

    def deal(self, workers: int) -> None:
        """Take every ``workers``-th batch as this process's (Grain's ``mp_prefetch`` slice).

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> src = xr.DataArray(np.zeros((8, 8)), dims=("y", "x")).patch(y=4, x=4).to_grain()
        >>> batches = BatchSource(src, 2, seed=0)
        >>> batches.deal(2)
        >>> batches.dealt_workers
        2
        """
        workers = check_count("workers", workers)
        self._dealt_workers = workers
        if self._releases is not None:
            self._releases.told(workers)

    @property
    def worker_count(self) -> int:
        """The ``mp_prefetch`` workers the batches are dealt to (each process reads its own)."""
        return self._workers

    @property
    def seed(self) -> int:
        """The seed of the chunk-shuffled order."""
        return self._seed

    @property
    def batch_size(self) -> int:
        """Items per batch (the last one of an epoch may hold fewer)."""
        return self._batch_size

    @property
    def patcher(self) -> Any:
        """What the source was built from."""
        return self._source.patcher

    @property
    def variables(self) -> tuple[Hashable, ...]:
        """The source's data keys."""
        return self._source.variables

    @property
    def fingerprint(self) -> str:
        """16 hex digits: the source's fingerprint, the batch size, the order's seed and kind."""
        if self._fingerprint is None:
            self._fingerprint = tokenize(
                "xpatch.BatchSource v1",
                self._source.fingerprint,
                self._batch_size,
                self._seed,
                self._drop,
                self._order,
                self._mix,
            )[:16]
        return self._fingerprint

    def cache_stats(self) -> CacheStats:
        """Chunk loads and hits of this process (the source's cache)."""
        return self._source.cache_stats()

    # -- pipelines --------------------------------------------------------------------

    def dataset(self) -> Any:
        """Return a ``grain.MapDataset`` of the batches whose index ``i`` keeps its epoch.

        ``.repeat()`` after it gives epoch ``i // len(self)`` its own order; its
        iterators (``.to_iter_dataset()``) carry :attr:`fingerprint` in their
        state; after ``.repeat``, ``.map`` or ``mp_prefetch``, end the pipeline
        with ``.pipe(batches.with_fingerprint)``.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> src = xr.DataArray(np.zeros((8, 8)), dims=("y", "x")).patch(y=4, x=4).to_grain()
        >>> batches = xpatch.grain.BatchSource(src, 2, seed=0)
        >>> [b["index"].tolist() for b in batches.dataset().repeat(2)] == [
        ...     batches[i]["index"].tolist() for i in range(4)]
        True
        """
        require_grain()
        from xpatch.grain.batch_dataset import BatchMapDataset

        return BatchMapDataset(self)

    def with_fingerprint(self, dataset: Any) -> Any:
        """Put :attr:`fingerprint` in the state of ``dataset``'s iterators (see ``Source``)."""
        require_grain()
        from xpatch.grain.datasets import FingerprintIterDataset

        return FingerprintIterDataset.wrap(dataset, self)


class _Releases:
    """Let go of each chunk once every batch before the oldest one in flight was served.

    As the sweep's reads do for items (:class:`~xpatch.grain.readahead.SweepReads`),
    at the granularity of batches: a chunk is dropped after the last batch touching
    it, and shrunk to its frame after the last batch holding a patch keyed to it (the
    chunk the sweep visits last among those the patch touches: later batches read it
    only at the edges its frame keeps). Without this, a cache of a few percent of the
    data evicted the chunks the sweep still needed before those it was done with.
    """

    def __init__(self, batches: BatchSource) -> None:
        self.batches = batches
        self.reads = batches.source.chunk_reads
        self.touched = np.asarray(self.reads.touched_chunks())
        self.chunk_count = int(self.touched.max(initial=-1)) + 1
        # Batches assembled at once: as many as the chunks the cache holds room for ahead
        # of the sweep serve (Grain's 16 threads, each a batch of some 8 chunks, flushed
        # a cache of a few percent of the data otherwise), and no more than the cores
        # copy at once: each holds its batch. On insitubatch's ERA5 case 4 batches at
        # once peaked at 213-224 MiB RSS an epoch, 2 at 198-204 MiB, as fast.
        _, ahead = self.reads.sweep_settings(batches.mix, None)
        per_chunk = len(self.touched) / max(self.chunk_count, 1)
        self.spread = min(1 + int(ahead * per_chunk // batches.batch_size), max(max_reads(), 2))
        self.workers = batches.dealt_workers or batches.worker_count
        #: The first batch (global index) this process served, and the gcd of the steps
        #: from it to the others: Grain's mp_prefetch hands a worker every W-th batch.
        #: A larger step counts as the workers once STEP_SIGHTINGS batches left it as
        #: it was: Grain's 16 threads may start batch 15 second, and a step of 15 taken
        #: at once let batches run far ahead of the sweep and flush chunks still to be
        #: served (1.03-1.15 loads per chunk in some of the ERA5 epochs of bench_peers).
        self.first: int | None = None
        self.step = 0
        self.seen = 0
        #: Batches of this process started and not finished, and waiting to start.
        self.running = self.waiting = 0
        self.lock = threading.Lock()
        #: The batches waiting for their turn, each with a condition of its own: a batch
        #: served wakes those it may let through, not all of Grain's waiting threads.
        #: Waking all of them (14 of Grain's 16 threads, after every batch) made an epoch
        #: of ``bench_storage.py``'s 1 GiB zarr at 20 ms a read 1.00-1.35x (median 1.14x)
        #: the time through 2 threads; woken so, 0.92-1.18x (median 1.02x), with 28
        #: thousand context switches an epoch instead of 38 (2 threads: 18).
        self.turns: dict[threading.Condition, tuple[int, int]] = {}
        self.epoch = -1
        self.low = 0
        self.done: set[int] = set()
        #: The first batch of the epoch asked for so far, and when the epoch began.
        self.lowest_asked, self.epoch_started = 0, 0.0
        self.plan: tuple[np.ndarray, ...] = ()
        self.retired = np.zeros(self.chunk_count, dtype=bool)
        self.next_retire = self.next_shrink = 0
        # Reads ahead: the chunks the next batches use first, in that order, up to the
        # room ahead (more while reads land late), on threads of their own; without
        # them a batch decoded its chunks only when asked, and a slow store's waits
        # added up one batch after another.
        self.ahead = ahead
        self.first_uses: tuple[np.ndarray, np.ndarray] = (np.empty(0, np.int64),) * 2
        self.first_uses_workers = 0
        self.next_ahead = self.next_fetch = 0
        #: Each chunk's first batch among this process's (``first_uses`` unsorted), and
        #: the newest batch started: a read ahead landing after it is late.
        self.first_use = np.empty(0, np.int64)
        self.frontier = -1
        self.late = late_reads_of(self.reads, ahead)
        self.pool: IdlePool | None = None

    def started(self, epoch: int, k: int) -> None:
        """Batch ``k`` of ``epoch`` is asked for: wait while it runs too far ahead, read ahead."""
        self._wait_turn(epoch, k)
        if (self.ahead or self.late.fetching) and not closing():
            with self.lock:
                due = self._due_reads() if epoch == self.epoch else None
            self._send(due)

    def _wait_turn(self, epoch: int, k: int) -> None:
        with self.lock:
            index = epoch * len(self.batches) + k
            if self.first is None:
                self.first = index
            elif index != self.first:
                step = math.gcd(self.step, abs(index - self.first))
                self.seen += 1
                # Fewer workers is safe at once (it only waits more); more, once seen
                # STEP_SIGHTINGS times. Told by Grain, the process keeps what it was told.
                confirmed = step == self.step and self.seen >= STEP_SIGHTINGS
                if self.batches.dealt_workers is not None:
                    step = self.workers
                if step != self.workers and (step < self.workers or confirmed):
                    self._take_workers(step, epoch)
                self.step = step
            if epoch > self.epoch or (epoch == self.epoch and self.low >= len(self.batches)):
                # A new epoch, or this one again. Grain's threads start its first batches
                # in any order (batch 14 came first once): those are taken as the start.
                self._start(epoch, 0 if k < FIRST_BATCHES else k)
            elif epoch == self.epoch and k < self.low:
                # A batch before the first one asked for further on (a restored state
                # asked for by many threads). The plan holds (planned again, it read
                # chunks ahead again that were served and let go: 1.03 loads per chunk).
                self.low = k
                if self.first_uses_workers:
                    ahead_from = int(np.searchsorted(self.first_uses[1], k))
                    self.next_ahead = min(self.next_ahead, ahead_from)
                    self.next_fetch = min(self.next_fetch, ahead_from)
            if epoch == self.epoch:
                self.lowest_asked = min(self.lowest_asked, k)
            started, low = time.monotonic(), self.low
            self.waiting += 1
            turn: threading.Condition | None = None
            # A batch asked alone (nothing of this process in flight or waiting) passes:
            # no batch would move the sweep for it (a process asked for every other
            # batch, one at a time, before its step is seen twice); it holds one batch's
            # chunks beyond the sweep's at most.
            try:
                # Not while closing: the batches behind may never be served.
                while self._held_back(epoch, k) and not closing():
                    if self.low != low:  # progress: the bound holds memory, it never stalls
                        started, low = time.monotonic(), self.low
                    elif self._restored_further_on():
                        self.low = self.lowest_asked
                        self._advance_low()
                        self._wake()
                        continue
                    elif time.monotonic() - started > MAX_WAIT_SECONDS and not self.running:
                        # Nobody serves the batches behind (another process's, or a state
                        # restored further on): this one starts the count again. Not while
                        # a batch of this process runs: on a loaded machine one took over
                        # the wait, and the batches let go flushed the cache (4x the loads).
                        self.low = k
                        break
                    if turn is None:
                        turn = threading.Condition(self.lock)
                        self.turns[turn] = (epoch, k)
                    turn.wait(0.05)
            finally:  # a waiter interrupted leaves no turn behind
                if turn is not None:
                    del self.turns[turn]
                self.waiting -= 1
            self.running += 1
            if epoch == self.epoch:
                self.frontier = max(self.frontier, k)

    def _restored_further_on(self) -> bool:
        # Under the lock: no batch between the sweep's mark and the first one asked for
        # was asked for since the epoch began, nothing runs, and the grace is over.
        return (
            self.low < self.lowest_asked
            and not self.running
            and time.monotonic() - self.epoch_started > START_GRACE_SECONDS
        )

    def _start(self, epoch: int, k: int) -> None:
        # Batches before the first one asked for are taken as served (a restored state).
        batches = self.batches
        order = batches.epoch_order(epoch)
        kept = batches.batch_size * len(batches)
        order = order[:kept]
        which = np.arange(len(order)) // batches.batch_size
        ranks, reversed_axes = sweep_ranks(self.reads.chunk_grids(), batches.seed, epoch)
        self.reads.set_sweep_direction(reversed_axes)
        touched = self.touched[order]
        used = touched >= 0
        last = np.full(self.chunk_count, -1, dtype=np.int64)
        np.maximum.at(last, touched[used], np.broadcast_to(which[:, None], touched.shape)[used])
        whole = np.full(self.chunk_count, -1, dtype=np.int64)
        np.maximum.at(whole, key_chunks(touched, ranks), which)
        by_last = np.argsort(last, kind="stable")
        by_whole = np.argsort(whole, kind="stable")
        self.plan = (by_last, last[by_last], by_whole, whole[by_whole])
        self.epoch, self.low, self.done = epoch, k, set()
        self.lowest_asked, self.epoch_started = len(batches), time.monotonic()
        self._wake()
        self.retired[:] = False
        self.next_retire = int(np.searchsorted(self.plan[1], 0))
        self.next_shrink = int(np.searchsorted(self.plan[3], 0))
        self._let_go()  # nothing yet: chunks used before k only are left to the cache
        self.first_uses_workers = 0  # planned again for this epoch at the first read ahead
        self.frontier = k - 1

    def _plan_reads_ahead(self) -> None:
        # Each chunk's first batch among this process's, the chunks in that order.
        batches = self.batches
        order = batches.epoch_order(self.epoch)[: batches.batch_size * len(batches)]
        which = np.arange(len(order)) // batches.batch_size
        mine = (self.epoch * len(batches) + which - (self.first or 0)) % self.workers == 0
        touched = self.touched[order]
        used = (touched >= 0) & mine[:, None]
        never = np.iinfo(np.int64).max
        first = np.full(self.chunk_count, never, dtype=np.int64)
        np.minimum.at(first, touched[used], np.broadcast_to(which[:, None], touched.shape)[used])
        by_first = np.argsort(first, kind="stable")
        first = first[by_first]
        kept = int(np.searchsorted(first, never))
        self.first_use = np.empty(self.chunk_count, np.int64)
        self.first_use[by_first] = first
        self.first_uses = (by_first[:kept], first[:kept])
        self.first_uses_workers = self.workers
        # Chunks first used before the oldest batch in flight are that batch's to read.
        self.next_ahead = self.next_fetch = int(np.searchsorted(self.first_uses[1], self.low))

    def _due_reads(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Return the chunks to read now, and to fetch the bytes of (from the oldest batch on)."""
        if not self.step:  # one batch seen: whose the next ones are is not known yet
            return None
        if self.first_uses_workers != self.workers:
            self._plan_reads_ahead()
        by_first, first = self.first_uses
        current = int(np.searchsorted(first, self.low))
        sent = (self.next_ahead, self.next_fetch)
        due, fetches, sent = due_in_first_use_order(by_first, current, sent, self.late)
        self.next_ahead, self.next_fetch = sent
        return due, fetches

    def _send(self, due: tuple[np.ndarray, np.ndarray] | None) -> None:
        if due is None:
            return
        reads, fetches = due
        if len(reads):
            if self.pool is None:
                with self.lock:
                    if self.pool is None:
                        self.pool = IdlePool(self.late.read_threads, "xpatch-batch-ahead")
            for chunk in reads.tolist():
                self.pool.submit(self._read, chunk)
        if len(fetches):
            fetch_chunks_bytes(self.reads, fetches)

    def _read(self, chunk: int) -> None:
        timed = read_ahead_timed(self.reads, chunk, self.retired)
        if timed is not None:
            with self.lock:
                late = chunk < len(self.first_use) and self.first_use[chunk] <= self.frontier
                self.late.landed(late, *timed)

    def finished(self, epoch: int, k: int) -> None:
        with self.lock:
            self.running -= 1
            if epoch != self.epoch:
                return
            self.done.add(k)
            if not self._advance_low():
                return
            self._wake()
            retire, shrink = self._let_go()
            reading = self.ahead or self.late.fetching
            due = self._due_reads() if reading and not closing() else None
        for chunk in shrink:
            self.reads.release(int(chunk), keep_frame=True)
        for chunk in retire:
            self.reads.release(int(chunk), keep_frame=False)
        self._send(due)

    def told(self, workers: int) -> None:
        """Grain dealt this process every ``workers``-th batch."""
        with self.lock:
            if workers != self.workers:
                self._take_workers(workers, self.epoch)

    def _take_workers(self, workers: int, epoch: int) -> None:
        # Under the lock: the batches between this process's are now others'.
        self.workers = workers
        if self.epoch == epoch and self._advance_low():
            self._wake()

    def _held_back(self, epoch: int, k: int) -> bool:
        # Under the lock: whether batch k of epoch waits for the batches before it.
        return (
            epoch == self.epoch
            and k >= self.low + self.spread * self.workers
            and (self.running > 0 or self.waiting > 1)
        )

    def _wake(self) -> None:
        # Under the lock: the waiting batches the sweep's new state lets through; the
        # others look again within 0.05 s.
        for turn, (epoch, k) in self.turns.items():
            if not self._held_back(epoch, k):
                turn.notify()

    def _advance_low(self) -> bool:
        # Past the batches served, and those another process serves; whether it moved.
        low = self.low
        # Served batches stay in ``done`` for the epoch: a batch before the first one
        # asked for moves the mark back (Grain's threads start them in any order), and
        # the mark passes again those served meanwhile. Discarded here, batch 3 served
        # before batch 0 started held the mark at 3 for good: every later batch waited.
        while self.low in self.done or not self._mine(self.low):
            self.low += 1
            if self.low >= len(self.batches):
                break
        return self.low != low

    def _mine(self, k: int) -> bool:
        # Grain's mp_prefetch hands worker w the batches w, w + W, ...: the others are theirs.
        return (self.epoch * len(self.batches) + k - self.first) % self.workers == 0

    def _let_go(self) -> tuple[np.ndarray, np.ndarray]:
        by_last, last, by_whole, whole = self.plan
        stop = int(np.searchsorted(last, self.low))
        retire = by_last[self.next_retire : stop]
        self.next_retire = max(self.next_retire, stop)
        self.retired[retire] = True
        stop = int(np.searchsorted(whole, self.low))
        shrink = by_whole[self.next_shrink : stop]
        self.next_shrink = max(self.next_shrink, stop)
        shrink = shrink[~self.retired[shrink]]
        self.retired[shrink] = True  # whole no more: a late read ahead must not reload it
        return retire, shrink


def stack_items(items: Sequence[dict]) -> dict[str, Any]:
    """``np.stack`` of each key of ``items`` (dicts of arrays, maybe nested), in order.

    Examples
    --------
    >>> batch = stack_items([{"a": np.zeros(2), "b": {"c": np.int64(i)}} for i in range(3)])
    >>> batch["a"].shape, batch["b"]["c"].tolist()
    ((3, 2), [0, 1, 2])
    """
    first = items[0]
    out = {}
    for key, value in first.items():
        column = [item[key] for item in items]
        if isinstance(value, dict):
            out[key] = stack_items(column)
        else:
            try:
                out[key] = np.stack([np.asarray(v) for v in column])
            except ValueError as error:
                shapes = sorted({np.shape(v) for v in column})
                raise OptionError(
                    f"the items' {key!r} have shapes {shapes}: a batch stacks one shape; "
                    "batch the sources of one shape apart (e.g. one scene layout each)."
                ) from error
    return out


class _PatchGather:
    """A :class:`PatchSource`'s batches, gathered from its chunks (built once per process)."""

    def __init__(self, source: PatchSource) -> None:
        self.source = source
        self.reader: PatchReader = source.reader
        layout = source.layout
        self.read_anchors = np.asarray(layout.plan.anchors, dtype=np.int64)
        self.anchors = np.asarray(layout_of(source.patcher).plan.anchors, dtype=np.int64)
        self.alone = self.reader.alone_chunks()
        grid = self.reader.grid
        # Each chunk's first cell per patched dim (block_of per chunk and batch cost more).
        self.origins = np.zeros((0, self.read_anchors.shape[1]), dtype=np.int64)
        self.blocks: list[tuple[int, ...]] = []
        if grid is not None:
            blocks = np.unravel_index(np.arange(grid.count), grid.numblocks)
            self.blocks = [tuple(b) for b in np.stack(blocks, axis=1).tolist()]
            self.origins = np.stack(
                [np.asarray(s, dtype=np.int64)[b] for s, b in zip(grid.starts, blocks)], axis=1
            )
        self.transforms: np.ndarray | None = None
        #: Per patch, whether its weights are the window itself (no cell past the edge).
        self.inside = (self.read_anchors + np.asarray(self.reader.size) <= self.reader.shape).all(1)
        # The chunks of one batch are read side by side (decoding is work: a thread a core).
        self.pool = IdlePool(os.cpu_count() or 1, "xpatch-batch")

    def batch(self, positions: np.ndarray) -> dict[str, Any]:
        source, reader = self.source, self.reader
        b = len(positions)
        # The first item says which keys an item has (weights, transform) and their shapes.
        first = source[int(positions[0])]
        out = {
            key: np.empty((b, *np.shape(value)), np.asarray(value).dtype)
            for key, value in first.items()
            if key not in ("anchor", "index", "transform", "weights")
        }
        for key, array in out.items():
            array[0] = first[key]
        alone = self.alone[positions]
        alone[0] = -1  # served already
        rest = np.flatnonzero(alone < 0)[1:]
        gathered = np.flatnonzero(alone >= 0)
        if len(gathered):
            chunks, inverse = np.unique(alone[gathered], return_inverse=True)
            # Chunks not held are read on the pool while this thread gathers from the others
            # (a chunk held costs a lookup: handing it to a thread would cost more).
            loads = {
                c: self.pool.submit(reader.chunk, c)
                for c in chunks.tolist()[1:]
                if not reader.cache.holds(self.key(c))
            }
            for c, chunk_id in enumerate(chunks.tolist()):
                load = loads.get(chunk_id)
                values = reader.chunk(chunk_id) if load is None else load.result()
                rows = gathered[inverse == c]
                self._gather_chunk(out, values, chunk_id, rows, positions[rows])
        for row in rest.tolist():
            position = int(positions[row])
            rows = {plan.name: out[str(plan.name)][row] for plan in reader.plans}
            reader.read(position, tuple(self.read_anchors[position].tolist()), into=rows)
        if "weights" in first:
            out["weights"] = self._weights(positions)
        if "transform" in first:
            if self.transforms is None:
                layout = source.layout
                self.transforms = patch_transforms(layout.obj, layout.dims, self.read_anchors)
            out["transform"] = self.transforms[positions]
        out["anchor"] = self.anchors[positions]
        out["index"] = positions.copy()
        return out

    def _weights(self, positions: np.ndarray) -> np.ndarray:
        # Read-only: a batch of patches inside the array is the window broadcast along the
        # batch axis, no bytes of its own (insitubatch's ERA5 case: a batch held 8.3 MiB,
        # half of it the same window 16 times; 251-256 MiB peak RSS an epoch, 208-215 MiB
        # with one shared array of windows, 4.2 MiB less again as a view).
        b, inside = len(positions), self.inside[positions]
        window = self.reader.window
        if inside.all():
            return np.broadcast_to(window, (b, *window.shape))
        # Past the edge: the window broadcast, then each such patch's zeros.
        weights = np.repeat(window[None], b, axis=0)
        for row in np.flatnonzero(~inside).tolist():
            anchor = tuple(self.read_anchors[positions[row]].tolist())
            weights[row] = self.reader.weights(anchor)
        weights.flags.writeable = False
        return weights

    def key(self, chunk: int) -> tuple:
        """Return the cache's key of chunk ``chunk`` (as the reader keys it, under its prefix)."""
        block = self.blocks[chunk]
        return block if self.reader.prefix is None else (self.reader.prefix, block)

    def _gather_chunk(
        self, out: dict, values: dict, chunk_id: int, rows: np.ndarray, positions: np.ndarray
    ) -> None:
        local = self.read_anchors[positions] - self.origins[chunk_id]
        for plan in self.reader.plans:
            target = out[str(plan.name)]
            if len(rows) < GATHER_ROWS:
                # A slice copy each: cheaper than building a window view for a few.
                for row, start in zip(rows.tolist(), local.tolist()):
                    target[row] = values[plan.name][patch_index(plan, start)]
            else:
                target[rows] = gather_patches(values[plan.name], plan, local)


def patch_index(plan: VariablePlan, start: Sequence[int]) -> tuple:
    """Index of ``plan``'s patch starting at ``start`` (one per patched dim, patcher's order).

    Examples
    --------
    >>> import xarray as xr
    >>> from xpatch.grain.reader import VariablePlan
    >>> plan = VariablePlan("v", xr.Variable(("b", "y"), np.zeros((2, 9))), ("y",), [3], 0)
    >>> patch_index(plan, [4])
    (slice(None, None, None), slice(4, 7, None))
    """
    index: list[slice] = [slice(None)] * len(plan.patch_shape)
    for ax, j, size in zip(plan.axes, plan.columns, plan.patch_size):
        index[ax] = slice(start[j], start[j] + size)
    return tuple(index)


def gather_patches(values: np.ndarray, plan: VariablePlan, local: np.ndarray) -> np.ndarray:
    """``(m, *plan.patch_shape)``: the patches of ``values`` starting at ``local``, one gather.

    ``local`` is ``(m, dims)``: each patch's start per patched dim (the patcher's
    order), relative to ``values``.

    Examples
    --------
    >>> import xarray as xr
    >>> from xpatch.grain.reader import VariablePlan
    >>> var = xr.Variable(("b", "y", "x"), np.arange(32).reshape(2, 4, 4))
    >>> plan = VariablePlan("v", var, ("y", "x"), [2, 2], 0)
    >>> gather_patches(var.values, plan, np.array([[0, 0], [2, 1]]))[1].tolist()
    [[[9, 10], [13, 14]], [[25, 26], [29, 30]]]
    """
    axes = list(plan.axes)
    windows = sliding_window_view(values, plan.patch_size, axis=tuple(axes))
    # Starts first, then the other axes, then the windows' axes (in the axes' order).
    windows = np.moveaxis(windows, axes, range(len(axes)))
    picked = windows[tuple(local[:, j] for j in plan.columns)]
    others = [a for a in range(values.ndim) if a not in axes]
    order = [
        1 + len(others) + axes.index(a) if a in axes else 1 + others.index(a)
        for a in range(values.ndim)
    ]
    return picked.transpose([0, *order])
