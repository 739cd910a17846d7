"""How long a read waited for a store's bytes, told by the reader that fetched them.

Reads ahead (:mod:`xpatch.grain.readahead`) send more reads where a store answers
late: they need the time spent waiting for bytes, not the time spent decoding
them (more reads in flight hide a wait; they only slow decoding down). A reader
that knows when it waits for a store (:class:`~xpatch.grain.zarr_chunks.ZarrChunks`)
adds that time with :func:`note_store_wait`; :func:`store_wait` collects what the
reads of one thread noted meanwhile. Readers that do not say (dask's) count 0.

Fetches ahead (``src.fetch_ahead("auto")``) go deeper where a store only keeps
reads waiting, not where it is busy: :class:`RoundTrips` tells one from the other.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

_local = threading.local()


@dataclass
class StoreWait:
    """Seconds the reads of one thread waited for store bytes (see :func:`store_wait`)."""

    seconds: float = 0.0


def note_store_wait(seconds: float) -> None:
    """Add ``seconds`` waited for a store's bytes to the wait this thread measures, if any."""
    measuring = getattr(_local, "wait", None)
    if measuring is not None:
        measuring.seconds += seconds


@contextmanager
def store_wait() -> Iterator[StoreWait]:
    """Measure the store waits the reads on this thread note while the block runs.

    Examples
    --------
    >>> with store_wait() as waited:
    ...     note_store_wait(0.02)
    ...     note_store_wait(0.01)
    >>> round(waited.seconds, 3)
    0.03
    >>> note_store_wait(1.0)  # no measure open on this thread: nothing to add to
    """
    outer = getattr(_local, "wait", None)
    _local.wait = waited = StoreWait()
    try:
        yield waited
    finally:
        _local.wait = outer
        if outer is not None:
            outer.seconds += waited.seconds


#: Weight of the newest fetch (or decoding) in :class:`RoundTrips`' running means.
RECENT_WEIGHT = 0.25
#: Chunks in the pipe per core that :meth:`RoundTrips.needed` asks for: Little's law
#: gives one; a sweep uses its chunks in bursts (a batch's chunks at once).
PIPE_PER_CORE = 2.0


def _running_mean(previous: float | None, value: float) -> float:
    return value if previous is None else previous + RECENT_WEIGHT * (value - previous)


class RoundTrips:
    """The fetches of one store's bytes: how long they take, how many queue, how many pay.

    Two questions decide how many fetches go out ahead of the reads
    (:class:`~xpatch.grain.readahead.LateReads`, ``fetch_ahead("auto")``):

    - *Do more fetches out queue?* TCP Vegas' estimate (Brakmo and Peterson, 1995):
      a fetch that took ``seconds`` with ``n`` fetches out (itself included),
      against the fastest fetch seen (``base``, the store's own round trip), had
      ``n * (1 - base / seconds)`` of them queued behind others rather than
      travelling (:meth:`queued`, in chunks: a dataset's variables fetch a chunk
      each side by side). A store that only keeps each read waiting (a
      far object store: tens of ms a read, whatever else is out) queues none; a
      busy one (a server on the same cores) queues them, and more fetches only
      hold memory there.
    - *Does the wait matter?* Little's law: to keep ``cores`` decoding, chunks
      whose bytes take ``trip`` to come and ``decode`` to decode must be in the
      pipe ``cores * (1 + trip / decode)`` at a time (:meth:`needed`). A local disk
      answers in a fraction of a decoding: fetching ahead there only holds bytes.

    Examples
    --------
    >>> trips = RoundTrips()
    >>> trips.queued() is None, trips.needed(cores=2, ahead=4) is None  # nothing timed yet
    (True, True)
    >>> for _ in range(8):  # 4 out at a time, each as fast as the fastest: none queue
    ...     trips.timed(out=4, seconds=0.020)
    ...     trips.decoded(0.005)
    >>> trips.queued()
    0.0
    >>> trips.needed(cores=2, ahead=4)  # 2 cores x 2 x (1 + 20 ms / 5 ms), less 4 read ahead
    16
    >>> for _ in range(8):  # 4 out, 4x the fastest round trip: 3 of them queue
    ...     trips.timed(out=4, seconds=0.080)
    >>> round(trips.queued(), 1)  # a running mean, on its way to 3
    2.7
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.out = 0
        #: Fetches timed so far.
        self.landed = 0
        self.base = float("inf")
        self._queued: float | None = None
        self._trip: float | None = None
        self._decode: float | None = None
        #: Fetches out ahead where the last sweep left them: the next one starts there.
        self.depth = 0
        #: Fetches a chunk takes (a dataset's variables, fetched side by side): the
        #: fetches that queue are counted in chunks, as those out ahead are.
        self.fetches_per_chunk = 1

    def __getstate__(self) -> dict:
        return {"fetches_per_chunk": self.fetches_per_chunk}  # each process times its own

    def __setstate__(self, state: dict) -> None:
        self.__init__()
        self.fetches_per_chunk = int(state.get("fetches_per_chunk", 1))

    @contextmanager
    def timing(self) -> Iterator[None]:
        """Count the block as a fetch out, and time it unless it raises.

        A fetch that failed (a reset connection, a missing key) made no round trip:
        timed, a quick failure would pass for the store's fastest answer.
        """
        with self._lock:
            self.out += 1
            out = self.out
        started = time.perf_counter()
        failed = True
        try:
            yield
            failed = False
        finally:
            seconds = time.perf_counter() - started
            with self._lock:
                self.out -= 1
            if not failed:
                self.timed(out, seconds)

    def timed(self, out: int, seconds: float) -> None:
        """Add a fetch that took ``seconds`` with ``out`` fetches out, itself included."""
        with self._lock:
            self.landed += 1
            self.base = min(self.base, seconds)
            queued = out * (1.0 - self.base / seconds) if seconds > 0 else 0.0
            self._queued = _running_mean(self._queued, queued)
            self._trip = _running_mean(self._trip, seconds)

    def decoded(self, seconds: float) -> None:
        """Add the decoding of a chunk fetched, which took ``seconds``."""
        with self._lock:
            self._decode = _running_mean(self._decode, seconds)

    def queued(self) -> float | None:
        """Return the chunks whose fetches queue rather than travel, lately (None: none timed)."""
        if self._queued is None:
            return None
        return self._queued / max(self.fetches_per_chunk, 1)

    def needed(self, cores: int, ahead: int) -> int | None:
        """Return the fetches beyond ``ahead`` reads that keep ``cores`` decoding (None: untimed).

        :data:`PIPE_PER_CORE` times Little's law's chunks in the pipe, less the
        ``ahead`` chunks read ahead (each fetches its own bytes), at least 0.
        """
        trip, decode = self._trip, self._decode
        if trip is None or decode is None:
            return None
        pipe = PIPE_PER_CORE * cores * (1.0 + trip / max(decode, 1e-6))
        return max(math.ceil(pipe) - int(ahead), 0)
