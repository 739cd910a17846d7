"""A bounded, thread-safe cache of array chunks, and patches served from it.

Random access to patches of a chunked (dask, zarr, GeoTIFF) array is cheap only
if every chunk is read once and sliced many times. :class:`ChunkCache` holds the
most recently used chunks up to a byte limit; :func:`assemble_patch` copies one
patch out of the chunks it touches.

The standard library's ``functools.lru_cache`` bounds entries, not bytes, and
neither it nor ``cachetools`` makes concurrent misses of one key wait for a single
load, which is what keeps 16 Grain read threads from reading a chunk 16 times.
Nor can they keep a smaller stand-in for an evicted entry: a chunk's frame
(:mod:`xpatch.core.chunk_frames`), which serves the patches straddling into it.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import dask
import numpy as np
from dask.highlevelgraph import MaterializedLayer
from dask.local import get_sync

from xpatch.core.plan import chunk_starts

if TYPE_CHECKING:
    import dask.array as da

#: Default byte limit of a chunk cache (per process).
DEFAULT_CACHE_BYTES = 512 * 2**20


@dataclass(frozen=True)
class FrameKey:
    """The key of the frame kept for the chunk under ``key``."""

    key: Hashable


@dataclass(frozen=True)
class CacheStats:
    """Counters of a :class:`ChunkCache`.

    Attributes
    ----------
    loads
        Chunks loaded (cache misses). Concurrent misses of one chunk count once.
    hits
        Requests served from the cache, waits for a load in flight included.
    evictions
        Chunks dropped to stay within the byte limit.
    cached_bytes
        Bytes held now.
    loaded_bytes
        Bytes of the chunks loaded (decoded), over all loads.
    load_seconds
        Time spent loading (reading and decoding), summed over the threads that
        loaded, read-ahead threads included.
    wait_seconds
        Time requests for patches spent waiting for a chunk (loading it
        themselves or waiting for a load in flight): the time the loader made a
        reader wait. Near 0 when reads ahead keep up.
    peak_bytes
        The most bytes held at once since the cache was made or cleared: what
        the loader's memory came to (never above the byte limit).
    """

    loads: int
    hits: int
    evictions: int
    cached_bytes: int
    loaded_bytes: int = 0
    load_seconds: float = 0.0
    wait_seconds: float = 0.0
    peak_bytes: int = 0

    @property
    def requests(self) -> int:
        """All chunk requests: ``loads + hits``."""
        return self.loads + self.hits


class _Pending:
    """A load in flight: other threads wait for its result instead of loading again."""

    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: object = None
        self.error: BaseException | None = None


class ChunkCache:
    """Least-recently-used cache of chunks, bounded in bytes, safe across threads.

    A missing chunk is loaded by the thread that asked first, outside the lock, so
    different chunks load in parallel; threads that ask for a chunk while it loads
    wait for that load. A chunk larger than the limit is returned but not kept.

    Chunks read ahead and not asked for yet are evicted first, the newest of them
    first: reads ahead go in the order of first use, so it is the one needed last.
    Least-recently-used alone evicts, when a load finds the cache full, a chunk a
    sweep is still mixing: the next patch reads it again and evicts the next one.

    With a ``shrink`` function, an evicted chunk is replaced by ``shrink(key,
    value)`` (its frame) unless that is None, and every other chunk is evicted
    before a frame is: use it when the frames fit in the limit besides a chunk.
    :meth:`get_or_frame` serves a request from a frame when it can.

    Parameters
    ----------
    max_bytes
        Upper bound of the bytes of the chunks (and frames) held.
    shrink
        Called with a chunk that is evicted (under the cache's lock) or released
        with ``keep_frame`` (outside it); returns the frame to keep, or None. It
        must not call the cache. Default: no frames, least-recently-used eviction.

    Examples
    --------
    >>> cache = ChunkCache(max_bytes=16)
    >>> cache.get("a", lambda: np.zeros(2)).tolist(), cache.get("a", lambda: None).tolist()
    ([0.0, 0.0], [0.0, 0.0])
    >>> cache.stats().loads, cache.stats().hits
    (1, 1)
    """

    def __init__(
        self,
        max_bytes: int = DEFAULT_CACHE_BYTES,
        shrink: Callable[[Hashable, object], object | None] | None = None,
    ) -> None:
        self.max_bytes = int(max_bytes)
        self.shrink = shrink
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()
        #: Chunks read ahead and not asked for since, in the order they landed.
        self._unasked: dict[Hashable, None] = {}
        self._pending: dict[Hashable, _Pending] = {}
        self._bytes = 0
        self._loads = 0
        self._hits = 0
        self._evictions = 0
        self._loaded_bytes = 0
        self._load_seconds = 0.0
        self._wait_seconds = 0.0
        self._peak_bytes = 0
        #: The largest chunk stored so far: what a load in flight is counted as.
        self._largest = 0

    def get(
        self,
        key: Hashable,
        load: Callable[[], object],
        ahead: bool = False,
        wanted: Callable[[], bool] | None = None,
    ) -> object:
        """Return the chunk under ``key``, calling ``load()`` once if it is not held.

        If the load fails with an exception, the threads waiting for it raise
        that exception too (the next request tries again); if it is interrupted
        (``KeyboardInterrupt``, ``SystemExit``), a waiting thread loads it itself.
        ``ahead=True`` marks a read ahead of use: its time is not a wait, and it
        returns None and loads nothing when the chunks held and the loads in flight
        leave no room for one more (it would evict a chunk that is still to be
        served, and that chunk would be read again). ``wanted`` is asked, under the
        cache's lock, before a load starts: False returns None and loads nothing (a
        read ahead of a chunk whose patches were all served while it waited).
        """
        started = time.perf_counter()
        while True:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None:
                    self._entries.move_to_end(key)
                    if not ahead:
                        self._unasked.pop(key, None)
                    self._hits += 1
                    return entry[0]
                pending = self._pending.get(key)
                if pending is None:
                    if wanted is not None and not wanted():
                        return None
                    if ahead and not self._room_for_one_more():
                        return None
                    pending = self._pending[key] = _Pending()
                    self._loads += 1
                    break
                self._hits += 1
            pending.done.wait()
            if not ahead:
                self._count_wait(started)
            if pending.error is None:
                return pending.value
            if isinstance(pending.error, Exception):
                raise pending.error
            with self._lock:
                self._hits -= 1  # the retry counts as this request
            started = time.perf_counter()
        try:
            value = load()
            pending.value = value
        except BaseException as error:
            pending.error = error
            raise
        finally:
            try:
                with self._lock:
                    del self._pending[key]
                    self._load_seconds += time.perf_counter() - started
                    if not ahead:
                        self._wait_seconds += time.perf_counter() - started
                    if pending.error is None:
                        self._loaded_bytes += nbytes_of(pending.value)
                        self._store(key, pending.value)
                        if ahead and key in self._entries:
                            self._unasked[key] = None
            finally:  # waiters must wake whatever happens above
                pending.done.set()
        return value

    def offer(self, key: Hashable, value: object) -> bool:
        """Hold ``value`` as the chunk under ``key`` unless it is held or being loaded.

        For chunks read together with another (one read of a run of neighbours):
        each counts as one load. Returns whether it was taken.
        """
        with self._lock:
            if key in self._entries or key in self._pending:
                return False
            self._loads += 1
            self._loaded_bytes += nbytes_of(value)
            self._store(key, value)
            return True

    def holds(self, key: Hashable) -> bool:
        """Whether the chunk under ``key`` is held or being loaded."""
        with self._lock:
            return key in self._entries or key in self._pending

    def _count_wait(self, started: float) -> None:
        with self._lock:
            self._wait_seconds += time.perf_counter() - started

    def get_or_frame(
        self, key: Hashable, serve: Callable[[object], object | None], load: Callable[[], object]
    ) -> tuple[bool, object]:
        """Return ``(True, chunk)``, or ``(False, serve(frame))`` when a frame can serve.

        The chunk under ``key`` if held; else the result of ``serve`` on its
        frame if a frame is held and ``serve`` does not return None; else the
        chunk, loaded as :meth:`get` does.
        """
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self._unasked.pop(key, None)
                self._hits += 1
                return True, entry[0]
            frame = self._entries.get(FrameKey(key))
        # Served outside the lock (a copy of a patch's worth): a frame is never
        # changed once kept, only dropped, and every other read waited on the copy.
        served = serve(frame[0]) if frame is not None else None
        if served is not None:
            with self._lock:
                if FrameKey(key) in self._entries:
                    self._entries.move_to_end(FrameKey(key))
                self._hits += 1
            return False, served
        return True, self.get(key, load)

    def release(self, key: Hashable, keep_frame: bool = False) -> None:
        """Drop the chunk under ``key``: the order says no patch needs it whole any more.

        With ``keep_frame``, its frame (``shrink``) takes its place, or it stays
        whole if it has none; else its frame goes too. Nothing happens to a load
        in flight, nor to a key not held.
        """
        if keep_frame:
            with self._lock:
                entry = self._entries.get(key)
            if entry is None:
                return
            # Cut outside the lock (a copy of the chunk's edges): every read waited on it.
            frame = self._frame_of(key, entry[0])
            with self._lock:
                # A chunk without a smaller frame stays whole: the patches to come need it.
                # One dropped or replaced meanwhile keeps what it has now.
                if frame is not None and self._entries.get(key) is entry:
                    self._drop(key)
                    self._hold_frame(key, frame)
            return
        with self._lock:
            for held in (key, FrameKey(key)):
                if held in self._entries:
                    self._drop(held)

    def _frame_of(self, key: Hashable, chunk: object) -> object | None:
        try:
            return self.shrink(key, chunk) if self.shrink is not None else None
        except Exception:  # a frame only spares a later read: go on without it
            return None

    def _keep_frame(self, key: Hashable, chunk: object) -> bool:
        frame = self._frame_of(key, chunk)
        if frame is None:
            return False
        self._hold_frame(key, frame)
        return True

    def _hold_frame(self, key: Hashable, frame: object) -> None:
        frame_size = nbytes_of(frame)
        self._entries[FrameKey(key)] = (frame, frame_size)
        self._bytes += frame_size

    def _room_for_one_more(self) -> bool:
        # The loads in flight land too: each counted as large as the largest chunk.
        coming = (len(self._pending) + 1) * self._largest
        return self._bytes + coming <= self.max_bytes

    def _store(self, key: Hashable, value: object) -> None:
        size = nbytes_of(value)
        self._largest = max(self._largest, size)
        if size > self.max_bytes:
            return
        if FrameKey(key) in self._entries:  # the chunk itself serves what its frame did
            self._drop(FrameKey(key))
        self._entries[key] = (value, size)
        self._bytes += size
        while self._bytes > self.max_bytes:
            victim = next((k for k in reversed(self._unasked) if k != key), None)
            if victim is None:
                victim = self._least_recent(key)
            evicted = self._drop(victim)
            self._evictions += 1
            if self.shrink is None or isinstance(victim, FrameKey):
                continue
            self._keep_frame(victim, evicted)
        self._peak_bytes = max(self._peak_bytes, self._bytes)

    def _least_recent(self, key: Hashable) -> Hashable:
        victim = next(k for k in self._entries if k != key)
        if self.shrink is not None:
            # Chunks first: a frame costs a fraction of one and serves its neighbours.
            victim = next(
                (k for k in self._entries if k != key and not isinstance(k, FrameKey)),
                victim,
            )
        return victim

    def _drop(self, key: Hashable) -> object:
        self._unasked.pop(key, None)
        value, size = self._entries.pop(key)
        self._bytes -= size
        return value

    def stats(self) -> CacheStats:
        """Return a snapshot of the counters."""
        with self._lock:
            return CacheStats(
                self._loads,
                self._hits,
                self._evictions,
                self._bytes,
                self._loaded_bytes,
                self._load_seconds,
                self._wait_seconds,
                self._peak_bytes,
            )

    def clear(self) -> None:
        """Drop every chunk and reset the counters."""
        with self._lock:
            self._entries.clear()
            self._unasked.clear()
            self._bytes = 0
            self._loads = self._hits = self._evictions = 0
            self._loaded_bytes = 0
            self._load_seconds = self._wait_seconds = 0.0
            self._peak_bytes = 0


def nbytes_of(value: object) -> int:
    """Bytes of the arrays in ``value``: an array, or dicts, lists, tuples and dataclasses of them.

    Examples
    --------
    >>> nbytes_of({"a": np.zeros(3), "b": [np.zeros(2, "f4"), None]})
    32
    """
    if isinstance(value, dict):
        return sum(nbytes_of(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(nbytes_of(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(nbytes_of(getattr(value, f.name)) for f in dataclasses.fields(value))
    return int(getattr(value, "nbytes", 0))


def assemble_patch(
    out: np.ndarray,
    axes: Sequence[int],
    anchor: Sequence[int],
    chunks: Sequence[tuple[tuple[slice, ...], np.ndarray]],
) -> np.ndarray:
    """Copy the parts of ``chunks`` that fall in the patch at ``anchor`` into ``out``.

    Parameters
    ----------
    out
        The patch buffer, already shaped and, for cells past the array's edge,
        filled with the pad value.
    axes
        Positions of the patched axes in ``out`` (and in every chunk).
    anchor
        Start of the patch per patched axis.
    chunks
        ``(region, values)`` pairs: a chunk's slices along the patched axes and
        its values (all of every other axis).

    Examples
    --------
    >>> a = np.arange(10)
    >>> pieces = [((slice(0, 4),), a[0:4]), ((slice(4, 8),), a[4:8])]
    >>> assemble_patch(np.zeros(3, int), [0], [3], pieces).tolist()
    [3, 4, 5]
    """
    for region, values in chunks:
        target = [slice(None)] * out.ndim
        source = [slice(None)] * out.ndim
        for ax, start, sl in zip(axes, anchor, region):
            lo = sl.start if sl.start > start else start
            hi = min(sl.stop, start + out.shape[ax])
            target[ax] = slice(lo - start, hi - start)
            source[ax] = slice(lo - sl.start, hi - sl.start)
        out[tuple(target)] = values[tuple(source)]
    return out


def stored_array(array: da.Array) -> object | None:
    """Return the array a dask array reads its chunks from unchanged, or None.

    xarray opens a zarr, netCDF or GeoTIFF with dask chunks as two layers: the
    backend's lazily indexed array under an ``original-`` key, and one ``getter``
    task per chunk that slices it. Slicing that array directly reads the same
    values without building and running a graph per chunk (about 1.8 ms a
    chunk, 55 % of decoding a compressed 2 MiB zarr chunk: measured in
    ``benchmarks/bench_storage.py``). Anything else (a computed array, one
    rechunked or cast after opening) returns None: its graph is the only way.

    Examples
    --------
    >>> import xarray as xr
    >>> from zarr.storage import MemoryStore
    >>> store = MemoryStore()
    >>> _ = xr.Dataset({"v": ("x", np.arange(8.0))}).to_zarr(store, consolidated=False)
    >>> lazy = xr.open_zarr(store, consolidated=False)["v"].data
    >>> stored = stored_array(lazy)
    >>> np.asarray(stored[2:4]).tolist(), stored_array(lazy + 1)
    ([2.0, 3.0], None)
    """
    layers = array.__dask_graph__().layers
    if len(layers) != 2 or array.name not in layers:
        return None
    (name,) = set(layers) - {array.name}
    original = layers[name]
    if not name.startswith("original-") or len(original) != 1:
        return None
    stored = original[name] if name in original else None
    if getattr(stored, "shape", None) != array.shape or getattr(stored, "dtype", None) != (
        array.dtype
    ):
        return None
    return stored


def read_region(array: da.Array, axes: Sequence[int], region: Sequence[slice]) -> np.ndarray:
    """Compute ``region`` (slices along ``axes``, all of other axes) of a dask array.

    Runs on the calling thread. When the region is made of whole blocks of
    ``array``, their tasks are run directly: a block comes back as the task made
    it, not copied into a new array by dask's ``compute``, which halves the cost
    of reading an in-memory or cheap chunk; blocks that the graph holds as numpy
    arrays (``da.from_array``) are taken as they are. Treat the result as read-only.

    Examples
    --------
    >>> import dask.array as da
    >>> x = da.arange(12, chunks=4).reshape(2, 6).rechunk((1, 3))
    >>> read_region(x, [1], [slice(3, 6)]).tolist()
    [[3, 4, 5], [9, 10, 11]]
    """
    starts = [list(chunk_starts(c)) for c in array.chunks]
    ranges: list[range] = [range(len(c)) for c in array.chunks]
    whole_blocks = True
    for ax, sl in zip(axes, region):
        first = starts[ax].index(sl.start) if sl.start in starts[ax] else None
        last = starts[ax].index(sl.stop) if sl.stop in starts[ax] else None
        if first is None or last is None:
            whole_blocks = False
            break
        ranges[ax] = range(first, last)
    if not whole_blocks:
        index = [slice(None)] * array.ndim
        for ax, sl in zip(axes, region):
            index[ax] = sl
        (value,) = dask.compute(array[tuple(index)], scheduler="sync")
        return np.asarray(value)
    keys = [(array.name, *block) for block in itertools.product(*ranges)]
    held = _held_blocks(array, keys)
    if held is not None:
        blocks = held
    else:
        graph = array.__dask_graph__().cull(set(keys))
        blocks = dict(zip(keys, get_sync(graph, keys)))
    if len(keys) == 1:
        return np.asarray(blocks[keys[0]])
    from dask.array.core import concatenate3  # a dask array's region: dask.array is loaded

    return concatenate3(_nest(blocks, array.name, ranges, ()))


def _held_blocks(array: da.Array, keys: list[tuple]) -> dict | None:
    """Return the blocks ``keys`` if the graph holds them as numpy arrays, else None.

    ``da.from_array`` of a numpy array (without a lock) and xarray's ``.chunk()``
    keep each block in the graph: nothing is computed, and culling the graph and
    running the scheduler took 100-250 us per chunk of a Grain epoch (4 ms of 62).
    A masked array, a lock or any task falls back to computing.
    """
    layer = array.__dask_graph__().layers.get(array.name)
    if not isinstance(layer, MaterializedLayer):
        return None  # a layer of tasks (e.g. Blockwise) would materialise whole on lookup
    blocks = {}
    for key in keys:
        value = layer.mapping.get(key)
        if type(value) is not np.ndarray:  # a task, an alias, a subclass: compute it
            return None
        blocks[key] = value
    return blocks


def _nest(blocks: dict, name: str, ranges: list[range], prefix: tuple) -> list | np.ndarray:
    """Nest the blocks of ``ranges`` in lists, as ``concatenate3`` takes them."""
    # Module-level: a closure calling itself is a reference cycle, which would keep
    # the blocks (a region's chunks) alive until a gc pass.
    if len(prefix) == len(ranges):
        return np.asarray(blocks[(name, *prefix)])
    return [_nest(blocks, name, ranges, (*prefix, b)) for b in ranges[len(prefix)]]
