"""glibc's allocator, told how xpatch's threads use memory (a no-op elsewhere).

Three habits of glibc's ``malloc`` cost a reading or writing process memory or time:

- Each thread that allocates under contention gets a heap of its own (an *arena*,
  up to eight per core), and a block freed into one arena is reused by that arena
  only. Grain's 16 read threads and the reads ahead each decode chunks and cut
  patches of a few hundred KiB to a few MiB: over one epoch of insitubatch's ERA5
  case (``benchmarks/bench_peers.py``, two rounds of runs) the peak RSS was 276-397
  MiB with glibc's default arenas and 237-292 MiB with two, at the same speed. One
  heap per four cores (one on 2 cores) took 12-13 MiB more off the same epoch
  (197 against 209 MiB from a local folder, 204 against 217 on S3, medians of 3-4),
  and 22-27 MiB off xpatch's 1 GiB sweep, at the same speed: the blocks are few and
  large (a handful per chunk), so threads seldom wait for the heap's lock.
- Its threshold for mapping a large block sits wherever the largest freed block
  put it (up to 32 MiB), so blocks of a few MiB come from those heaps too
  (:func:`map_large_blocks`, used by writes in waves: ``docs/scale.md``).
- A reader frees a decoded chunk or a batch of a few MiB for every one it makes,
  and glibc hands such blocks back to the OS (a mapped block, or the free top of a
  heap past 2x the threshold), so every page of the next one is faulted in again:
  sys time, and a lock the faults of every thread queue on. On the ERA5 case's
  epoch of whole batches (``BatchSource``), keeping them for reuse
  (:func:`reuse_freed_blocks`) took it from 1.14-1.44 s to 0.87-1.05 s (six runs
  each, alternated), page faults from 116-133 thousand to 40-44 thousand, sys time
  from 0.64-0.79 s to 0.29-0.35 s; the peak RSS rose from 250-271 to 284-301 MiB
  (what is kept for reuse). Keeping less (16 MiB) was slower (1.14-1.20 s).

The settings are process-wide and kept (glibc has no way back); each is applied
when its value changes, and never when the environment already sets it
(``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``): the
user's choice wins.
"""

from __future__ import annotations

import ctypes
import functools
import os

from xpatch.core.cores import worker_count

#: ``mallopt`` parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

#: The largest block a reading process keeps on its heaps (glibc's own ceiling for the
#: threshold it moves by itself): chunks and batches of a few MiB are reused, not mapped.
HEAP_BLOCKS = 32 * 2**20


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return None
    return libc if hasattr(libc, "mallopt") else None


def bound_arenas(count: int | None = None) -> bool:
    """Have glibc keep at most ``count`` heaps (default: one per four cores, at least one).

    Called when :mod:`xpatch.grain` is imported (by ``import xpatch``), before a
    store starts threads of its own, and by a Grain source's reader in each process.
    glibc fixes its limit once more than eight arenas exist, and arenas created
    before stay: threads then share those. Returns whether the setting was applied
    (False off glibc, or when ``MALLOC_ARENA_MAX`` is set).

    Examples
    --------
    >>> bound_arenas() in (True, False)
    True
    """
    return _apply("MALLOC_ARENA_MAX", M_ARENA_MAX, default_arenas() if count is None else count)


def default_arenas() -> int:
    """Return the heaps :func:`bound_arenas` keeps by default: one per four cores, at least one.

    Examples
    --------
    >>> default_arenas() >= 1
    True
    """
    return max(worker_count() // 4, 1)


def reuse_freed_blocks(retained: int) -> bool:
    """Have glibc reuse freed blocks of up to 32 MiB, keeping up to ``retained`` bytes free.

    A reading process frees a chunk or a batch of a few MiB for every one it makes.
    With glibc's defaults each is mapped afresh or handed back when freed at the
    top of a heap, and every page of the next one is faulted in again (sys time,
    and a lock every thread's faults wait on). Called by a Grain source's reader in
    each process, with its cache's budget: at most that much is kept free for reuse.
    A process that also writes in waves (:func:`map_large_blocks`) takes the setting
    of whichever was called last.

    Examples
    --------
    >>> reuse_freed_blocks(64 * 2**20) in (True, False)
    True
    """
    mapped = _apply("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, HEAP_BLOCKS)
    kept = _apply("MALLOC_TRIM_THRESHOLD_", M_TRIM_THRESHOLD, max(int(retained), HEAP_BLOCKS))
    return mapped and kept


def map_large_blocks(threshold: int) -> bool:
    """Have glibc map every block of ``threshold`` bytes or more: freed, it leaves the process.

    Examples
    --------
    >>> map_large_blocks(2**20) in (True, False)
    True
    """
    return _apply("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, int(threshold))


def trim() -> None:
    """Hand the memory glibc keeps for reuse back to the OS (as dask.distributed's workers do).

    Examples
    --------
    >>> trim()
    """
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


#: Each parameter's value as last set here (per process: a forked child inherits it).
_applied: dict[int, int] = {}


def _apply(variable: str, parameter: int, value: int) -> bool:
    libc = _libc()
    if libc is None or variable in os.environ:
        return False
    if _applied.get(parameter) == value:
        return True
    applied = bool(libc.mallopt(parameter, value))
    if applied:
        _applied[parameter] = value
    return applied
