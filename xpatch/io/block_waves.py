"""Run the store tasks of a write in waves of a few blocks, locally or on a cluster.

One dask computation over all the blocks of an output lets the scheduler (the
local threaded one, or a cluster's) start many block rows at once, each holding
its input chunks and patch groups, so memory grows with the output.
:func:`plan_waves` splits the store tasks into waves of a few blocks, in
row-major block order; :func:`run_in_waves` computes them one wave after
another, keeping between waves only the thin pieces by which patch groups
overhang into blocks still to come; past :data:`OVERHANG_BYTES` of them, locally,
those whose next reader is furthest ahead wait in temporary files
(:class:`OverhangSpill`). :mod:`xpatch.io.writer`
decides when waves are used (:func:`waves_fit_the_scheduler` or a
``dask.distributed`` client, and a plan that does not recompute too much).
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import dask
import dask.local
from dask.callbacks import Callback
from dask.core import get_dependencies
from dask.optimization import cull
from dask.threaded import get as threaded_get

from xpatch.core.chunk_cache import nbytes_of
from xpatch.core.cores import worker_count
from xpatch.core.malloc import map_large_blocks, trim
from xpatch.io.spill_folders import LockedFolder

#: Names of the store tasks of a write start with this; the progress bar counts them.
STORE_TASK_PREFIX = "xpatch-write-"

#: A wave holds at least this many blocks per worker thread, to keep the cores busy.
BLOCKS_PER_THREAD = 1

#: On a cluster a wave holds this many times more blocks: each wave is a round trip
#: through the scheduler (1 block per thread took 41 s for a 4 GiB write, 4 took 27-31 s).
CLUSTER_WAVE_FACTOR = 4

#: Overhang pieces kept between local waves past this many bytes wait in files
#: (:class:`OverhangSpill`): a row of them grows with the output's width. With 16 MiB a
#: 4 GiB write peaked at 329-336 MiB against 353-358 with none spilled, in 26-27 s against 25.
OVERHANG_BYTES = 16 * 2**20

#: Waves are given up when, together, they would run this many times the tasks of
#: one computation (a result that mixes distant blocks, such as ``r / r.max()``).
WAVE_OVERHEAD = 2.0


def active_client() -> Any:
    """Return the active ``dask.distributed`` client, or None (also without distributed)."""
    try:
        from distributed import default_client
    except ImportError:
        return None
    try:
        return default_client()
    except ValueError:
        return None


def waves_fit_the_scheduler() -> bool:
    """Tell whether the active dask scheduler suits waves.

    Waves suit the threaded and synchronous schedulers, not a process pool per wave.

    Returns
    -------
    bool
        True on the threaded or synchronous scheduler (or none configured).
    """
    scheduler = dask.base.get_scheduler()
    return scheduler is None or scheduler in (threaded_get, dask.local.get_sync)


def _constant(value: Any) -> Any:
    return value


def _is_overhang(key: Any) -> bool:
    return "-overhang" in str(key[0] if isinstance(key, tuple) else key)


def plan_waves(graph: dict, indices: dict, threads: int | None = None) -> tuple | None:
    """Split the store tasks into waves of a few blocks, in row-major block order.

    Walks the waves as they will run, with the overhangs of earlier waves kept.

    Parameters
    ----------
    graph
        The whole task graph, store tasks included.
    indices
        Each store task's key -> the index of the block it writes.
    threads
        Threads that run a wave (default: this machine's cores).

    Returns
    -------
    tuple or None
        The graph, the waves, the wave that computes each overhang, and for each
        key the last wave that reads it (the arguments of :func:`run_in_waves`);
        or None when the waves would recompute too much.
    """
    ordered = sorted(indices, key=lambda key: (indices[key], str(key)))
    size = BLOCKS_PER_THREAD * (threads or worker_count())
    waves = [ordered[i : i + size] for i in range(0, len(ordered), size)]
    dependencies = {key: get_dependencies(graph, key) for key in graph}
    first: dict = {}  # overhang -> the wave that computes (and keeps) it
    computed_in: dict = {}
    last_read: dict = {}
    visits = 0
    for number, keys in enumerate(waves):
        seen: set = set()
        stack = list(keys)
        while stack:
            key = stack.pop()
            if key in seen:
                continue
            seen.add(key)
            last_read[key] = number
            if _is_overhang(key):
                # Computed, and kept, in the wave that computes its patch group.
                group_wave = min(computed_in.get(d, number) for d in dependencies[key])
                first.setdefault(key, group_wave)
                if first[key] < number:
                    continue  # kept from an earlier wave: read, not recomputed
            computed_in.setdefault(key, number)
            stack.extend(dependencies[key])
        visits += len(seen)
    if visits > WAVE_OVERHEAD * len(last_read):
        return None
    return graph, waves, first, last_read


def run_in_waves(
    graph: dict, waves: list, first: dict, last_read: dict, progress: bool, client: Any = None
) -> int:
    """Compute the store tasks wave by wave.

    One dask computation over all blocks lets the local scheduler start many block
    rows at once, each holding its input chunks and patch groups, so memory grows
    with the output. Waves bound it: each computes a few blocks, and the only
    results kept from one wave for later ones are the thin overhang pieces of its
    patch groups (keys with ``-overhang`` in their name) that blocks still to come
    read; input chunks a later wave shares are read again rather than held. Each
    patch group is computed once, in the wave of its home block, when every block
    of the result depends on nearby blocks only.

    Parameters
    ----------
    graph, waves, first, last_read
        The plan made by :func:`plan_waves`; ``graph`` is changed in place.
    progress
        Show a text progress bar of the blocks written.
    client
        A ``dask.distributed`` client to run the waves on (default: the local
        scheduler). The overhangs kept between waves then stay on the workers.

    Returns
    -------
    int
        The sum of the store tasks' results: the number of blocks written.
    """
    scheduler = dask.base.get_scheduler() or threaded_get
    map_large_blocks(MMAP_THRESHOLD)
    bar = _BlockProgress(sum(map(len, waves))) if progress else contextlib.nullcontext()
    written = 0
    carried: dict = {}  # overhang key -> its pieces, standing in the graph
    values: list = []
    culled: dict = {}
    spill = OverhangSpill(OVERHANG_BYTES)
    with bar, spill:
        try:
            for number, keys in enumerate(waves):
                keep = [
                    k for k, start in first.items() if start == number and last_read[k] > number
                ]
                culled, _ = cull(graph, keys + keep)
                if client is None:
                    values = list(scheduler(culled, keys + keep))
                else:  # the overhangs stay on the workers, as futures the next graphs name
                    values = list(client.get(culled, keys + keep, sync=False))
                    values[: len(keys)] = client.gather(values[: len(keys)])
                    if progress:  # no local callback sees the cluster's tasks
                        bar.done += len(keys)
                        bar._draw()
                written += sum(values[: len(keys)])
                carried.update(zip(keep, values[len(keys) :]))
                values = []
                for key in list(carried):
                    if last_read[key] <= number:
                        del carried[key], graph[key]  # its last reader has run
                        spill.forget(key)
                        continue
                    if client is None:
                        if key not in spill:
                            carried[key] = _unread_pieces(key, carried[key], last_read, number)
                            graph[key] = (functools.partial(_constant, carried[key]),)
                    else:
                        graph[key] = carried[key]
                if client is None:
                    spill.over(carried, graph, functools.partial(_next_read, last_read, number))
                trim()  # what a wave freed goes back to the OS
        except BaseException:
            # A failed wave must not leave results on the cluster (futures that the
            # traceback's frames would pin for the client's life), nor hold them here.
            if client is not None:
                from distributed import Future

                for future in (*values, *carried.values()):
                    if isinstance(future, Future):
                        future.release()  # as its deletion would; cancel() races the graph
            for held in (carried, graph, values, culled):
                held.clear()
            raise
    return written


class OverhangSpill:
    """Files on local disk for the overhang pieces that local waves keep past a byte budget.

    Waves go row by row of blocks, so the pieces kept for the next row grow with the
    output's width: with 4-band 1024² chunks and 256² patches at stride 192 they
    reached 25 MiB for rows of 8 blocks (a 1 GiB output) and 40 MiB for rows of 16
    (4 GiB): about 2.5 MiB a block, so half a GiB for rows of 200. Past
    ``budget`` bytes, the pieces whose next reader is the furthest ahead go to a
    temporary folder, and the graph reads them back from there; their file goes
    when their last reader has run, the folder when the write ends, failed or not.
    The folder of a killed process goes with the next spill in the same temporary
    directory (:mod:`xpatch.io.spill_folders`).
    If the folder cannot be made or written (a full disk), the write warns and keeps
    its pieces in memory. Where ``TMPDIR`` is a tmpfs, the files are in memory too.
    A cluster's waves keep their pieces on the workers, which spill by themselves.

    Examples
    --------
    >>> import numpy as np
    >>> spill, graph = OverhangSpill(budget=16), {}
    >>> carried = {"a": np.zeros(2), "b": np.ones(2)}  # 16 bytes each
    >>> with spill:
    ...     spill.over(carried, graph, lambda key, pieces: {"a": 1, "b": 2}[key])
    ...     print(sorted(spill), carried["a"].tolist(), graph["b"][0]().tolist())
    ['b'] [0.0, 0.0] [1.0, 1.0]
    """

    def __init__(self, budget: int) -> None:
        self.budget = int(budget)
        self._folder: LockedFolder | None = None
        self._files: dict = {}  # spilled key -> its file
        self._count = 0

    def __enter__(self) -> OverhangSpill:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._folder is not None:
            self._folder.remove()
        self._folder, self._files = None, {}

    def __contains__(self, key: object) -> bool:
        return key in self._files

    def __iter__(self):
        return iter(self._files)

    def over(self, carried: dict, graph: dict, next_read: Callable[[Any, Any], int]) -> None:
        """Spill the pieces read the furthest ahead until those held fit the budget.

        ``next_read(key, pieces)`` is the number of the next wave that reads them.
        """
        sizes = {k: nbytes_of(v) for k, v in carried.items() if k not in self._files}
        held = sum(sizes.values())
        ahead = {k: next_read(k, carried[k]) for k in sizes}
        for key in sorted(sizes, key=lambda k: (ahead[k], sizes[k]), reverse=True):
            if held <= self.budget:
                break
            try:
                path = self._write(carried[key])
            except OSError as error:  # no room or no folder: memory still holds them
                warnings.warn(
                    f"xpatch could not spill overhang pieces of this write to "
                    f"{self._folder.path if self._folder else tempfile.gettempdir()!r} "
                    f"({error}); it keeps them in memory. Point TMPDIR at a writable "
                    "local disk to bound the memory.",
                    RuntimeWarning,
                    stacklevel=2,
                )
                self.budget = sys.maxsize
                return
            self._files[key] = path
            carried[key] = path
            graph[key] = (functools.partial(_read_spilled, path),)
            held -= sizes[key]

    def _write(self, pieces: Any) -> str:
        if self._folder is None:
            self._folder = LockedFolder()
        path = os.path.join(self._folder.path, f"{self._count}.pickle")
        self._count += 1
        try:
            with open(path, "wb") as file:
                pickle.dump(pieces, file, protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(path)
            raise
        return path

    def forget(self, key: object) -> None:
        """Remove the file of ``key``, once no wave reads it."""
        path = self._files.pop(key, None)
        if path is not None:
            os.remove(path)


def _read_spilled(path: str) -> Any:
    with open(path, "rb") as file:
        return pickle.load(file)


def _next_read(last_read: dict, number: int, key: Any, pieces: Any) -> int:
    """Return the first wave after ``number`` that reads the overhang ``key`` (its ``pieces``)."""
    if not isinstance(pieces, dict):
        return last_read[key]
    waves = (_block_read(last_read, key, block) for block in pieces)
    return min((w for w in waves if w > number), default=last_read[key])


def _unread_pieces(key: tuple, pieces: Any, last_read: dict, number: int) -> Any:
    """Drop the pieces of an overhang that no wave after ``number`` reads."""
    if not isinstance(pieces, dict):
        return pieces
    return {
        block: piece
        for block, piece in pieces.items()
        if _block_read(last_read, key, block) > number
    }


def _block_read(last_read: dict, key: tuple, block: tuple) -> int:
    """Return the last wave that reads the piece of overhang ``key`` that falls on ``block``.

    An overhang ``(f"{name}-overhang", group, *lead_block)`` maps blocks to pieces;
    the block's combine task is ``(name, *lead_block, *block)``.
    """
    name = str(key[0]).removesuffix("-overhang")
    return last_read.get((name, *key[2:], *block), -1)


#: Arrays from this size on get pages of their own, handed back to the OS when freed:
#: with glibc's sliding threshold, input chunks, patches and partials of a few MiB
#: came from the worker threads' heaps, and the resident size grew by ~130 MiB over
#: the live data in a 1 GiB write (docs/scale.md).
MMAP_THRESHOLD = 2**20


class _BlockProgress(Callback):
    """A text progress bar of blocks written, across the waves of one write."""

    def __init__(self, total: int, width: int = 40) -> None:
        super().__init__()
        self.total = total
        self.done = 0
        self.width = width
        self.started = time.perf_counter()

    def __enter__(self) -> _BlockProgress:
        super().__enter__()
        self._draw()
        return self

    def __exit__(self, *args: object) -> None:
        super().__exit__(*args)
        self._draw()
        sys.stdout.write("\n")
        sys.stdout.flush()

    def _posttask(self, key, result, dsk, state, worker_id) -> None:
        if isinstance(key, tuple) and str(key[0]).startswith(STORE_TASK_PREFIX):
            self.done += 1
            self._draw()

    def _draw(self) -> None:
        fraction = self.done / self.total if self.total else 1.0
        filled = int(self.width * fraction)
        elapsed = time.perf_counter() - self.started
        sys.stdout.write(
            f"\r[{'#' * filled}{' ' * (self.width - filled)}] | {fraction:4.0%} Completed | "
            f"{self.done}/{self.total} blocks | {elapsed:.1f}s"
        )
        sys.stdout.flush()
