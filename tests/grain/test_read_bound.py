"""The source bounds its reads: 16 Grain threads at the floor read each chunk once."""

from __future__ import annotations

import grain
import numpy as np
import pytest
import xarray as xr

import xpatch  # noqa: F401 - registers .patch


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> xr.DataArray:
    # 2 x 2048 x 1024 uint16 in 128² chunks: a 16 x 8 grid of 64 KiB chunks on disk,
    # patches 64² stride 48 straddling them (the storage benchmark's shape, smaller).
    path = tmp_path_factory.mktemp("bound") / "image.zarr"
    values = np.random.default_rng(0).integers(0, 4000, (2, 2048, 1024), dtype=np.uint16)
    encoding = {"image": {"chunks": (2, 128, 128)}}
    xr.Dataset({"image": (("band", "y", "x"), values)}).to_zarr(
        path, encoding=encoding, consolidated=False, zarr_format=3
    )
    return xr.open_zarr(path, consolidated=False)["image"]


def source(image: xr.DataArray, cache_bytes: int):
    return image.patch(y=64, x=64, stride=48).to_grain(cache_bytes=cache_bytes, weights=False)


def test_sixteen_threads_at_the_floor_read_each_chunk_once(image):
    floor = source(image, 2**30).memory_report().floor_bytes
    src = source(image, floor)
    dataset = grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=1)
    for epoch in range(2):
        src.clear_cache()
        seen = [
            int(item["index"])
            for item in dataset.to_iter_dataset(grain.ReadOptions(num_threads=16))
        ]
        assert sorted(seen) == list(range(len(src)))
        assert src.cache_stats().loads <= 1.05 * src.chunk_count, epoch


def test_loads_at_once_are_bounded_by_the_source(image):
    src = source(image, 2**30)
    src.reader.max_reads = 1
    running, most = [0], [0]
    read = src.reader._read_region

    def counted(region):
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            return read(region)
        finally:
            running[0] -= 1

    src.reader._read_region = counted
    dataset = grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=0)
    list(dataset.to_iter_dataset(grain.ReadOptions(num_threads=16)))
    assert most[0] == 1
    assert src.cache_stats().loads == src.chunk_count


def test_the_default_budget_is_accepted(image):
    src = image.patch(y=64, x=64, stride=48).to_grain()
    assert len(src.chunk_shuffle(seed=0)) == len(src)
