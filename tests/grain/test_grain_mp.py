"""The Grain source in worker processes: mp_prefetch, DataLoader, checkpoints, files.

Grain starts workers with the ``spawn`` method, so each test pays a few seconds of
imports in two fresh processes; the tests are few and each checks several things.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xpatch

grain = pytest.importorskip("grain")

TWO_WORKERS = grain.MultiprocessingOptions(num_workers=2)


def batches(iterator, count=None) -> list[tuple[list[int], float]]:
    out = []
    for batch in iterator:
        out.append((batch["index"].tolist(), float(batch["data"].sum())))
        if count is not None and len(out) == count:
            break
    return out


@pytest.fixture(scope="module")
def zarr_scene(tmp_path_factory) -> xr.DataArray:
    """A scene in a zarr store, opened lazily: workers must reopen it."""
    path = tmp_path_factory.mktemp("grain") / "scene.zarr"
    values = np.random.default_rng(0).normal(size=(2, 96, 112)).astype("float32")
    scene = xr.DataArray(values, dims=("band", "y", "x"), name="scene")
    scene.chunk({"y": 32, "x": 32}).to_dataset().to_zarr(path)
    return xr.open_zarr(path)["scene"]


def test_mp_prefetch_gives_the_single_process_batches_and_resumes_exactly(zarr_scene):
    src = zarr_scene.patch(y=24, x=24, stride=16).to_grain()
    pipeline = src.chunk_shuffle(seed=4).batch(8).to_iter_dataset()
    single = batches(pipeline)
    multi_iterator = iter(pipeline.mp_prefetch(TWO_WORKERS))
    head = batches(multi_iterator, count=3)
    state = multi_iterator.get_state()
    tail = batches(multi_iterator)
    assert head + tail == single
    multi_iterator.close()
    restored = iter(pipeline.mp_prefetch(TWO_WORKERS))
    restored.set_state(state)
    assert batches(restored) == tail
    restored.close()
    # The values come from the file, reopened in each worker.
    first = single[0][0][0]
    y, x = np.asarray(src.patcher.anchors())[first]
    assert src[first]["data"].sum() == pytest.approx(
        float(zarr_scene.values[:, y : y + 24, x : x + 24].sum()), rel=1e-5
    )


def test_dataloader_with_workers_restores_a_checkpoint_at_the_next_batch(zarr_scene):
    def loader(source):
        sampler = grain.samplers.IndexSampler(
            len(source),
            shuffle=True,
            seed=11,
            num_epochs=1,
            shard_options=grain.sharding.NoSharding(),
        )
        return grain.DataLoader(
            data_source=source,
            sampler=sampler,
            operations=[grain.transforms.Batch(batch_size=6)],
            worker_count=2,
        )

    src = zarr_scene.patch(y=24, x=24, stride=16).to_grain()
    iterator = iter(loader(src))
    batches(iterator, count=2)
    state = iterator.get_state()
    expected = batches(iterator)
    # A fresh source over the same data, as after a restart: its repr matches.
    again = zarr_scene.patch(y=24, x=24, stride=16).to_grain()
    restored = iter(loader(again))
    restored.set_state(state)
    assert batches(restored) == expected
    seen = sorted(np.concatenate([indices for indices, _ in expected]).tolist())
    assert len(seen) == len(set(seen))


def test_a_geotiff_opened_with_chunks_reopens_in_each_worker(tmp_path):
    rioxarray = pytest.importorskip("rioxarray")
    from rasterio.transform import from_origin

    values = np.random.default_rng(3).normal(size=(3, 80, 96)).astype("float32")
    scene = xr.DataArray(values, dims=("band", "y", "x"))
    scene = scene.rio.write_crs("EPSG:32630").rio.write_transform(from_origin(500000, 4e6, 10, 10))
    path = tmp_path / "scene.tif"
    scene.rio.to_raster(path, tiled=True, blockxsize=32, blockysize=32)
    opened = rioxarray.open_rasterio(path, chunks={"y": 32, "x": 32})
    src = opened.patch(y=24, x=24, stride=16).to_grain()
    pipeline = src.chunk_shuffle(seed=1).batch(8).to_iter_dataset()
    single = batches(pipeline)
    iterator = iter(pipeline.mp_prefetch(TWO_WORKERS))
    assert batches(iterator) == single
    iterator.close()
    first = single[0][0][0]
    y, x = np.asarray(src.patcher.anchors())[first]
    np.testing.assert_array_equal(src[first]["data"], values[:, y : y + 24, x : x + 24])


def test_a_checkpoint_refuses_another_number_of_workers_with_an_xpatch_error(zarr_scene):
    # After mp_prefetch the fingerprint lost the pipeline's shape: a restore into another
    # worker count raised Grain's IndexError or KeyError, or served other elements.
    src = zarr_scene.patch(y=24, x=24, stride=16).to_grain()

    def pipeline(workers: int):
        shuffled = src.chunk_shuffle(seed=4, worker_count=workers, batch_size=4).batch(4)
        options = grain.MultiprocessingOptions(num_workers=workers)
        return shuffled.to_iter_dataset().mp_prefetch(options).pipe(src.with_fingerprint)

    iterator = iter(pipeline(2))
    head = batches(iterator, count=2)
    state = iterator.get_state()
    tail = batches(iterator)
    iterator.close()
    assert state["xpatch_order"].startswith("workers=2;batch=4;chunk_shuffle(seed=4")
    other = iter(pipeline(3))
    with pytest.raises(xpatch.OptionError, match="number of mp_prefetch workers"):
        other.set_state(state)
    other.close()
    same = iter(pipeline(2))
    same.set_state(state)
    assert batches(same) == tail and len(head) == 2
    same.close()
