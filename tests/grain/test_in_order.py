"""``src[i]`` in index order: runs of chunks read in one call, each dropped after its last patch."""

from __future__ import annotations

import dask.array as dsa
import numpy as np
import pytest
import xarray as xr

import xpatch  # noqa: F401 - registers .patch
from xpatch.grain.reader import RUN_CHUNKS, PatchReader

CHUNK = 16


def stored_scene(tmp_path, rows: int = 48, cols: int = 112) -> tuple[xr.Dataset, xr.Dataset]:
    """A zarr of a (band, y, x) image and a (y,) row variable, opened lazily, and its values."""
    rng = np.random.default_rng(0)
    values = xr.Dataset(
        {
            "v": (("band", "y", "x"), rng.integers(0, 4000, (2, rows, cols)).astype("uint16")),
            "row": (("y",), rng.normal(size=rows).astype("float32")),
        }
    )
    encoding = {"v": {"chunks": (2, CHUNK, CHUNK)}, "row": {"chunks": (CHUNK,)}}
    values.to_zarr(tmp_path / "s.zarr", encoding=encoding, consolidated=False)
    return values, xr.open_zarr(tmp_path / "s.zarr", consolidated=False)


@pytest.fixture
def counted_reads(monkeypatch):
    """The regions the readers read, one per call of the store."""
    regions = []
    original = PatchReader._load_region

    def counting(self, region):
        regions.append(tuple(region))
        return original(self, region)

    monkeypatch.setattr(PatchReader, "_load_region", counting)
    return regions


def test_in_index_order_chunks_are_read_in_runs_once_each_and_dropped_after_use(
    tmp_path, counted_reads
):
    values, lazy = stored_scene(tmp_path)
    chunk_bytes = 2 * CHUNK * CHUNK * 2
    limit = 16 * chunk_bytes  # the data has 3 x 7 = 21 chunks; a run takes a quarter
    src = lazy["v"].patch(y=12, x=12, stride=9).to_grain(cache_bytes=limit)
    held = []
    for i in range(len(src)):
        item = src[i]
        y, x = item["anchor"].tolist()
        np.testing.assert_array_equal(item["data"], values["v"].values[:, y : y + 12, x : x + 12])
        held.append(src.cache_stats().cached_bytes)
    stats = src.cache_stats()
    assert stats.loads == 21 and stats.evictions == 0  # dropped after use, never evicted
    assert max(held) <= limit and held[-1] <= 2 * RUN_CHUNKS * chunk_bytes
    assert len(counted_reads) < 21  # several chunks per read of the store
    widths = [r[1].stop - r[1].start for r in counted_reads]
    assert max(widths) == RUN_CHUNKS * CHUNK


def test_a_variable_without_the_last_patched_dim_is_read_in_runs_exactly(tmp_path):
    values, lazy = stored_scene(tmp_path)
    src = lazy.patch(y=12, x=12, stride=9).to_grain(cache_bytes=2**16)
    for i in range(len(src)):
        item = src[i]
        y, x = item["anchor"].tolist()
        np.testing.assert_array_equal(item["v"], values["v"].values[:, y : y + 12, x : x + 12])
        np.testing.assert_array_equal(item["row"], values["row"].values[y : y + 12])


def test_data_that_fits_the_cache_stays_cached_for_the_next_epoch(tmp_path):
    _, lazy = stored_scene(tmp_path)
    src = lazy["v"].patch(y=12, x=12, stride=9).to_grain()  # the default cache: 512 MiB
    for _ in range(2):
        for i in range(len(src)):
            src[i]
    assert src.cache_stats().loads == 21


def test_computed_input_in_order_is_read_chunk_by_chunk_once_each(counted_reads):
    values = np.random.default_rng(1).normal(size=(2, 48, 112)).astype("float32")
    computed = xr.DataArray(
        dsa.from_array(values, chunks=(2, CHUNK, CHUNK)) + 1, dims=("b", "y", "x")
    )
    src = computed.patch(y=12, x=12, stride=9).to_grain(cache_bytes=16 * 2 * CHUNK * CHUNK * 4)
    for i in range(len(src)):
        item = src[i]
        y, x = item["anchor"].tolist()
        np.testing.assert_allclose(item["data"], values[:, y : y + 12, x : x + 12] + 1)
    assert src.cache_stats().loads == 21 and len(counted_reads) == 21


def test_reading_out_of_order_evicts_by_itself_and_drops_nothing(tmp_path):
    values, lazy = stored_scene(tmp_path)
    src = lazy["v"].patch(y=12, x=12, stride=9).to_grain(cache_bytes=2**20)
    order = np.random.default_rng(3).permutation(len(src))
    for i in order.tolist():
        item = src[i]
        y, x = item["anchor"].tolist()
        np.testing.assert_array_equal(item["data"], values["v"].values[:, y : y + 12, x : x + 12])
    # The whole scene fits: nothing was dropped, and each chunk was read once.
    assert src.cache_stats().loads == 21
    assert src.cache_stats().cached_bytes == 21 * 2 * CHUNK * CHUNK * 2
