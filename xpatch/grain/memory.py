"""What a chunk-shuffled run holds in memory, computed from the geometry before any read.

A sweep (:mod:`xpatch.core.sweep`) holds, besides the chunks waiting for their
next row (their frames, or themselves), the chunks of the positions in flight
(:func:`~xpatch.grain.readahead.sweep_span`), those mixed, those read ahead and
the one landing. Below the sum of these at the least mixing and reading ahead
(the *floor* of ``cache_bytes``) a sweep evicts chunks it still needs and reads
them again: :func:`check_floor` refuses such a budget before reading.
:func:`memory_report` states it all, with the loads in flight and Grain's batch
queue, as numbers (:class:`MemoryReport`) that print readably.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from xpatch.core.errors import OptionError
from xpatch.core.sweep import waiting_row
from xpatch.grain.readahead import fetch_depth_of, loads_at_once, patch_sources, sweep_span

#: Chunks a sweep holds whole at the least besides the span of the positions in flight:
#: the one mixed (``mix=1``), the one read ahead and the one landing in the cache.
FLOOR_CHUNKS = 3

#: Grain's ``ReadOptions()`` defaults (grain 0.2): read threads and prefetch buffer.
GRAIN_THREADS, GRAIN_PREFETCH = 16, 500

MiB = 2**20


@dataclass(frozen=True)
class SweepNeeds:
    """What a sweep over a source's chunks holds, in bytes (see :func:`sweep_needs`)."""

    chunk_bytes: int
    waiting_chunks: int
    waiting_bytes: int
    span_chunks: int
    cache_bytes: int

    @property
    def floor_bytes(self) -> int:
        """The least ``cache_bytes`` with which a sweep reads each chunk once."""
        return self.waiting_bytes + (FLOOR_CHUNKS + self.span_chunks) * self.chunk_bytes

    def working_bytes(self, mix: int, ahead: int) -> int:
        """Bytes held with ``mix`` chunks mixed and ``ahead`` read ahead."""
        whole = max(mix, 1) + ahead + 1 + self.span_chunks
        return self.waiting_bytes + whole * self.chunk_bytes


@dataclass(frozen=True)
class MemoryReport:
    """What a chunk-shuffled epoch holds, stated before any read (:func:`memory_report`).

    Attributes
    ----------
    chunk_bytes
        Bytes of the largest chunk, every variable read from chunks.
    chunk_count
        Chunks of the source.
    waiting_chunks, waiting_bytes
        Chunks waiting for their next row at most, and what they keep (frames or whole).
    span_chunks
        Chunks the positions in flight span (Grain's threads wait beyond them).
    mix, ahead
        The sweep's settings within ``cache_bytes``.
    working_bytes
        What the sweep holds in the cache at most: the waiting row, and the chunks
        mixed, read ahead, landing and of the positions in flight. While reads make
        progress: a read held back a second with nothing behind it in flight (a
        thread the machine did not run) starts the pass again where it is, one held
        five seconds goes on, and the cache may then hold up to ``cache_bytes``
        rather than stall.
    floor_bytes, floor_chunks
        The least ``cache_bytes`` with which each chunk is read once per epoch.
    cache_bytes
        The cache's byte limit.
    reads_in_flight, in_flight_bytes
        Chunk loads at once (whatever Grain's threads) and the bytes they decode.
    item_bytes, batch_size, prefetch, queue_bytes
        Bytes of one item's data arrays, the batch size, Grain's prefetch buffer
        (elements of the pipeline: batches after ``.batch``) and what it holds full.
    fetched_chunks, fetched_bytes
        Chunks whose stored bytes are fetched ahead of the reads at most
        (``src.fetch_ahead(n)``, from a store that keeps reads waiting), and those
        bytes counted as decoded chunks: compressed, they take less.
    """

    chunk_bytes: int
    chunk_count: int
    waiting_chunks: int
    waiting_bytes: int
    span_chunks: int
    mix: int
    ahead: int
    working_bytes: int
    floor_bytes: int
    floor_chunks: float
    cache_bytes: int
    reads_in_flight: int
    in_flight_bytes: int
    item_bytes: int
    batch_size: int
    prefetch: int
    queue_bytes: int
    fetched_chunks: int = 0
    fetched_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """The cache's working set (within its limit), loads and fetches in flight, the queue."""
        cache = min(self.working_bytes, self.cache_bytes)
        return cache + self.in_flight_bytes + self.fetched_bytes + self.queue_bytes

    @property
    def below_floor(self) -> bool:
        """Whether ``cache_bytes`` is below the floor (a sweep would read chunks again)."""
        return self.cache_bytes < self.floor_bytes

    def __str__(self) -> str:
        rows = [
            ("one chunk (all variables)", self.chunk_bytes, f"{self.chunk_count} chunks"),
            (
                "waiting row (frames)",
                self.waiting_bytes,
                f"{self.waiting_chunks} chunks waiting for their next row",
            ),
            (
                "sweep working set",
                self.working_bytes,
                f"mix={self.mix}, read_ahead={self.ahead}, positions in flight span "
                f"{self.span_chunks} chunks",
            ),
            (
                "floor of cache_bytes",
                self.floor_bytes,
                f"{self.floor_chunks:.1f} chunks; cache_bytes={_size(self.cache_bytes)}"
                + (" is BELOW it" if self.below_floor else ""),
            ),
            ("reads in flight", self.in_flight_bytes, f"{self.reads_in_flight} loads at once"),
            (
                "bytes fetched ahead",
                self.fetched_bytes,
                f"{self.fetched_chunks} chunks' stored bytes, counted as decoded",
            ),
            (
                "batch queue",
                self.queue_bytes,
                f"up to {self.prefetch} elements (Grain's prefetch) of {self.batch_size} items "
                f"of {_size(self.item_bytes)}",
            ),
            ("total", self.total_bytes, "cache (within its limit) + in flight + fetched + queue"),
        ]
        lines = ["MemoryReport (computed from the geometry, nothing read)"]
        lines += [f"  {name:<26} {_size(size):>10}  {note}" for name, size, note in rows]
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))


def _size(nbytes: int) -> str:
    """``nbytes`` in KiB, MiB or GiB, whichever reads best."""
    for unit, scale in (("GiB", 2**30), ("MiB", MiB), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def sweep_needs(reads: Any) -> SweepNeeds | None:
    """Return what a sweep over the chunks ``reads`` reads holds, or None if unknown.

    ``reads`` is a source's :attr:`~xpatch.grain.base.Source.chunk_reads`: a
    :class:`~xpatch.grain.PatchSource`, a scene source (its scenes share one cache)
    or a tree source (the sweep follows its reference node). Nothing is read:
    the frames are measured on the anchors.
    """
    sources = patch_sources(reads)
    if not sources:
        return None
    costs = [source.reader.sweep_costs() for source in sources]
    grids = [source.chunk_grids()[0] for source in sources]
    chunk_bytes = max(c for c, _ in costs)
    waiting = max(waiting_row(g) * share * c for g, (c, share) in zip(grids, costs))
    waiting_chunks = max(waiting_row(g) if share > 0 else 0 for g, (_, share) in zip(grids, costs))
    # A tree's reads have no chunk count of their own: the sweep's are its reference node's.
    span = sweep_span(len(reads), sum(source.chunk_count for source in sources))
    cache_bytes = sources[0].reader.cache.max_bytes
    return SweepNeeds(chunk_bytes, waiting_chunks, int(np.ceil(waiting)), span, cache_bytes)


def check_floor(reads: Any) -> None:
    """Raise :class:`~xpatch.OptionError` if the cache is below a sweep's floor.

    Before any read: below the floor, a sweep evicts chunks it still needs and
    reads each chunk several times (a 4 MiB budget over 180 chunks made 3,846 loads).
    """
    needs = sweep_needs(reads)
    if needs is None or needs.chunk_bytes == 0 or needs.cache_bytes >= needs.floor_bytes:
        return
    floor, chunk = needs.floor_bytes, max(needs.chunk_bytes, 1)
    raise OptionError(
        f"cache_bytes={needs.cache_bytes} ({needs.cache_bytes / MiB:.1f} MiB) is below the floor "
        f"of chunk_shuffle's sweep, {floor} bytes ({floor / MiB:.1f} MiB, {floor / chunk:.1f} "
        f"chunks of {chunk / MiB:.2f} MiB: {needs.waiting_chunks} chunks waiting for their next "
        f"row keep {needs.waiting_bytes / MiB:.1f} MiB, and {FLOOR_CHUNKS + needs.span_chunks} "
        "chunks are held whole); below it every chunk would be read several times. Pass "
        f"cache_bytes >= {floor} to to_grain, or lower the floor: smaller chunks (rechunk or "
        "write the store with smaller ones), fewer variables, patches that straddle fewer "
        "chunks; order='chunk' is not refused but reads a chunk again for each neighbour "
        "its cache cannot wait for. src.memory_report() states the floor before reading."
    )


def memory_report(
    source: Any, batch_size: int = 1, read_options: Any = None, item_bytes: int | None = None
) -> MemoryReport:
    """State what a chunk-shuffled epoch of ``source`` holds, before anything is read.

    Parameters
    ----------
    source
        A :class:`~xpatch.grain.base.Source`.
    batch_size
        Items per element of the pipeline after the shuffle (``.batch(batch_size)``).
    read_options
        Grain's ``ReadOptions``; default its defaults (16 threads, 500 elements).
    item_bytes
        Bytes of one item; default the data arrays of the source's ``item_spec()``
        (or of its chunk reads'), which a source without one states as 0.
    """
    reads = source.chunk_reads
    needs = sweep_needs(reads)
    if needs is None:
        needs = SweepNeeds(0, 0, 0, 0, 0)
    mix, ahead = reads.sweep_settings(None, None)
    prefetch = int(getattr(read_options, "prefetch_buffer_size", GRAIN_PREFETCH))
    elements = -(-len(source) // max(int(batch_size), 1))
    if item_bytes is None:
        item_bytes = _item_bytes(source) or _item_bytes(reads)
    sources = patch_sources(reads)
    reads_at_once = loads_at_once(reads) or 0
    fetched = fetch_depth_of(reads)
    chunk = max(needs.chunk_bytes, 1)
    return MemoryReport(
        chunk_bytes=needs.chunk_bytes,
        chunk_count=sum(int(s.chunk_count) for s in sources),
        waiting_chunks=needs.waiting_chunks,
        waiting_bytes=needs.waiting_bytes,
        span_chunks=needs.span_chunks,
        mix=mix,
        ahead=ahead,
        working_bytes=needs.working_bytes(mix, ahead) if needs.chunk_bytes else 0,
        floor_bytes=needs.floor_bytes if needs.chunk_bytes else 0,
        floor_chunks=needs.floor_bytes / chunk if needs.chunk_bytes else 0.0,
        cache_bytes=needs.cache_bytes,
        reads_in_flight=reads_at_once,
        in_flight_bytes=reads_at_once * needs.chunk_bytes,
        item_bytes=int(item_bytes),
        batch_size=int(batch_size),
        prefetch=prefetch,
        queue_bytes=min(prefetch, elements) * int(batch_size) * int(item_bytes),
        fetched_chunks=fetched,
        fetched_bytes=fetched * needs.chunk_bytes,
    )


def _item_bytes(source: Any) -> int:
    spec = getattr(source, "item_spec", None)
    if spec is None:
        return 0
    return sum(
        int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        for _, shape, dtype in spec().values()
    )
