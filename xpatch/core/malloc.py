"""glibc's allocator, told how xpatch's threads use memory (a no-op elsewhere).

Two habits of glibc's ``malloc`` grow the resident size of a reading or writing
process well past the data it holds:

- Each thread that allocates under contention gets a heap of its own (an *arena*,
  up to eight per core), and a block freed into one arena is reused by that arena
  only. Grain's 16 read threads and the reads ahead each decode chunks and cut
  patches of a few hundred KiB to a few MiB: over one epoch of insitubatch's ERA5
  case (``benchmarks/bench_peers.py``, two rounds of runs) the peak RSS was 276-397
  MiB with glibc's default arenas and 237-292 MiB with two, at the same speed.
- Its threshold for mapping a large block sits wherever the largest freed block
  put it (up to 32 MiB), so blocks of a few MiB come from those heaps too
  (:func:`map_large_blocks`, used by writes in waves: ``docs/scale.md``).

Both settings are process-wide and kept (glibc has no way back); each is applied
once, and never when the environment already sets it (``MALLOC_ARENA_MAX``,
``MALLOC_MMAP_THRESHOLD_``): the user's choice wins.
"""

from __future__ import annotations

import ctypes
import functools
import os

#: ``mallopt`` parameters (glibc's malloc.h).
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return None
    return libc if hasattr(libc, "mallopt") else None


def bound_arenas(count: int | None = None) -> bool:
    """Have glibc keep at most ``count`` heaps (default: the cores this process may use).

    Called before xpatch's read threads start (a Grain source's reader, in each
    process). Arenas created before stay; threads then share those. Returns whether
    the setting was applied (False off glibc, or when ``MALLOC_ARENA_MAX`` is set).

    Examples
    --------
    >>> bound_arenas() in (True, False)
    True
    """
    if count is None:
        count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return _apply("MALLOC_ARENA_MAX", M_ARENA_MAX, max(int(count or 1), 2))


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


@functools.cache
def _apply(variable: str, parameter: int, value: int) -> bool:
    libc = _libc()
    if libc is None or variable in os.environ:
        return False
    return bool(libc.mallopt(parameter, value))
