"""Many scenes in one layout: ScenePatcher, its Grain source and its shared cache."""

from __future__ import annotations

import os

import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

import xpatch
from tests.conftest import forbid_compute
from xpatch.core.shuffle import worker_permutation

grain = pytest.importorskip("grain")
rioxarray = pytest.importorskip("rioxarray")
from rasterio.transform import from_origin  # noqa: E402

BANDS = 3
CHUNK = 128
#: (height, width, CRS, dtype) of the three GeoTIFF scenes of the Done-when test.
SCENES = (
    (768, 256, "EPSG:32631", "uint16"),
    (512, 256, "EPSG:4326", "uint16"),
    (640, 256, "EPSG:32631", "float32"),
)


def write_scene(path, height, width, crs, dtype, seed) -> None:
    values = np.random.default_rng(seed).integers(0, 1000, (BANDS, height, width)).astype(dtype)
    scene = xr.DataArray(values, dims=("band", "y", "x"))
    if crs == "EPSG:4326":
        transform = from_origin(5.0 + seed, 50.0, 0.0001, 0.0001)
    else:
        transform = from_origin(500000.0 + 1000 * seed, 4e6, 10.0, 10.0)
    scene = scene.rio.write_transform(transform)
    scene.rio.write_crs(crs).rio.to_raster(path, tiled=True, blockxsize=CHUNK, blockysize=CHUNK)


@pytest.fixture(scope="module")
def scene_files(tmp_path_factory) -> list[str]:
    folder = tmp_path_factory.mktemp("scenes")
    paths = []
    for k, spec in enumerate(SCENES):
        path = str(folder / f"scene{k}.tif")
        write_scene(path, *spec, seed=k)
        paths.append(path)
    return paths


class LoadsOfThisProcess:
    """Attach the process id and its cache's load count to an item (runs in the workers)."""

    def __init__(self, source) -> None:
        self.source = source

    def __call__(self, item: dict) -> dict:
        item["pid"] = np.int64(os.getpid())
        item["loads"] = np.int64(self.source.cache_stats().loads)
        return item


def rows(iterator, count=None) -> list[tuple[list[int], list[int], float]]:
    out = []
    for batch in iterator:
        out.append((batch["index"].tolist(), batch["scene"].tolist(), float(batch["data"].sum())))
        if count is not None and len(out) == count:
            break
    return out


def test_three_geotiff_scenes_through_mp_prefetch_resume_exactly_and_read_each_chunk_once(
    scene_files,
):
    """The issue's Done-when: 3 GeoTIFFs (two CRSs), chunk shuffle, 2 workers, checkpoint."""
    sp = xpatch.patch_scenes(scene_files, y=24, x=24, stride=20, chunks=CHUNK)
    chunk_bytes = BANDS * CHUNK * CHUNK * 4
    src = sp.to_grain(cache_bytes=8 * chunk_bytes, dtype="float32", weights=False)
    assert src.chunk_count == 12 + 8 + 10
    assert sp.names == ("scene0", "scene1", "scene2")
    pipeline = (
        grain.MapDataset.source(src)
        .pipe(src.chunk_shuffle, seed=7, worker_count=2, batch_size=8)
        .map(LoadsOfThisProcess(src))
        .batch(8)
        .to_iter_dataset()
        .mp_prefetch(grain.MultiprocessingOptions(num_workers=2))
        .pipe(src.with_fingerprint)
    )
    iterator = iter(pipeline)
    head, loads = [], {}
    for batch in iterator:
        head.append((batch["index"].tolist(), batch["scene"].tolist(), float(batch["data"].sum())))
        for pid, count in zip(batch["pid"].tolist(), batch["loads"].tolist()):
            loads[pid] = max(loads.get(pid, 0), count)
        if len(head) == 5:
            state = iterator.get_state()
        if len(head) * 8 >= len(src):
            break
    iterator.close()
    # One epoch: every patch once, from the scene its index says.
    served = np.concatenate([np.asarray(i) for i, _, _ in head])
    assert sorted(served.tolist()) == list(range(len(src)))
    scenes = np.concatenate([np.asarray(s) for _, s, _ in head])
    assert (scenes == [sp.names.index(sp.scene_of(i)) for i in served]).all()
    # Both workers read, and together each chunk about once (target <= 1.25): each
    # reads a run of neighbouring chunks, and they share the row at the runs' border.
    assert len(loads) == 2
    assert sum(loads.values()) / src.chunk_count <= 1.25, loads
    # The state resumes at the exact next batch in fresh workers.
    restored = iter(pipeline)
    restored.set_state(state)
    assert rows(restored, count=3) == head[5:8]
    restored.close()
    # Values are the scene's own, cast to the declared dtype.
    index = head[6][0][3]
    name, local = sp.locate(index)
    expected = sp.patchers[name][local].values.astype("float32")
    np.testing.assert_array_equal(src[index]["data"], expected)


def test_items_are_each_scenes_patch_with_scene_and_global_index(scene_files):
    sp = xpatch.patch_scenes(scene_files, y=24, x=24, stride=20, chunks=CHUNK)
    src = sp.to_grain(dtype="float32", transform=True)
    for i in (0, len(sp.patchers["scene0"]) + 3, len(src) - 1):
        name, local = sp.locate(i)
        patch = sp[i]
        item = src[i]
        assert int(item["index"]) == i and int(item["scene"]) == sp.names.index(name)
        np.testing.assert_array_equal(item["data"], patch.values.astype("float32"))
        assert item["anchor"].tolist() == sp.patchers[name].anchors().values[local].tolist()
        # Georeferencing is the scene's own.
        assert patch.rio.crs == sp.patchers[name].obj.rio.crs
        np.testing.assert_allclose(item["transform"], tuple(patch.rio.transform())[:6])
    anchors = sp.anchors()
    assert anchors.sizes["patch"] == len(sp) and anchors.scene.values[-1] == "scene2"
    assert sp.bounds().sizes["patch"] == len(sp)


def test_different_dtypes_need_a_declared_one_and_unsafe_casts_are_refused(scene_files):
    sp = xpatch.patch_scenes(scene_files, y=48, x=48, chunks=CHUNK)
    with pytest.raises(xpatch.OptionError, match=r"different dtypes.*dtype='float32'"):
        sp.to_grain()
    with pytest.raises(
        xpatch.OptionError, match=r"scene .scene2., .data. is float32, which int32 cannot hold"
    ):
        sp.to_grain(dtype="int32")


def test_scenes_with_other_band_counts_are_refused():
    a = xr.DataArray(np.zeros((3, 32, 32), "float32"), dims=("band", "y", "x"))
    b = xr.DataArray(np.zeros((4, 40, 32), "float32"), dims=("band", "y", "x"))
    sp = xpatch.patch_scenes({"rgb": a, "rgbn": b}, y=16, x=16)
    with pytest.raises(xpatch.OptionError, match=r"'rgb': \(3, 16, 16\), 'rgbn': \(4, 16, 16\)"):
        sp.to_grain()


def test_errors_name_the_scene_and_the_fix():
    good = xr.DataArray(np.zeros((32, 32)), dims=("y", "x"))
    small = xr.DataArray(np.zeros((8, 32)), dims=("y", "x"))
    with pytest.raises(xpatch.GeometryError, match="scene 'small'"):
        xpatch.patch_scenes({"good": good, "small": small}, y=16, x=16)
    with pytest.raises(xpatch.OptionError, match="matches no file"):
        xpatch.patch_scenes("/nonexistent/*.tif", y=16, x=16)
    with pytest.raises(xpatch.OptionError, match="lacks \\['b'\\]"):
        xpatch.patch_scenes({"a": good, "b": good}, y=16, x=16, sampler={"a": None})
    with pytest.raises(xpatch.OptionError, match="empty"):
        xpatch.patch_scenes([], y=16, x=16)
    sp = xpatch.patch_scenes([good], y=16, x=16)
    with pytest.raises(IndexError, match="out of range for 4"):
        sp[4]


def test_one_sampler_per_scene_and_weighted_anchors_per_scene():
    rng = np.random.default_rng(0)
    scenes = {k: xr.DataArray(rng.random((64, 64)), dims=("y", "x")) for k in ("a", "b")}
    weights = xr.zeros_like(scenes["b"])
    weights[40:48, 8:16] = 1  # all mass in one 8 x 8 square
    sampler = {"a": xpatch.RandomAnchors(5, seed=1), "b": xpatch.WeightedAnchors(weights, 20, 3)}
    sp = xpatch.patch_scenes(scenes, y=16, x=16, sampler=sampler)
    assert [len(p) for p in sp.patchers.values()] == [5, 20]
    centres = sp.patchers["b"].anchors().values + 8
    assert ((centres >= [40, 8]) & (centres < [48, 16])).all()


def test_apply_and_reconstruct_give_one_result_per_scene():
    rng = np.random.default_rng(1)
    scenes = [
        xr.DataArray(rng.random(shape), dims=("y", "x")).chunk(24) for shape in ((48, 64), (40, 40))
    ]
    sp = xpatch.patch_scenes(scenes, y=16, x=16, stride=12, window="hann")
    results = sp.apply(lambda b: b * 2)
    for scene, result in zip(scenes, results.values()):
        np.testing.assert_allclose(result.values, scene.values * 2)
    predictions = xr.concat([p.patches() for p in sp.patchers.values()], dim="patch")
    for scene, back in zip(scenes, sp.reconstruct(predictions).values()):
        np.testing.assert_allclose(back.values, scene.values)
    with pytest.raises(xpatch.PredictionError, match=r"has .* patches"):
        sp.reconstruct(predictions.isel(patch=slice(1, None)))


def test_weights_in_global_order_are_cut_with_the_predictions():
    rng = np.random.default_rng(4)
    scenes = [xr.DataArray(rng.random(shape), dims=("y", "x")) for shape in ((28, 40), (28, 28))]
    sp = xpatch.patch_scenes(scenes, y=16, x=16, stride=12)
    patchers = list(sp.patchers.values())
    predictions = xr.concat([p.patches() for p in patchers], dim="patch")
    # Each patch predicts its own number: the weights decide every overlapped cell.
    predictions = predictions * 0 + xr.DataArray(np.arange(len(sp), dtype=float), dims="patch")
    weights = rng.random(len(sp)) + 0.1
    results = list(sp.reconstruct(predictions, weights=weights).values())
    for k, (p, result) in enumerate(zip(patchers, results)):
        first, last = sp.offsets[k], sp.offsets[k + 1]
        total, weight = np.zeros(p.obj.shape), np.zeros(p.obj.shape)
        for (ay, ax), value, w in zip(p.anchors().values, range(first, last), weights[first:last]):
            total[ay : ay + 16, ax : ax + 16] += w * value
            weight[ay : ay + 16, ax : ax + 16] += w
        np.testing.assert_allclose(result.values, total / weight, rtol=1e-12)
    as_array = xr.DataArray(weights, dims="patch")
    for a, b in zip(results, sp.reconstruct(predictions, weights=as_array).values()):
        np.testing.assert_allclose(a.values, b.values)


def test_the_source_pickles_and_its_fingerprint_names_every_scene():
    import pickle

    a = xr.DataArray(np.arange(64 * 64.0).reshape(64, 64), dims=("y", "x")).chunk(32)
    src = xpatch.patch_scenes([a, a + 1], y=16, x=16, stride=12).to_grain()
    copy = pickle.loads(pickle.dumps(src))
    assert copy.fingerprint == src.fingerprint
    np.testing.assert_array_equal(copy[40]["data"], src[40]["data"])
    assert copy.cache_stats().loads == 1  # a cache of its own, shared by its scenes
    others = {
        xpatch.patch_scenes([a, a + 2], y=16, x=16, stride=12).to_grain().fingerprint,
        xpatch.patch_scenes([a + 1, a], y=16, x=16, stride=12).to_grain().fingerprint,
        xpatch.patch_scenes({"x": a, "y": a + 1}, y=16, x=16, stride=12).to_grain().fingerprint,
    }
    assert src.fingerprint not in others


def test_the_cache_is_shared_and_bounded_across_scenes():
    a = xr.DataArray(np.zeros((64, 64), "float64"), dims=("y", "x")).chunk(32)
    chunk_bytes = 32 * 32 * 8
    src = xpatch.patch_scenes([a] * 4, y=32, x=32).to_grain(cache_bytes=3 * chunk_bytes)
    for i in range(len(src)):
        src[i]
    stats = src.cache_stats()
    assert stats.loads == 16 and stats.cached_bytes <= 3 * chunk_bytes


@pytest.mark.parametrize("epoch", [0, 1, 2, 5])
def test_each_worker_gets_a_run_of_neighbouring_chunks_in_every_epoch(epoch):
    """Batches run on across epochs, so epoch e's batches start at element e * n."""
    groups = np.repeat(np.arange(16), 4)  # 16 chunks of 4 patches; 64 is no multiple of 5 * 2
    n, batch, workers = len(groups), 5, 2
    order = worker_permutation(groups, seed=3, epoch=epoch, worker_count=workers, batch_size=batch)
    assert sorted(order.tolist()) == list(range(n))
    worker = ((np.arange(n) + epoch * n) // batch) % workers
    seen = [set(groups[order[worker == w]].tolist()) for w in range(workers)]
    assert len(seen[0] & seen[1]) <= 1  # only the chunk at the runs' border is shared
    for w in range(workers):
        chunks = groups[order[worker == w]]
        assert int((np.diff(chunks) != 0).sum()) == len(set(chunks)) - 1  # each chunk once


def test_the_runs_turn_from_epoch_to_epoch():
    groups = np.repeat(np.arange(8), 4)
    firsts = []
    for epoch in range(2):
        order = worker_permutation(groups, seed=0, epoch=epoch, worker_count=2, batch_size=4)
        worker = ((np.arange(32) + epoch * 32) // 4) % 2
        firsts.append(set(groups[order[worker == 0]].tolist()))
    assert firsts[0] == {0, 1, 2, 3} and firsts[1] == {4, 5, 6, 7}


def test_a_checkpoint_names_the_worker_count_it_was_dealt_to():
    da_ = xr.DataArray(np.zeros((64, 64)), dims=("y", "x")).chunk(16)
    src = xpatch.patch_scenes([da_, da_ + 1], y=16, x=16).to_grain()

    def pipeline(workers):
        return (
            grain.MapDataset.source(src)
            .pipe(src.chunk_shuffle, seed=0, worker_count=workers, batch_size=4)
            .batch(4)
            .to_iter_dataset()
            .pipe(src.with_fingerprint)
        )

    iterator = iter(pipeline(2))
    next(iterator)
    state = iterator.get_state()
    assert state["xpatch_fingerprint"] == src.fingerprint
    sweep = "order=sweep,mix=12"  # the default cache holds 12 chunks to mix, and more
    assert state["xpatch_order"] == f"batch=4;chunk_shuffle(seed=0,{sweep},workers=2,batch=4)"
    with pytest.raises(xpatch.OptionError, match="worker_count or batch_size"):
        iter(pipeline(3)).set_state(state)
    restored = iter(pipeline(2))
    restored.set_state(state)
    assert next(restored)["index"].tolist() == next(iterator)["index"].tolist()
    # A pipeline that deals to one worker says so by leaving the dealing out.
    assert iter(pipeline(1)).get_state()["xpatch_order"] == f"batch=4;chunk_shuffle(seed=0,{sweep})"


def test_scenes_whose_dims_come_in_other_orders_are_refused():
    a = xr.DataArray(np.zeros((2, 32, 32)), dims=("band", "y", "x"))
    with pytest.raises(
        xpatch.OptionError, match=r"different orders.*transpose\(\.\.\., 'y', 'x'\)"
    ):
        xpatch.patch_scenes({"a": a, "b": a.transpose("band", "x", "y")}, y=16, x=16)
    sp = xpatch.patch_scenes({"a": a, "b": a.transpose("y", "x", "band")}, y=16, x=16)
    with pytest.raises(
        xpatch.OptionError, match=r"different orders.*transpose\('band', 'y', 'x'\)"
    ):
        sp.to_grain()


def test_integers_cast_to_floats_and_samplers_keyed_by_position():
    ints = xr.DataArray(np.arange(32 * 32, dtype="int32").reshape(32, 32), dims=("y", "x"))
    floats = ints.astype("float64")
    sampler = {0: xpatch.RandomAnchors(2, seed=0), 1: xpatch.RandomAnchors(3, seed=1)}
    sp = xpatch.patch_scenes([ints, floats], y=16, x=16, sampler=sampler)
    assert len(sp) == 5
    src = sp.to_grain(dtype="float32")
    np.testing.assert_array_equal(src[0]["data"], sp[0].values.astype("float32"))
    with pytest.raises(xpatch.OptionError, match="int16 cannot hold"):
        sp.to_grain(dtype="int16")


@settings(max_examples=25, deadline=None)
@given(
    shapes=st.lists(
        st.tuples(st.integers(12, 40), st.integers(12, 40), st.integers(5, 16)),
        min_size=1,
        max_size=4,
    ),
    size=st.integers(4, 12),
    stride=st.integers(2, 12),
    cache_chunks=st.integers(1, 8),
    seed=st.integers(0, 2**16),
)
def test_every_item_of_a_chunk_shuffled_epoch_is_the_scenes_own_patch(
    shapes, size, stride, cache_chunks, seed
):
    rng = np.random.default_rng(seed)
    scenes = [
        xr.DataArray(rng.random((h, w), dtype="float32"), dims=("y", "x")).chunk(c)
        for h, w, c in shapes
    ]
    sp = xpatch.patch_scenes(
        scenes, y=size, x=size, stride=min(stride, size), boundary="pad", pad_mode="reflect"
    )
    largest = max(c for _, _, c in shapes) ** 2 * 4
    src = sp.to_grain(cache_bytes=cache_chunks * largest)
    order = src.chunk_shuffled_order(seed=seed)
    assert sorted(order.tolist()) == list(range(len(src)))
    for i in order.tolist():
        name, local = sp.locate(i)
        np.testing.assert_array_equal(src[i]["data"], sp.patchers[name][local].values)


def test_building_the_layout_the_source_and_the_results_computes_nothing():
    rng = np.random.default_rng(2)
    scenes = [
        xr.DataArray(rng.random((2, h, 64)), dims=("band", "y", "x")).chunk({"y": 32, "x": 32})
        for h in (64, 96)
    ]
    with forbid_compute() as refused:
        sp = xpatch.patch_scenes(scenes, y=16, x=16, stride=12, window="hann")
        src = sp.to_grain(cache_bytes=2**16)
        src.fingerprint, src.shuffle_groups(), repr(src), repr(sp)
        results = sp.apply(lambda b: b + 1)
        back = sp.reconstruct(xr.concat([p.patches() for p in sp.patchers.values()], "patch"))
    assert refused.computes == 0
    assert src.cache_stats().loads == 0
    for scene, result, rebuilt in zip(scenes, results.values(), back.values()):
        np.testing.assert_allclose(result.values, scene.values + 1)
        np.testing.assert_allclose(rebuilt.values, scene.values)


def test_files_named_alike_need_names_and_a_variable_picks_from_a_store(tmp_path):
    values = xr.DataArray(np.arange(32 * 32.0).reshape(32, 32), dims=("y", "x"))
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        xr.Dataset({"v": values, "w": values * 2}).to_zarr(tmp_path / folder / "s.zarr")
    paths = [str(tmp_path / f / "s.zarr") for f in ("a", "b")]
    with pytest.raises(xpatch.OptionError, match=r"named \['s'\].*mapping"):
        xpatch.patch_scenes(paths, y=16, x=16)
    with pytest.raises(xpatch.OptionError, match="pick one with --variable"):
        xpatch.patch_scenes({"a": paths[0]}, y=16, x=16)
    sp = xpatch.patch_scenes({"a": paths[0], "b": paths[1]}, y=16, x=16, variable="w")
    np.testing.assert_array_equal(sp[3].values, values.values[16:32, 16:32] * 2)


def test_printing_the_source_does_not_change_how_its_cache_evicts():
    da_ = xr.DataArray(np.zeros((64, 64), "float32"), dims=("y", "x")).chunk(32)
    src = xpatch.patch_scenes([da_, da_], y=16, x=16, stride=12).to_grain(cache_bytes=2**20)
    fingerprint = src.fingerprint
    repr(src)
    assert src.cache_stats() == src.cache_stats() and src._cache.shrink is None
    assert src.shuffle_groups().ndim == 2 and src._cache.shrink is not None
    assert src.fingerprint == fingerprint


def test_shards_split_the_scenes_patches_without_overlap():
    rng = np.random.default_rng(4)
    scenes = [
        xr.DataArray(rng.random((h, 64), dtype="float32"), dims=("y", "x")).chunk(32)
        for h in (64, 96, 32)
    ]
    src = xpatch.patch_scenes(scenes, y=16, x=16, stride=12).to_grain()
    served = []
    for index in range(3):
        options = grain.sharding.ShardOptions(shard_index=index, shard_count=3)
        shard = src.chunk_shuffle(seed=1, shard_options=options)
        items = [shard[i] for i in range(len(shard))]
        served.append([int(item["index"]) for item in items])
        for item in items:
            name, local = src.patcher.locate(int(item["index"]))
            np.testing.assert_array_equal(item["data"], src.patcher.patchers[name][local].values)
    assert sorted(i for run in served for i in run) == list(range(len(src)))
    assert max(map(len, served)) - min(map(len, served)) <= 1
