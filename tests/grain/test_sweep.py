"""The sweep order of chunk_shuffle: each chunk read once per epoch within a small cache."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import threading
import time

import dask.array as dsa
import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xpatch
from xpatch.core.chunk_cache import stored_array
from xpatch.core.sweep import chunk_uses, sweep_permutation, sweep_ranks, waiting_row

grain = pytest.importorskip("grain")

BANDS = 2


def lazy_scene(rows: int, cols: int, chunk: int, seed: int = 1) -> tuple[np.ndarray, xr.DataArray]:
    values = np.random.default_rng(seed).normal(size=(BANDS, rows, cols)).astype("float32")
    lazy = xr.DataArray(
        dsa.from_array(values, chunks=(BANDS, chunk, chunk)), dims=("band", "y", "x")
    )
    return values, lazy


def chunk_bytes(chunk: int) -> int:
    return BANDS * chunk * chunk * 4


def at_the_floor(patcher):
    """``patcher``'s Grain source with the least cache a sweep accepts (its floor)."""
    return patcher.to_grain(cache_bytes=patcher.to_grain().memory_report().floor_bytes)


def direct_cuts(values: np.ndarray, **options) -> dict[tuple, np.ndarray]:
    """Every patch of the numpy array under the same layout, by anchor."""
    src = xr.DataArray(values, dims=("band", "y", "x")).patch(**options).to_grain()
    return {tuple(src[i]["anchor"].tolist()): src[i]["data"] for i in range(len(src))}


# -- the order --------------------------------------------------------------------------


def test_a_sweep_visits_a_whole_line_of_chunks_before_the_next_and_ranks_every_chunk():
    ranks, reversed_axes = sweep_ranks([(3, 5), (2, 2)], seed=4, epoch=0)
    assert sorted(ranks.tolist()) == list(range(15 + 4))
    # Each scene is swept whole: its chunks take consecutive ranks.
    first, second = ranks[:15], ranks[15:]
    assert first.max() - first.min() == 14 and second.max() - second.min() == 3
    # The 5-chunk axis is swept slowest: the first 3 visited share their column.
    visit = np.argsort(first)
    assert len(set((visit[:3] % 5).tolist())) == 1
    assert [len(axes) for axes in reversed_axes] == [2, 2]
    assert waiting_row((3, 5)) == 4


def test_a_patch_comes_after_every_chunk_it_touches_was_visited():
    _, lazy = lazy_scene(40, 40, 10)
    src = lazy.patch(y=8, x=8, stride=5).to_grain()
    touched = src.touched_chunks()
    for epoch in range(3):
        ranks, _ = sweep_ranks(src.chunk_grids(), seed=7, epoch=epoch)
        order = sweep_permutation(touched, ranks, mix=1, seed=7, epoch=epoch)
        assert sorted(order.tolist()) == list(range(len(src)))
        key = np.where(touched >= 0, ranks[np.maximum(touched, 0)], -1).max(axis=1)[order]
        # With mix=1, the chunk a patch is keyed to never goes back by a whole chunk.
        assert (np.diff(key) >= -1).all()


def test_chunk_uses_gives_the_first_and_last_position_of_each_chunk():
    touched = np.array([[0, 1], [1, -1], [2, -1]])
    first, last = chunk_uses(np.array([1, -1, 0, 2]), touched, 4)
    assert first.tolist() == [2, 0, 3, 4] and last.tolist() == [2, 2, 3, -1]


def test_the_same_seed_gives_the_same_order_in_another_process():
    code = (
        "import json, numpy as np, xarray as xr, dask.array as dsa, xpatch\n"
        "values = np.random.default_rng(1).normal(size=(2, 60, 44)).astype('float32')\n"
        "lazy = xr.DataArray(dsa.from_array(values, chunks=(2, 16, 16)), dims=('band','y','x'))\n"
        "src = lazy.patch(y=8, x=8, stride=6).to_grain()\n"
        "print(json.dumps([src.chunk_shuffled_order(seed=11, epoch=e).tolist() for e in (0, 1)]))\n"
    )
    there = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
    )
    _, lazy = lazy_scene(60, 44, 16)
    src = lazy.patch(y=8, x=8, stride=6).to_grain()
    here = [src.chunk_shuffled_order(seed=11, epoch=e).tolist() for e in (0, 1)]
    assert here == there and here[0] != here[1]
    dataset = src.chunk_shuffle(seed=11)
    assert [int(dataset[i]["index"]) for i in range(len(src))] == here[0]


# -- loads --------------------------------------------------------------------------------


@pytest.mark.parametrize("threaded", [False, True])
def test_an_epoch_reads_each_chunk_once_with_a_cache_of_a_few_chunks(threaded):
    # 6 x 5 chunks; patches straddle chunk borders in both axes; the cache holds 10
    # chunks, a third of the data (a row of frames, the chunks being mixed, 12 with
    # those Grain's 16 threads read at once): the chunk order read chunks again for
    # their neighbours' straddling patches.
    values, lazy = lazy_scene(96, 80, 16)
    options = {"y": 10, "x": 10, "stride": 7}
    budget = (12 if threaded else 10) * chunk_bytes(16)
    expected = direct_cuts(values, **options)
    loads = {}
    for order in ("sweep", "chunk"):
        src = lazy.patch(**options).to_grain(cache_bytes=budget)
        # Reads ahead run in threads, whose timing moves a load or two: exact counts
        # are taken without them (and Grain's threads are bounded below).
        dataset = src.chunk_shuffle(seed=3, order=order, read_ahead=None if threaded else 0)
        for epoch in range(2):
            if threaded:
                items = list(dataset.to_iter_dataset())  # Grain's 16 read threads
            else:
                items = [dataset[epoch * len(src) + i] for i in range(len(src))]
            assert sorted(int(item["index"]) for item in items) == list(range(len(src)))
            for item in items:
                np.testing.assert_array_equal(item["data"], expected[tuple(item["anchor"])])
        loads[order] = src.cache_stats().loads
    if threaded:
        assert loads["sweep"] <= 2 * 30 * 1.05, loads
    else:
        assert loads["sweep"] == 2 * 30, loads
    assert loads["chunk"] > 2 * loads["sweep"], loads


def test_three_scenes_of_other_shapes_are_each_read_once_through_one_cache():
    scenes = [lazy_scene(48, 80, 16, seed=s)[1] for s in range(3)]
    scenes[1] = scenes[1].isel(y=slice(0, 32), x=slice(0, 48))
    scenes[2] = lazy_scene(64, 32, 16, seed=2)[1]
    sp = xpatch.patch_scenes(scenes, y=10, x=10, stride=7)
    src = at_the_floor(sp)
    assert src.chunk_count == 15 + 6 + 8
    dataset = src.chunk_shuffle(seed=2, read_ahead=0)
    items = [dataset[i] for i in range(len(src))]
    assert sorted(int(item["index"]) for item in items) == list(range(len(src)))
    for item in items[::7]:
        scene = scenes[int(item["scene"])]
        y, x = item["anchor"].tolist()
        np.testing.assert_array_equal(item["data"], scene[:, y : y + 10, x : x + 10].values)
    assert src.cache_stats().loads == src.chunk_count


def test_a_dataset_with_mixed_dims_is_read_once_and_exact():
    values, image = lazy_scene(64, 64, 16)
    mask = xr.DataArray(dsa.from_array(values[0] > 0, chunks=16), dims=("y", "x"))  # no band dim
    ds = xr.Dataset({"image": image, "mask": mask})
    src = at_the_floor(ds.patch(y=12, x=12, stride=9))
    dataset = src.chunk_shuffle(seed=5, read_ahead=0)
    for i in range(len(src)):
        item = dataset[i]
        y, x = item["anchor"].tolist()
        np.testing.assert_array_equal(item["image"], values[:, y : y + 12, x : x + 12])
        np.testing.assert_array_equal(item["mask"], values[0, y : y + 12, x : x + 12] > 0)
    assert src.cache_stats().loads == 16


def test_workers_read_their_own_runs_and_share_only_the_chunks_at_the_cut():
    _, lazy = lazy_scene(128, 64, 16)  # 8 x 4 chunks
    src = at_the_floor(lazy.patch(y=10, x=10, stride=7))
    total, touched = 0, src.touched_chunks()
    for worker in range(2):
        mine = pickle.loads(pickle.dumps(src))  # as mp_prefetch sends it to a worker
        dataset = mine.chunk_shuffle(seed=1, worker_count=2, batch_size=4, read_ahead=0)
        positions = [i for i in range(len(src)) if (i // 4) % 2 == worker]
        for i in positions:
            dataset[i]
        order = dataset.permutation(0)
        needed = np.unique(touched[order[positions]])
        # Each worker reads each chunk its patches touch once, no more.
        assert mine.cache_stats().loads == len(needed[needed >= 0])
        total += mine.cache_stats().loads
    # Together: all 32 chunks, and at most the row at the cut (4) and its neighbours twice.
    assert 32 <= total <= 32 + 2 * 4, total


def test_a_second_pass_over_the_same_epoch_reads_each_chunk_once_again():
    _, lazy = lazy_scene(64, 64, 16)
    src = at_the_floor(lazy.patch(y=10, x=10, stride=7))
    dataset = src.chunk_shuffle(seed=3, read_ahead=0)
    for _ in range(2):  # e.g. a new iterator after a restore
        for i in range(len(src)):
            dataset[i]
    assert src.cache_stats().loads == 2 * 16
    # A pass restored in the middle of an epoch, in a fresh process (a fresh source):
    # each chunk the positions it reads touch, once.
    fresh = at_the_floor(lazy.patch(y=10, x=10, stride=7))
    restored = fresh.chunk_shuffle(seed=3, read_ahead=0)
    half = range(len(src) // 2, len(src))
    for i in half:
        restored[i]
    touched = fresh.touched_chunks()[restored.permutation(0)[list(half)]]
    assert fresh.cache_stats().loads == len(np.unique(touched[touched >= 0]))


def test_reads_ahead_load_the_coming_chunks_before_they_are_asked_for():
    _, lazy = lazy_scene(64, 64, 16)
    src = lazy.patch(y=8, x=8, stride=8).to_grain()  # 16 chunks, no straddling
    dataset = src.chunk_shuffle(seed=0, read_ahead=4)
    dataset[0]
    deadline = time.monotonic() + 10
    while src.cache_stats().loads < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert src.cache_stats().loads == 5  # the first chunk, and the next 4
    without = lazy.patch(y=8, x=8, stride=8).to_grain()
    without.chunk_shuffle(seed=0, read_ahead=0)[0]
    time.sleep(0.1)
    assert without.cache_stats().loads == 1


def counting_latency_store(store, seconds: float):
    """A zarr ``LatencyStore`` over ``store`` whose class counts the reads in flight at once."""
    from zarr.testing.store import LatencyStore

    class Counting(LatencyStore):
        in_flight = most = 0

        async def get(self, *args, **kwargs):
            type(self).in_flight += 1
            type(self).most = max(type(self).most, type(self).in_flight)
            try:
                return await super().get(*args, **kwargs)
            finally:
                type(self).in_flight -= 1

    return Counting(store, get_latency=seconds)


def slow_items_source(tmp_path, seconds: float, seed: int = 3, fetch_ahead: int | str = 0):
    """8x8 patches of a 64-chunk zarr on a store answering in ``seconds``; values, store class.

    Nothing is fetched ahead unless ``fetch_ahead`` says (``src.fetch_ahead``): the reads
    sent beyond the room are what these tests watch.
    """
    from zarr.storage import LocalStore

    values = np.random.default_rng(seed).integers(0, 4000, (2, 128, 128)).astype("uint16")
    xr.Dataset({"v": (("band", "y", "x"), values)}).to_zarr(
        tmp_path / "s.zarr", encoding={"v": {"chunks": (2, 16, 16)}}, consolidated=False
    )
    slow = counting_latency_store(LocalStore(tmp_path / "s.zarr", read_only=True), seconds)
    da_ = xr.open_zarr(slow, consolidated=False)["v"]
    chunk = 2 * 16 * 16 * 2
    src = da_.patch(y=8, x=8, stride=8).to_grain(cache_bytes=12 * chunk)
    src.fetch_ahead(fetch_ahead)
    return src, values, type(slow)


def check_items(dataset, values: np.ndarray) -> None:
    """Every item of ``dataset`` (8x8 patches of ``values``), in order, equals its patch."""
    for i in range(len(dataset)):
        item = dataset[i]
        y, x = item["anchor"].tolist()
        np.testing.assert_array_equal(item["data"], values[:, y : y + 8, x : x + 8])


def test_where_the_store_answers_late_more_reads_are_in_flight_than_the_cache_keeps_room_for(
    tmp_path,
):
    src, values, store = slow_items_source(tmp_path, 0.03)
    ahead = 3
    check_items(src.chunk_shuffle(seed=2, read_ahead=ahead), values)
    stats = src.cache_stats()
    # Each read waits 30 ms: sent earlier, more are in flight than the 3 the cache
    # keeps room for (and the one this loop asks for), and none lands too early.
    assert store.most > ahead + 1
    assert stats.loads == src.chunk_count and stats.evictions == 0


def test_the_variables_of_a_chunk_on_a_store_that_answers_late_are_fetched_side_by_side(
    tmp_path,
):
    from zarr.storage import LocalStore

    rng = np.random.default_rng(4)
    values = {name: rng.integers(0, 99, (16, 16)).astype("int16") for name in "abcde"}
    xr.Dataset({name: (("y", "x"), v) for name, v in values.items()}).to_zarr(
        tmp_path / "s.zarr", encoding={n: {"chunks": (16, 16)} for n in values}, consolidated=False
    )
    slow = counting_latency_store(LocalStore(tmp_path / "s.zarr", read_only=True), 0.05)
    src = xr.open_zarr(slow, consolidated=False).patch(y=8, x=8).to_grain()
    type(slow).most = 0  # opening read the metadata
    item = src[0]  # one chunk of each variable: five reads of 50 ms
    assert type(slow).most >= 4  # five at once (a busy machine may start one late); one before
    for name in values:
        np.testing.assert_array_equal(item[name], values[name][:8, :8])


def test_a_zarr_opened_by_xarray_is_read_from_the_store_without_dask(tmp_path):
    values = np.random.default_rng(0).integers(0, 1000, (2, 48, 48)).astype("uint16")
    xr.Dataset({"v": (("band", "y", "x"), values)}).to_zarr(
        tmp_path / "s.zarr", encoding={"v": {"chunks": (2, 16, 16)}}, consolidated=False
    )
    da_ = xr.open_zarr(tmp_path / "s.zarr", consolidated=False)["v"]
    assert stored_array(da_.data) is not None
    assert stored_array((da_ + 1).data) is None and stored_array(da_.data.rechunk(8)) is None
    src = da_.patch(y=12, x=12, stride=9).to_grain()
    dataset = src.chunk_shuffle(seed=1)
    import dask

    with dask.config.set(scheduler=_refuse):  # no dask computation at all
        for i in range(len(src)):
            item = dataset[i]
            y, x = item["anchor"].tolist()
            np.testing.assert_array_equal(item["data"], values[:, y : y + 12, x : x + 12])
    assert src.cache_stats().loads == 9


def _refuse(*args, **kwargs):
    raise AssertionError("dask computed")


@pytest.mark.parametrize("kind", ["geotiff", "netcdf"])
def test_a_geotiff_or_netcdf_opened_with_chunks_is_read_from_the_file_without_dask(kind, tmp_path):
    import dask

    values = np.random.default_rng(0).integers(0, 1000, (2, 48, 48)).astype("uint16")
    scene = xr.DataArray(values, dims=("band", "y", "x"))
    if kind == "geotiff":
        rioxarray = pytest.importorskip("rioxarray")
        scene.rio.to_raster(tmp_path / "s.tif", tiled=True, blockxsize=16, blockysize=16)
        opened = rioxarray.open_rasterio(tmp_path / "s.tif", chunks=(2, 16, 16))
    else:
        # scipy's netCDF3 engine: scipy is a dependency, netCDF4 is not.
        scene.to_dataset(name="v").to_netcdf(tmp_path / "s.nc", engine="scipy")
        opened = xr.open_dataset(tmp_path / "s.nc", engine="scipy", chunks={"y": 16, "x": 16})
        opened = opened["v"]
    assert stored_array(opened.data) is not None
    src = opened.patch(y=12, x=12, stride=9).to_grain()
    dataset = src.chunk_shuffle(seed=1)
    with dask.config.set(scheduler=_refuse):
        for i in range(len(src)):
            item = dataset[i]
            y, x = item["anchor"].tolist()
            np.testing.assert_array_equal(item["data"], values[:, y : y + 12, x : x + 12])
    assert src.cache_stats().loads == 9


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(12, 60),
    cols=st.integers(12, 60),
    chunk=st.integers(5, 20),
    size=st.integers(2, 12),
    stride=st.integers(1, 12),
    cache_chunks=st.integers(1, 10),
    workers=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_property_every_patch_once_exact_whatever_the_cache_and_the_workers(
    rows, cols, chunk, size, stride, cache_chunks, workers, seed
):
    values, lazy = lazy_scene(rows, cols, chunk)
    options = {"y": min(size, rows), "x": min(size, cols), "stride": min(stride, size)}
    src = lazy.patch(**options).to_grain(cache_bytes=cache_chunks * chunk_bytes(chunk))
    report = src.memory_report()
    if report.below_floor:  # refused before any read, the floor named
        with pytest.raises(xpatch.OptionError, match=f"cache_bytes >= {report.floor_bytes}"):
            src.chunk_shuffle(seed=seed, worker_count=workers, batch_size=3)
        assert src.cache_stats().loads == 0
        src = lazy.patch(**options).to_grain(cache_bytes=report.floor_bytes)
    dataset = src.chunk_shuffle(seed=seed, worker_count=workers, batch_size=3)
    expected = direct_cuts(values, **options)
    served = []
    for worker in range(workers):  # each worker's share, as mp_prefetch deals it
        for i in range(len(src)):
            if (i // 3) % workers == worker:
                item = dataset[i]
                served.append(int(item["index"]))
                np.testing.assert_array_equal(item["data"], expected[tuple(item["anchor"])])
    assert sorted(served) == list(range(len(src)))


def test_bad_options_name_the_argument_and_the_fix():
    _, lazy = lazy_scene(32, 32, 16)
    src = lazy.patch(y=8, x=8).to_grain()
    with pytest.raises(xpatch.OptionError, match="order='random' is not one of"):
        src.chunk_shuffle(seed=0, order="random")
    with pytest.raises(xpatch.OptionError, match="mix=0 must be an int >= 1"):
        src.chunk_shuffle(seed=0, mix=0)
    with pytest.raises(xpatch.OptionError, match="read_ahead=-1 must be an int >= 0"):
        src.chunk_shuffle(seed=0, read_ahead=-1)


def test_batches_of_the_sweep_mix_several_chunks_and_more_than_the_chunk_order():
    _, lazy = lazy_scene(160, 160, 16)  # 10 x 10 chunks
    src = lazy.patch(y=8, x=8, stride=6).to_grain()
    sweep = src.anchor_chunks_per_batch(src.chunk_shuffled_order(seed=0))
    chunk = src.anchor_chunks_per_batch(src.chunk_shuffled_order(seed=0, order="chunk"))
    one_chunk = src.anchor_chunks_per_batch(src.chunk_shuffled_order(seed=0, mix=1))
    assert sweep >= 8 > chunk and sweep > one_chunk, (sweep, chunk, one_chunk)
    with pytest.raises(xpatch.OptionError, match="batch_size=10000 is more than"):
        src.anchor_chunks_per_batch(np.arange(len(src)), batch_size=10_000)


def test_a_torch_dataloader_reads_a_batch_in_one_call_in_the_sweeps_order():
    torch = pytest.importorskip("torch")
    values, lazy = lazy_scene(64, 64, 16)
    src = lazy.patch(y=12, x=12, stride=9).to_grain(weights=False)
    calls = []
    getitems = type(src).__getitems__

    def counted(self, indices):
        calls.append(list(indices))
        return getitems(self, indices)

    order = src.chunk_shuffled_order(seed=4).tolist()
    loader = torch.utils.data.DataLoader(src, batch_size=8, sampler=order)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(src), "__getitems__", counted)
        batches = list(loader)
    assert [i for call in calls for i in call] == order  # one call per batch, in order
    assert len(calls) == len(batches) == -(-len(src) // 8)
    first = batches[0]
    y, x = first["anchor"][0].tolist()
    np.testing.assert_array_equal(first["data"][0].numpy(), values[:, y : y + 12, x : x + 12])


def test_a_read_left_waiting_by_the_next_epoch_returns_and_never_winds_the_epoch_back():
    # Grain's threads read ahead across epochs (.repeat()): a read of the old epoch
    # waiting for its turn when the next epoch starts must return, not wait forever for
    # positions nobody reads any more, nor plan its old epoch again (that leaked the new
    # epoch's reads, and every later read waited for them: pytest hung at exit).
    import threading

    from xpatch.grain.readahead import SweepReads

    class Chunks:
        def read_ahead(self, chunk):
            pass

        def release(self, chunk, keep_frame):
            pass

        def set_sweep_direction(self, reversed_axes):
            pass

    n = 200
    touched = np.arange(n)[:, None] // 10  # 20 chunks of 10 patches
    reads = SweepReads(
        Chunks(),
        touched,
        20,
        lambda epoch: np.arange(n),
        lambda epoch: (np.arange(20), [(False,)]),
        ahead=0,
    )
    reads.reached(0)  # epoch 0 starts; position 0 stays in flight
    late = threading.Thread(target=reads.reached, args=(150,))  # must wait for position 0
    late.start()
    time.sleep(0.2)
    assert late.is_alive()
    reads.reached(n)  # epoch 1, position 0
    late.join(timeout=2)
    assert not late.is_alive()
    reads.finished(n)
    assert reads._epoch == 1 and not reads._in_flight
    for i in range(n + 1, 2 * n):  # the rest of epoch 1 goes on, no read waits
        reads.reached(i)
        reads.finished(i)
    assert reads._low == n


@settings(max_examples=200, deadline=None)
@given(
    ahead=st.integers(0, 12),
    loads=st.none() | st.integers(0, 16),
    landings=st.lists(st.tuples(st.booleans(), st.floats(0, 1), st.floats(0, 1)), max_size=60),
)
def test_reads_sent_beyond_the_room_stay_within_their_bound_and_follow_late_waits(
    ahead, loads, landings
):
    from xpatch.grain.readahead import MAX_LATE_PER_AHEAD, LateReads

    late = LateReads(ahead, loads)
    most = MAX_LATE_PER_AHEAD * ahead if ahead > 1 else 0
    if loads is not None:  # never more reads out at once than the reader loads at once
        most = min(most, max(loads - ahead, 0))
    assert late.most == most
    for is_late, waited, rest in landings:
        before = late.count
        late.landed(is_late, waited, waited + rest)
        assert 0 <= late.count <= most
        if is_late and waited >= rest:  # a wait for the store, not decoding: one more
            assert late.count == min(before + 1, most)
        else:  # never more for a read in time, or one that decoded longer than it waited
            assert late.count <= before
    # From any state, as many late waits as the bound reach it; a run in time ends at 0.
    for _ in range(most):
        late.landed(True, 0.02, 0.024)
    assert late.count == most
    for _ in range(most * max(ahead, 1)):
        late.landed(False, 0.02, 0.024)
    assert late.count == 0


def slow_batches(tmp_path, seconds: float, fetch_ahead: int | str = 0):
    """A BatchSource over a 64-chunk zarr on a store answering in ``seconds``; values, store.

    Nothing is fetched ahead unless ``fetch_ahead`` says (as :func:`slow_items_source`).
    """
    from zarr.storage import LocalStore

    from xpatch.grain import BatchSource

    values = np.random.default_rng(5).integers(0, 4000, (2, 128, 128)).astype("uint16")
    xr.Dataset({"v": (("band", "y", "x"), values)}).to_zarr(
        tmp_path / "s.zarr", encoding={"v": {"chunks": (2, 16, 16)}}, consolidated=False
    )
    slow = counting_latency_store(LocalStore(tmp_path / "s.zarr", read_only=True), seconds)
    src = xr.open_zarr(slow, consolidated=False)["v"].patch(y=8, x=8, stride=8)
    src = src.to_grain(cache_bytes=24 * 2 * 16 * 16 * 2)
    src.fetch_ahead(fetch_ahead)
    return BatchSource(src, 4, seed=2), values, type(slow)


def check_batch(batches, k: int, values: np.ndarray) -> None:
    batch = batches[k]
    for data, (y, x) in zip(batch["data"], batch["anchor"].tolist()):
        np.testing.assert_array_equal(data, values[:, y : y + 8, x : x + 8])


def test_batches_asked_as_fast_as_a_slow_store_answers_get_reads_beyond_the_room(tmp_path):
    # The count of reads beyond the room was computed from the sweep's pace, which the
    # reads in flight set: it settled below its bound (1 GiB, 20 ms a read: 2-3 of 4).
    batches, values, store = slow_batches(tmp_path, 0.03)
    ahead = batches._tracking().ahead
    assert ahead > 1
    for k in range(len(batches)):
        check_batch(batches, k, values)
    stats = batches.cache_stats()
    assert stats.loads == batches.source.chunk_count and stats.evictions == 0
    assert batches._tracking().late.count == batches._tracking().late.most
    assert store.most > ahead + 1


def count_reads_ahead(source) -> dict:
    """Count ``source.read_ahead`` calls at once: ``sent["most"]`` is the most seen."""
    reading = threading.Lock()
    sent = {"now": 0, "most": 0}
    read_ahead = source.read_ahead

    def counted(*args, **kwargs):
        with reading:
            sent["now"] += 1
            sent["most"] = max(sent["most"], sent["now"])
        try:
            return read_ahead(*args, **kwargs)
        finally:
            with reading:
                sent["now"] -= 1

    source.read_ahead = counted
    return sent


def test_items_read_ahead_never_outnumber_the_readers_loads_at_once(tmp_path):
    # The items sweep shares the bound with BatchSource (below).
    src, values, _ = slow_items_source(tmp_path, 0.03)
    ahead = 3
    src.reader.max_reads = ahead + 1  # before the sweep and the first load start
    sent = count_reads_ahead(src)
    dataset = src.chunk_shuffle(seed=2, read_ahead=ahead)
    check_items(dataset, values)
    assert 1 < sent["most"] <= ahead + 1
    assert dataset._reading()._late.most == 1  # the one read the gate has room for
    stats = src.cache_stats()
    assert stats.loads == src.chunk_count and stats.evictions == 0


def test_reads_ahead_sent_at_once_never_outnumber_the_readers_loads_at_once(tmp_path):
    # A read beyond the reader's gate waited there and could only land early and hold its
    # chunk: on moto's S3 server 12-16 MiB more at the peak of an ERA5 epoch, no faster.
    batches, values, _ = slow_batches(tmp_path, 0.03)
    source = batches.source
    _, ahead = source.chunk_reads.sweep_settings(batches.mix, None)
    assert ahead > 1
    source.reader.max_reads = ahead + 1  # before the sweep and the first load start
    sent = count_reads_ahead(source)
    for k in range(len(batches)):
        check_batch(batches, k, values)
    assert 1 < sent["most"] <= ahead + 1
    late = batches._tracking().late
    assert late.most == 1 and late.count == 1  # the one read the gate has room for
    stats = batches.cache_stats()
    assert stats.loads == source.chunk_count and stats.evictions == 0


def test_batches_asked_slower_than_a_slow_store_answers_get_no_reads_beyond_the_room(tmp_path):
    # A training step slower than the store: reads beyond the room would only wait in the cache.
    batches, values, _ = slow_batches(tmp_path, 0.01)
    releases = batches._tracking()
    counts = []
    for k in range(len(batches)):
        check_batch(batches, k, values)
        counts.append(releases.late.count)
        time.sleep(0.06)
    assert max(counts[len(counts) // 2 :]) == 0
    stats = batches.cache_stats()
    assert stats.loads == batches.source.chunk_count and stats.evictions == 0
