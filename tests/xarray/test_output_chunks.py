"""apply's output dims that are not patched are chunked so output blocks stay bounded."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import xarray as xr

import xpatch
from tests.conftest import forbid_compute


def scores(n: int):
    """A model returning ``n`` class scores per cell, each a multiple of the band."""

    def model(batch: np.ndarray) -> np.ndarray:
        return np.concatenate([batch * k for k in range(n)], axis=1)

    return model


def test_a_hundred_classes_on_1024_chunks_stay_within_dask_chunk_size():
    """The issue's case: 100 classes on 1024² float32 chunks were 400 MiB output blocks."""
    da = xr.DataArray(
        dask.array.zeros((1, 4096, 4096), dtype="float32", chunks=(1, 1024, 1024)),
        dims=("band", "y", "x"),
    )
    p = da.patch(y=256, x=256, stride=192)
    with forbid_compute():
        # A budget that lets tasks hold the partial sums of 100 classes over a chunk.
        out = p.apply(scores(100), output_dims={"class": 100}, dtype="float32", task_memory="4GiB")
    block = max(out.chunks[0]) * max(out.chunks[1]) * max(out.chunks[2]) * out.dtype.itemsize
    assert block <= 128 * 2**20 < 100 * 1024 * 1024 * 4
    assert sum(out.chunks[0]) == 100 and out.chunks[1:] == da.chunks[1:]
    # At the default budget the tasks' partial sums (1279² cells x 100 classes: 624 MiB)
    # do not fit either: the working blocks, and so the output's, are smaller.
    with forbid_compute():
        small = p.apply(scores(100), output_dims={"class": 100}, dtype="float32")
    assert max(small.chunks[1]) * max(small.chunks[2]) < 1024 * 1024
    # a few classes stay one chunk: nothing changes for the common case
    few = p.apply(scores(3), output_dims={"class": 3}, dtype="float32")
    assert few.chunks[0] == (3,)


@pytest.mark.parametrize("reduce", ["mean", "vote"])
def test_split_classes_give_the_same_values_with_fn_called_once_per_batch(reduce):
    rng = np.random.default_rng(0)
    values = rng.integers(0, 9, (1, 64, 48)).astype("float32")
    da = xr.DataArray(values, dims=("band", "y", "x"))
    calls = []

    def model(batch):
        calls.append(len(batch))
        out = scores(10)(batch)
        return out.astype("uint8") if reduce == "vote" else out

    dtype = "uint8" if reduce == "vote" else "float32"
    options = dict(output_dims={"class": 10}, dtype=dtype, reduce=reduce, batch_size=8)
    with dask.config.set({"array.chunk-size": "4KiB"}):
        lazy = da.chunk(y=32, x=24).patch(y=16, x=16, stride=8).apply(model, **options)
    assert len(lazy.chunks[0]) > 1  # split along the classes
    with dask.config.set(scheduler="synchronous"):
        computed = lazy.values
    lazy_calls, calls[:] = len(calls), []
    eager = da.patch(y=16, x=16, stride=8).apply(model, **options)
    np.testing.assert_allclose(computed, eager.values, rtol=1e-6)
    np.testing.assert_allclose(computed[3], values[0] * 3, rtol=1e-6)
    # the lead pieces share their group's task: fn runs once per batch, not once per piece
    assert lazy_calls == sum(-(-n // 8) for n in group_sizes(da.chunk(y=32, x=24)))


def group_sizes(da):
    p = da.patch(y=16, x=16, stride=8)
    return [stop - start for start, stop in p.plan.groups]


def test_dict_outputs_are_split_each_by_its_own_size(tmp_path):
    da = xr.DataArray(np.ones((1, 64, 48), "float32"), dims=("band", "y", "x")).chunk(y=32, x=24)
    p = da.patch(y=16, x=16, stride=8)

    def two(b):
        return {"many": scores(10)(b), "one": b[:, 0]}

    with dask.config.set({"array.chunk-size": "4KiB"}):
        ds = p.apply(two, output_dims={"many": {"class": 10}, "one": {}}, dtype="float32")
    assert len(ds["many"].chunks[0]) > 1
    xpatch.write(ds, tmp_path / "o.zarr", progress=False)
    back = xr.open_zarr(tmp_path / "o.zarr")
    np.testing.assert_allclose(back["many"].values[:, 0, 0], np.arange(10))
