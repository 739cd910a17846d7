"""Sliding-window inference: ``p.apply`` and the size of the lazy graphs."""

from __future__ import annotations

import pickle
import threading

import dask
import dask.array as dsa
import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings

import xpatch
from tests.conftest import forbid_compute
from tests.xarray.test_roundtrip import build, layouts, patch_options, tolerance


class PatchCounter:
    """A batch function that records every patch it sees (by content, thread-safe)."""

    def __init__(self, fn=lambda b: b * 3.0 - 1.0):
        self.fn = fn
        self.seen: list[np.ndarray] = []
        self.lock = threading.Lock()

    def __call__(self, batch):
        with self.lock:
            self.seen.extend(batch.copy())
        return self.fn(batch)

    @property
    def count(self):
        return len(self.seen)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_apply_of_a_pointwise_fn_equals_fn_on_the_whole_array(layout):
    shape, sizes, strides, boundary, chunks, window, carried, dtype, seed = layout
    da = build(shape, carried, dtype, seed)
    options = patch_options(da, sizes, strides, boundary, window)
    expected = da * 3.0 - 1.0
    lazy_input = da.chunk({"band": 1, **dict(zip(da.dims[1:], chunks))})
    for source in (da, lazy_input):
        p = source.patch(**options)
        counter = PatchCounter()
        out = p.apply(counter, batch_size=5)
        assert isinstance(out.data, dsa.Array) == (source is lazy_input)
        values = out.values
        np.testing.assert_allclose(values, expected.values, **tolerance(dtype))
        # Every patch exactly once, after one patch of zeros that found fn's output.
        assert counter.count == len(p) + 1 and not counter.seen[0].any()
        assert out.dims == da.dims
        xr.testing.assert_identical(out.coords.to_dataset(), da.coords.to_dataset())


def test_each_patch_goes_through_fn_once_and_in_batches(scene):
    lazy = scene.chunk({"y": 16, "x": 20})
    p = lazy.patch(y=12, x=12, stride=8, window="hann")
    sizes = []
    counter = PatchCounter(lambda b: sizes.append(len(b)) or b)
    p.apply(counter, batch_size=4).compute()
    assert counter.count == len(p) + 1  # the first, a patch of zeros, found fn's output
    assert sizes[0] == 1 and max(sizes) <= 4
    expected = p.patches().values
    seen = np.stack(counter.seen[1:])
    # Same patches, each once (groups may run in any order).
    key = lambda a: a.reshape(len(a), -1).tolist()  # noqa: E731
    assert sorted(key(seen)) == sorted(key(expected))


def test_building_apply_computes_nothing_and_calls_fn_never(scene):
    lazy = scene.chunk({"y": 16, "x": 20})
    counter = PatchCounter()
    with forbid_compute():
        p = lazy.patch(y=12, x=12, stride=8, window="hann")
        out = p.apply(counter, batch_size=4, output_dims={"score": 2}, dtype="float32")
        assert out.shape == (2, 40, 50)
    assert counter.count == 0


def test_declared_output_dims_and_dtype_skip_the_call_on_zeros(scene):
    p = scene.chunk({"y": 16}).patch(y=10, x=10, stride=5, window="tukey")

    def scores(batch):  # (b, band, y, x) -> (b, class, y, x) float32
        return np.stack([batch.mean(axis=1), batch.max(axis=1)], axis=1).astype("float32")

    counter = PatchCounter(scores)
    out = p.apply(counter, output_dims={"class": 2}, dtype="float32")
    assert counter.count == 0  # declared: fn is not called to find them
    assert out.dims == ("class", "y", "x")
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.isel(**{"class": 0}), scene.mean("band"), atol=1e-5)
    np.testing.assert_allclose(out.isel(**{"class": 1}), scene.max("band"), atol=1e-5)
    assert "band" not in out.coords and list(out.y.values) == list(scene.y.values)


def test_fn_that_breaks_its_declaration_fails_with_a_clear_error(scene):
    p = scene.patch(y=10, x=10)
    declared = {"output_dims": {"band": 3}, "dtype": scene.dtype}
    with pytest.raises(xpatch.PredictionError, match=r"expected \(\d+, 3, 10, 10\).*output_dims"):
        p.apply(lambda b: b[:, :2], **declared)
    integers = xr.DataArray(np.arange(100).reshape(10, 10), dims=("y", "x")).patch(y=5, x=5)
    with pytest.raises(xpatch.PredictionError, match=r"pass dtype='float64'"):
        integers.apply(lambda b: b / 2, dtype="int64")


def test_output_dims_and_dtype_left_out_are_found_by_one_call_on_zeros(scene):
    # A float model over integer imagery, and a model that drops the band dim: found,
    # not refused after a failed run.
    integers = xr.DataArray(np.arange(100).reshape(10, 10), dims=("y", "x"))
    halves = integers.chunk(5).patch(y=5, x=5)
    with forbid_compute():
        out = halves.apply(lambda b: b / 2)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out.values, integers.values / 2)
    p = scene.chunk({"y": 16}).patch(y=10, x=10, stride=5)
    counter = PatchCounter(lambda b: b.mean(axis=1))
    with forbid_compute():
        mean = p.apply(counter)
    assert counter.count == 1 and counter.seen[0].shape == (3, 10, 10)  # one patch of zeros
    assert mean.dims == ("y", "x")
    np.testing.assert_allclose(mean, scene.mean("band"), rtol=1e-6)
    # New non-patched dims cannot be named from their sizes: refused, naming the fix.
    with pytest.raises(xpatch.OptionError, match=r"shape \(5,\).*output_dims=\{'dim0': 5\}"):
        p.apply(lambda b: np.repeat(b[:, :1], 5, axis=1))
    # A dict fn's outputs are found too, its weights' entry aside.
    ds = p.apply(lambda b: {"m": b.mean(axis=1), "s": b * 2, "w": np.ones(len(b))}, weights="w")
    assert list(ds) == ["m", "s"]
    assert ds["m"].dims == ("y", "x") and ds["s"].dims == ("band", "y", "x")
    np.testing.assert_allclose(ds["s"], scene * 2, rtol=1e-6)

    # A fn that fails on zeros says how to skip the call.
    def needs_signal(batch):
        if not batch.any():
            raise ValueError("all zeros")
        return batch

    with pytest.raises(ValueError, match="all zeros") as caught:
        p.apply(needs_signal)
    (note,) = caught.value.__notes__
    assert "batch of zeros" in note and "output_dims=" in note, note
    p.apply(needs_signal, output_dims={"band": 3}, dtype=scene.dtype)  # declared: not called


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fn": 3}, "is not callable"),
        ({"batch_size": 0}, "batch_size=0 must be a positive int"),
        ({"output_dims": ["class"]}, "must map the output's non-patched dim names"),
        ({"output_dims": {"y": 3}}, "which are patched dims"),
        ({"reduce": "median"}, "reduce"),
    ],
)
def test_bad_apply_arguments_are_refused_before_any_work(scene, kwargs, message):
    p = scene.chunk({"y": 16}).patch(y=10, x=10)
    arguments = {"fn": np.negative, **kwargs}
    with forbid_compute(), pytest.raises(xpatch.XPatchError, match=message):
        p.apply(**arguments)


def test_apply_needs_a_dataarray(scene):
    p = xr.Dataset({"a": scene}).patch(y=10, x=10)
    with pytest.raises(xpatch.OptionError, match="to_dataarray"):
        p.apply(np.negative)


def test_padded_cells_reach_fn_with_the_pad_value_and_do_not_leak(scene):
    p = scene.patch(y=16, x=16, stride=16, boundary="pad", window="hann")
    saw_nan = []
    out = p.apply(lambda b: saw_nan.append(bool(np.isnan(b).any())) or np.nan_to_num(b) + 1)
    assert any(saw_nan)
    np.testing.assert_allclose(out, scene + 1, rtol=1e-12)


def test_apply_with_max_reduction(scene):
    p = scene.patch(y=10, x=10, stride=5)
    out = p.apply(np.abs, reduce="max")
    np.testing.assert_allclose(out, abs(scene))


def test_big_graphs_have_a_few_tasks_per_chunk():
    # The layout: (4, 8192, 8192) in 1024^2 chunks, 256^2 patches, stride 192.
    data = xr.DataArray(
        dsa.zeros((4, 8192, 8192), chunks=(4, 1024, 1024), dtype="float32"),
        dims=("band", "y", "x"),
    )
    n_chunks = 64
    with forbid_compute():
        p = data.patch(y=256, x=256, stride=192, window="hann")
        round_trip = p.reconstruct(p.patches())
        applied = p.apply(lambda b: b, batch_size=32)
    for result in (round_trip, applied):
        graph = result.data.__dask_graph__()
        own = sum(len(layer) for name, layer in graph.layers.items() if "zeros" not in name)
        assert own / n_chunks <= 4.1, own / n_chunks
    assert len(p) == 43 * 43
    layer = round_trip.data.__dask_graph__().layers[round_trip.data.name]
    assert sum("window" in str(key[0]) for key in layer) == 1


def test_apply_graph_holds_fn_once_and_pickles_small():
    fn_bytes = np.ones(50_000)  # a "model" of 400 kB closed over by fn

    def model(batch):
        return batch * fn_bytes[0]

    data = xr.DataArray(dsa.zeros((64, 64), chunks=16), dims=("y", "x"))
    out = data.patch(y=8, x=8, stride=6).apply(model)
    graph = dict(out.data.__dask_graph__())
    assert sum(str(k[0]).startswith("xpatch-fn-") for k in graph) == 1
    cloudpickle = pytest.importorskip("cloudpickle")
    assert len(cloudpickle.dumps(graph)) < 2 * len(pickle.dumps(fn_bytes))


def test_numpy_and_dask_apply_agree_and_dask_stays_lazy_until_computed(scene):
    calls = []
    fn = PatchCounter(lambda b: calls.append(1) or np.sqrt(np.abs(b)))
    eager = scene.patch(y=14, x=14, stride=9, window="triangular").apply(fn)
    lazy = scene.chunk({"y": 13, "x": 17}).patch(y=14, x=14, stride=9, window="triangular")
    calls_so_far = len(calls)
    with forbid_compute():
        lazy_out = lazy.apply(fn)
    assert len(calls) == calls_so_far + 1  # building called fn once, on a patch of zeros
    with dask.config.set(scheduler="synchronous"):
        np.testing.assert_allclose(lazy_out.values, eager.values, rtol=1e-12)


def test_apply_drops_the_inputs_packing_and_keeps_its_nodata_unless_told(scene):
    encoded = scene.assign_attrs(_FillValue=0, scale_factor=1e-4, add_offset=1.0, nodata=0)
    out = encoded.patch(y=10, x=10).apply(lambda b: b + 1)
    assert out.attrs == {"units": "reflectance", "_FillValue": 0}
    assert encoded.attrs["_FillValue"] == 0  # the input keeps its own
    # A model whose 0 is a value: give the output another nodata.
    zeros = encoded.patch(y=10, x=10).apply(lambda b: b * 0, nodata=np.nan)
    assert zeros.attrs["_FillValue"] != zeros.attrs["_FillValue"]  # NaN
    assert (zeros.values == 0).all()
    bare = encoded.patch(y=10, x=10).apply(lambda b: b * 0, nodata=None)
    assert bare.attrs == {"units": "reflectance"}
    with pytest.raises(xpatch.OptionError, match="nodata='band' must be 'input'"):
        encoded.patch(y=10, x=10).apply(lambda b: b, nodata="band")


@pytest.mark.parametrize(
    "fn",
    [lambda b: b * 2, lambda b: b, lambda b: b[::-1][::-1], lambda b: b[::-1].copy()[::-1],
     lambda b: np.flip(b, axis=0)],
)  # fmt: skip
def test_results_written_over_the_patches_equal_a_fresh_stack(fn):
    """Small patches' results go over their own patches (no second array of the group);
    views of the batch, reversed ones included, must come out as a fresh stack does."""
    from xpatch.core.apply import InferenceSetup, Output, run_batches

    def runs(dtype: str) -> InferenceSetup:  # fn in batches of 5, one output (1, *patch) of dtype
        return InferenceSetup(fn, 5, {None: Output((1,), np.dtype(dtype))}, None, None)

    patches = np.random.default_rng(4).random((23, 1, 4, 5))
    (expected,) = run_batches(patches.copy(), runs("f8"), (4, 5)).values()
    scratch = patches.copy()
    (got,) = run_batches(scratch, runs("f8"), (4, 5), into_patches=True).values()
    assert got is scratch  # written in place: no fresh array
    np.testing.assert_array_equal(got, expected)
    (other,) = run_batches(patches.copy(), runs("f4"), (4, 5), into_patches=True).values()
    np.testing.assert_array_equal(other, expected.astype("f4"))  # another dtype: a new array
