"""What every xpatch data source shares: the chunk-local order, the fingerprint, Grain.

:class:`Source` is the base of :class:`~xpatch.grain.PatchSource`,
:class:`~xpatch.scenes.SceneSource` and :class:`~xpatch.tree.TreeSource`. A
source holds two contracts. Its items: how long it is, how to read item ``i``
and what identifies it (:meth:`Source.make_fingerprint`). Its chunk reads
(:class:`~xpatch.grain.readahead.ChunkReads`): which chunks each patch belongs
to and touches, and how they are read ahead and let go, done by the object
:attr:`Source.chunk_reads` hands (the source itself when it reads its own
chunks). This class turns the two into the chunk-local shuffle
(:meth:`Source.chunk_shuffle`, one implementation of the order, the sharding and
the dealing to worker processes), the cached :attr:`Source.fingerprint` and the
fingerprinted checkpoints (:meth:`Source.with_fingerprint`). A new source
subclasses it in its own folder; one whose items are built from another source's
items subclasses :class:`WrappedSource`, which hands the inner source's chunk reads.

The sources need only numpy; their pipeline methods import Grain
(:mod:`xpatch.grain.datasets`), which ``pip install "xarray-patch[grain]"`` brings.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Literal

import numpy as np

from xpatch.core.chunk_cache import CacheStats
from xpatch.core.errors import OptionError
from xpatch.core.shuffle import check_count, check_seed, chunk_local_permutation
from xpatch.core.sweep import sweep_permutation, sweep_ranks
from xpatch.grain.memory import MemoryReport, memory_report
from xpatch.grain.readahead import ChunkReads, patch_sources, round_trips_of
from xpatch.grain.store_wait import RoundTrips

GRAIN_HINT = 'pip install "xarray-patch[grain]" (or pip install grain)'


def require_grain():
    """Import grain, or raise an ImportError that says what to install."""
    try:
        return importlib.import_module("grain")
    except ImportError as error:
        raise ImportError(f"this needs Grain: {GRAIN_HINT}.") from error


def mark_absl_flags_parsed() -> None:
    """Mark absl's flags parsed, which Grain's worker processes need.

    grain 0.2.18 reads absl flags when it starts worker processes and raises
    ``UnparsedFlagAccessError`` when no program parsed them (grain issue 1355),
    as in any script or notebook that does not run under ``absl.app``. Flags
    already parsed are left alone.
    """
    try:
        from absl import flags
    except ImportError:  # grain brings absl; without it there is nothing to do
        return
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


class Source:
    """Random access to patches, with a chunk-local order and a fingerprint (a base class).

    Subclasses define the items (``__len__``, ``__getitem__``, :attr:`patcher`,
    :attr:`variables`, :meth:`make_fingerprint`, and ``self._fingerprint = None``
    when built) and the chunk reads: either the methods of
    :class:`~xpatch.grain.readahead.ChunkReads` on the source itself (its
    :attr:`chunk_reads` is then itself), or :attr:`chunk_reads` handing another
    object that has them (as :class:`WrappedSource` hands its inner source's).
    """

    _fingerprint: str | None = None

    def __len__(self) -> int:  # pragma: no cover - every source defines it
        raise NotImplementedError

    def __getitem__(self, index: int) -> dict:  # pragma: no cover - every source defines it
        raise NotImplementedError

    def __getitems__(self, indices: Sequence[int]) -> list[dict]:
        """Items ``indices``, in their order: the batched read PyTorch's ``DataLoader`` asks for.

        With a ``sampler`` or ``batch_sampler``, ``DataLoader`` hands a whole batch of
        indices to one call; reading them in one place keeps their chunks together in
        the cache.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> src = xr.DataArray(np.arange(64.0).reshape(8, 8), dims=("y", "x")).patch(
        ...     y=4, x=4).to_grain()
        >>> [int(item["index"]) for item in src.__getitems__([3, 0])]
        [3, 0]
        """
        return [self[int(i)] for i in indices]

    def anchor_chunks_per_batch(self, order: Sequence[int], batch_size: int = 16) -> float:
        """Return the mean number of distinct chunks holding the anchors of a batch.

        How mixed an order's batches are: ``batch_size`` for a global shuffle of data
        of many chunks, 1 when each batch comes from one chunk. Batches are
        ``batch_size`` consecutive elements of ``order``; a last partial one is left out.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da_ = xr.DataArray(np.zeros((64, 64)), dims=("y", "x")).chunk(16)
        >>> src = da_.patch(y=8, x=8).to_grain()
        >>> src.anchor_chunks_per_batch(np.arange(len(src)), batch_size=4)  # chunk by chunk
        1.0
        >>> src.anchor_chunks_per_batch(src.chunk_shuffled_order(seed=0), batch_size=4) > 1
        True
        """
        chunks = self.chunk_reads.chunk_of_patch()[np.asarray(order)]
        whole = len(chunks) // batch_size * batch_size
        if whole == 0:
            raise OptionError(
                f"batch_size={batch_size} is more than the {len(chunks)} elements of the order."
            )
        rows = np.sort(chunks[:whole].reshape(-1, batch_size), axis=1)
        return float(((np.diff(rows, axis=1) != 0).sum(axis=1) + 1).mean())

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        mark_absl_flags_parsed()

    @property
    def patcher(self) -> Any:  # pragma: no cover - every source defines it
        """What the source was built from (its layout)."""
        raise NotImplementedError

    @property
    def variables(self) -> tuple[Hashable, ...]:  # pragma: no cover - every source defines it
        """The data keys of an item."""
        raise NotImplementedError

    def make_fingerprint(self) -> str:  # pragma: no cover - every source defines it
        """Compute the 16 hex digits of :attr:`fingerprint`."""
        raise NotImplementedError

    @property
    def chunk_reads(self) -> ChunkReads:
        """What reads this source's chunks (:class:`~xpatch.grain.readahead.ChunkReads`).

        The chunk-local orders and the sweep's reads ahead talk to it, never to the
        items: a source that reads its own chunks (the default) is its own; a
        :class:`WrappedSource` hands its inner source's.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> src = xr.DataArray(np.zeros((8, 8)), dims=("y", "x")).patch(y=4, x=4).to_grain()
        >>> src.chunk_reads is src
        True
        """
        return self

    @property
    def fingerprint(self) -> str:
        """16 hex digits that identify the patches this source serves: layout and data.

        Computed on first use (``repr`` shows it) and pickled with the source; the
        same construction gives the same fingerprint in every process.
        """
        if self._fingerprint is None:
            self._fingerprint = self.make_fingerprint()
        return self._fingerprint

    # -- pipelines --------------------------------------------------------------------

    def chunk_shuffled_order(
        self,
        seed: int,
        epoch: int = 0,
        order: Literal["sweep", "chunk"] = "sweep",
        mix: int | None = None,
    ) -> np.ndarray:
        """Return the patch order of a chunk-shuffled epoch (an array of indices).

        The same order :meth:`chunk_shuffle` serves (one process, the whole
        source), without Grain: a sampler for PyTorch's ``DataLoader(src,
        sampler=...)`` or any other loop. Nothing is read ahead along it.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da_ = xr.DataArray(np.zeros((64, 64)), dims=("y", "x")).chunk(32)
        >>> src = da_.patch(y=16, x=16).to_grain()
        >>> order = src.chunk_shuffled_order(seed=0)
        >>> sorted(order.tolist()) == list(range(16))
        True
        >>> bool((order != src.chunk_shuffled_order(seed=0, epoch=1)).any())
        True
        """
        check_seed(seed)
        reads = self.chunk_reads
        if order == "chunk":
            return chunk_local_permutation(reads.shuffle_groups(), seed, epoch)
        if order != "sweep":
            raise OptionError(f"order={order!r} is not one of ('sweep', 'chunk').")
        mix, _ = reads.sweep_settings(None if mix is None else check_count("mix", mix), None)
        ranks, _ = sweep_ranks(reads.chunk_grids(), seed, epoch)
        return sweep_permutation(reads.touched_chunks(), ranks, mix, seed, epoch)

    def memory_report(
        self, batch_size: int = 1, read_options: Any = None, item_bytes: int | None = None
    ) -> MemoryReport:
        """State what a chunk-shuffled epoch holds in memory, computed before any read.

        One chunk (every variable), the sweep's working set (the chunks waiting
        for their next row, mixed, read ahead and of the positions in flight), the
        floor of ``cache_bytes`` below which a sweep reads chunks again, the
        loads in flight and Grain's batch queue (its prefetch buffer of elements,
        batches after ``.batch(batch_size)``). Print it, or read its numbers.

        Parameters
        ----------
        batch_size
            Items per element after the shuffle (``.batch(batch_size)``).
        read_options
            Grain's ``ReadOptions`` of the pipeline; default Grain's defaults.
        item_bytes
            Bytes of one item; default its data arrays (``item_spec``), or 0 if unknown.

        Returns
        -------
        xpatch.grain.memory.MemoryReport

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da_ = xr.DataArray(np.zeros((64, 64), "float32"), dims=("y", "x")).chunk(16)
        >>> report = da_.patch(y=8, x=8, stride=6).to_grain().memory_report(batch_size=4)
        >>> report.chunk_bytes, report.floor_bytes <= report.cache_bytes
        (1024, True)
        """
        return memory_report(self, batch_size, read_options, item_bytes)

    def fetch_ahead(self, chunks: int | Literal["auto"] = "auto") -> None:
        """Have a sweep fetch the stored bytes of up to ``chunks`` chunks beyond its reads ahead.

        For stores that keep each read waiting (an object store, tens of ms a read):
        the bytes of the chunks next in the sweep's order are fetched, compressed, on
        threads of their own, and decoded into the cache only when the reads ahead
        reach them, so the cache's budget holds decoded chunks and no waiting reads.
        The bytes are memory beyond ``cache_bytes``: :meth:`memory_report` states
        them (at most). Stores read without a wait (a local folder, memory) fetch
        nothing ahead. Set it before an epoch starts: a running sweep keeps what it
        began with.

        The default, ``"auto"``, fetches up to 16 chunks' bytes ahead: as many as keep
        the cores decoding (Little's law on the fetches' round trip and the chunks'
        decoding, twice over), and no more than the store answers without queueing
        them (TCP Vegas' rule; :class:`~xpatch.grain.store_wait.RoundTrips`). A far
        store that only keeps reads waiting gets 16; a local folder through obstore,
        whose bytes come within a decoding, none; a busy server few. On
        ``benchmarks/bench_storage.py``'s 1 GiB zarr it took an epoch of
        ``BatchSource`` from 1.75x zarr's concurrent read to 1.30x at 20 ms a read,
        from 1.65x to 0.79x at 50 ms (a fixed 16: 1.37x and 0.74x); from moto's S3
        server on the same two cores, where a fixed 4 or 16 made no epoch faster and
        held 10-25 MiB more, it held a few MiB more. An int fixes the count; 0 fetches
        nothing ahead.

        Parameters
        ----------
        chunks
            Chunks whose stored bytes may be fetched beyond the reads ahead: an int
            >= 0, or ``"auto"`` (up to 16, by the store's round trips).

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da_ = xr.DataArray(np.zeros((64, 64), "float32"), dims=("y", "x")).chunk(16)
        >>> src = da_.patch(y=8, x=8).to_grain()
        >>> src.fetch_ahead(8)
        >>> src.memory_report().fetched_chunks  # in memory: nothing waits for its bytes
        0
        """
        if chunks != "auto" and (
            isinstance(chunks, bool) or not isinstance(chunks, int | np.integer) or chunks < 0
        ):
            raise OptionError(
                f"fetch_ahead(chunks={chunks!r}): chunks must be an int >= 0 (the chunks "
                "whose stored bytes a sweep fetches beyond its reads ahead; 0: none) or "
                '"auto" (the default: up to 16, as many as the store answers without '
                "queueing them)."
            )
        for source in patch_sources(self.chunk_reads):
            source.reader.fetch_ahead_chunks = chunks if chunks == "auto" else int(chunks)

    def chunk_shuffle(
        self,
        dataset: Any = None,
        *,
        seed: int,
        shard_options: Any = None,
        worker_count: int = 1,
        batch_size: int = 1,
        order: Literal["sweep", "chunk"] = "sweep",
        mix: int | None = None,
        read_ahead: int | None = None,
    ) -> Any:
        """Shuffle so that each chunk is read once per epoch: a sweep, mixed, read ahead.

        Every epoch (every pass of ``len(self)`` indices, as after ``.repeat()``)
        has its own order, the same in every process for the same seed, and serves
        every patch once. The default order is a sweep (:mod:`xpatch.core.sweep`):
        each scene's chunks row after row (the scenes, the direction of every axis
        and the order of axes of as many chunks drawn at random per epoch), a patch
        coming when the last chunk it touches is visited, and the patches of
        ``mix`` consecutive chunks interleaved at random. The chunks waiting for
        their next row keep only the edges their straddling patches need (their
        frames), and the chunks of the coming positions are read in background
        threads while the current ones are served; a chunk is dropped as soon as
        no coming position needs it. Each chunk is then read and decoded once per
        epoch within a cache of a few percent of the data (figures in
        ``docs/storage.md``), where a random order of chunks reloaded a chunk for
        each neighbour whose straddling patches needed it.

        A batch of 16 holds patches of 8 or 9 chunks at the default ``mix``
        (a global shuffle: about 16); shuffle the batches, or raise ``mix`` with
        ``cache_bytes``, for more mixing. Its own iterators carry
        :attr:`fingerprint` in their state.

        Parameters
        ----------
        dataset
            A ``grain.MapDataset`` of ``len(self)`` elements whose element ``i``
            comes from patch ``i`` (``grain.MapDataset.source(src)``, maybe
            followed by ``.map``). Default: the source itself. So
            ``grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=42)``.
        seed
            The seed; ``0 <= seed < 2**32``.
        shard_options
            A ``grain.sharding.ShardOptions``: keep only this shard's share of the
            patches, a contiguous run of them in chunk order (split as Grain's
            ``IndexSampler`` splits its index), so shards do not overlap and share
            at most the chunks at their borders.
        worker_count, batch_size
            With ``.batch(batch_size)`` and ``mp_prefetch`` of ``worker_count``
            workers after the shuffle, give both: Grain hands worker ``w`` every
            ``worker_count``-th batch, so each epoch is dealt to the workers as
            contiguous runs of the order, and each worker reads only its own
            chunks (in its own cache) instead of every chunk.
        order
            ``"sweep"`` (default) as above; ``"chunk"``: chunks in a random order,
            each with its patches (xpatch's order before the sweep: it reads each
            chunk once only when the cache holds every chunk's frame besides a
            chunk, and reads nothing ahead).
        mix
            How many consecutive chunks of the sweep have their patches
            interleaved. Default: up to 12, as many as ``cache_bytes`` holds
            besides the chunks read ahead and the waiting row's frames.
        read_ahead
            How many chunks are read ahead of use, in as many threads (0: none).
            Default: up to 8, as ``cache_bytes`` allows.

        Returns
        -------
        grain.MapDataset

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da_ = xr.DataArray(np.zeros((64, 64)), dims=("y", "x")).chunk(16)
        >>> src = da_.patch(y=8, x=8, stride=6).to_grain()
        >>> order = [int(item["index"]) for item in src.chunk_shuffle(seed=0)]
        >>> sorted(order) == list(range(len(src))), src.cache_stats().loads  # 16 chunks
        (True, 16)
        """
        require_grain()
        from xpatch.grain.datasets import chunk_shuffle

        return chunk_shuffle(
            self,
            dataset,
            seed,
            shard_options,
            worker_count,
            batch_size,
            order,
            mix,
            read_ahead,
        )

    def with_fingerprint(self, dataset: Any) -> Any:
        """Put this source's :attr:`fingerprint` in the state of ``dataset``'s iterators.

        Grain's ``MapDataset`` pipelines save only a position (``{"next_index": n}``),
        which ``set_state`` applies to a pipeline over any source. Ending a pipeline
        with ``.pipe(src.with_fingerprint)`` nests that position under the
        fingerprint; ``set_state`` then raises :class:`~xpatch.OptionError` for a
        state saved from another source, or without a fingerprint. Put it last, after
        ``mp_prefetch``: before it, a worker refuses at the first ``next`` instead.
        Iterators of ``src.chunk_shuffle(...)`` itself carry the fingerprint already.

        Parameters
        ----------
        dataset
            A ``grain.IterDataset`` over this source's patches.

        Returns
        -------
        grain.IterDataset
            The same elements; state ``{"xpatch_fingerprint", "xpatch_layout", "pipeline"}``.

        Examples
        --------
        >>> import grain, numpy as np, xarray as xr, xpatch
        >>> da_ = xr.DataArray(np.zeros((64, 64)), dims=("y", "x")).chunk(32)
        >>> def pipeline(src):
        ...     return grain.MapDataset.source(src).batch(2).to_iter_dataset().pipe(
        ...         src.with_fingerprint)
        >>> src = da_.patch(y=16, x=16).to_grain()
        >>> iterator = iter(pipeline(src))
        >>> _ = next(iterator)
        >>> state = iterator.get_state()
        >>> state["xpatch_fingerprint"] == src.fingerprint, state["pipeline"]
        (True, {'next_index': 1})
        >>> iter(pipeline(da_.patch(y=16, x=16, stride=8).to_grain())).set_state(state)
        Traceback (most recent call last):
        ...
        xpatch.core.errors.OptionError: set_state: the checkpoint was saved from ...
        """
        require_grain()
        from xpatch.grain.datasets import FingerprintIterDataset

        return FingerprintIterDataset.wrap(dataset, self)


class WrappedSource(Source):
    """A source whose item ``i`` is built from item ``i`` of another source (a base class).

    The inner source does the chunk reads: :attr:`chunk_reads` is its, so
    :meth:`~Source.chunk_shuffle` orders, reads ahead and lets go of the inner
    source's chunks, each decoded once per epoch, and the cache is the inner
    source's. The chunk-read members are forwarded here, once for every wrapper.

    Subclasses define ``__getitem__`` (from ``self.inner[i]``) and
    :meth:`~Source.make_fingerprint` (the inner source's fingerprint and what the
    wrapper adds), and call ``super().__init__(inner)``; :attr:`patcher` and
    :attr:`variables` are the inner source's unless they say otherwise.

    Parameters
    ----------
    inner
        The source whose items are wrapped, one for one.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xpatch
    >>> from xpatch.grain.base import WrappedSource
    >>> class Doubled(WrappedSource):
    ...     def __getitem__(self, index):
    ...         item = self.inner[index]
    ...         return {**item, "data": 2 * item["data"]}
    ...     def make_fingerprint(self):
    ...         return ("doubled" + self.inner.fingerprint)[:16]
    >>> da_ = xr.DataArray(np.ones((8, 8)), dims=("y", "x")).chunk(4)
    >>> src = Doubled(da_.patch(y=4, x=4).to_grain())
    >>> src.chunk_reads is src.inner, float(src[0]["data"].sum()), src.chunk_count
    (True, 32.0, 4)
    """

    def __init__(self, inner: Source) -> None:
        self._inner = inner
        self._fingerprint = None

    def __len__(self) -> int:
        return len(self._inner)

    @property
    def inner(self) -> Source:
        """The source whose items are wrapped: its reads, its cache and its order."""
        return self._inner

    @property
    def chunk_reads(self) -> ChunkReads:
        """The inner source's chunk reads (:attr:`Source.chunk_reads`)."""
        return self._inner.chunk_reads

    @property
    def patcher(self) -> Any:
        """What the inner source was built from."""
        return self._inner.patcher

    @property
    def variables(self) -> tuple[Hashable, ...]:
        """The inner source's data keys."""
        return self._inner.variables

    # -- the inner source's chunks, for callers that ask the wrapper ---------------------

    def cache_stats(self) -> CacheStats:
        """Chunk loads and hits of this process (the inner source's cache)."""
        return self._inner.cache_stats()

    def clear_cache(self) -> None:
        """Drop the inner source's cached chunks and reset its counters."""
        self._inner.clear_cache()

    @property
    def chunk_count(self) -> int:
        """Number of the inner source's chunks."""
        return self._inner.chunk_count

    def chunk_of_patch(self) -> np.ndarray:
        """For every patch, the chunk holding its anchor (``chunk_reads.chunk_of_patch``)."""
        return self.chunk_reads.chunk_of_patch()

    def shuffle_groups(self) -> np.ndarray:
        """Return the groups ``order="chunk"`` visits (``chunk_reads.shuffle_groups``)."""
        return self.chunk_reads.shuffle_groups()

    def touched_chunks(self) -> np.ndarray:
        """Return the chunks each patch touches (``chunk_reads.touched_chunks``)."""
        return self.chunk_reads.touched_chunks()

    def chunk_grids(self) -> list[tuple[int, ...]]:
        """Return the chunk grid of each scene (``chunk_reads.chunk_grids``)."""
        return self.chunk_reads.chunk_grids()

    def sweep_settings(self, mix: int | None, ahead: int | None) -> tuple[int, int]:
        """Return ``(mix, ahead)`` of a sweep (``chunk_reads.sweep_settings``)."""
        return self.chunk_reads.sweep_settings(mix, ahead)

    def read_ahead(self, chunk: int, wanted: Callable[[], bool] | None = None) -> None:
        """Load chunk ``chunk`` ahead of use (``chunk_reads.read_ahead``)."""
        self.chunk_reads.read_ahead(chunk, wanted)

    def release(self, chunk: int, keep_frame: bool) -> None:
        """Drop chunk ``chunk`` (``chunk_reads.release``)."""
        self.chunk_reads.release(chunk, keep_frame)

    def fetch_depth(self) -> int:
        """Chunks whose bytes a sweep may fetch ahead (``chunk_reads.fetch_depth``)."""
        return self.chunk_reads.fetch_depth()

    def fetch_round_trips(self) -> RoundTrips | None:
        """Return the fetches that set how many go out ahead (``chunk_reads``')."""
        return round_trips_of(self.chunk_reads)

    def fetch_chunk_bytes(self, chunk: int) -> None:
        """Fetch chunk ``chunk``'s stored bytes (``chunk_reads.fetch_chunk_bytes``)."""
        self.chunk_reads.fetch_chunk_bytes(chunk)

    def set_sweep_direction(self, reversed_axes: list[tuple[bool, ...]]) -> None:
        """Face a sweep's direction (``chunk_reads.set_sweep_direction``)."""
        self.chunk_reads.set_sweep_direction(reversed_axes)
