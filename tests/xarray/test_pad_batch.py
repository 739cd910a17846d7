"""apply(..., pad_batch=True): fn sees batches of exactly batch_size; jax.jit compiles once."""

from __future__ import annotations

import threading

import dask
import numpy as np
import pytest
import xarray as xr

import xpatch


@pytest.fixture
def image() -> xr.DataArray:
    rng = np.random.default_rng(1)
    return xr.DataArray(rng.normal(size=(2, 70, 61)), dims=("band", "y", "x"))


def recording(seen: list):
    lock = threading.Lock()

    def fn(batch: np.ndarray) -> np.ndarray:
        with lock:
            seen.append(batch.shape)
        return batch * 2.0 - 1.0

    return fn


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("boundary", ["shift", "pad"])
def test_fn_sees_only_full_batches_and_results_do_not_change(image, lazy, boundary):
    # Chunks of uneven sizes: the groups hold different numbers of patches.
    obj = image.chunk(y=(30, 25, 15), x=(20, 41)) if lazy else image
    p = obj.patch(y=16, x=16, stride=10, boundary=boundary, window="hann")
    if lazy:
        counts = {b - a for a, b in p.plan.groups}
        assert len(counts) > 1
    padded_seen: list = []
    plain_seen: list = []
    padded = p.apply(recording(padded_seen), batch_size=8, pad_batch=True).values
    plain = p.apply(recording(plain_seen), batch_size=8).values
    assert {shape[0] for shape in padded_seen} == {8}
    assert {shape[0] for shape in plain_seen} != {8}  # the short batches pad_batch fills
    assert all(shape[1:] == (2, 16, 16) for shape in padded_seen)
    np.testing.assert_array_equal(padded, plain)


def test_a_single_patch_fills_a_whole_batch():
    da = xr.DataArray(np.arange(5.0), dims="x")
    seen: list = []
    out = da.patch(x=5).apply(recording(seen), batch_size=4, pad_batch=True)
    assert seen == [(4, 5), (4, 5)]  # a batch of zeros found fn's output; then the patch
    np.testing.assert_array_equal(out.values, da.values * 2 - 1)


@pytest.mark.parametrize("lazy", [False, True])
def test_jax_jit_compiles_once_per_run(image, lazy):
    jax = pytest.importorskip("jax")
    traces = []

    @jax.jit
    def model(batch):
        traces.append(batch.shape)  # runs once per trace, not per call
        return batch * 2.0 - 1.0

    obj = image.astype("float32")
    obj = obj.chunk(y=(30, 25, 15), x=(20, 41)) if lazy else obj
    p = obj.patch(y=16, x=16, stride=10, boundary="pad", pad_mode="reflect")
    with dask.config.set(scheduler="synchronous"):
        out = p.apply(model, batch_size=8, pad_batch=True).values
    assert len(traces) == 1, traces
    expected = p.apply(lambda b: b * 2.0 - 1.0, batch_size=8)
    np.testing.assert_allclose(out, expected.values, rtol=1e-6)
    # Without pad_batch each new short batch size traces again (the full size is cached).
    traces.clear()
    with dask.config.set(scheduler="synchronous"):
        p.apply(model, batch_size=8).compute()
    assert traces and all(shape[0] < 8 for shape in traces)


def test_shape_errors_still_name_the_batch(image):
    p = image.patch(y=16, x=16)
    declared = {"output_dims": {"band": 2}, "dtype": image.dtype}
    with pytest.raises(xpatch.PredictionError, match=r"fn returned shape \(5, 1, 16, 16\)"):
        p.apply(lambda b: b[:, :1], batch_size=5, pad_batch=True, **declared)
    with pytest.raises(xpatch.OptionError, match=r"shape \(1,\) on a batch of zeros"):
        p.apply(lambda b: b[:, :1], batch_size=5, pad_batch=True)


@pytest.mark.parametrize("value", [1, "yes", None, 0.0])
def test_pad_batch_must_be_a_bool(image, value):
    with pytest.raises(xpatch.OptionError, match=rf"pad_batch={value!r} must be True or False"):
        image.patch(y=16, x=16).apply(lambda b: b, pad_batch=value)
