"""BatchSource: whole batches of a chunk-shuffled epoch, gathered chunk by chunk.

Every batch must equal ``np.stack`` of the items it holds, in the order
``src.chunk_shuffled_order`` gives, epoch after epoch; through Grain (and its
worker processes) it resumes exactly from a checkpoint.
"""

from __future__ import annotations

import pickle
import threading
import time

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import xpatch
from xpatch.core.errors import OptionError
from xpatch.grain import BatchSource
from xpatch.grain import batches as batches_module
from xpatch.grain.batches import stack_items

grain = pytest.importorskip("grain")


def expected_batches(src, batches, epochs=1):
    """The batches as np.stack of the per-item dicts, epoch after epoch."""
    out = []
    b = batches.batch_size
    for epoch in range(epochs):
        order = src.chunk_shuffled_order(seed=batches._seed, epoch=epoch)
        for k in range(len(batches)):
            chosen = order[k * b : (k + 1) * b]
            out.append(stack_items([src[int(i)] for i in chosen]))
    return out


def assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for key in want:
        if isinstance(want[key], dict):
            assert_same(got[key], want[key])
        else:
            assert got[key].dtype == want[key].dtype, key
            assert got[key].shape == want[key].shape, key
            np.testing.assert_array_equal(got[key], want[key], err_msg=str(key))


def scene(shape=(40, 44), chunks=10) -> xr.DataArray:
    values = np.arange(np.prod(shape), dtype="float32").reshape(shape)
    return xr.DataArray(values, dims=("y", "x")).chunk(chunks)


@pytest.fixture(params=[1, 10**6], ids=["gathered", "sliced"])
def gather_rows(request, monkeypatch):
    """The patches of one chunk in a batch: all by one gather, or each by a slice copy."""
    monkeypatch.setattr(batches_module, "GATHER_ROWS", request.param)
    return request.param


@pytest.mark.parametrize(
    "make",
    [
        # straddling chunks and reaching past the array (boundary="pad"), weights zeroed there
        lambda: scene().patch(y=8, x=8, stride=6, boundary="pad").to_grain(),
        # a window across a periodic seam and a halo: read anchors differ from the items'
        lambda: scene().patch(y=8, x=8, stride=8, halo=1).to_grain(),
        # no dask chunks: every patch takes the per-patch read
        lambda: scene().compute().patch(y=8, x=8, stride=6).to_grain(weights=False),
    ],
    ids=["pad", "halo", "numpy"],
)
def test_every_batch_equals_the_stacked_items_in_order_epoch_after_epoch(make, gather_rows):
    src = make()
    batches = BatchSource(src, 5, seed=3)
    assert len(batches) == -(-len(src) // 5)
    want = expected_batches(src, batches, epochs=2)
    got = [batches[i] for i in range(2 * len(batches))]
    for g, w in zip(got, want):
        assert_same(g, w)
    # epochs differ: the second one is its own order
    assert got[0]["index"].tolist() != got[len(batches)]["index"].tolist()


@pytest.mark.parametrize("boundary", ["shift", "pad"])
def test_batch_weights_are_read_only_and_batches_inside_the_array_share_them(boundary):
    # A batch's weights were written out per batch: on insitubatch's ERA5 case half
    # of every batch was the same window 16 times (251-256 MiB peak, 208-215 without).
    src = scene().patch(y=8, x=8, stride=6, boundary=boundary, window="hann").to_grain()
    batches = BatchSource(src, 4, seed=2)
    got = [batches[k] for k in range(len(batches))]
    for batch, want in zip(got, expected_batches(src, batches)):
        assert_same(batch, want)
        assert not batch["weights"].flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            batch["weights"][0, 0, 0] = 1
        assert batch["data"].flags.writeable and batch["data"].flags.owndata
    inside = [b["weights"] for b in got if (b["weights"] > 0).all()]
    assert len(inside) >= 2
    assert all(np.shares_memory(w, inside[0]) for w in inside)
    past_edge = [b["weights"] for b in got if not (b["weights"] > 0).all()]
    assert (boundary == "pad") == bool(past_edge)  # zeros past the edge: fresh arrays
    assert not any(np.shares_memory(w, inside[0]) for w in past_edge)


def test_a_dataset_with_axes_in_other_orders_and_a_transform(gather_rows):
    rng = np.random.default_rng(0)
    y, x = np.arange(30.0), np.arange(36.0)
    ds = xr.Dataset(
        {
            "image": (("band", "y", "x"), rng.normal(size=(3, 30, 36)).astype("f4")),
            "mask": (("x", "y"), rng.integers(0, 9, (36, 30)).astype("u1")),
            "extra": (("y", "t", "x"), rng.normal(size=(30, 2, 36))),
        },
        coords={"y": y, "x": x},
    ).chunk({"y": 10, "x": 12})
    src = ds.patch(y=5, x=6, stride=5).to_grain(transform=True)
    batches = BatchSource(src, 7, seed=1)
    for got, want in zip([batches[i] for i in range(len(batches))], expected_batches(src, batches)):
        assert_same(got, want)
    assert batches[0]["transform"].shape == (7, 6)


def test_patches_inside_a_chunk_are_gathered_not_read_one_by_one():
    # ERA5-like: whole fields one time step each, chunks of 4 time steps
    values = np.arange(32 * 6 * 8, dtype="float32").reshape(32, 6, 8)
    da_ = xr.DataArray(values, dims=("time", "lat", "lon")).chunk({"time": 4})
    src = da_.patch(time=1, lat=6, lon=8).to_grain()
    reads = []
    original = src.reader.read
    src.reader.read = lambda *args: reads.append(args) or original(*args)
    batches = BatchSource(src, 8, seed=0, drop_remainder=True)
    got = [batches[i] for i in range(len(batches))]
    # one read per batch: its first item, which says which keys an item has
    assert len(reads) == len(batches) == 4
    del src.reader.read
    assert src.cache_stats().loads == 8  # each chunk once
    for g, w in zip(got, expected_batches(src, batches)):
        assert_same(g, w)


@pytest.mark.parametrize(
    "options",
    [
        {"stride": 6, "boundary": "pad"},
        {"stride": 8, "halo": 1},
        {"stride": 6, "halo": 1, "boundary": {"x": "periodic"}},
    ],
    ids=["pad", "halo", "periodic"],
)
def test_a_patch_read_into_given_arrays_equals_it_read_alone_and_is_written_there(options):
    # Batches write straddling patches straight into their rows (no patch-sized copy
    # between): the same values as a patch read on its own, edges and seams included.
    src = scene().patch(y=8, x=8, **options).to_grain(weights=False)
    reader = src.reader
    anchors = src.layout.plan.anchors
    straddling = [i for i in range(len(src)) if reader.alone_chunks()[i] < 0]
    assert straddling
    for position in range(len(src)):
        anchor = tuple(int(a) for a in anchors[position])
        alone = reader.read(position, anchor)
        rows = {name: np.full_like(value, -7) for name, value in alone.items()}
        got = reader.read(position, anchor, into=rows)
        for name, value in alone.items():
            assert got[name] is rows[name]
            np.testing.assert_array_equal(rows[name], value, err_msg=f"{position} {name}")


def test_straddling_patches_are_written_into_their_batch_rows(monkeypatch):
    src = scene().patch(y=8, x=8, stride=6).to_grain(weights=False)
    written = []
    original = src.reader.read

    def read(position, anchor, into=None):
        if into is not None:
            written.append(into)
        return original(position, anchor, into=into)

    monkeypatch.setattr(src.reader, "read", read)
    batches = BatchSource(src, 8, seed=0)
    got = [batches[k] for k in range(len(batches))]
    assert written
    assert all(any(np.shares_memory(rows["data"], b["data"]) for b in got) for rows in written)
    for g, w in zip(got, expected_batches(src, batches)):
        assert_same(g, w)


def test_straddling_patches_read_each_chunk_once_through_grain_threads_in_a_small_cache(
    monkeypatch,
):
    # 64 chunks of 64 KiB, a budget of 12 of them: Grain's 16 threads assembling 16
    # batches at once (8 or 9 chunks each) reloaded each chunk 6-8 times before the bound.
    # The bound's escape after MAX_WAIT_SECONDS (nobody serves the batches behind) is
    # not what this watches: on a machine loaded by two test runs at once, one epoch
    # read 68 loads (4 evictions), most likely by a stall that took that escape.
    monkeypatch.setattr(batches_module, "MAX_WAIT_SECONDS", 60.0)
    values = np.random.default_rng(0).normal(size=(1024, 1024)).astype("f4")
    da_ = xr.DataArray(values, dims=("y", "x")).chunk(128)
    src = da_.patch(y=48, x=48, stride=36).to_grain(cache_bytes=12 * 128 * 128 * 4)
    batches = BatchSource(src, 16, seed=1)
    served = [b["index"] for b in batches.dataset().to_iter_dataset()]
    assert src.cache_stats().loads / src.chunk_count <= 1.05
    assert sorted(np.concatenate(served).tolist()) == list(range(len(src)))


def test_a_process_asked_for_every_other_batch_never_waits_for_the_others(monkeypatch):
    # As an mp_prefetch worker of two is: the batches between are another process's.
    monkeypatch.setattr(batches_module, "MAX_WAIT_SECONDS", 60.0)
    values = np.random.default_rng(0).normal(size=(1024, 1024)).astype("f4")
    da_ = xr.DataArray(values, dims=("y", "x")).chunk(128)
    src = da_.patch(y=48, x=48, stride=36).to_grain(cache_bytes=12 * 128 * 128 * 4)
    batches = BatchSource(src, 16, seed=1)  # worker_count left at 1: found from the batches
    started = time.monotonic()
    for k in range(0, len(batches), 2):
        batches[k]
    assert time.monotonic() - started < 10
    assert src.cache_stats().loads / src.chunk_count <= 1.05


def waiting_batches(monkeypatch, side: int, chunk: int, patch: int, batch_size: int):
    """Batches of noise in dask chunks whose waits for the sweep never time out."""
    monkeypatch.setattr(batches_module, "MAX_WAIT_SECONDS", 60.0)
    values = np.random.default_rng(0).normal(size=(side, side)).astype("f4")
    src = xr.DataArray(values, dims=("y", "x")).chunk(chunk).patch(y=patch, x=patch)
    return BatchSource(src.to_grain(), batch_size, seed=1)


def test_a_state_restored_early_in_an_epoch_starts_there_at_once(monkeypatch):
    # Restored at batch 5, Grain asks for batches 5, 6, ... only. The sweep starts an
    # epoch at batch 0 when a batch among its first 16 comes first (Grain's threads ask
    # for those in any order): it waited for batches nobody asks for, MAX_WAIT_SECONDS
    # (2 s) at every such resume. Here that wait is 60 s: the thread would still run.
    def fresh():
        return waiting_batches(monkeypatch, side=512, chunk=64, patch=32, batch_size=16)

    every = indices(fresh().dataset().to_iter_dataset())
    iterator = iter(fresh().dataset().to_iter_dataset())
    head = indices(iterator, count=5)
    state = iterator.get_state()
    iterator.close()
    batches = fresh()  # as in a new process
    restored = iter(batches.dataset().to_iter_dataset())
    restored.set_state(state)
    rest: list = []
    thread = threading.Thread(target=lambda: rest.extend(indices(restored)), daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert head + rest == every
    src = batches.source
    assert src.cache_stats().loads <= src.chunk_count


def test_a_batch_asked_second_from_far_ahead_waits_for_the_sweep(monkeypatch):
    # Grain's 16 threads may start batch 15 right after batch 0: taken as a step of 15
    # (15 mp_prefetch workers), it ran ahead and its chunks flushed chunks still to be
    # served (1.05-1.10 loads per chunk in some ERA5 epochs of bench_peers).
    import threading

    batches = waiting_batches(monkeypatch, side=1024, chunk=128, patch=64, batch_size=16)
    releases = batches._tracking()
    releases.started(0, 0)
    far = threading.Thread(target=lambda: batches[15])
    far.start()
    far.join(0.5)
    assert far.is_alive()  # waiting: batches 1 to 14 come first
    # Grain's other threads ask for them meanwhile.
    others = [threading.Thread(target=lambda k=k: batches[k]) for k in range(1, 15)]
    for thread in others:
        thread.start()
    releases.finished(0, 0)
    for thread in [*others, far]:
        thread.join(30)
        assert not thread.is_alive()
    assert releases.workers == 1  # every batch is this process's


def test_a_served_batch_wakes_only_the_waiting_batches_it_lets_through(monkeypatch):
    # Grain's 16 threads: 14 wait for their turn. Each batch served woke all of them
    # (38 thousand context switches an epoch of the 1 GiB zarr at 20 ms a read, 16
    # threads 1.14x the time of 2); now those the sweep's new mark lets through.
    import threading

    batches = waiting_batches(monkeypatch, side=1024, chunk=128, patch=64, batch_size=16)
    releases = batches._tracking()
    releases.spread = 2  # batches 0 and 1 run, 2 on wait
    woken: list[int] = []

    class Turn(threading.Condition):  # every Condition made meanwhile: only turns count
        def notify(self, n=1):
            if self in releases.turns:
                woken.append(releases.turns[self][1])
            super().notify(n)

    monkeypatch.setattr(threading, "Condition", Turn)

    def wait_until(done) -> None:
        deadline = time.monotonic() + 30
        while not done() and time.monotonic() < deadline:
            time.sleep(0.01)

    releases.started(0, 0)
    releases.started(0, 1)
    passed: list[int] = []
    waiting = [
        threading.Thread(target=lambda k=k: (releases.started(0, k), passed.append(k)))
        for k in range(2, 8)
    ]
    for thread in waiting:
        thread.start()
    wait_until(lambda: len(releases.turns) == len(waiting))
    assert sorted(k for _, k in releases.turns.values()) == list(range(2, 8))
    releases.finished(0, 0)  # the mark moves to 1: batch 2 may start
    wait_until(lambda: passed)
    assert woken == [2] and passed == [2]
    for k in range(1, 8):  # the rest, in turn
        releases.finished(0, k)
        if k + 2 < 8:
            wait_until(lambda k=k: k + 2 in passed)
    for thread in waiting:
        thread.join(30)
        assert not thread.is_alive()
    assert passed == list(range(2, 8)) and not releases.turns


def test_batches_started_out_of_order_two_apart_are_not_taken_for_another_workers(monkeypatch):
    # Grain's 16 threads once started batches 3, 5 and 7 first: taken for every other
    # batch of two mp_prefetch workers, the process let go of the chunks of the even
    # ones, its own, and read them again (2.1 loads per chunk that epoch). And batch 3
    # served before batch 0 started held the sweep's mark at 3: batch 10 on waited.
    import threading

    batches = waiting_batches(monkeypatch, side=512, chunk=64, patch=32, batch_size=8)
    releases = batches._tracking()
    taken = []
    real = releases._take_workers
    monkeypatch.setattr(releases, "_take_workers", lambda w, e: (taken.append(w), real(w, e)))
    got, threads = {}, []
    for k in [3, 5, 7, 9, 0, 1, 2, 4, 6, 8, *range(10, 16)]:
        threads.append(threading.Thread(target=lambda k=k: got.setdefault(k, batches[k])))
        threads[-1].start()
        time.sleep(0.05 if k in (3, 5, 7, 9) else 0)
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()
    assert taken == [] and releases.workers == 1
    for k in range(16):
        assert_same(got[k], batches.batch(batches.positions(k)))


def test_a_worker_given_every_other_batch_by_grain_knows_it_at_once():
    src = scene((64, 64), 16).patch(y=8, x=8, stride=8).to_grain()
    batches = BatchSource(src, 4, seed=3)
    assert batches.dealt_workers is None
    sliced = batches.dataset().slice(slice(1, None, 2))  # as mp_prefetch gives worker 1 of 2
    assert batches.dealt_workers == 2 and batches._tracking().workers == 2
    got = [b["index"].tolist() for b in sliced.to_iter_dataset()]
    assert got == [batches[k]["index"].tolist() for k in range(1, len(batches), 2)]
    assert batches._tracking().workers == 2
    with pytest.raises(OptionError, match="workers=0"):
        batches.deal(0)


def test_drop_remainder_and_a_short_last_batch():
    src = scene().patch(y=8, x=8, stride=8).to_grain()
    assert len(src) == 30
    assert len(BatchSource(src, 8, seed=0)) == 4
    assert len(BatchSource(src, 8, seed=0)[3]["index"]) == 6
    dropped = BatchSource(src, 8, seed=0, drop_remainder=True)
    assert len(dropped) == 3
    assert dropped[3]["index"].tolist() == src.chunk_shuffled_order(seed=0, epoch=1)[:8].tolist()


def test_forecast_samples_are_batched_per_sample_and_exact():
    times = pd.date_range("2021-01-01", periods=16, freq="6h")
    rng = np.random.default_rng(1)
    era5 = xr.Dataset(
        {
            "t2m": (("time", "lat", "lon"), rng.normal(size=(16, 8, 12)).astype("f4")),
            "oro": (("lat", "lon"), rng.normal(size=(8, 12)).astype("f4")),
        },
        coords={"time": times},
    ).chunk({"time": 4})
    fc = era5.patch(time=xpatch.Forecast(inputs=["-6h", "0h"], targets=["6h"]), lat=4, lon=6)
    src = fc.to_grain()
    batches = BatchSource(src, 6, seed=2)
    for got, want in zip([batches[i] for i in range(len(batches))], expected_batches(src, batches)):
        assert_same(got, want)
    assert batches[0]["inputs"]["t2m"].shape == (6, 2, 4, 6)


def test_scenes_are_batched_per_sample_and_exact():
    a = scene((40, 48), 16)
    b = scene((32, 32), 16) + 1e4
    src = xpatch.patch_scenes({"a": a, "b": b}, y=8, x=8, stride=8).to_grain()
    batches = BatchSource(src, 6, seed=4)
    got = [batches[i] for i in range(len(batches))]
    for g, w in zip(got, expected_batches(src, batches)):
        assert_same(g, w)
    assert set(np.concatenate([g["scene"] for g in got]).tolist()) == {0, 1}


def test_bad_arguments_are_refused_naming_them():
    src = scene().patch(y=8, x=8, stride=8).to_grain()
    with pytest.raises(OptionError, match="batch_size=0"):
        BatchSource(src, 0, seed=0)
    with pytest.raises(OptionError, match="seed=-1"):
        BatchSource(src, 4, seed=-1)
    with pytest.raises(OptionError, match="drop_remainder=True leaves no batch"):
        BatchSource(src, 31, seed=0, drop_remainder=True)
    with pytest.raises(OptionError, match="drop_remainder='no'"):
        BatchSource(src, 4, seed=0, drop_remainder="no")
    with pytest.raises(OptionError, match="worker_count=0"):
        BatchSource(src, 4, seed=0, worker_count=0)
    with pytest.raises(OptionError, match="order='random'"):
        BatchSource(src, 4, seed=0, order="random")
    with pytest.raises(OptionError, match="not an xpatch source"):
        BatchSource(list(range(9)), 4, seed=0)
    with pytest.raises(IndexError, match="-1"):
        BatchSource(src, 4, seed=0)[-1]


def test_fingerprint_names_the_source_batch_size_and_seed_and_pickles():
    def make(**kw):
        args = {"batch_size": 4, "seed": 0, **kw}
        size = args.pop("batch_size")
        return BatchSource(scene().patch(y=8, x=8, stride=8).to_grain(), size, **args)

    fp = make().fingerprint
    assert fp == make().fingerprint and len(fp) == 16
    assert len({fp, make(batch_size=5).fingerprint, make(seed=1).fingerprint}) == 3
    batches = make()
    first = batches[0]
    copy = pickle.loads(pickle.dumps(batches))
    assert copy.fingerprint == fp
    assert_same(copy[0], first)


def indices(iterator, count=None):
    out = []
    for batch in iterator:
        out.append(batch["index"].tolist())
        if count is not None and len(out) == count:
            break
    return out


def test_grain_pipeline_keeps_epochs_and_resumes_mid_epoch():
    src = scene().patch(y=8, x=8, stride=6).to_grain()
    batches = BatchSource(src, 6, seed=5)
    pipeline = batches.dataset().repeat(2).to_iter_dataset().pipe(batches.with_fingerprint)
    every = indices(pipeline)
    assert every == [batches[i]["index"].tolist() for i in range(2 * len(batches))]
    iterator = iter(pipeline)
    head = indices(iterator, count=3)
    state = iterator.get_state()
    assert state["xpatch_fingerprint"] == batches.fingerprint
    restored = iter(pipeline)
    restored.set_state(state)
    assert head + indices(restored) == every
    other = BatchSource(src, 6, seed=6)
    with pytest.raises(OptionError, match="fingerprint"):
        iter(other.dataset().to_iter_dataset()).set_state(state)


def test_worker_processes_give_the_same_batches_and_resume(tmp_path):
    path = tmp_path / "scene.zarr"
    scene((48, 40), 16).to_dataset(name="v").to_zarr(path)
    src = xr.open_zarr(path)["v"].patch(y=8, x=8, stride=8).to_grain()
    batches = BatchSource(src, 4, seed=7, worker_count=2)
    pipeline = batches.dataset().to_iter_dataset()
    single = indices(pipeline)
    options = grain.MultiprocessingOptions(num_workers=2)
    iterator = iter(pipeline.mp_prefetch(options))
    head = indices(iterator, count=3)
    state = iterator.get_state()
    iterator.close()
    restored = iter(pipeline.mp_prefetch(options))
    restored.set_state(state)
    assert head + indices(restored) == single
    restored.close()


def test_batches_through_worker_processes_equal_the_items_weights_included(tmp_path):
    # Weights of batches inside the array are a broadcast view (stride 0 along the
    # batch axis); Grain's workers hand batches over through shared memory.
    path = tmp_path / "scene.zarr"
    scene((36, 40), 12).to_dataset(name="v").to_zarr(path)
    patcher = xr.open_zarr(path)["v"].patch(y=8, x=8, stride=6, window="hann", boundary="pad")
    src = patcher.to_grain()
    batches = BatchSource(src, 4, seed=3)
    pipeline = batches.dataset().to_iter_dataset()
    options = grain.MultiprocessingOptions(num_workers=2)
    got = [
        {key: np.array(value) for key, value in batch.items()}  # before its memory is reused
        for batch in pipeline.mp_prefetch(options)
    ]
    want = expected_batches(src, batches)
    assert len(got) == len(want)
    for batch, expected in zip(got, want):
        assert_same(batch, expected)
    inside = [b for b in (batches[k] for k in range(len(batches))) if (b["weights"] > 0).all()]
    assert inside and all(b["weights"].strides[0] == 0 for b in inside)


class InlinePool:
    """Runs what is submitted at once, on the submitting thread: a deterministic order."""

    def __init__(self, *args) -> None:
        pass

    def submit(self, function, *args) -> None:
        function(*args)


def test_the_chunks_the_next_batches_use_first_are_read_ahead_in_that_order(monkeypatch):
    # Without reads ahead a batch decoded its chunks only when asked: with a slow
    # store, its waits added up batch after batch.
    monkeypatch.setattr(batches_module, "IdlePool", InlinePool)
    values = np.random.default_rng(0).normal(size=(512, 512)).astype("f4")
    da_ = xr.DataArray(values, dims=("y", "x")).chunk(64)
    src = da_.patch(y=32, x=32, stride=32).to_grain(cache_bytes=24 * 64 * 64 * 4)
    batches = BatchSource(src, 16, seed=1)
    read_ahead = []
    real = src._reader.read_ahead
    src._reader.read_ahead = lambda chunk, wanted=None: (
        read_ahead.append(chunk),
        real(chunk, wanted),
    )
    for k in range(len(batches)):
        batches[k]
    touched = np.asarray(src.chunk_reads.touched_chunks())
    first_use = {}
    for k in range(len(batches)):
        for chunk in np.unique(touched[batches.positions(k)]).tolist():
            first_use.setdefault(chunk, k)
    assert len(read_ahead) >= len(first_use) // 2  # most chunks came before their batch
    assert all(chunk in first_use for chunk in read_ahead)
    uses = [first_use[chunk] for chunk in read_ahead]
    assert uses == sorted(uses)  # in the order the batches use them first
    assert min(uses) >= 1  # the first batch reads its own: nothing is known before it
    assert src.cache_stats().loads == src.chunk_count  # and each chunk once
