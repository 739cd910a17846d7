"""Round trips and numpy/dask equivalence: the exactness properties of overlap-add."""

from __future__ import annotations

import warnings

import dask.array as dsa
import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xpatch
from tests.conftest import sorted_by_anchor

WINDOWS = ["boxcar", "hann", "triangular", "tukey", ("tukey", 0.3), ("gaussian", 2.0), "blackman"]


@st.composite
def layouts(draw):
    """A random array (1 carried dim + 1 to 3 patched dims), layout and chunking."""
    k = draw(st.integers(1, 3))
    shape = [draw(st.integers(1, 24 if k < 3 else 10)) for _ in range(k)]
    boundary = draw(st.sampled_from(["shift", "pad", "drop"]))
    sizes, strides = [], []
    for extent in shape:
        size = draw(st.integers(1, extent + (3 if boundary == "pad" else 0)))
        sizes.append(size)
        strides.append(draw(st.integers(1, size)))
    if boundary == "drop":
        # "drop" only covers every cell when the strides land flush with the edge.
        shape = [s + ((e - s) // t) * t for e, s, t in zip(shape, sizes, strides)]
    chunks = [draw(st.integers(1, e)) for e in shape]
    window = draw(st.sampled_from(WINDOWS))
    carried = draw(st.integers(1, 3))
    dtype = draw(st.sampled_from(["float64", "float32"]))
    seed = draw(st.integers(0, 2**16))
    return shape, sizes, strides, boundary, chunks, window, carried, dtype, seed


def build(shape, carried, dtype, seed):
    dims = ["band"] + [f"d{i}" for i in range(len(shape))]
    values = np.random.default_rng(seed).normal(size=(carried, *shape)).astype(dtype)
    coords = {d: np.arange(n) * 0.5 for d, n in zip(dims[1:], shape)}
    return xr.DataArray(values, dims=dims, coords=coords, attrs={"source": "test"})


def patch_options(da, sizes, strides, boundary, window):
    """The patch keyword arguments of a drawn layout, for the patched dims of ``build``."""
    return dict(
        size=dict(zip(da.dims[1:], sizes)),
        stride=dict(zip(da.dims[1:], strides)),
        boundary=boundary,
        window=window,
    )


def tolerance(dtype):
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == "float32" else {"rtol": 1e-12, "atol": 1e-12}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_reconstruct_of_patches_is_the_input_for_numpy_and_dask(layout):
    shape, sizes, strides, boundary, chunks, window, carried, dtype, seed = layout
    da = build(shape, carried, dtype, seed)
    options = patch_options(da, sizes, strides, boundary, window)
    p = da.patch(**options)
    eager = p.reconstruct(p.patches())
    assert eager.dims == da.dims
    assert eager.dtype == np.dtype(dtype)
    np.testing.assert_allclose(eager.values, da.values, **tolerance(dtype))
    xr.testing.assert_identical(eager.coords.to_dataset(), da.coords.to_dataset())
    assert eager.attrs == da.attrs

    lazy_input = da.chunk({"band": 1, **dict(zip(da.dims[1:], chunks))})
    lp = lazy_input.patch(**options)
    lazy_patches = lp.patches()
    assert isinstance(lazy_patches.data, dsa.Array)
    np.testing.assert_array_equal(
        sorted_by_anchor(lazy_patches).values, sorted_by_anchor(p.patches()).values
    )
    lazy = lp.reconstruct(lazy_patches)
    assert isinstance(lazy.data, dsa.Array)
    np.testing.assert_allclose(lazy.values, eager.values, **tolerance(dtype))


@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("reduce", ["mean", "max", "min"])
def test_borders_come_back_exactly_for_every_window_and_reduction(window, reduce):
    da = xr.DataArray(np.random.default_rng(1).random((33, 47)), dims=("y", "x"))
    p = da.patch(y=8, x=10, stride=3, window=window)
    out = p.reconstruct(p.patches(), reduce=reduce).values
    np.testing.assert_allclose(out, da.values, rtol=1e-12)
    for edge in (out[0], out[-1], out[:, 0], out[:, -1]):
        assert np.isfinite(edge).all()


def test_sum_reduction_is_the_weighted_sum():
    da = xr.DataArray(np.ones(6), dims="x")
    p = da.patch(x=4, stride=2)  # anchors 0, 2: cells 2, 3 are covered twice
    assert p.reconstruct(p.patches(), reduce="sum").values.tolist() == [1, 1, 2, 2, 1, 1]


def test_max_and_min_take_the_extreme_over_covering_patches():
    da = xr.DataArray(np.zeros(6), dims="x")
    p = da.patch(x=4, stride=2)
    pred = p.patches() + xr.DataArray([1.0, 5.0], dims="patch")
    assert p.reconstruct(pred, reduce="max").values.tolist() == [1, 1, 5, 5, 5, 5]
    assert p.reconstruct(pred, reduce="min").values.tolist() == [1, 1, 1, 1, 5, 5]


def test_weighted_mean_follows_the_window():
    da = xr.DataArray(np.zeros(6), dims="x")
    p = da.patch(x=4, stride=2, window="hann")
    pred = p.patches() + xr.DataArray([0.0, 1.0], dims="patch")
    w = p.weights().values
    # Cell 2 is position 2 of patch 0 (value 0) and position 0 of patch 1 (value 1).
    assert p.reconstruct(pred).values[2] == pytest.approx(w[0] / (w[2] + w[0]))
    assert w[0] / (w[2] + w[0]) < 0.2  # far from the unweighted mean 0.5


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_nan_predictions_are_skipped_not_spread(lazy):
    da = xr.DataArray(np.arange(8.0), dims="x")
    p = da.patch(x=4, stride=2, window="hann")
    pred = p.patches().copy()
    pred[1, 1] = np.nan  # patch 1 covers cells 2..5; cell 3 still has patch 0
    pred[2, :] = np.nan  # patch 2 covers cells 4..7; cells 6, 7 have nothing else
    if lazy:
        pred = pred.chunk({"patch": 1})
    out = p.reconstruct(pred).values
    np.testing.assert_allclose(out[:6], da.values[:6])
    assert np.isnan(out[6:]).all()


def test_cells_no_patch_covers_are_nan_for_every_reduction():
    da = xr.DataArray(np.ones(10), dims="x")
    with pytest.warns(xpatch.UncoveredCellsWarning, match="2 of 10 cells"):
        p = da.patch(x=4, boundary="drop")
    for reduce in ("mean", "sum", "max", "min"):
        out = p.reconstruct(p.patches(), reduce=reduce).values
        assert np.isnan(out[8:]).all()
        assert np.isfinite(out[:8]).all()


def test_gaps_between_patches_are_reported_and_nan():
    da = xr.DataArray(np.ones(10), dims="x")
    with pytest.warns(xpatch.UncoveredCellsWarning, match="4 of 10 cells"):
        p = da.patch(x=2, stride=4)  # anchors 0, 4, 8: cells 2, 3, 6, 7 uncovered
    assert np.isnan(p.reconstruct(p.patches()).values).tolist() == [
        False,
        False,
        True,
        True,
        False,
        False,
        True,
        True,
        False,
        False,
    ]


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [("float16", "float32"), ("float32", "float32"), ("uint8", "float64"), ("int64", "float64")],
)
def test_accumulation_dtype_does_not_overflow_or_wrap(dtype, expected):
    # 300 overlaps of 255 would wrap a uint8 (or float16 near 65504) accumulator.
    values = np.full(400, 255 if dtype == "uint8" else 250, dtype=dtype)
    da = xr.DataArray(values, dims="x")
    p = da.patch(x=300, stride=1)
    assert len(p) == 101
    out = p.reconstruct(p.patches(), reduce="mean")
    assert out.dtype == np.dtype(expected)
    # float32 accumulation of 101 normalised weights: rounding grows with the overlap
    # count (about 101 x 2**-24); a wrapped or overflowed accumulator is off by far more.
    np.testing.assert_allclose(out.values, values.astype("float64"), rtol=2e-5)
    summed = p.reconstruct(p.patches(), reduce="sum").values
    assert summed.max() == pytest.approx(float(values[0]) * 101, rel=1e-6)


def test_large_integers_survive_the_round_trip():
    values = np.array([2**40 + 1, 2**40 + 3, 7, 9], dtype=np.int64)
    da = xr.DataArray(values, dims="x")
    p = da.patch(x=2, stride=1)
    np.testing.assert_array_equal(p.reconstruct(p.patches()).values, values.astype(float))


def test_predictions_may_swap_the_carried_dims(scene):
    p = scene.patch(y=16, x=16, stride=12, window="hann")
    scores = (
        p.patches()
        .mean("band")
        .expand_dims(klass=["water", "land"])
        .copy()
        .assign_coords(klass=["water", "land"])
    )
    scores[0] *= -1
    out = p.reconstruct(scores)
    assert out.dims == ("klass", "y", "x")
    assert out.klass.values.tolist() == ["water", "land"]
    np.testing.assert_allclose(out.y, scene.y)
    expected = scene.mean("band")
    np.testing.assert_allclose(out.sel(klass="land"), expected, rtol=1e-12)
    np.testing.assert_allclose(out.sel(klass="water"), -expected, rtol=1e-12)
    assert "band" not in out.coords


def test_dataset_variables_are_patched_together_and_carried_whole():
    rng = np.random.default_rng(5)
    ds = xr.Dataset(
        {
            "image": (("band", "y", "x"), rng.random((2, 20, 24))),
            "mask": (("x", "y"), rng.integers(0, 3, (24, 20)).astype("int16")),
            "meta": (("band",), np.array([1.0, 2.0])),
        },
        coords={"y": np.arange(20), "x": np.arange(24)},
        attrs={"title": "scene"},
    )
    p = ds.patch(y=8, x=8, stride=6, window="hann")
    patches = p.patches()
    assert patches["image"].dims == ("patch", "band", "y", "x")
    assert patches["mask"].dims == ("patch", "x", "y")
    assert patches["mask"].dtype == np.int16
    assert "patch" not in patches["meta"].dims
    one = p[3]
    np.testing.assert_array_equal(one["image"].values, patches["image"][3].values)
    np.testing.assert_array_equal(one["mask"].values, patches["mask"][3].values)
    np.testing.assert_array_equal(one["image"].y.values, one["mask"].y.values)
    out = p.reconstruct(patches)
    np.testing.assert_allclose(out["image"], ds["image"])
    np.testing.assert_allclose(out["mask"], ds["mask"])
    assert out["mask"].dims == ("x", "y")
    xr.testing.assert_identical(out["meta"], ds["meta"])
    assert out.attrs == ds.attrs
    lazy = ds.chunk({"y": 7, "x": 9}).patch(y=8, x=8, stride=6, window="hann")
    np.testing.assert_allclose(lazy.reconstruct(lazy.patches())["image"], ds["image"])


def test_reconstruct_accepts_a_single_variable_of_a_dataset_patcher():
    ds = xr.Dataset({"a": (("y", "x"), np.ones((6, 6)))})
    p = ds.patch(y=3, x=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = p.reconstruct(p.patches()["a"])
    assert out.name == "a"
    np.testing.assert_array_equal(out, ds["a"])
