"""Many scenes, one label source (issue 40 item 4): on_grid per scene, then patch_scenes.

Three scenes in three UTM zones (EPSG:32631-32633, near 6 E, where they meet) share one
label GeoTIFF in EPSG:4326. Each scene gets the labels warped into its own projection,
lazily; a chunk-shuffled Grain epoch serves every patch once and warps a label window
only when it loads that chunk of the image (never on its own), as often as a Dataset
whose labels were on the grid already; the balanced sampler works on the warped labels.
"""

from __future__ import annotations

import numpy as np
import pyproj
import pytest
import rioxarray
import xarray as xr

import xpatch
from tests.conftest import forbid_compute
from tests.grid.test_on_grid import whole_warp
from xpatch.grid import warp

grain = pytest.importorskip("grain")

N, CHUNK, SIZE = 96, 32, 16
CHUNK_BYTES = 3 * CHUNK * CHUNK * 4 + CHUNK * CHUNK  # the image's 3 float32 bands + uint8 labels


def utm_scenes() -> dict[str, xr.DataArray]:
    scenes = {}
    for i, epsg in enumerate((32631, 32632, 32633)):
        x0, y0 = pyproj.Transformer.from_crs(4326, epsg, always_xy=True).transform(
            5.995 + 0.01 * i, 45.0
        )
        x0, y0 = round(x0, -1), round(y0, -1)
        scene = xr.DataArray(
            np.random.default_rng(i).random((3, N, N), dtype=np.float32),
            dims=("band", "y", "x"),
            coords={"y": y0 - 5 - 10 * np.arange(N), "x": x0 + 5 + 10 * np.arange(N)},
            name="image",
        ).rio.write_crs(f"EPSG:{epsg}")
        scenes[f"zone{epsg - 32600}"] = scene.chunk({"band": -1, "y": CHUNK, "x": CHUNK})
    return scenes


@pytest.fixture(scope="module")
def label_file(tmp_path_factory):
    """Classes 1-4 in blocks over the three scenes, 0.0002 degrees, 0 as nodata."""
    res = 0.0002
    lat = 45.01 - res / 2 - res * np.arange(150)
    lon = 5.985 + res / 2 + res * np.arange(260)
    classes = np.add.outer(np.arange(lat.size) // 15, np.arange(lon.size) // 20) % 4 + 1
    cover = xr.DataArray(classes.astype(np.uint8), dims=("y", "x"), coords={"y": lat, "x": lon})
    path = tmp_path_factory.mktemp("labels") / "cover.tif"
    cover.rio.write_crs("EPSG:4326").rio.write_nodata(0).rio.to_raster(
        path, tiled=True, blockxsize=64, blockysize=64
    )
    return path


def open_labels(path) -> xr.DataArray:
    return rioxarray.open_rasterio(path, chunks=64).squeeze("band", drop=True)


@pytest.fixture
def warp_calls(monkeypatch):
    """Every label window warped: (the scene's CRS, the output chunk's transform)."""
    calls = []
    original = warp._warp_block

    def counting(block, **kwargs):
        calls.append((kwargs["dst_crs"], tuple(kwargs["dst_transform"])))
        return original(block, **kwargs)

    monkeypatch.setattr(warp, "_warp_block", counting)
    return calls


def test_each_scene_gets_the_labels_in_its_own_projection_lazily(label_file):
    labels = open_labels(label_file)
    scenes = utm_scenes()
    with forbid_compute():
        grids = {name: xpatch.on_grid(scene, labels=labels) for name, scene in scenes.items()}
        sp = xpatch.patch_scenes(grids, y=SIZE, x=SIZE)
    assert len(sp) == 3 * (N // SIZE) ** 2
    for name, scene in scenes.items():
        ds = grids[name]
        assert ds.rio.crs == scene.rio.crs and ds.labels.chunks == scene.chunks[1:]
        expected = whole_warp(labels.compute(), scene, "nearest", 0)
        np.testing.assert_array_equal(ds.labels.values, expected)
        assert set(np.unique(expected)) == {1, 2, 3, 4}  # every scene fully labelled


def epoch(src) -> list[int]:
    pipeline = (
        grain.MapDataset.source(src)
        .pipe(src.chunk_shuffle, seed=0)
        .to_iter_dataset(grain.ReadOptions(num_threads=2))
    )
    return [int(item["index"]) for item in pipeline]


def test_an_epoch_warps_a_label_window_only_with_its_image_chunk(label_file, warp_calls):
    labels = open_labels(label_file)
    scenes = utm_scenes()
    grids = {name: xpatch.on_grid(scene, labels=labels) for name, scene in scenes.items()}
    src = xpatch.patch_scenes(grids, y=SIZE, x=SIZE).to_grain(cache_bytes=8 * CHUNK_BYTES)
    assert warp_calls == []  # building the source warped nothing
    served = epoch(src)
    assert sorted(served) == list(range(len(src)))  # every patch once
    loads = src.cache_stats().loads
    assert len(set(warp_calls)) == src.chunk_count == 3 * (N // CHUNK) ** 2
    assert len(warp_calls) == loads  # a label window is warped when, and only when, its chunk loads
    # About once per chunk, as the same layout reads a Dataset whose labels are on the grid
    # already (Grain's thread timing makes either read a chunk or two again: 27-28 of 27).
    on_grid_already = {
        name: ds.assign(labels=ds.labels.copy(data=ds.labels.values).chunk(CHUNK))
        for name, ds in grids.items()
    }
    plain = xpatch.patch_scenes(on_grid_already, y=SIZE, x=SIZE).to_grain(
        cache_bytes=8 * CHUNK_BYTES
    )
    epoch(plain)
    assert loads <= 1.1 * src.chunk_count
    assert plain.cache_stats().loads <= 1.1 * src.chunk_count


def test_the_balanced_sampler_works_on_the_warped_labels(label_file):
    labels = open_labels(label_file)
    grids = {name: xpatch.on_grid(scene, labels=labels) for name, scene in utm_scenes().items()}
    samplers = {
        name: xpatch.WeightedAnchors(xpatch.balanced_weights(ds.labels), count=200, seed=i)
        for i, (name, ds) in enumerate(grids.items())
    }
    sp = xpatch.patch_scenes(grids, y=SIZE, x=SIZE, sampler=samplers)
    for name, patcher in sp.patchers.items():
        anchors = np.asarray(patcher.anchors())
        centres = grids[name].labels.values[anchors[:, 0] + SIZE // 2, anchors[:, 1] + SIZE // 2]
        counts = np.bincount(centres, minlength=5)[1:]
        assert counts.min() > 0.6 * counts.mean(), (name, counts)
