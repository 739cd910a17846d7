"""A zarr opened without dask chunks is read by its own chunks, each once, without dask.

``xr.open_zarr(..., chunks=None)`` gives variables that xarray reads lazily
through its indexing wrappers. Before, the Grain source read each patch through
them, so every patch decoded every chunk it touched again (an ERA5 epoch of single
time steps from chunks of 8: 7.6 s, every chunk decoded 8 times). Now such a
variable is read by the zarr's own chunks through the source's cache, as one
opened with dask chunks.
"""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from zarr.storage import LocalStore, MemoryStore

import xpatch
from xpatch.grain.zarr_chunks import ZarrChunks


def write(store, values: np.ndarray, chunks, **attrs) -> xr.DataArray:
    """``values`` as variable ``v`` of a zarr in ``store``, opened without dask chunks."""
    data = xr.Dataset({"v": (("y", "x"), values, attrs)})
    data.to_zarr(store, encoding={"v": {"chunks": chunks}}, consolidated=False)
    return xr.open_zarr(store, consolidated=False, chunks=None)["v"]


@settings(max_examples=40, deadline=None)
@given(
    shape=st.tuples(st.integers(6, 30), st.integers(6, 30)),
    chunks=st.tuples(st.integers(2, 12), st.integers(2, 12)),
    size=st.integers(2, 6),
    stride=st.integers(1, 6),
    boundary=st.sampled_from(["shift", "pad", "periodic"]),
    halo=st.sampled_from([0, 1]),
    batched=st.booleans(),
)
def test_items_and_batches_equal_those_of_the_values_in_memory_each_chunk_read_once(
    shape, chunks, size, stride, boundary, halo, batched
):
    values = np.random.default_rng(sum(shape)).normal(size=shape).astype("float32")
    lazy = write(MemoryStore(), values, chunks)
    options = dict(y=size, x=size, stride=min(stride, size), halo=halo)
    options["boundary"] = {"x": "periodic"} if boundary == "periodic" else boundary
    if halo or boundary == "pad":
        options["pad_mode"] = "reflect"
    src = lazy.patch(**options).to_grain(cache_bytes=values.nbytes * 4)
    expected = xr.DataArray(values, dims=("y", "x")).patch(**options).to_grain()
    assert isinstance(src._plans[0].stored, ZarrChunks)
    order = src.chunk_shuffled_order(seed=1, epoch=0)
    if batched:
        batches = xpatch.grain.BatchSource(src, 3, seed=1)
        got = np.concatenate([batches[k]["data"] for k in range(len(batches))])
        order = np.concatenate([batches.positions(k) for k in range(len(batches))])
    else:
        got = np.stack([src[int(i)]["data"] for i in order])
    np.testing.assert_array_equal(got, np.stack([expected[int(i)]["data"] for i in order]))
    touched = np.unique(src.touched_chunks()[order])
    assert src.cache_stats().loads == len(touched[touched >= 0])
    assert not lazy.variable._in_memory  # nothing read whole


def test_the_patches_are_planned_and_read_on_the_zarrs_chunks():
    values = np.arange(20 * 24, dtype="float32").reshape(20, 24)
    lazy = write(MemoryStore(), values, (8, 12))
    p = lazy.patch(y=4, x=4)
    src = p.to_grain()
    assert p.plan.grid.chunks == ((8, 8, 4), (12, 12))
    assert src.chunk_count == 6
    for i in range(len(src)):  # in index order, each chunk read once
        y, x = src[i]["anchor"]
        np.testing.assert_array_equal(src[i]["data"], values[y : y + 4, x : x + 4])
    assert src.cache_stats().loads == 6


def test_a_decoded_variable_is_read_through_xarray_with_its_decoded_values():
    values = np.arange(12 * 12, dtype="int16").reshape(12, 12)
    data = xr.Dataset({"v": (("y", "x"), values)})
    store = MemoryStore()
    encoding = {"v": {"chunks": (4, 4), "scale_factor": 0.5, "dtype": "int16"}}
    data.to_zarr(store, encoding=encoding, consolidated=False)
    lazy = xr.open_zarr(store, consolidated=False, chunks=None)["v"]
    src = lazy.patch(y=4, x=4).to_grain()
    assert src._plans[0].stored is None  # the scale is xarray's to apply
    for i in range(len(src)):
        y, x = src[i]["anchor"]
        np.testing.assert_array_equal(src[i]["data"], values[y : y + 4, x : x + 4])


def test_fingerprints_name_the_store_not_only_the_shape(tmp_path):
    values = np.zeros((8, 8), "float32")
    first = write(MemoryStore(), values, (4, 4)).patch(y=4, x=4).to_grain().fingerprint
    other = write(MemoryStore(), values + 1, (4, 4)).patch(y=4, x=4).to_grain().fingerprint
    assert first != other  # two stores with data of one shape are not one data
    local = write(LocalStore(tmp_path / "a.zarr"), values, (4, 4))
    again = xr.open_zarr(tmp_path / "a.zarr", consolidated=False, chunks=None)["v"]
    assert (
        local.patch(y=4, x=4).to_grain().fingerprint == again.patch(y=4, x=4).to_grain().fingerprint
    )


def test_a_second_epoch_with_cache_dir_reads_the_local_disk(tmp_path):
    values = np.random.default_rng(0).normal(size=(16, 16)).astype("float32")
    write(LocalStore(tmp_path / "a.zarr"), values, (4, 8))

    def epoch():
        lazy = xr.open_zarr(tmp_path / "a.zarr", consolidated=False, chunks=None)["v"]
        src = lazy.patch(y=4, x=4).to_grain(cache_dir=tmp_path / "cache")
        got = np.stack([src[i]["data"] for i in src.chunk_shuffled_order(seed=0, epoch=0)])
        return got, src.disk_cache_stats()["data"]

    first, written = epoch()
    second, read = epoch()
    np.testing.assert_array_equal(first, second)
    assert (written.writes, read.hits, read.writes) == (8, 8, 0)


@pytest.mark.parametrize("cache", [True, False])
def test_values_already_in_memory_are_served_from_memory(cache):
    values = np.arange(64, dtype="float32").reshape(8, 8)
    store = MemoryStore()
    write(store, values, (4, 4))
    lazy = xr.open_dataset(store, engine="zarr", consolidated=False, chunks=None, cache=cache)["v"]
    lazy.load()
    src = lazy.patch(y=4, x=4).to_grain()
    assert src._plans[0].stored is None
    np.testing.assert_array_equal(src[3]["data"], values[4:8, 4:8])
