"""Read whole chunks of a zarr array on the calling thread, not through zarr's event loop.

``zarr.Array.__getitem__`` hands every read to zarr's event loop, whose worker
threads fetch the chunk's bytes and decode them: each chunk passes the GIL between
four threads, and under Grain's read threads on 2 cores every pass waits its turn.
Read here, a chunk's bytes come from the store on the calling thread (a local folder
or memory as zarr's stores read them; an object store through obstore's synchronous
calls, which wait with the GIL released: :mod:`xpatch.grain.object_store`; else from
zarr's event loop) and its codecs decode them on the calling thread, releasing the GIL
where they decompress. The 512 chunks of the 1 GiB zarr of
``benchmarks/bench_storage.py``, read one after another by one thread: 1.0 s so,
1.5-2.0 s through zarr; a shuffled epoch through Grain's 16 read threads went from
1.8x to 1.3-1.6x the time of zarr decoding each chunk once.

Only what can be decoded exactly this way is: a regular chunk grid, no sharding;
zarr v3 with codecs that decode without the event loop (``bytes``, ``zstd``,
``blosc``, ``gzip``, ``transpose``, ``crc32c``), or zarr v2 of numbers, dates or
booleans (its numcodecs compressor and filters). The first chunk each process reads
is checked against zarr's own read of it; should they ever differ, zarr reads
everything from then on and a warning says so.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from itertools import product
from typing import Literal, TypeVar

import numpy as np

from xpatch.grain.disk_cache import DiskChunks
from xpatch.grain.object_store import object_store_of
from xpatch.grain.store_wait import RoundTrips, note_store_wait, store_wait
from xpatch.grain.threads import IdlePool

#: Threads that wait for an object store's bytes, the variables of a chunk side by side;
#: as many again fetch the bytes of chunks a sweep decodes next (``ZarrChunks.fetch_ahead``).
FETCH_THREADS = 16
#: Chunks of one array whose bytes are fetched ahead and not decoded yet, at most: a bound
#: should fetches be left unclaimed (a sweep forgets those of the chunks it drops).
MOST_FETCHED = 64

_pools: dict[str, tuple[int, IdlePool]] = {}
_pool_lock = threading.Lock()
T = TypeVar("T")


class ChunkReadError(OSError):
    """A chunk of stored data could not be read or decoded: the message says which and where.

    Raised from the store's or codec's own error (``__cause__``), which names neither
    the variable, nor the chunk, nor the store.
    """


def _process_pool(kind: Literal["decode", "fetch", "fetch ahead"]) -> IdlePool:
    # One per process: a pool inherited through fork has no threads behind it. Decoding
    # is work (as many threads as cores); fetching from an object store is waiting.
    # Fetches ahead have a pool of their own: a read waiting for one in the "fetch"
    # pool must never wait behind itself. Its threads end when idle: none outlives the
    # pipeline that read through it.
    with _pool_lock:
        held = _pools.get(kind)
        if held is None or held[0] != os.getpid():
            size = (os.cpu_count() or 1) if kind == "decode" else FETCH_THREADS
            name = f"xpatch-{kind.replace(' ', '-')}"
            held = _pools[kind] = (os.getpid(), IdlePool(size, name))
        return held[1]


def side_by_side(reads: Sequence[Callable[[], T]], kind: Literal["decode", "fetch"]) -> list[T]:
    """Return the results of ``reads`` run side by side in this process's ``kind`` pool.

    Each waited for its store (:mod:`xpatch.grain.store_wait`) on a thread of the
    pool; the caller notes the longest of those waits as its own.

    Examples
    --------
    >>> side_by_side([lambda: 1, lambda: 2], "fetch")
    [1, 2]
    """

    def timed(read: Callable[[], T]) -> tuple[T, float]:
        with store_wait() as waited:
            value = read()
        return value, waited.seconds

    pool = _process_pool(kind)
    results = [future.result() for future in [pool.submit(timed, read) for read in reads]]
    note_store_wait(max((seconds for _, seconds in results), default=0.0))
    return [value for value, _ in results]


def chunk_coords(
    shape: Sequence[int], chunk_shape: Sequence[int], index: Sequence[slice]
) -> list[tuple[int, ...]]:
    """Return the coordinates of the chunks that ``index`` (slices of steps of 1) touches.

    Examples
    --------
    >>> chunk_coords((6, 5), (4, 4), (slice(2, 6), slice(0, 2)))
    [(0, 0), (1, 0)]
    """
    bounds = [sl.indices(n)[:2] for sl, n in zip(index, shape)]
    ranges = [
        range(start // c, -(-stop // c)) if stop > start else range(0)
        for (start, stop), c in zip(bounds, chunk_shape)
    ]
    return list(product(*ranges))


def where_in(array: object, index: Sequence[slice]) -> str:
    """Name the chunks of zarr array ``array`` that ``index`` touches, by key, and the store.

    Examples
    --------
    >>> import zarr
    >>> from zarr.storage import MemoryStore
    >>> z = zarr.create_array(MemoryStore(), shape=(6, 5), chunks=(4, 4), dtype="int32")
    >>> where_in(z, (slice(2, 6), slice(0, 2)))  # doctest: +ELLIPSIS
    "chunks 'c/0/0', 'c/1/0' of the zarr array at memory://..."
    """
    try:
        coords = chunk_coords(array.shape, array.chunks, index)
        keys = [array.metadata.encode_chunk_key(c) for c in coords]
    except Exception:  # a zarr without these: the store alone
        return f"the zarr array at {array.store_path}"
    named = ", ".join(repr(key) for key in keys)
    return f"chunk{'s' if len(keys) != 1 else ''} {named} of the zarr array at {array.store_path}"


def error_text(error: BaseException) -> str:
    """``"Type: message"`` of ``error``, for a message that wraps it."""
    return f"{type(error).__name__}: {error}"


class ZarrChunks:
    """Slice a zarr array by whole chunks, decoding them on the calling thread.

    Built by :meth:`of`, which returns None for arrays it cannot read exactly.
    ``chunks[index]`` takes a tuple of slices (steps of 1) and returns a numpy
    array, read-only when it is one chunk as decoded.

    Examples
    --------
    >>> import numpy as np, zarr
    >>> from zarr.storage import MemoryStore
    >>> z = zarr.create_array(MemoryStore(), shape=(6, 5), chunks=(4, 4), dtype="int32")
    >>> z[...] = np.arange(30).reshape(6, 5)
    >>> chunks = ZarrChunks.of(z)
    >>> chunks[0:6, 4:5].ravel().tolist()
    [4, 9, 14, 19, 24, 29]
    """

    def __init__(self, array, codecs: tuple, chunk_shape: tuple[int, ...]) -> None:
        from zarr.abc.store import SupportsGetSync

        self.array = array
        #: Whether reads wait for an object store (bytes only on zarr's event loop):
        #: several variables' chunks are then best fetched side by side.
        self.waits_on_store = not isinstance(array.store_path.store, SupportsGetSync)
        #: The object store's bytes fetched on the calling thread, the interpreter lock
        #: released while it waits (obstore); None: through zarr's event loop.
        self.object_store = (
            object_store_of(array.store_path.store, array.store_path.path)
            if self.waits_on_store
            else None
        )
        self.shape = tuple(array.shape)
        self.dtype = np.dtype(array.dtype)
        self.ndim = len(self.shape)
        self._codecs = codecs
        self._chunk_shape = chunk_shape
        self._specs: list | None = None
        self._checked = False
        self._trusted = True
        self._lock = threading.Lock()
        #: The stored bytes of chunks fetched ahead of their decoding, by chunk coordinates.
        self._fetched: dict[tuple[int, ...], Future] = {}
        self._fetch_lock = threading.Lock()
        #: The object store's fetches out, and how many queue (``fetch_ahead("auto")``).
        self.round_trips = RoundTrips()
        #: Decoded chunks on local disk (``cache_dir=``), read before the store and
        #: written after it; None: every chunk comes from the store.
        self.disk: DiskChunks | None = None

    @classmethod
    def of(cls, array) -> ZarrChunks | None:
        """Return a chunk reader of zarr array ``array``, or None when it takes zarr's reads."""
        try:
            from zarr.abc.codec import (
                ArrayArrayCodec,
                ArrayBytesCodec,
                BytesBytesCodec,
                SupportsSyncCodec,
            )
            from zarr.core.chunk_grids import RegularChunkGrid
        except ImportError:  # another zarr: its own reads are always right
            return None
        metadata = getattr(array, "metadata", None)
        zarr_format = getattr(metadata, "zarr_format", None)
        if zarr_format == 2:
            if np.dtype(array.dtype).kind not in "biufcmM":
                return None  # objects, strings: zarr's own decoding
            codecs = (V2Decode(metadata.filters, metadata.compressor),)
            return cls(array, codecs, tuple(int(n) for n in metadata.chunks))
        if zarr_format != 3 or not isinstance(metadata.chunk_grid, RegularChunkGrid):
            return None
        codecs = tuple(metadata.codecs)
        if not all(isinstance(c, SupportsSyncCodec) for c in codecs):
            return None  # sharding, or a codec that decodes only on the event loop
        kinds = [
            [isinstance(c, kind) for kind in (ArrayArrayCodec, ArrayBytesCodec, BytesBytesCodec)]
            for c in codecs
        ]
        stages = [row.index(True) if sum(row) == 1 else -1 for row in kinds]
        if -1 in stages or stages != sorted(stages) or stages.count(1) != 1:
            return None  # not the chain zarr itself would accept
        return cls(array, codecs, tuple(int(n) for n in metadata.chunk_grid.chunk_shape))

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_lock"], state["_fetch_lock"]
        state["_fetched"] = {}  # fetches are this process's
        state["_specs"] = None
        state["_checked"] = False  # checked again in each process
        return state

    def __setstate__(self, state: dict) -> None:
        state = {"_fetched": {}, "round_trips": RoundTrips(), **state}
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._fetch_lock = threading.Lock()

    def __getitem__(self, index: Sequence[slice]) -> np.ndarray:
        index = tuple(index)
        failed: ChunkReadError | None = None
        if self._trusted:
            fresh: list[bool] = []
            try:
                values = self._read(index, fresh)
            except ChunkReadError as error:  # zarr's own read below reads it, or fails too
                values, failed = None, error
            except Exception:  # zarr's own read below says what is wrong, or reads it
                values = None
            # Only what was decoded here is checked: chunks from the disk cache were
            # decoded by a process whose check passed, and checking them would read the
            # store again.
            if values is not None and not self._checked and any(fresh):
                with self._lock:
                    if not self._checked:
                        self._check(index, values)
                        self._checked = True
            if values is not None and self._trusted:
                return values
        try:
            return np.asarray(self.array[index])
        except Exception as error:
            if failed is not None:  # it names the chunk; zarr's error is its context
                raise failed from failed.__cause__
            raise ChunkReadError(f"{where_in(self.array, index)}: {error_text(error)}") from error

    @property
    def chunk_shape(self) -> tuple[int, ...]:
        """The shape of the array's stored chunks (the last along an axis may be cut)."""
        return self._chunk_shape

    @property
    def location(self) -> str:
        """Where the array is stored: its store and path, as zarr spells them."""
        return str(self.array.store_path)

    def _chunk_coords(self, index: tuple) -> list[tuple[int, ...]]:
        return chunk_coords(self.shape, self._chunk_shape, index)

    def _check(self, index: tuple, values: np.ndarray) -> None:
        # Values unlike zarr's own: zarr reads everything from now on.
        expected = np.asarray(self.array[index])
        same = values.shape == expected.shape and values.dtype == expected.dtype
        if same:
            equal_nan = values.dtype.kind in "fc"
            same = bool(np.array_equal(values, expected, equal_nan=equal_nan))
        if not same:
            self._trusted = False
            if self.disk is not None:  # what this process wrote there is as wrong
                self.disk.clear()
                self.disk = None
            warnings.warn(
                f"xpatch's direct reads of the zarr array {self.array.store_path} gave "
                "other values than zarr's: it is read through zarr from now on (slower). "
                "Please report it with the array's codecs.",
                RuntimeWarning,
                stacklevel=4,
            )

    def _read(self, index: tuple, fresh: list[bool]) -> np.ndarray:
        # ``fresh`` gets, per chunk, whether it was decoded from the store (not the disk).
        bounds = [sl.indices(n)[:2] for sl, n in zip(index, self.shape)]
        coords = self._chunk_coords(index)
        if len(coords) == 1:
            chunk = self._chunk(coords[0], fresh)
            cut = tuple(
                slice(start - i * c, stop - i * c)
                for (start, stop), i, c in zip(bounds, coords[0], self._chunk_shape)
            )
            return chunk[cut]
        out = np.empty([stop - start for start, stop in bounds], self.dtype)

        def place(chunk_coords: tuple[int, ...]) -> None:
            chunk = self._chunk(chunk_coords, fresh)
            target, source = [], []
            for (start, stop), i, c in zip(bounds, chunk_coords, self._chunk_shape):
                lo, hi = max(start, i * c), min(stop, (i + 1) * c)
                target.append(slice(lo - start, hi - start))
                source.append(slice(lo - i * c, hi - i * c))
            out[tuple(target)] = chunk[tuple(source)]

        # Several chunks are decoded side by side, as zarr would (patches read in index
        # order, a run of 4 chunks per read: 0.8-0.9x the floor so, 1.2x one by one).
        side_by_side([lambda c=c: place(c) for c in coords], "decode")
        return out

    def _chunk(self, chunk_coords: tuple[int, ...], fresh: list[bool]) -> np.ndarray:
        """Chunk ``chunk_coords`` from the disk cache, else decoded from the store (and kept)."""
        disk = self.disk
        if disk is not None:
            values = disk.get(chunk_coords, self._chunk_shape, self.dtype)
            if values is not None:
                values.setflags(write=False)
                fresh.append(False)
                return values
        values = self._decoded(chunk_coords)
        fresh.append(True)
        if disk is not None:
            disk.put(chunk_coords, values)
        return values

    def _chunk_specs(self) -> list:
        # What each codec decodes against: the spec it was given on the way in.
        if self._specs is None:
            from zarr.core.buffer import default_buffer_prototype

            zeros = (0,) * self.ndim
            config = self.array._async_array.config
            spec = self.array.metadata.get_chunk_spec(zeros, config, default_buffer_prototype())
            specs = []
            for codec in self._codecs:
                specs.append(spec)
                spec = codec.resolve_metadata(spec)
            self._specs = specs
        return self._specs

    def _fetch_object(self, key: str, prototype):
        """Return chunk ``key``'s bytes via obstore; should it fail, zarr fetches from then on.

        obstore may not reach what s3fs reaches (an AWS profile, a bucket outside the
        region given): then zarr's event loop fetches this chunk and all the others.
        """
        from zarr.core.sync import sync

        reader = self.object_store
        try:
            fetched = reader.fetch(key)
        except Exception as error:
            raw = sync((self.array.store_path / key).get(prototype=prototype))
            self.object_store = None  # zarr read it where obstore could not
            warnings.warn(
                f"obstore could not read {reader.description or self.location} "
                f"({error_text(error)}); its chunks are read through zarr's own store "
                "from now on (slower).",
                RuntimeWarning,
                stacklevel=2,
            )
            return raw
        return None if fetched is None else prototype.buffer.from_bytes(fetched)

    def fetch_ahead(self, index: Sequence[slice]) -> None:
        """Start fetching the stored bytes of the chunks ``index`` touches, to decode later.

        Only from a store that keeps reads waiting (an object store): the bytes come on
        threads of their own while the chunk's decoding waits its turn, and the chunk's
        read (:meth:`__getitem__`) takes them. Chunks held on the disk cache, fetched
        already, or beyond :data:`MOST_FETCHED` are left alone. What a read never takes
        stays until :meth:`forget`.
        """
        if not self.waits_on_store or not self._trusted:
            return
        for coords in self._chunk_coords(tuple(index)):
            disk = self.disk
            if disk is not None and disk.path(coords).exists():
                continue
            with self._fetch_lock:
                if coords in self._fetched or len(self._fetched) >= MOST_FETCHED:
                    continue
                self._fetched[coords] = self._start_fetch(coords)

    def _start_fetch(self, chunk_coords: tuple[int, ...]) -> Future:
        # Through obstore, a thread waits with the interpreter lock released. A store
        # that reads only on zarr's event loop gets the read as a task of that loop:
        # no thread of ours waits on it (as fast, measured, and 16 threads fewer).
        try:
            from zarr.core.sync import _get_loop
        except ImportError:  # another zarr: a thread waits on its loop instead
            _get_loop = None
        if self.object_store is not None or _get_loop is None:
            return _process_pool("fetch ahead").submit(self._fetch, chunk_coords)
        import asyncio

        _, store_path, prototype = self._stored_at(chunk_coords)

        async def read():
            with self.round_trips.timing():
                return await store_path.get(prototype=prototype)

        return asyncio.run_coroutine_threadsafe(read(), _get_loop())

    def forget(self, index: Sequence[slice]) -> None:
        """Let go of the bytes fetched ahead of the chunks ``index`` touches: none is read now."""
        if not self._fetched:
            return
        with self._fetch_lock:
            dropped = [self._fetched.pop(c, None) for c in self._chunk_coords(tuple(index))]
        for future in dropped:
            if future is not None:
                future.cancel()  # still queued: never fetched

    def fetched_count(self) -> int:
        """Chunks whose bytes were fetched ahead (or are being fetched) and not decoded yet."""
        return len(self._fetched)

    def _stored_at(self, chunk_coords: tuple[int, ...]) -> tuple[str, object, object]:
        """Return chunk ``chunk_coords``'s key, its path in the store, and its buffer prototype."""
        key = self.array.metadata.encode_chunk_key(chunk_coords)
        return key, self.array.store_path / key, self._chunk_specs()[0].prototype

    def _where(self, key: str, chunk_coords: tuple[int, ...]) -> str:
        return f"chunk {key!r} (chunk {chunk_coords}) of the zarr array at {self.location}"

    def _fetch(self, chunk_coords: tuple[int, ...]):
        """Return the stored bytes of chunk ``chunk_coords`` (None: never written)."""
        from zarr.abc.store import SupportsGetSync
        from zarr.core.sync import sync

        key, store_path, prototype = self._stored_at(chunk_coords)
        try:
            if isinstance(store_path.store, SupportsGetSync):  # a folder, memory
                return store_path.get_sync(prototype=prototype)
            with self.round_trips.timing():
                if self.object_store is not None:  # obstore, on this thread, lock released
                    return self._fetch_object(key, prototype)
                # An object store reads only on the event loop: the bytes come from there.
                return sync(store_path.get(prototype=prototype))
        except Exception as error:
            where = self._where(key, chunk_coords)
            raise ChunkReadError(f"could not fetch {where}: {error_text(error)}") from error

    def _stored_bytes(self, chunk_coords: tuple[int, ...]):
        """Return chunk ``chunk_coords``'s stored bytes: fetched ahead if they were, else now."""
        with self._fetch_lock:
            fetched = self._fetched.pop(chunk_coords, None)
        asked = time.monotonic()
        try:
            raw = fetched.result() if fetched is not None else self._fetch(chunk_coords)
        except Exception:
            if fetched is None:
                raise
            raw = self._fetch(chunk_coords)  # a failed fetch ahead: its error is raised here
        note_store_wait(time.monotonic() - asked)
        return raw

    def _decoded(self, chunk_coords: tuple[int, ...]) -> np.ndarray:
        from zarr.core.codec_pipeline import fill_value_or_default

        specs = self._chunk_specs()
        raw = self._stored_bytes(chunk_coords)
        if raw is None:  # never written: zarr's fill value
            values = np.full(self._chunk_shape, fill_value_or_default(specs[0]), self.dtype)
        else:
            data = raw
            started = time.perf_counter()
            try:
                for codec, spec in zip(reversed(self._codecs), reversed(specs)):
                    data = codec._decode_sync(data, spec)
                values = data.as_numpy_array().view()
            except Exception as error:  # a damaged or truncated chunk, most likely
                where = self._where(
                    self.array.metadata.encode_chunk_key(chunk_coords), chunk_coords
                )
                raise ChunkReadError(
                    f"could not decode {where} ({len(raw)} bytes stored; damaged or "
                    f"truncated?): {error_text(error)}"
                ) from error
            if self.waits_on_store:  # how many fetches ahead pay (fetch_ahead("auto"))
                self.round_trips.decoded(time.perf_counter() - started)
        if values.dtype != self.dtype or values.shape != self._chunk_shape:
            raise ValueError(  # zarr reads it instead
                f"decoded a {values.shape} {values.dtype} chunk of a zarr array of "
                f"{self._chunk_shape} {self.dtype} chunks"
            )
        values.setflags(write=False)
        return values


class V2Decode:
    """Decode a zarr v2 chunk on the calling thread, as zarr's own ``V2Codec`` does.

    ``V2Codec`` decodes only on zarr's event loop, in threads it starts per chunk;
    these are its steps (decompress, undo the filters, view as the dtype, reshape
    in the array's order), for dtypes other than objects.

    Examples
    --------
    >>> import numpy as np, zarr
    >>> from zarr.storage import MemoryStore
    >>> z = zarr.create_array(MemoryStore(), shape=(6, 5), chunks=(4, 4), dtype="f4", zarr_format=2)
    >>> z[...] = np.arange(30).reshape(6, 5)
    >>> chunks = ZarrChunks.of(z)
    >>> chunks[4:6, 3:5].tolist()
    [[23.0, 24.0], [28.0, 29.0]]
    """

    def __init__(self, filters, compressor) -> None:
        self.filters = tuple(filters or ())
        self.compressor = compressor

    def resolve_metadata(self, spec):
        """Return the chunk spec the bytes decode against: the array's own."""
        return spec

    def _decode_sync(self, data, spec):
        from numcodecs.compat import ensure_ndarray_like
        from zarr.registry import get_ndbuffer_class

        chunk = data.as_array_like()
        if self.compressor:
            chunk = self.compressor.decode(chunk)
        for codec in reversed(self.filters):
            chunk = codec.decode(chunk)
        chunk = ensure_ndarray_like(chunk).view(spec.dtype.to_native_dtype())
        chunk = chunk.reshape(-1, order="A").reshape(spec.shape, order=spec.order)
        return get_ndbuffer_class().from_ndarray_like(chunk)
