"""Chunks of a zarr v3 array read on the calling thread: zarr's values, or zarr's own reads."""

from __future__ import annotations

import pickle
import warnings

import hypothesis.strategies as st
import numpy as np
import pytest
import xarray as xr
import zarr
from hypothesis import given, settings
from zarr.codecs import BloscCodec, GzipCodec, TransposeCodec, ZstdCodec
from zarr.storage import LocalStore, MemoryStore
from zarr.testing.store import LatencyStore

import xpatch  # noqa: F401
from xpatch.core.chunk_cache import stored_array
from xpatch.grain.zarr_chunks import ZarrChunks
from xpatch.xarray.variables import zarr_array_under


def make_array(store, values: np.ndarray, chunks, **codecs) -> zarr.Array:
    array = zarr.create_array(
        store, shape=values.shape, chunks=chunks, dtype=values.dtype, fill_value=0, **codecs
    )
    array[...] = values
    return array


CODECS = {
    "zstd": {"compressors": ZstdCodec(level=1)},
    "blosc": {"compressors": BloscCodec(cname="lz4", clevel=3)},
    "gzip": {"compressors": GzipCodec(level=1)},
    "transposed": {"filters": [TransposeCodec(order=(1, 0))], "compressors": ZstdCodec()},
    "uncompressed": {"compressors": None},
}


@pytest.mark.parametrize("codecs", sorted(CODECS))
@pytest.mark.parametrize("dtype", ["uint16", "float32", "int64"])
def test_every_region_reads_zarrs_values_edges_and_unwritten_chunks_included(codecs, dtype):
    values = (np.arange(23 * 17) % 11).astype(dtype).reshape(23, 17)
    values[8:16, :] = 0  # chunks equal to the fill value are not written
    if values.dtype.kind == "f":
        values[1, 2] = np.nan
    array = make_array(MemoryStore(), values, (8, 5), **CODECS[codecs])
    chunks = ZarrChunks.of(array)
    assert chunks is not None
    for region in [
        (slice(0, 8), slice(0, 5)),  # one chunk
        (slice(16, 23), slice(15, 17)),  # the corner chunk, cut by the array's edge
        (slice(8, 16), slice(5, 10)),  # never written
        (slice(3, 20), slice(2, 17)),  # many chunks, parts of them
        (slice(0, 23), slice(0, 17)),
    ]:
        got = chunks[region]
        np.testing.assert_array_equal(got, values[region])
        assert got.dtype == values.dtype


@settings(max_examples=40, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 20), st.integers(1, 20), st.integers(1, 4)),
    chunk=st.tuples(st.integers(1, 8), st.integers(1, 8), st.integers(1, 4)),
    data=st.data(),
)
def test_any_box_of_any_grid_equals_zarrs_read(shape, chunk, data):
    values = np.random.default_rng(0).integers(-50, 50, shape).astype("int32")
    array = make_array(MemoryStore(), values, chunk, compressors=ZstdCodec())
    region = []
    for n in shape:
        start = data.draw(st.integers(0, n - 1))
        region.append(slice(start, data.draw(st.integers(start + 1, n))))
    got = ZarrChunks.of(array)[tuple(region)]
    np.testing.assert_array_equal(got, values[tuple(region)])


def test_a_store_read_on_zarrs_event_loop_gives_the_same_values(tmp_path):
    values = np.arange(40 * 30, dtype="float64").reshape(40, 30)
    make_array(LocalStore(tmp_path / "a.zarr"), values, (16, 16), compressors=ZstdCodec())
    slow = LatencyStore(LocalStore(tmp_path / "a.zarr", read_only=True), get_latency=0.001)
    chunks = ZarrChunks.of(zarr.open_array(slow, mode="r"))
    np.testing.assert_array_equal(chunks[5:40, 0:17], values[5:40, 0:17])


def test_sharded_arrays_are_left_to_zarr_and_version_2_arrays_are_read():
    values = np.arange(64, dtype="int16").reshape(8, 8)
    sharded = zarr.create_array(
        MemoryStore(), shape=(8, 8), chunks=(2, 2), shards=(4, 4), dtype="int16"
    )
    sharded[...] = values
    version_2 = zarr.create_array(
        MemoryStore(), shape=(8, 8), chunks=(4, 4), dtype="int16", zarr_format=2
    )
    version_2[...] = values
    assert ZarrChunks.of(sharded) is None
    np.testing.assert_array_equal(ZarrChunks.of(version_2)[2:7, 1:8], values[2:7, 1:8])


def test_only_a_zarr_that_xarray_reads_unchanged_is_found_under_it():
    store = MemoryStore()
    data = xr.Dataset(
        {
            "plain": (("y", "x"), np.arange(16.0).reshape(4, 4)),
            "scaled": (("y", "x"), np.arange(16.0).reshape(4, 4)),
        }
    )
    data["scaled"].encoding.update(dtype="int16", scale_factor=0.5, _FillValue=-1)
    data.to_zarr(store, consolidated=False, zarr_format=3)
    opened = xr.open_zarr(store, consolidated=False)
    assert zarr_array_under(stored_array(opened["plain"].data)) is not None
    assert zarr_array_under(stored_array(opened["scaled"].data)) is None  # CF-decoded
    eager = xr.open_zarr(store, consolidated=False, chunks=None)["plain"][1:].chunk(2)
    assert stored_array(eager.data) is None or zarr_array_under(stored_array(eager.data)) is None


def test_values_unlike_zarrs_are_never_served_and_a_warning_says_so(monkeypatch):
    values = np.arange(64, dtype="int32").reshape(8, 8)
    chunks = ZarrChunks.of(make_array(MemoryStore(), values, (4, 4), compressors=ZstdCodec()))
    wrong = lambda self, coords: np.full((4, 4), 7, "int32")  # noqa: E731
    monkeypatch.setattr(ZarrChunks, "_decoded", wrong)
    with pytest.warns(RuntimeWarning, match="other values than zarr's"):
        first = chunks[0:4, 0:4]
    np.testing.assert_array_equal(first, values[0:4, 0:4])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(chunks[4:8, 0:8], values[4:8, 0:8])


def test_a_failing_read_is_zarrs_to_report(monkeypatch):
    values = np.arange(64, dtype="int32").reshape(8, 8)
    chunks = ZarrChunks.of(make_array(MemoryStore(), values, (4, 4), compressors=ZstdCodec()))

    def broken(self, coords):
        raise OSError("a codec this reader does not know")

    monkeypatch.setattr(ZarrChunks, "_decoded", broken)
    np.testing.assert_array_equal(chunks[2:6, 2:6], values[2:6, 2:6])


def test_it_pickles_and_checks_itself_again_after(tmp_path):
    values = np.arange(100, dtype="uint8").reshape(10, 10)
    array = make_array(LocalStore(tmp_path / "p.zarr"), values, (4, 4), compressors=ZstdCodec())
    chunks = ZarrChunks.of(array)
    chunks[0:4, 0:4]
    again = pickle.loads(pickle.dumps(chunks))
    np.testing.assert_array_equal(again[3:10, 1:9], values[3:10, 1:9])


def test_a_sources_epoch_reads_chunks_past_zarrs_event_loop_with_the_same_patches(
    tmp_path, monkeypatch
):
    values = np.random.default_rng(3).integers(0, 4000, (2, 96, 80)).astype("uint16")
    data = xr.Dataset({"image": (("band", "y", "x"), values)})
    encoding = {"image": {"chunks": (2, 32, 32), "compressors": ZstdCodec()}}
    data.to_zarr(tmp_path / "s.zarr", encoding=encoding, consolidated=False, zarr_format=3)
    image = xr.open_zarr(tmp_path / "s.zarr", consolidated=False)["image"]
    calls = []
    read = zarr.Array.__getitem__
    monkeypatch.setattr(zarr.Array, "__getitem__", lambda s, i: calls.append(i) or read(s, i))
    src = image.patch(y=24, x=24, stride=20).to_grain(weights=False)
    for i in range(len(src)):
        item = src[i]
        y, x = item["anchor"]
        np.testing.assert_array_equal(item["data"], values[:, y : y + 24, x : x + 24])
    assert src.cache_stats().loads == src.chunk_count
    assert len(calls) == 1  # the first chunk's check, against zarr's own read
