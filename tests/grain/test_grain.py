"""The Grain source: items, chunk cache, chunk-local shuffle, pickling, predictions."""

from __future__ import annotations

import pickle
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import dask.array as dsa
import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xpatch
from tests.conftest import ComputeCounter, forbid_compute, run_script
from tests.xarray.test_roundtrip import build, layouts, patch_options
from xpatch.core.chunk_cache import ChunkCache

grain = pytest.importorskip("grain")


def dask_scene(chunks=(3, 16, 16)) -> xr.DataArray:
    values = np.random.default_rng(0).normal(size=(3, 64, 80)).astype("float32")
    return xr.DataArray(dsa.from_array(values, chunks=chunks), dims=("band", "y", "x"))


def epoch_order(dataset) -> list[int]:
    return [int(item["index"]) for item in dataset]


# -- items ------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_items_are_the_patches_for_numpy_and_dask_input(layout):
    shape, sizes, strides, boundary, chunks, window, carried, dtype, seed = layout
    eager = build(shape, carried, dtype, seed)
    lazy = eager.chunk(dict(zip(eager.dims[1:], chunks)))
    options = patch_options(eager, sizes, strides, boundary, window)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", xpatch.UncoveredCellsWarning)
        for obj in (eager, lazy):
            p = obj.patch(**options)
            src = p.to_grain(cache_bytes=4 * eager.nbytes)
            expected = p.patches().values
            anchors = np.asarray(p.anchors())
            for i in range(len(src)):
                item = src[i]
                np.testing.assert_array_equal(item["data"], expected[i])
                assert item["data"].dtype == eager.dtype
                np.testing.assert_array_equal(item["anchor"], anchors[i])
                assert int(item["index"]) == i
            if isinstance(obj.data, dsa.Array):
                assert src.cache_stats().loads == src.chunk_count


def test_seed_recipe_runs_through_xpatch():
    arr = np.arange(256 * 256, dtype=np.float32).reshape(256, 256)
    field = xr.DataArray(arr, dims=("y", "x"))
    with pytest.warns(xpatch.UncoveredCellsWarning):
        p = field.patch(y=32, x=32, stride=24, window="hann", boundary="drop")
    source = p.to_grain()
    assert len(source) == 100
    assert source[0]["data"].shape == (32, 32)
    dataset = grain.MapDataset.source(source).shuffle(seed=42).batch(batch_size=8)
    batch = next(iter(dataset))
    shapes = {k: v.shape for k, v in batch.items()}
    assert shapes == {"data": (8, 32, 32), "weights": (8, 32, 32), "anchor": (8, 2), "index": (8,)}
    for row, i in enumerate(batch["index"]):
        y, x = batch["anchor"][row]
        np.testing.assert_array_equal(batch["data"][row], arr[y : y + 32, x : x + 32])
        np.testing.assert_array_equal(batch["anchor"][row], np.asarray(p.anchors())[i])
    np.testing.assert_allclose(batch["weights"][0], p.weights().values, rtol=1e-6)


def test_dataset_items_keep_variables_aligned():
    image = dask_scene()
    mask = (image.isel(band=0) > 0).compute()  # numpy-backed beside a dask variable
    ds = xr.Dataset({"image": image, "mask": mask.transpose("x", "y"), "label": 1})
    src = ds.patch(y=20, x=24, stride=12).to_grain()
    assert src.variables == ("image", "mask")
    for i in range(len(src)):
        item = src[i]
        y, x = item["anchor"]
        np.testing.assert_array_equal(item["image"], image.values[:, y : y + 20, x : x + 24])
        np.testing.assert_array_equal(item["mask"], mask.values[y : y + 20, x : x + 24].T)
        assert item["mask"].dtype == bool
    only = ds.patch(y=20, x=24).to_grain(variables=["mask"])
    assert sorted(only[0]) == ["anchor", "index", "mask", "weights"]


def test_variables_chunked_differently_are_read_by_the_first_ones_chunks():
    image = dask_scene()  # 16 x 16 chunks set the grid
    other = image.isel(band=0).chunk({"y": 20, "x": 24}) * 2  # straddles that grid
    ds = xr.Dataset({"image": image, "other": other})
    src = ds.patch(y=20, x=20, stride=10).to_grain()
    for i in range(len(src)):
        y, x = src[i]["anchor"]
        np.testing.assert_array_equal(src[i]["other"], other.values[y : y + 20, x : x + 20])
    assert src.cache_stats().loads == src.chunk_count == 20


def test_a_file_opened_without_dask_is_read_window_by_window_not_whole(tmp_path):
    values = np.random.default_rng(2).normal(size=(2, 40, 48)).astype("float32")
    xr.DataArray(values, dims=("band", "y", "x"), name="s").to_dataset().to_zarr(
        tmp_path / "s.zarr"
    )
    lazy = xr.open_zarr(tmp_path / "s.zarr", chunks=None)["s"]
    src = lazy.patch(y=16, x=16, stride=12).to_grain()
    repr(src)
    assert not lazy.variable._in_memory  # building read nothing whole
    for i in range(len(src)):
        y, x = src[i]["anchor"]
        np.testing.assert_array_equal(src[i]["data"], values[:, y : y + 16, x : x + 16])
    assert not lazy.variable._in_memory
    again = xr.open_zarr(tmp_path / "s.zarr", chunks=None)["s"]
    assert repr(again.patch(y=16, x=16, stride=12).to_grain()) == repr(src)


def test_the_chunks_that_order_the_patches_are_the_chunks_that_are_cached():
    image = dask_scene()  # 16 x 16 chunks order the patches
    other = image.isel(band=0).chunk({"y": 32, "x": 40})
    src = xr.Dataset({"image": image, "other": other}).patch(y=8, x=8).to_grain(variables=["other"])
    assert src.chunk_count == 20
    order = src.chunk_of_patch()
    assert (np.diff(order) >= 0).all()  # chunk-major in the grid that is cached


def test_padded_cells_get_the_pad_value_and_zero_weight():
    scene = dask_scene()
    src = scene.patch(y=48, x=48, stride=40, boundary="pad", window="hann").to_grain()
    last = src[len(src) - 1]
    y, x = last["anchor"]
    inside_y, inside_x = 64 - y, 80 - x
    assert inside_y < 48 and inside_x < 48
    assert np.isnan(last["data"][:, inside_y:, :]).all()
    assert np.isnan(last["data"][:, :, inside_x:]).all()
    np.testing.assert_array_equal(last["data"][:, :inside_y, :inside_x], scene.values[:, y:, x:])
    assert (last["weights"][inside_y:, :] == 0).all() and (last["weights"][:, inside_x:] == 0).all()
    assert (last["weights"][:inside_y, :inside_x] > 0).all()
    assert src[0]["weights"].dtype == np.float32 and (src[0]["weights"] > 0).all()


def test_items_do_not_alias_the_input_or_the_cache():
    values = np.zeros((3, 32, 32), "float32")
    scene = xr.DataArray(dsa.from_array(values, chunks=(3, 16, 16)), dims=("band", "y", "x"))
    src = scene.patch(y=16, x=16, stride=8).to_grain()
    first = src[0]
    first["data"] += 1
    assert (values == 0).all() and (src[0]["data"] == 0).all()
    first["weights"][:] = 0
    assert (src[0]["weights"] > 0).all()


def test_weights_false_leaves_the_weights_out_and_serves_the_same_patches():
    scene = dask_scene()
    with_weights = scene.patch(y=24, x=24, stride=20).to_grain()
    without = scene.patch(y=24, x=24, stride=20).to_grain(weights=False)
    for i in range(len(without)):
        item, full = without[i], with_weights[i]
        assert sorted(item) == ["anchor", "data", "index"]
        np.testing.assert_array_equal(item["data"], full["data"])
    with pytest.raises(xpatch.OptionError, match="weights='no' must be True or False"):
        scene.patch(y=24, x=24).to_grain(weights="no")


def test_negative_indices_count_from_the_end_and_bad_ones_are_refused():
    src = dask_scene().patch(y=32, x=40).to_grain()
    np.testing.assert_array_equal(src[-1]["data"], src[len(src) - 1]["data"])
    assert int(src[-1]["index"]) == len(src) - 1
    with pytest.raises(IndexError, match="out of range for 4 patches"):
        src[4]
    with pytest.raises(TypeError, match="must be an int"):
        src[1.0]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"cache_bytes": -1}, xpatch.OptionError, "cache_bytes=-1 must be a number of bytes"),
        ({"variables": ["a"]}, xpatch.OptionError, "applies to Datasets"),
    ],
)
def test_bad_source_options_are_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        dask_scene().patch(y=32, x=40).to_grain(**kwargs)


def test_bad_dataset_variables_are_refused():
    image = dask_scene()
    ds = xr.Dataset({"image": image, "scale": image.isel(x=0, y=0), "weights": image})
    with pytest.raises(xpatch.DimensionError, match=r"\['scale'\] have none of the patched"):
        ds.patch(y=32, x=40).to_grain(variables=["image", "scale"])
    with pytest.raises(xpatch.OptionError, match="collide with the item keys"):
        ds.patch(y=32, x=40).to_grain()
    with pytest.raises(xpatch.OptionError, match="selects nothing"):
        ds.patch(y=32, x=40).to_grain(variables=[])


# -- chunks, cache and laziness ---------------------------------------------------------


def test_building_the_source_computes_nothing():
    scene = dask_scene()
    with forbid_compute():
        src = scene.patch(y=24, x=24, stride=12).to_grain()
        repr(src)
        len(src)


@pytest.mark.parametrize("computed", [True, False], ids=["tasks", "blocks held in the graph"])
def test_each_chunk_is_computed_once_per_epoch_not_once_per_patch(computed):
    # ``from_array`` keeps numpy blocks in its graph: they are taken, not computed.
    scene = dask_scene() + 0 if computed else dask_scene()
    src = scene.patch(y=24, x=24, stride=12).to_grain()
    with ComputeCounter() as counter:
        for i in range(len(src)):
            src[i]
    assert len(src) == 30 and src.chunk_count == 20
    assert counter.computes == (src.chunk_count if computed else 0)
    stats = src.cache_stats()
    assert stats.loads == src.chunk_count
    assert stats.cached_bytes == scene.nbytes
    with ComputeCounter() as counter:
        src[7]
    assert counter.computes == 0
    assert src.cache_stats().loads == src.chunk_count  # served from the cache, not reloaded


def test_blocks_held_in_the_graph_are_served_read_only_without_touching_the_graph():
    scene = dask_scene()
    held = [v for v in dict(scene.data.__dask_graph__()).values() if isinstance(v, np.ndarray)]
    assert len(held) == 20  # the premise: from_array keeps its blocks in the graph
    src = scene.patch(y=24, x=24, stride=12).to_grain()
    expected = scene.values
    for i in range(len(src)):
        item = src[i]
        y, x = item["anchor"].tolist()
        np.testing.assert_array_equal(item["data"], expected[:, y : y + 24, x : x + 24])
    chunk = src.reader.cache.get((0, 1), lambda: None)["data"]
    assert not chunk.flags.writeable
    assert all(v.flags.writeable for v in held)  # the caller's graph is left as it was


@pytest.mark.parametrize(
    "kind, held",
    [("from_array", True), ("masked", False), ("locked", False), ("task", False)],
)
def test_read_region_takes_only_plain_numpy_blocks_from_the_graph(kind, held):
    from xpatch.core.chunk_cache import _held_blocks, read_region

    data = np.arange(3 * 8 * 10, dtype="float32").reshape(3, 8, 10)
    array = {
        "from_array": lambda: dsa.from_array(data, chunks=(3, 4, 5)),
        "masked": lambda: dsa.from_array(np.ma.masked_array(data, data > 100), chunks=(3, 4, 5)),
        "locked": lambda: dsa.from_array(data, chunks=(3, 4, 5), lock=True),
        "task": lambda: dsa.from_array(data, chunks=(3, 4, 5)) + 0,
    }[kind]()
    keys = [(array.name, 0, 1, 0), (array.name, 0, 1, 1)]
    blocks = _held_blocks(array, keys)
    assert (blocks is not None) == held
    if held:  # the graph's own arrays, not copies
        graph = dict(array.__dask_graph__())
        assert all(blocks[key] is graph[key] for key in keys)
    region = read_region(array, [1, 2], [slice(4, 8), slice(0, 10)])
    np.testing.assert_array_equal(region, data[:, 4:8])


def test_cache_stays_within_its_byte_limit_and_counts_evictions():
    scene = dask_scene()
    chunk_bytes = 3 * 16 * 16 * 4
    src = scene.patch(y=16, x=16).to_grain(cache_bytes=2 * chunk_bytes)
    for i in reversed(range(len(src))):  # not in index order: the cache evicts by itself
        src[i]
        assert src.cache_stats().cached_bytes <= 2 * chunk_bytes
    stats = src.cache_stats()
    assert stats.loads == 20 and stats.evictions == 18
    src.clear_cache()
    assert src.cache_stats() == type(stats)(0, 0, 0, 0)


def test_the_cache_reports_the_most_bytes_it_held_at_once_never_above_its_limit():
    cache = ChunkCache(max_bytes=100)
    for key in "ab":
        cache.get(key, lambda: np.zeros(5))  # 40 bytes each
    cache.release("a")
    assert cache.stats().cached_bytes == 40 and cache.stats().peak_bytes == 80
    for key in "cde":  # 120 bytes asked: one is evicted each time past two
        cache.get(key, lambda: np.zeros(5))
    assert cache.stats().evictions == 2 and cache.stats().peak_bytes == 80
    cache.get("big", lambda: np.zeros(13))  # 104 bytes: served, not kept
    assert cache.stats().peak_bytes == 80
    cache.clear()
    assert cache.stats().peak_bytes == 0


def test_a_sequential_epoch_reads_each_chunk_once_with_two_rows_of_chunks_cached():
    scene = dask_scene()  # 4 x 5 chunks
    src = scene.patch(y=12, x=12, stride=8).to_grain(cache_bytes=2 * 5 * 3 * 16 * 16 * 4)
    for i in range(len(src)):
        src[i]
    assert src.cache_stats().loads == src.chunk_count


def test_chunks_read_ahead_and_not_asked_for_yet_are_evicted_first_the_newest_first():
    # Least-recently-used alone evicts the chunks a sweep still mixes: read again, each
    # evicts the next.
    cache = ChunkCache(max_bytes=5 * 8)
    for key in "ab":
        cache.get(key, lambda: np.zeros(1))  # in use by the sweep
    for key in "cde":
        cache.get(key, lambda: np.zeros(1), ahead=True)  # read ahead in order of first use
    cache.get("c", lambda: None)  # asked for: in use now
    cache.get("f", lambda: np.zeros(1))  # a load the cache has no room for
    assert not cache.holds("e") and all(cache.holds(k) for k in "abcdf")
    cache.get("g", lambda: np.zeros(1))
    assert not cache.holds("d")
    cache.get("h", lambda: np.zeros(1))  # none read ahead and unasked left: the oldest
    assert not cache.holds("a") and all(cache.holds(k) for k in "bcfgh")
    assert cache.stats().evictions == 3
    # Asked for through get_or_frame too, a chunk read ahead is evicted by recent use again.
    cache.release("h")
    cache.get("j", lambda: np.zeros(1), ahead=True)
    cache.get_or_frame("j", lambda frame: None, lambda: None)
    cache.get("k", lambda: np.zeros(1))
    assert cache.holds("j") and not cache.holds("b")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.booleans()), max_size=60), st.integers(1, 6))
def test_the_cache_evicts_as_its_model_says_and_stays_within_its_limit(requests, room):
    cache = ChunkCache(max_bytes=room * 8)
    held: list[int] = []  # least recently used first
    unasked: list[int] = []  # read ahead, not asked for since; in the order they landed
    for key, ahead in requests:
        if key in held:
            if not ahead and key in unasked:
                unasked.remove(key)
            held.remove(key)
            held.append(key)
        elif not ahead or len(held) < room:
            held.append(key)
            if ahead:
                unasked.append(key)
            while len(held) > room:
                others = [k for k in unasked if k != key]
                victim = others[-1] if others else next(k for k in held if k != key)
                held.remove(victim)
                if victim in unasked:
                    unasked.remove(victim)
        cache.get(key, lambda: np.zeros(1), ahead=ahead)
        assert sorted(k for k in range(10) if cache.holds(k)) == sorted(held)
        assert cache.stats().cached_bytes == 8 * len(held) <= room * 8


def test_concurrent_requests_for_one_chunk_load_it_once():
    cache = ChunkCache(max_bytes=2**20)
    calls = []
    start = threading.Barrier(8)

    def slow_load():
        calls.append(1)
        time.sleep(0.2)
        return np.ones(4)

    def ask(_):
        start.wait()
        return cache.get("chunk", slow_load)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(ask, range(8)))
    assert len(calls) == 1
    assert all(r is results[0] for r in results)
    assert cache.stats().loads == 1 and cache.stats().hits == 7


def test_a_failed_load_reaches_every_waiter_and_is_retried_later():
    cache = ChunkCache(max_bytes=2**20)
    start = threading.Barrier(4)
    calls = []

    def failing():
        calls.append(1)
        time.sleep(0.2)
        raise OSError("disk gone")

    def ask(_):
        start.wait()
        try:
            cache.get("k", failing)
        except OSError as error:
            return str(error)

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(ask, range(4))) == ["disk gone"] * 4
    assert len(calls) == 1  # the waiters got the one load's error, they did not retry
    assert cache.get("k", lambda: np.zeros(1)).tolist() == [0.0]
    assert cache.stats().loads == 2


def test_an_interrupted_load_is_taken_over_by_a_waiting_thread():
    cache = ChunkCache(max_bytes=2**20)
    started = threading.Event()

    def interrupted():
        started.set()
        time.sleep(0.2)
        raise KeyboardInterrupt

    def waiter():
        started.wait()
        return cache.get("k", lambda: np.ones(2))

    with ThreadPoolExecutor(1) as pool:
        result = pool.submit(waiter)
        with pytest.raises(KeyboardInterrupt):
            cache.get("k", interrupted)
        assert result.result(timeout=5).tolist() == [1.0, 1.0]
    assert cache.stats().loads == 2 and cache.stats().hits == 0


def test_a_chunk_larger_than_the_cache_is_served_but_not_kept():
    cache = ChunkCache(max_bytes=8)
    assert cache.get("big", lambda: np.zeros(4)).shape == (4,)
    assert cache.stats().cached_bytes == 0
    cache.get("big", lambda: np.zeros(4))
    assert cache.stats().loads == 2


def test_many_threads_get_the_same_items_as_one():
    scene = dask_scene(chunks=(1, 16, 16))  # chunked along band too
    src = scene.patch(y=24, x=24, stride=12).to_grain()
    expected = [src[i]["data"] for i in range(len(src))]
    src.clear_cache()
    order = np.random.default_rng(1).permutation(len(src)).tolist() * 3
    with ThreadPoolExecutor(16) as pool:
        items = list(pool.map(src.__getitem__, order))
    for i, item in zip(order, items):
        np.testing.assert_array_equal(item["data"], expected[i])
    assert src.cache_stats().loads == src.chunk_count


def test_grains_threaded_reads_give_the_sequential_batches():
    src = dask_scene().patch(y=24, x=24, stride=12).to_grain()
    dataset = grain.MapDataset.source(src).batch(4)
    sequential = [b["data"] for b in dataset]
    threaded = [b["data"] for b in dataset.to_iter_dataset(grain.ReadOptions(num_threads=16))]
    assert len(threaded) == len(sequential)
    for a, b in zip(sequential, threaded):
        np.testing.assert_array_equal(a, b)


# -- pickling and repr ------------------------------------------------------------------


def test_the_source_pickles_without_its_cache():
    src = dask_scene().patch(y=24, x=24, stride=12).to_grain()
    empty = len(pickle.dumps(src))
    for i in range(len(src)):
        src[i]
    assert len(pickle.dumps(src)) < empty + 1024  # the cache holds 61 kB
    clone = pickle.loads(pickle.dumps(src))
    assert clone.cache_stats().loads == 0
    assert repr(clone) == repr(src)
    np.testing.assert_array_equal(clone[5]["data"], src[5]["data"])


REPR_SCRIPT = """
import numpy as np, xarray as xr, dask.array as dsa, xpatch
values = np.arange(3 * 64 * 80, dtype="float32").reshape(3, 64, 80)
scene = xr.DataArray(dsa.from_array(values, chunks=(3, 16, 16)), dims=("band", "y", "x"))
result = scene.patch(y=24, x=24, stride=12, window="hann").to_grain()
print(repr(result))
"""


def test_repr_is_the_same_in_another_process_and_tells_data_apart():
    out = run_script(REPR_SCRIPT).strip()
    assert "object at" not in out
    exec_globals: dict = {}
    exec(REPR_SCRIPT.replace("print(repr(result))", ""), exec_globals)  # the same construction here
    assert repr(exec_globals["result"]) == out
    assert out.endswith(f"fingerprint={exec_globals['result'].fingerprint})")
    values = np.arange(3 * 64 * 80, dtype="float32").reshape(3, 64, 80)
    other = xr.DataArray(dsa.from_array(values + 1, chunks=(3, 16, 16)), dims=("band", "y", "x"))
    assert repr(other.patch(y=24, x=24, stride=12, window="hann").to_grain()) != out
    assert repr(exec_globals["scene"].patch(y=24, x=24, stride=8).to_grain()) != out


# -- chunk-local shuffle and sharding ---------------------------------------------------


def test_the_chunk_order_visits_chunks_whole_in_a_new_order_every_epoch():
    src = dask_scene().patch(y=8, x=8, stride=4).to_grain()
    chunk = src.chunk_of_patch()
    dataset = src.chunk_shuffle(seed=7, order="chunk")
    first = epoch_order(dataset)
    assert sorted(first) == list(range(len(src)))
    # Each chunk's patches come as one run.
    runs = chunk[first][np.r_[True, np.diff(chunk[first]) != 0]]
    assert len(runs) == len(set(runs.tolist())) == src.chunk_count
    two = epoch_order(
        grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=7, order="chunk").repeat(2)
    )
    assert two[: len(src)] == first
    assert sorted(two[len(src) :]) == list(range(len(src))) and two[len(src) :] != first
    assert epoch_order(src.chunk_shuffle(seed=8, order="chunk")) != first
    assert first == src.chunk_shuffled_order(seed=7, order="chunk").tolist()
    clone = pickle.loads(pickle.dumps(dataset))
    assert epoch_order(clone) == first


def test_chunk_shuffle_reads_far_fewer_chunks_than_a_global_shuffle():
    scene = dask_scene()
    chunk_bytes = 3 * 16 * 16 * 4
    loads = {}
    for kind in ("chunk", "global"):
        src = scene.patch(y=8, x=8, stride=4).to_grain(cache_bytes=4 * chunk_bytes)
        base = grain.MapDataset.source(src)
        dataset = (
            src.chunk_shuffle(seed=3, order="chunk") if kind == "chunk" else base.shuffle(seed=3)
        )
        for i in range(len(dataset)):  # one reader: iterating reads ahead on 16 threads
            dataset[i]
        loads[kind] = src.cache_stats().loads / src.chunk_count
    # A chunk's group needs at most 4 chunks (patches straddle right and down).
    assert loads["chunk"] <= 4
    assert loads["global"] > 3 * loads["chunk"]


def Options(**kwargs):  # a ShardOptions that grain has not validated
    return SimpleNamespace(drop_remainder=False, **kwargs)


def test_chunk_shuffle_after_a_map_and_its_errors():
    src = dask_scene().patch(y=8, x=8, stride=4).to_grain()
    mapped = grain.MapDataset.source(src).map(lambda item: int(item["index"]) * 10)
    assert sorted(src.chunk_shuffle(mapped, seed=1)) == [10 * i for i in range(len(src))]
    with pytest.raises(xpatch.OptionError, match="element i to be patch i"):
        src.chunk_shuffle(mapped.batch(2), seed=1)
    with pytest.raises(xpatch.OptionError, match=r"seed=-1 must be an int in \[0, 2\*\*32\)"):
        src.chunk_shuffle(seed=-1)
    with pytest.raises(xpatch.OptionError, match="index must be in"):
        src.chunk_shuffle(seed=1, shard_options=Options(shard_index=3, shard_count=3))


def test_shards_split_the_patch_index_without_overlap():
    src = dask_scene().patch(y=8, x=8, stride=4).to_grain()
    n = len(src)
    shards = [
        epoch_order(src.chunk_shuffle(seed=5, shard_options=grain.sharding.ShardOptions(i, 3)))
        for i in range(3)
    ]
    assert sorted(np.concatenate(shards).tolist()) == list(range(n))
    # Contiguous runs of the chunk-major index: shards share at most a boundary chunk.
    chunk = src.chunk_of_patch()
    shared = set(chunk[shards[0]]) & set(chunk[shards[2]])
    assert not shared
    # Explicit anchors keep the caller's order; shards still split by chunk.
    rng = np.random.default_rng(0)
    anchors = xpatch.Anchors({"y": rng.integers(0, 56, 60), "x": rng.integers(0, 72, 60)})
    scattered = dask_scene().patch(y=8, x=8, sampler=anchors).to_grain()
    parts = [
        epoch_order(
            scattered.chunk_shuffle(seed=5, shard_options=grain.sharding.ShardOptions(i, 2))
        )
        for i in range(2)
    ]
    assert sorted(np.concatenate(parts).tolist()) == list(range(60))
    chunk_sets = [set(scattered.chunk_of_patch()[part].tolist()) for part in parts]
    assert len(chunk_sets[0] & chunk_sets[1]) <= 1
    sliced = [epoch_order(grain.MapDataset.source(src)[i::3]) for i in range(3)]
    assert sorted(np.concatenate(sliced).tolist()) == list(range(n))
    sampled = []
    for i in range(3):
        sampler = grain.samplers.IndexSampler(
            n, shard_options=grain.sharding.ShardOptions(i, 3), shuffle=True, seed=1, num_epochs=1
        )
        loader = grain.DataLoader(data_source=src, sampler=sampler, worker_count=0)
        sampled.append([int(item["index"]) for item in loader])
    assert sorted(np.concatenate(sampled).tolist()) == list(range(n))


def test_a_restored_iterator_continues_with_the_next_batch():
    src = dask_scene().patch(y=8, x=8, stride=4).to_grain()
    pipeline = src.chunk_shuffle(seed=2).batch(16).to_iter_dataset()
    iterator = iter(pipeline)
    for _ in range(5):
        next(iterator)
    state = iterator.get_state()
    expected = [b["index"].tolist() for b in iterator]
    restored = iter(pipeline)
    restored.set_state(state)
    assert [b["index"].tolist() for b in restored] == expected


# -- back to the grid -------------------------------------------------------------------


def test_predictions_from_a_shuffled_pipeline_reconstruct_the_grid():
    scene = dask_scene()
    p = scene.patch(y=24, x=24, stride=12, window="hann")
    src = p.to_grain()
    batches = list(src.chunk_shuffle(seed=9).batch(7))
    values = np.concatenate([b["data"] * 2 for b in batches])
    index = np.concatenate([b["index"] for b in batches])
    pred = src.predictions(values, index=index, dims=("band", "y", "x"))
    np.testing.assert_allclose(p.reconstruct(pred).values, 2 * scene.values, rtol=1e-6)
    # Keyed by anchor instead: reconstruct matches them itself.
    anchors = np.concatenate([b["anchor"] for b in batches])
    by_anchor = xr.DataArray(
        values,
        dims=("patch", "band", "y", "x"),
        coords={"y_anchor": ("patch", anchors[:, 0]), "x_anchor": ("patch", anchors[:, 1])},
    )
    np.testing.assert_allclose(p.reconstruct(by_anchor).values, 2 * scene.values, rtol=1e-6)


def test_incomplete_or_repeated_predictions_are_refused():
    src = dask_scene().patch(y=24, x=24, stride=12).to_grain()
    n = len(src)
    values = np.zeros((n, 24, 24))
    index = np.arange(n)
    with pytest.raises(xpatch.PredictionError, match=r"missing \[3\], repeated \[4\]"):
        src.predictions(values, index=np.where(index == 3, 4, index), dims=("y", "x"))
    with pytest.raises(xpatch.PredictionError, match=r"out of range \[99\]"):
        src.predictions(values, index=np.where(index == 3, 99, index), dims=("y", "x"))
    with pytest.raises(xpatch.PredictionError, match="must be a 1-D sequence of ints"):
        src.predictions(values, index=index.astype(float), dims=("y", "x"))
    with pytest.raises(xpatch.PredictionError, match=r"must be \(30, <one size per dim>\)"):
        src.predictions(values, index=index, dims=("band", "y", "x"))
    for dims in ("yx", ("patch", "x"), ("y", "y")):
        with pytest.raises(xpatch.PredictionError, match="distinct dim names other than"):
            src.predictions(values, index=index, dims=dims)
    with pytest.raises(xpatch.PredictionError, match=r"missing \[0, 1, 2, 3, 4\]"):
        src.predictions(values[:0], index=[], dims=("y", "x"))


# -- optional dependency ----------------------------------------------------------------

NO_GRAIN = """
import sys
sys.modules["grain"] = None  # as if grain were not installed
import numpy as np, xarray as xr, xpatch
src = xr.DataArray(np.zeros((8, 8)), dims=("y", "x")).patch(y=4, x=4).to_grain()
assert src[3]["data"].shape == (4, 4)
try:
    src.chunk_shuffle(seed=1)
except ImportError as error:
    print(error)
"""


def test_the_source_works_without_grain_and_the_shuffle_says_what_to_install():
    out = run_script(NO_GRAIN)
    assert 'pip install "xarray-patch[grain]"' in out


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_a_dataset_with_mixed_dims_feeds_every_variable(lazy):
    # A static mask(lat, lon) beside t2m(time, lat, lon), patched along all three.
    rng = np.random.default_rng(0)
    ds = xr.Dataset(
        {
            "t2m": (("time", "lat", "lon"), rng.random((5, 11, 13))),
            "mask": (("lat", "lon"), rng.random((11, 13))),
        }
    )
    source = ds.chunk({"lat": 6, "lon": 7}) if lazy else ds
    p = source.patch(time=2, lat=4, lon=5, stride={"lat": 3})
    src = p.to_grain()
    assert src.variables == ("t2m", "mask")
    for i in range(len(src)):
        item = src[i]
        t, y, x = item["anchor"]
        np.testing.assert_array_equal(item["mask"], ds["mask"].values[y : y + 4, x : x + 5])
        np.testing.assert_array_equal(
            item["t2m"], ds["t2m"].values[t : t + 2, y : y + 4, x : x + 5]
        )
    xr.testing.assert_allclose(p.reconstruct(p.patches()).compute(), ds)
