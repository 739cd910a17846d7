"""Reading ahead of a known order, and letting go of what it no longer needs.

A sweep (:mod:`xpatch.core.sweep`) fixes each epoch's order before the first
patch is read, so the chunks every position needs are known: :class:`SweepReads`
loads the next chunks in background threads while the current ones are served
(a bounded number in flight), and drops a chunk and its frame from the cache as
soon as every position that needs it was read, so the cache holds what is in
use, not what was used last.

A read in flight holds no bytes until it lands. Where reads take long (an object
store), more are sent than the cache keeps room for while they land after the
sweep reached their chunks (:class:`LateReads`), so that they land about when the
chunks kept for reads ahead are used, and the cache holds no more than it would on
a fast disk. With ``src.fetch_ahead(n)``, from a store that keeps reads waiting,
``n`` fetches of the next chunks' stored bytes go out beyond the reads ahead
instead: the bytes wait outside the cache, compressed, and a chunk is decoded into
the cache only when the reads ahead reach it.

It only moves chunks in and out of the cache: a chunk dropped too early is read
again by the patch that needs it (counted in the cache's loads), never served
wrong.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from xpatch.core.cores import worker_count
from xpatch.core.sweep import chunk_uses, key_chunks
from xpatch.grain.store_wait import RoundTrips, store_wait
from xpatch.grain.threads import IdlePool, closing

#: Positions behind a read, none of them in flight for this long, are read by nobody:
#: a thread takes microseconds between two reads of a batch.
JUMP_SECONDS = 1.0
#: A waiting read looks again this often, and never waits longer than MAX_WAIT_SECONDS.
STALL_CHECK_SECONDS = 0.05
MAX_WAIT_SECONDS = 5.0
#: Reads sent beyond ``ahead`` are at most this many times ``ahead``. Measured at
#: 20 ms per read: 3 was no faster than 1, and when the pace changed its reads landed
#: early enough to evict chunks still needed (1.01-1.03 loads per chunk, none with 1).
MAX_LATE_PER_AHEAD = 1
#: TCP Vegas' bounds (its alpha and beta) on the chunks whose fetches out queue rather
#: than travel (:class:`~xpatch.grain.store_wait.RoundTrips`): below the first one more
#: chunk's bytes go out ahead, above the second one fewer.
FEW_QUEUED = 2.0
MANY_QUEUED = 4.0


def max_reads() -> int:
    """Return how many chunk loads a source runs at once: the cores this process may use.

    Grain's ``ReadOptions`` default to 16 threads whatever the cores; decoding is
    bound by the cores, so more loads at once only hold more chunks in memory.
    """
    return worker_count()


def sweep_spread(patch_count: int, chunk_count: int, reads: int | None = None) -> int:
    """Return how far reads may start ahead of the oldest position not yet read.

    One chunk's patches, or ``reads`` positions (default :func:`max_reads`) if that is
    more: Grain's other threads wait (a read of a cached chunk takes microseconds),
    so 16 threads hold no more chunks than ``reads`` threads do. A spread of 16
    positions over chunks of 7 patches held 4 chunks whole at once, and a budget of
    8 chunks (with the waiting row's frames) read each chunk 1.27 times.

    Examples
    --------
    >>> sweep_spread(903, 128, reads=2), sweep_spread(100, 100, reads=2)
    (7, 2)
    """
    per_chunk = patch_count // max(chunk_count, 1)
    return max(max_reads() if reads is None else int(reads), int(per_chunk), 1)


def sweep_span(patch_count: int, chunk_count: int, reads: int | None = None) -> int:
    """Return how many chunks the positions within :func:`sweep_spread` span at most.

    Examples
    --------
    >>> sweep_span(903, 128, reads=2)  # 7 patches a chunk: two chunks
    2
    """
    per_chunk = max(patch_count / max(chunk_count, 1), 1.0)
    return int(np.ceil(sweep_spread(patch_count, chunk_count, reads) / per_chunk)) + 1


def patch_sources(reads: Any) -> list[Any]:
    """Return the sources of patches whose readers ``reads`` drives (source, scenes, tree)."""
    if hasattr(reads, "reader"):
        return [reads]
    sources = getattr(reads, "sources", None)
    if isinstance(sources, dict):  # a tree: the sweep follows its reference node
        return [sources[reads.reference]]
    if isinstance(sources, tuple | list):
        return list(sources)
    return []


def loads_at_once(reads: Any) -> int | None:
    """Return the chunk loads at once of the readers ``reads`` drives (None if it has none)."""
    sources = patch_sources(reads)
    return max(s.reader.reads_at_once() for s in sources) if sources else None


def fetch_depth_of(chunk_reads: Any) -> int:
    """Return the chunks whose bytes a sweep over ``chunk_reads`` fetches ahead (0: none)."""
    depth = getattr(chunk_reads, "fetch_depth", None)
    return int(depth()) if depth is not None else 0


def round_trips_of(chunk_reads: Any) -> RoundTrips | None:
    """Return the fetches whose queueing sets how many a sweep sends ahead (None: fixed)."""
    trips = getattr(chunk_reads, "fetch_round_trips", None)
    return trips() if trips is not None else None


def late_reads_of(chunk_reads: Any, ahead: int) -> LateReads:
    """Return the :class:`LateReads` of a sweep over ``chunk_reads`` with room for ``ahead``.

    It sends fetches of bytes, not reads, beyond the room when the source's store keeps
    reads waiting and its reader fetches ahead (:func:`fetch_depth_of`): as many as
    asked, or, with ``fetch_ahead("auto")``, as many as the store answers without
    queueing them (:func:`round_trips_of`).
    """
    return LateReads(
        ahead,
        loads_at_once(chunk_reads),
        fetch_depth_of(chunk_reads),
        round_trips_of(chunk_reads),
    )


def due_in_first_use_order(
    by_first: np.ndarray, current: int, sent: tuple[int, int], late: LateReads
) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """Return the chunks to read ahead now, those to fetch the bytes of, and what is sent.

    ``by_first`` are the chunks in the order of their first use, the first ``current``
    of them used already; ``sent`` counts those whose read, and whose fetch, went out
    (a chunk read fetches its own bytes). Reads go up to ``late.ahead`` chunks ahead,
    fetches up to ``late.count`` beyond (:meth:`LateReads.stops`).

    Examples
    --------
    >>> late = LateReads(ahead=2, loads=8, fetching=4)
    >>> late.count = 3
    >>> due_in_first_use_order(np.arange(10), 1, (0, 0), late)
    (array([0, 1, 2]), array([3, 4, 5]), (3, 6))
    """
    read_stop, fetch_stop = late.stops(current, len(by_first))
    next_read, next_fetch = sent
    due = by_first[next_read:read_stop]
    next_read = max(next_read, read_stop)
    fetches = by_first[max(next_fetch, next_read) : fetch_stop]
    return due, fetches, (next_read, max(next_fetch, next_read, fetch_stop))


def fetch_chunks_bytes(chunk_reads: Any, chunks: np.ndarray) -> None:
    """Start fetching the stored bytes of ``chunks`` (they are decoded when read)."""
    for chunk in chunks.tolist():
        try:
            chunk_reads.fetch_chunk_bytes(chunk)
        except Exception:  # never raises: a fetch that cannot start is the read's to do
            return


class LateReads:
    """How many reads (or fetches) go out beyond the room kept for reads ahead: more while late.

    A read ahead *lands late* when the sweep reached the chunk's first use while the
    read was still in flight. Each late landing whose wait for the store's bytes was
    at least as long as the rest of the read (decoding: more reads in flight hide a
    wait, not work) sends one more read beyond ``ahead``, up to
    ``MAX_LATE_PER_AHEAD * ahead``; every ``ahead`` landings in time send one fewer.
    So a fast disk, or a consumer slower than the store (a training step), sends
    none: the cache holds no more than the room kept ahead.

    The count used to be computed from the sweep's measured pace (the store's wait
    over the time per chunk). A sweep waiting for its reads goes at the pace the
    reads in flight set, so that count settled wherever it began: on
    ``benchmarks/bench_storage.py``'s 1 GiB zarr with 20 ms per read, 2-3 of the 4
    allowed, 3.9-4.6 s an epoch of ``BatchSource``; 3.1-3.4 s with 4.

    With ``fetching`` (a count), what goes out beyond the room are fetches of the
    chunks' stored bytes, not reads: ``fetching`` of them, late or not, so the cache
    holds no chunk that is not within the room kept for it (and only fetches go out
    when the budget leaves no room for reads ahead). The bytes are the chunk's as
    stored (compressed), outside the cache's budget
    (:func:`~xpatch.grain.memory.memory_report` states them). On
    ``benchmarks/bench_storage.py --quick``'s zarr, whose budget at the sweep's floor
    leaves no room for reads ahead, 16 fetches took an epoch of ``BatchSource`` from
    4.6x zarr's concurrent read to 1.75x at 20 ms per read, from 5.6x to 1.14x at 50 ms.

    With ``round_trips`` as well (``fetch_ahead("auto")``), ``fetching`` is a ceiling:
    each time a fetch lands, the count goes one up while fewer than :data:`FEW_QUEUED`
    of the fetches out queue and fewer are out than keep the cores decoding, one down
    while more than :data:`MANY_QUEUED` queue or more are out than that
    (:class:`~xpatch.grain.store_wait.RoundTrips`). It starts where the last sweep
    over the store left it, else at 0 (a first epoch of ``bench_storage.py --quick``'s
    64 chunks at 50 ms a read is still growing for much of it). A store that only keeps reads
    waiting gets fetches up to the ceiling; one that is busy (moto's S3 server on the
    reader's two cores, where 4 and 16 fetches made no epoch faster and held 10-25 MiB
    more) or answers within a decoding (a local folder through obstore) gets few.

    Not thread-safe: its owner calls it under its own lock.

    No more reads go out than the reader loads at once (``loads``): one beyond would
    wait at the reader's gate, and could only land early and hold its chunk. On
    moto's S3 server (8 loads at once, ``ahead`` 7 on insitubatch's ERA5 case) the
    reads beyond the gate held 12-16 MiB more at the peak and made no epoch faster.

    Parameters
    ----------
    ahead
        Chunks the cache keeps room for, read ahead. With room for one there is
        none to spare for a read landing early: no read goes beyond it.
    loads
        Chunk loads the reader runs at once (:func:`loads_at_once`); None: no bound
        but ``MAX_LATE_PER_AHEAD * ahead``.
    fetching
        Fetches of stored bytes that go out beyond the room at most, instead of reads
        (``Source.fetch_ahead``); 0: reads.

    Examples
    --------
    >>> late = LateReads(ahead=4)
    >>> for _ in range(6):  # 20 ms reads that decode in 4 ms, landing after first use
    ...     late.landed(late=True, waited=0.020, seconds=0.024)
    >>> late.count  # at most MAX_LATE_PER_AHEAD * ahead
    4
    >>> for _ in range(8):  # the consumer slowed down: they land in time
    ...     late.landed(late=False, waited=0.020, seconds=0.024)
    >>> late.count
    2
    >>> late.landed(late=True, waited=0.001, seconds=0.004)  # a fast disk: decoding is the work
    >>> late.count
    2
    """

    def __init__(
        self,
        ahead: int,
        loads: int | None = None,
        fetching: int = 0,
        round_trips: RoundTrips | None = None,
    ) -> None:
        self.ahead = int(ahead)
        self.fetching = int(fetching) > 0
        self.round_trips = round_trips if self.fetching else None
        self._trips_seen = 0
        if self.fetching:
            self.most = int(fetching)
        else:
            self.most = MAX_LATE_PER_AHEAD * self.ahead if self.ahead > 1 else 0
            if loads is not None:
                self.most = min(self.most, max(int(loads) - self.ahead, 0))
        self.in_time_per_step = max(self.ahead, 1)
        # Fetches go as deep as asked from the start: the bytes they hold are stated
        # before reading, and a count grown from late reads grew none without room
        # for reads ahead (a budget at the sweep's floor). Set by the store's round
        # trips, they start where the last sweep over the store left them (none at
        # first) and follow the fetches as they land.
        if self.round_trips is not None:
            self.count = min(self.round_trips.depth, self.most)
        else:
            self.count = self.most if self.fetching else 0
        self._in_time = 0

    def landed(self, late: bool, waited: float, seconds: float) -> None:
        """Count a read ahead that landed after (``late``) or before its chunk's first use.

        ``waited`` is the part of its ``seconds`` spent waiting for the store's bytes.
        Fetching, the count stays as asked.
        """
        if self.fetching:
            return
        if late and waited >= seconds - waited:
            self.count = min(self.count + 1, self.most)
            self._in_time = 0
            return
        self._in_time += 1
        if self._in_time >= self.in_time_per_step:
            self.count = max(self.count - 1, 0)
            self._in_time = 0

    @property
    def read_threads(self) -> int:
        """Threads the reads ahead need at most: the room, and the reads beyond it."""
        return self.ahead + (0 if self.fetching else self.most)

    def stops(self, current: int, total: int) -> tuple[int, int]:
        """Return where reads ahead stop, and fetches, in first-use order from ``current``.

        >>> late = LateReads(ahead=4)
        >>> late.count = 2
        >>> late.stops(10, 100), LateReads(ahead=4, loads=8, fetching=8).stops(10, 12)
        ((16, 16), (12, 12))
        """
        if self.round_trips is not None:
            self._follow_round_trips()
        beyond = min(current + self.ahead + self.count, total)
        return (min(current + self.ahead, total) if self.fetching else beyond), beyond

    def _follow_round_trips(self) -> None:
        # One step per fetch landed since the last look: a burst of looks moves nothing.
        trips = self.round_trips
        landed = trips.landed
        if landed == self._trips_seen:
            return
        self._trips_seen = landed
        queued = trips.queued()
        if queued is None:
            return
        needed = trips.needed(max_reads(), self.ahead)
        if queued > MANY_QUEUED or (needed is not None and self.count > needed):
            self.count = max(self.count - 1, 0)
        elif queued < FEW_QUEUED and (needed is None or self.count < needed):
            # One more per fetch landed doubles those out each round trip, as TCP's
            # slow start does. Doubling per fetch landed overshot: a store serving one
            # read at a time got 16 before its queue showed in the running mean.
            self.count = min(self.count + 1, self.most)
        trips.depth = self.count


def read_ahead_timed(
    chunk_reads: ChunkReads, chunk: int, retired: np.ndarray
) -> tuple[float, float] | None:
    """Read ``chunk`` ahead unless ``retired[chunk]`` when its load starts.

    Returns ``(waited, seconds)``: the store wait and the whole read's time. None
    when nothing was read: the interpreter is exiting (a dropped pipeline's queued
    reads), or the read failed (the patch or batch that needs the chunk reads it
    again, and raises).
    """
    if closing():
        return None
    started = time.perf_counter()
    try:
        with store_wait() as waited:
            chunk_reads.read_ahead(chunk, lambda: not retired[chunk])
    except Exception:
        return None
    return waited.seconds, time.perf_counter() - started


def _in_order_of(positions: np.ndarray, used: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # The chunks that are used, sorted by their position, and those positions.
    chunks = np.flatnonzero(used)
    chunks = chunks[np.argsort(positions[chunks], kind="stable")]
    return chunks, positions[chunks]


class ChunkReads(Protocol):
    """The chunk-read contract of a source: what its chunks are, in what order, and their reads.

    A source's items are one contract (``__len__``, ``__getitem__``, the
    fingerprint); how its chunks are read is this one. Every
    :class:`~xpatch.grain.base.Source` hands the object that does them as
    :attr:`~xpatch.grain.base.Source.chunk_reads`: a source that reads its own
    chunks (:class:`~xpatch.grain.PatchSource`, :class:`~xpatch.scenes.SceneSource`,
    :class:`~xpatch.tree.TreeSource`) is its own, a source whose items are built from
    another's (:class:`~xpatch.grain.base.WrappedSource`) hands the inner source's.
    The chunk-local orders (:mod:`xpatch.grain.datasets`, ``Source.chunk_shuffled_order``)
    ask the first five; :class:`SweepReads` asks the last five. Chunks are named by
    global ids, the source's chunks numbered scene after scene.
    """

    def chunk_of_patch(self) -> np.ndarray:
        """For every patch, the (global) id of the chunk holding its anchor."""
        ...

    def shuffle_groups(self) -> np.ndarray:
        """Return the groups ``order="chunk"`` visits: ``(n,)`` or ``(n, m)`` labels, -1 padded.

        With ``(n, m)`` labels a patch comes with the last of its groups.
        """
        ...

    def touched_chunks(self) -> np.ndarray:
        """``(n, m)``: the global ids of the chunks each patch touches, -1 padded."""
        ...

    def chunk_grids(self) -> list[tuple[int, ...]]:
        """Return the number of chunks along each patched axis, per scene (global ids follow)."""
        ...

    def sweep_settings(self, mix: int | None, ahead: int | None) -> tuple[int, int]:
        """Return ``(mix, ahead)`` for a sweep within the cache, and keep the frames that pay."""
        ...

    def read_ahead(self, chunk: int, wanted: Callable[[], bool] | None = None) -> None:
        """Load chunk ``chunk`` before a patch asks for it, if ``wanted()`` when it starts."""
        ...

    def release(self, chunk: int, keep_frame: bool) -> None:
        """Drop chunk ``chunk`` from the cache, keeping its frame or not (and its bytes fetched)."""
        ...

    def fetch_depth(self) -> int:
        """Chunks whose stored bytes the sweep may fetch beyond its reads ahead (0: none)."""
        ...

    def fetch_chunk_bytes(self, chunk: int) -> None:
        """Start fetching chunk ``chunk``'s stored bytes; its read decodes them."""
        ...

    def set_sweep_direction(self, reversed_axes: list[tuple[bool, ...]]) -> None:
        """Keep only the frame sides facing what a sweep visits later (per scene, per axis)."""
        ...


class SweepReads:
    """Read the chunks of each epoch's positions ahead of them; shrink and drop them after.

    Parameters
    ----------
    chunk_reads
        Loads and drops chunks (:meth:`ChunkReads.read_ahead`, :meth:`ChunkReads.release`):
        a source's :attr:`~xpatch.grain.base.Source.chunk_reads`, not the source.
    touched
        ``(n, m)``: the global chunk ids of the patch at every element, -1 padded.
    chunk_count
        Number of global chunk ids.
    permutation
        ``permutation(epoch)``: the element at each position of the epoch.
    sweep_ranks
        ``sweep_ranks(epoch)``: every chunk's visit rank, and per scene and axis
        whether that epoch's sweep runs from high to low; ``chunk_reads`` keeps the
        frame sides that face the chunks visited later
        (:meth:`ChunkReads.set_sweep_direction`).
    ahead
        How many chunks are read ahead of the newest position and may wait in the
        cache for it; more are in flight where reads land late (:class:`LateReads`).
    dealt
        ``(worker_count, batch_size)``: positions go to ``mp_prefetch`` workers by
        batch; a process reads ahead only for the workers whose positions it serves.
    """

    def __init__(
        self,
        chunk_reads: ChunkReads,
        touched: np.ndarray,
        chunk_count: int,
        permutation: Callable[[int], np.ndarray],
        sweep_ranks: Callable[[int], tuple[np.ndarray, list[tuple[bool, ...]]]],
        ahead: int,
        dealt: tuple[int, int] = (1, 1),
    ) -> None:
        self._chunk_reads = chunk_reads
        self._touched = touched
        self._chunk_count = int(chunk_count)
        self._permutation = permutation
        self._sweep_ranks = sweep_ranks
        self._ahead = int(ahead)
        self._workers_total, self._batch_size = dealt
        # Positions of other workers lie between this process's: the spread spans theirs too.
        self._spread = sweep_spread(len(touched), chunk_count) * self._workers_total
        self._lock = threading.Lock()
        # Reads held back by the spread, each on a condition of its own: a finished read
        # wakes only those it lets go. Woken all at each finished read, Grain's 16
        # threads took 2.3 s over an epoch of patches in memory, 1.9 s so (2 threads: 1.3 s).
        self._held: dict[tuple[int, int], threading.Condition] = {}
        self._in_flight: set[int] = set()
        self._pool: IdlePool | None = None
        self._late = late_reads_of(chunk_reads, self._ahead)
        self._epoch = -1
        self._workers: set[int] = set()
        self._frontier = -1
        self._by_first = self._first = self._by_last = self._last = np.empty(0, np.int64)
        self._first_use = np.empty(0, np.int64)
        self._next_ahead = self._next_retire = self._next_shrink = self._next_fetch = 0
        self._by_whole_last = self._whole_last = np.empty(0, np.int64)
        self._ranks = np.zeros(self._chunk_count, dtype=np.int64)
        self._retired = np.zeros(self._chunk_count, dtype=bool)
        self._mine = np.zeros(0, dtype=bool)
        self._done: set[int] = set()
        self._low = 0
        self._stalled_since: float | None = None

    def reached(self, index: int) -> None:
        """Element ``index`` (epoch after epoch) is about to be read: read the next chunks.

        Once the interpreter exits (:func:`~xpatch.grain.threads.closing`), the reads
        left are those a dropped pipeline queued: nothing is planned or waited for.
        """
        if closing():
            return
        epoch, position, worker = self._locate(index)
        with self._lock:
            if epoch < self._epoch:  # a late read of the epoch before: nothing to plan
                return
            # A position read already: a new iterator (or a restored state) starts here.
            again = position < self._low and position not in self._in_flight
            if epoch > self._epoch or (epoch == self._epoch and again):
                self._start(epoch, position)
            if worker not in self._workers:
                self._add_worker(worker)
            if not self._keep_within_spread(epoch, position):
                return  # another pass began while this read waited: it plans nothing
            self._in_flight.add(position)
            self._frontier = max(self._frontier, position)
            reading = self._ahead or self._late.fetching
            load, fetches = self._due_reads() if reading else ((), ())
        if len(load):
            pool = self._thread_pool()
            for chunk in load:
                # Never raises: a read ahead that cannot start is read by its patch.
                pool.submit(self._read, int(chunk))
        if len(fetches):
            fetch_chunks_bytes(self._chunk_reads, fetches)

    def finished(self, index: int) -> None:
        """Element ``index`` was read: drop the chunks no position still to read needs."""
        epoch, position, _ = self._locate(index)
        with self._lock:
            if epoch != self._epoch or position not in self._in_flight:
                return  # a read of a pass that another one replaced
            self._in_flight.discard(position)
            self._done.add(position)
            n = len(self._mine)
            low = self._low
            # Every position below the low-water mark was read (or is another worker's).
            while self._low < n and (not self._mine[self._low] or self._low in self._done):
                self._done.discard(self._low)
                self._low += 1
                self._stalled_since = None
            if self._low == low:
                return  # nothing new below the mark: nothing to let go (most reads)
            for (held, _), condition in self._held.items():
                if held - self._spread <= self._low:
                    condition.notify()
            stop = int(np.searchsorted(self._last, self._low))
            retire = self._by_last[self._next_retire : stop]
            self._next_retire = max(self._next_retire, stop)
            self._retired[retire] = True
            stop = int(np.searchsorted(self._whole_last, self._low))
            shrink = self._by_whole_last[self._next_shrink : stop]
            self._next_shrink = max(self._next_shrink, stop)
            shrink = shrink[~self._retired[shrink]]
            self._retired[shrink] = True  # whole no more: a late read ahead must not reload it
        # Only patches keyed to chunks visited later still need these: their frames do.
        for chunk in shrink:
            self._chunk_reads.release(int(chunk), keep_frame=True)
        for chunk in retire:
            self._chunk_reads.release(int(chunk), keep_frame=False)

    def _keep_within_spread(self, epoch: int, position: int) -> bool:
        # Wait (the lock released) while the oldest position not yet read is more than
        # self._spread behind. A thread reading a batch is between two of its
        # positions for microseconds; if nothing behind is read for JUMP_SECONDS, nobody
        # reads those positions (a pass restored further on): a new pass starts here.
        # No wait lasts past MAX_WAIT_SECONDS: the bound spares memory, it must never
        # hold a read. False when another pass began meanwhile (this read is late).
        started = time.monotonic()
        if self._low >= position - self._spread:
            return self._epoch == epoch
        key = (position, threading.get_ident())
        condition = self._held[key] = threading.Condition(self._lock)
        try:
            return self._wait_within_spread(epoch, position, started, condition)
        finally:
            del self._held[key]

    def _wait_within_spread(
        self, epoch: int, position: int, started: float, condition: threading.Condition
    ) -> bool:
        while self._low < position - self._spread:
            if self._epoch != epoch:
                return False
            if closing():  # the positions behind may never be read
                return True
            now = time.monotonic()
            if now - started >= MAX_WAIT_SECONDS:
                return True
            if any(p < position - self._spread for p in self._in_flight):
                self._stalled_since = None
            elif self._stalled_since is None:
                self._stalled_since = now
            elif now - self._stalled_since >= JUMP_SECONDS:
                self._start(epoch, position)
                return True
            condition.wait(STALL_CHECK_SECONDS)
        return self._epoch == epoch

    def _locate(self, index: int) -> tuple[int, int, int]:
        epoch, position = divmod(int(index), len(self._touched))
        return epoch, position, (int(index) // self._batch_size) % self._workers_total

    def _start(self, epoch: int, position: int) -> None:
        # Positions before the first one read are taken as read: a restored state
        # starts in the middle of an epoch.
        self._epoch, self._workers = epoch, set()
        self._frontier, self._low = position - 1, position
        self._retired[:] = False
        self._done = set()
        self._stalled_since = None
        self._in_flight.clear()
        for condition in self._held.values():
            condition.notify()
        self._ranks, reversed_axes = self._sweep_ranks(epoch)
        self._chunk_reads.set_sweep_direction(reversed_axes)

    def _add_worker(self, worker: int) -> None:
        self._workers.add(worker)
        n = len(self._touched)
        order = self._permutation(self._epoch)
        served_by = ((np.arange(n) + self._epoch * n) // self._batch_size) % self._workers_total
        self._mine = np.isin(served_by, sorted(self._workers))
        first, last = chunk_uses(np.where(self._mine, order, -1), self._touched, self._chunk_count)
        self._first_use = first
        self._by_first, self._first = _in_order_of(first, first < n)
        self._by_last, self._last = _in_order_of(last, last >= 0)
        # The last position of each chunk's own patches (those it is the last visited
        # chunk of): after it, a chunk is needed only at the sides its frame keeps.
        key_chunk = key_chunks(self._touched, self._ranks)
        positions = np.flatnonzero(self._mine)
        whole_last = np.full(self._chunk_count, -1, dtype=np.int64)
        np.maximum.at(whole_last, key_chunk[order[positions]], positions)
        self._by_whole_last, self._whole_last = _in_order_of(whole_last, whole_last >= 0)
        # Chunks first used before the frontier were read (or are being read) already.
        self._next_ahead = int(np.searchsorted(self._first, self._frontier, side="right"))
        self._next_fetch = self._next_ahead
        self._next_retire = int(np.searchsorted(self._last, self._low))
        self._next_shrink = int(np.searchsorted(self._whole_last, self._low))

    def _due_reads(self) -> tuple[np.ndarray, np.ndarray]:
        # The chunks to read ahead now, and those whose bytes to fetch.
        current = int(np.searchsorted(self._first, self._frontier, side="right"))
        sent = (self._next_ahead, self._next_fetch)
        due, fetches, sent = due_in_first_use_order(self._by_first, current, sent, self._late)
        self._next_ahead, self._next_fetch = sent
        return due, fetches

    def _thread_pool(self) -> IdlePool:
        # Daemons that end when idle: a pipeline stopped early takes them with it.
        with self._lock:
            if self._pool is None:
                self._pool = IdlePool(self._late.read_threads, "xpatch-ahead")
            return self._pool

    def _read(self, chunk: int) -> None:
        # Queued behind the patches that needed it sooner, it may have been read and
        # dropped by them meanwhile: asked again as the load would start, under the
        # cache's lock (a check here alone left a window for a second load).
        timed = read_ahead_timed(self._chunk_reads, chunk, self._retired)
        if timed is not None:
            with self._lock:
                # Late: a position using the chunk was reached while it was in flight.
                late = chunk < len(self._first_use) and self._first_use[chunk] <= self._frontier
                self._late.landed(late, *timed)
