"""A chunk-shuffled pipeline stopped early: the script exits, xpatch's threads end."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import xarray as xr

import xpatch  # noqa: F401  (the .patch accessor)
from xpatch.grain.threads import IDLE_SECONDS, IdlePool

grain = pytest.importorskip("grain")

#: Three pipelines left after three batches: with and without ``.repeat()``, with
#: two read threads and Grain's default options; and two of whole batches. Before the
#: fix the script never ended (each read waited 5 s for a position whose read had
#: failed to start at exit).
STOPPED_EARLY = textwrap.dedent(
    """
    import numpy as np, xarray as xr, grain, xpatch, xpatch.grain
    scene = xr.DataArray(
        np.random.default_rng(0).random((2, 512, 512), dtype="float32"),
        dims=("band", "y", "x"),
    ).chunk({"y": 128, "x": 128})
    src = scene.patch(y=64, x=64, stride=48).to_grain()
    kept = []
    for repeat, options in [
        (True, grain.ReadOptions(num_threads=2)),
        (False, grain.ReadOptions(num_threads=2)),
        (True, grain.ReadOptions()),
    ]:
        ds = grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=42)
        ds = ds.repeat() if repeat else ds
        it = iter(ds.batch(8).to_iter_dataset(options))
        for _ in range(3):
            next(it)
        kept.append(it)
    # Whole batches, reading ahead on threads of their own: the same.
    batches = xpatch.grain.BatchSource(src, 8, seed=42)
    for ds in (batches.dataset().repeat(), batches.dataset()):
        it = iter(ds.to_iter_dataset())
        for _ in range(3):
            next(it)
        kept.append(it)
    print("done", flush=True)
    """
)


def test_a_script_that_stops_a_chunk_shuffled_pipeline_early_exits() -> None:
    run = subprocess.run(
        [sys.executable, "-c", STOPPED_EARLY], capture_output=True, text=True, timeout=90
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "done"


def _xpatch_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("xpatch-")}


def test_threads_of_a_dropped_iterator_end() -> None:
    scene = xr.DataArray(
        np.random.default_rng(0).random((2, 256, 256), dtype="float32"),
        dims=("band", "y", "x"),
    ).chunk({"y": 64, "x": 64})
    src = scene.patch(y=32, x=32, stride=24).to_grain()
    before = _xpatch_threads()
    ds = grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=1).repeat().batch(8)
    it = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=2)))
    for _ in range(3):
        next(it)
    started = _xpatch_threads() - before
    assert started  # reads ahead ran on threads of xpatch's
    assert all(t.daemon for t in started)
    del it
    gc.collect()
    deadline = time.monotonic() + 10
    while _xpatch_threads() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _xpatch_threads() - before  # ds is still held: its threads ended anyway


def test_idle_pool_threads_end_when_idle_and_start_again() -> None:
    pool = IdlePool(2, "xpatch-test-pool")
    assert [f.result() for f in [pool.submit(abs, -k) for k in range(5)]] == list(range(5))
    named = lambda: [t for t in threading.enumerate() if t.name.startswith("xpatch-test-pool")]  # noqa: E731
    assert 1 <= len(named()) <= 2
    deadline = time.monotonic() + IDLE_SECONDS + 5
    while named() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert named() == []
    assert pool.submit(abs, -7).result(timeout=5) == 7  # new work starts a thread again


def test_idle_pool_hands_the_error_to_the_future() -> None:
    pool = IdlePool(1, "xpatch-test-error")
    future = pool.submit(int, "not a number")
    with pytest.raises(ValueError, match="not a number"):
        future.result(timeout=5)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX only")
def test_idle_pool_runs_work_in_a_forked_child() -> None:
    pool = IdlePool(1, "xpatch-test-fork")
    assert pool.submit(abs, -1).result(timeout=5) == 1  # a thread the child will not have
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if the pool starts a thread of its own
        try:
            os._exit(0 if pool.submit(abs, -2).result(timeout=5) == 2 else 1)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
