"""``scale=``: models whose patches come back at another resolution than their input."""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xpatch
from tests.conftest import forbid_compute
from xpatch.core.errors import DimensionError, OptionError, PredictionError


def upsample(factor: int):
    """A super-resolution 'model' that repeats every cell ``factor`` times along y and x."""

    def model(batch: np.ndarray) -> np.ndarray:
        return np.repeat(np.repeat(batch, factor, axis=-1), factor, axis=-2)

    return model


def block_mean(q: int):
    """A head at 1/q resolution: the mean of each q x q block of the patch."""

    def head(batch: np.ndarray) -> np.ndarray:
        *lead, ny, nx = batch.shape
        return batch.reshape(*lead, ny // q, q, nx // q, q).mean(axis=(-3, -1))

    return head


@pytest.fixture
def raster() -> xr.DataArray:
    """A 2-band UTM raster, 10 m cells, with its transform and CRS written by rioxarray."""
    pytest.importorskip("rioxarray")
    rng = np.random.default_rng(3)
    x = 500_000 + 10.0 * (np.arange(48) + 0.5)
    y = 4_000_000 - 10.0 * (np.arange(40) + 0.5)
    da = xr.DataArray(
        rng.normal(size=(2, 40, 48)).astype("float32"),
        dims=("band", "y", "x"),
        coords={"band": [1, 2], "y": y, "x": x},
        attrs={"long_name": "reflectance"},
    )
    return da.rio.write_crs("EPSG:32633").rio.write_transform()


def both(da: xr.DataArray, **patch):
    return da.patch(**patch), da.chunk({"y": 16, "x": 24}).patch(**patch)


@pytest.mark.parametrize("factor", [2, 4])
def test_repeat_model_reconstructs_np_repeat_with_scaled_transform(raster, factor):
    expected = np.repeat(np.repeat(raster.values, factor, -1), factor, -2)
    eager, lazy = both(raster, y=16, x=16, stride=8, window="hann", boundary="pad")
    with forbid_compute():
        lazy_out = lazy.apply(upsample(factor), batch_size=5, scale=factor)
    for out in (eager.apply(upsample(factor), batch_size=5, scale=factor), lazy_out):
        np.testing.assert_allclose(out.values, expected, rtol=1e-6)
        assert out.dims == raster.dims and out.dtype == raster.dtype
        assert out.shape == (2, 40 * factor, 48 * factor)
        a, b, c, d, e, f = tuple(out.rio.transform())[:6]
        assert (a, b, c, d, e, f) == (10 / factor, 0, 500_000, 0, -10 / factor, 4_000_000)
        assert out.rio.crs == raster.rio.crs
        # cell centres of the finer grid, first and last
        assert out.x.values[0] == pytest.approx(500_000 + 5 / factor)
        assert out.y.values[-1] == pytest.approx(4_000_000 - 400 + 5 / factor)
        np.testing.assert_array_equal(out.band, raster.band)
        assert out.attrs["long_name"] == "reflectance"


@pytest.mark.parametrize("factor", [2, 4])
def test_reconstruct_infers_the_factor_from_the_patch_shape(raster, factor):
    expected = np.repeat(np.repeat(raster.values, factor, -1), factor, -2)
    for p in both(raster, y=16, x=16, stride=12, window="triang"):
        patches = p.patches()
        bigger = xr.apply_ufunc(
            upsample(factor),
            patches,
            input_core_dims=[["y", "x"]],
            output_core_dims=[["y", "x"]],
            exclude_dims={"y", "x"},
            dask="parallelized",
            dask_gufunc_kwargs={"output_sizes": {"y": 16 * factor, "x": 16 * factor}},
            output_dtypes=[patches.dtype],
        )
        inferred = p.reconstruct(bigger)
        explicit = p.reconstruct(bigger, scale={"y": factor, "x": factor})
        np.testing.assert_allclose(inferred.values, expected, rtol=1e-6)
        xr.testing.assert_identical(inferred, explicit)
        assert inferred.rio.transform().a == 10 / factor
        with pytest.raises(PredictionError, match=r"patch shape .*at scale=\{'y': '3'"):
            p.reconstruct(bigger, scale=3)


def test_quarter_resolution_head_equals_coarsen_mean(raster):
    expected = raster.coarsen(y=4, x=4).mean()
    eager, lazy = both(raster, y=16, x=16, stride=8, window="hann")
    outs = [p.apply(block_mean(4), scale=Fraction(1, 4)) for p in (eager, lazy)]
    outs.append(eager.apply(block_mean(4), scale={"y": 0.25, "x": "1/4"}))
    for out in outs:
        assert out.shape == (2, 10, 12)
        np.testing.assert_allclose(out.values, expected.values, rtol=1e-5)
        np.testing.assert_allclose(out.x, expected.x)
        np.testing.assert_allclose(out.y, expected.y)
        assert out.rio.transform().a == 40 and out.rio.transform().e == -40
    xr.testing.assert_allclose(outs[0], outs[1].compute(), rtol=1e-6)


def test_one_dim_scaled_only(raster):
    """{dim: factor} scales that dim alone; the other keeps the input's cells."""
    p = raster.patch(y=8, x=16, stride=8)
    out = p.apply(lambda b: np.repeat(b, 3, axis=-1), scale={"x": 3})
    np.testing.assert_allclose(out.values, np.repeat(raster.values, 3, axis=-1))
    t = out.rio.transform()
    assert (t.a, t.e) == (pytest.approx(10 / 3), -10)
    np.testing.assert_array_equal(out.y, raster.y)


def test_input_nodata_lands_on_the_cells_it_lies_under(raster):
    holes = raster.copy()
    holes.attrs["_FillValue"] = np.nan  # NaN is this raster's nodata: it masks the output
    holes.values[:, :4, :4] = np.nan  # one 4x4 block: a whole cell at 1/4
    holes.values[:, 10, 10] = np.nan  # a single cell: part of a cell at 1/4
    for p in both(holes, y=16, x=16, stride=8):
        up = p.apply(upsample(2), scale=2)
        assert np.isnan(up.values[:, :8, :8]).all()
        assert np.isnan(up.values[:, 20:22, 20:22]).all()
        assert np.isnan(up.values).sum() == 2 * (64 + 4)
        down = p.apply(lambda b: np.nan_to_num(block_mean(4)(b)), scale=0.25)
        assert np.isnan(down.values[:, 0, 0]).all()
        assert np.isnan(down.values).sum() == 2  # the all-nodata block, in each band


def test_nodata_value_and_integer_labels_at_quarter_resolution():
    labels = xr.DataArray(
        np.repeat(np.repeat(np.arange(12, dtype="uint8").reshape(3, 4), 4, 0), 4, 1),
        dims=("y", "x"),
        attrs={"_FillValue": 255},
    )
    labels.values[:4, :4] = 255
    p = labels.patch(y=8, x=8, stride=4)
    out = p.apply(lambda b: b[..., ::4, ::4], reduce="max", scale=0.25)
    assert out.dtype == np.uint8 and out.attrs["_FillValue"] == 255
    expected = np.arange(12, dtype="uint8").reshape(3, 4)
    expected[0, 0] = 255
    np.testing.assert_array_equal(out.values, expected)


def test_dataset_predictions_and_several_outputs_share_the_grid(raster):
    p = raster.patch(y=16, x=16, stride=8)

    def two(b):
        return {"sr": upsample(2)(b), "mean": upsample(2)(b).mean(axis=1)}

    out = p.apply(two, output_dims={"sr": None, "mean": {}}, scale=2)
    assert out["sr"].shape == (2, 80, 96) and out["mean"].shape == (80, 96)
    np.testing.assert_allclose(out["mean"], np.repeat(np.repeat(raster.mean("band"), 2, 0), 2, 1))
    assert out.rio.transform().a == 5


def test_scaled_coordinates_datetimes_and_curvilinear():
    time = np.datetime64("2024-01-01") + np.arange(8) * np.timedelta64(6, "h")
    yy, xx = np.meshgrid(np.arange(6.0), np.arange(8.0), indexing="ij")
    da = xr.DataArray(
        np.arange(48.0).reshape(6, 8),
        dims=("y", "time"),
        coords={
            "time": time,
            "lat": (("y", "time"), 45 + 0.1 * yy + 0.01 * xx),
            "station": ("y", list("abcdef")),
            "height": ((), 2.0),
        },
    )
    p = da.patch(y=2, time=4, stride={"y": 2, "time": 4})
    with pytest.warns(UserWarning, match=r"'station' is not numeric.*leaves it out"):
        out = p.apply(lambda b: np.repeat(np.repeat(b, 2, -1), 2, -2), scale=2)
    assert out.time.dtype == da.time.dtype
    # input cell i is centred on 6 h * i; output cell j on 3 h * j - 1.5 h
    start = np.datetime64("2024-01-01") - np.timedelta64(90, "m")
    expected_time = start + np.arange(16) * np.timedelta64(3, "h")
    np.testing.assert_array_equal(out.time.values, expected_time)
    y2, x2 = np.meshgrid((np.arange(12) + 0.5) / 2 - 0.5, (np.arange(16) + 0.5) / 2 - 0.5,
                         indexing="ij")  # fmt: skip
    np.testing.assert_allclose(out.lat.values, 45 + 0.1 * y2 + 0.01 * x2)
    assert "station" not in out.coords and float(out.height) == 2.0


def test_errors_name_the_numbers_before_any_work(raster):
    p = raster.chunk(y=16, x=24).patch(y=16, x=16, stride=8)
    calls = []

    def model(b):
        calls.append(1)
        return b

    with forbid_compute():
        with pytest.raises(OptionError, match=r"patch size 16 along 'y' 48/5 cells"):
            p.apply(model, scale=0.6)
        with pytest.raises(OptionError, match=r"extent of 'y' \(40 cells\) 40/3"):
            raster.patch(y=6, x=6).apply(model, scale=Fraction(1, 3))
        with pytest.raises(OptionError, match=r"anchor 6 along 'y' at output cell 3/2"):
            raster.patch(y=8, x=8, stride=6, boundary="pad").apply(model, scale=0.25)
        with pytest.raises(DimensionError, match=r"scale names \['band'\]"):
            p.apply(model, scale={"band": 2})
        for bad in (0, -2, "fast", True, float("nan"), [2]):
            with pytest.raises(OptionError, match=r"not a positive scale factor"):
                p.apply(model, scale=bad)
        with pytest.raises(OptionError, match=r"window is an array"):
            raster.patch(y=4, x=4, window=np.ones((4, 4))).apply(model, scale=2)
    assert not calls
    with pytest.raises(PredictionError, match=r"fn returned shape .*scale=\{dim: factor\}"):
        raster.patch(y=16, x=16).apply(model, scale=2)


@st.composite
def scaled_layouts(draw):
    """A 1-D or 2-D layout whose size, stride and extent a factor scales exactly."""
    factor = draw(st.sampled_from([Fraction(1, 2), Fraction(1, 3), Fraction(2), Fraction(3)]))
    q = factor.denominator
    n_dims = draw(st.sampled_from([1, 2]))
    size = [q * draw(st.integers(1, 3)) for _ in range(n_dims)]
    stride = [q * draw(st.integers(1, s // q)) for s in size]
    shape = [q * draw(st.integers(s // q, 5)) for s in size]
    chunks = [draw(st.integers(1, n)) for n in shape]
    window = draw(st.sampled_from(["boxcar", "hann", "triang"]))
    boundary = draw(st.sampled_from(["shift", "pad"]))
    return factor, size, stride, shape, chunks, window, boundary


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scaled_layouts())
def test_property_scaled_round_trip_numpy_equals_dask(layout):
    factor, size, stride, shape, chunks, window, boundary = layout
    dims = ("y", "x")[-len(shape) :]
    values = np.random.default_rng(len(shape)).normal(size=shape)
    da = xr.DataArray(values, dims=dims)
    patch = dict(zip(dims, size), stride=dict(zip(dims, stride)), window=window,
                 boundary=boundary)  # fmt: skip
    eager = da.patch(**patch)
    lazy = da.chunk(dict(zip(dims, chunks))).patch(**patch)
    if factor.denominator == 1:
        f = int(factor)
        expected = values
        for ax in range(values.ndim):
            expected = np.repeat(expected, f, axis=ax)

        def model(b):
            for ax in range(1, b.ndim):
                b = np.repeat(b, f, axis=ax)
            return b
    else:
        q = factor.denominator
        expected = da.coarsen(dict.fromkeys(dims, q)).mean().values

        def model(b):
            for ax in range(1, b.ndim):
                moved = np.moveaxis(b, ax, -1)
                merged = moved.reshape(*moved.shape[:-1], moved.shape[-1] // q, q).mean(-1)
                b = np.moveaxis(merged, -1, ax)
            return b

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", xpatch.UncoveredCellsWarning)
        with forbid_compute():
            lazy_out = lazy.apply(model, batch_size=3, scale=factor)
        eager_out = eager.apply(model, batch_size=3, scale=factor)
    np.testing.assert_allclose(eager_out.values, expected, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(lazy_out.values, eager_out.values, rtol=1e-12, atol=1e-12)
    eager_rec = eager.reconstruct(xr.apply_ufunc(
        model, eager.patches(), input_core_dims=[list(dims)], output_core_dims=[list(dims)],
        exclude_dims=set(dims)))  # fmt: skip
    np.testing.assert_allclose(eager_rec.values, expected, rtol=1e-9, atol=1e-12)


def test_write_of_a_scaled_result_to_geotiff_and_zarr(raster, tmp_path):
    rioxarray = pytest.importorskip("rioxarray")
    p = raster.chunk(y=16, x=24).patch(y=16, x=16, stride=8)
    out = p.apply(upsample(2), scale=2)
    xpatch.write(out, tmp_path / "sr.tif", progress=False)
    back = rioxarray.open_rasterio(tmp_path / "sr.tif")
    assert back.shape == (2, 80, 96) and back.rio.transform().a == 5
    assert back.rio.crs == raster.rio.crs
    np.testing.assert_allclose(back.values, np.repeat(np.repeat(raster.values, 2, -1), 2, -2))
    xpatch.write(out, tmp_path / "sr.zarr", progress=False)
    stored = xr.open_zarr(tmp_path / "sr.zarr")
    (variable,) = stored.data_vars.values()
    np.testing.assert_allclose(variable.values, back.values)


SR_MODEL = """
import numpy as np

def up2(batch):
    return np.repeat(np.repeat(batch, 2, axis=-1), 2, axis=-2)

def quarter(batch):
    *lead, ny, nx = batch.shape
    return batch.reshape(*lead, ny // 4, 4, nx // 4, 4).mean(axis=(-3, -1))
"""


@pytest.mark.parametrize(
    ("fn", "scale", "cell"), [("up2", "2", 5.0), ("quarter", "y=1/4,x=0.25", 40.0)]
)
def test_cli_scale_writes_the_scaled_geotiff(raster, tmp_path, capsys, fn, scale, cell):
    from xpatch.cli import main

    rioxarray = pytest.importorskip("rioxarray")
    (tmp_path / "sr_model.py").write_text(SR_MODEL)
    raster.rio.to_raster(tmp_path / "in.tif")
    argv = ["apply", str(tmp_path / "in.tif"), str(tmp_path / "out.tif"), "--fn",
            f"{tmp_path / 'sr_model.py'}:{fn}", "--size", "16", "--stride", "8",
            "--scale", scale, "--chunks", "16", "--no-progress"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    out = rioxarray.open_rasterio(tmp_path / "out.tif")
    t = out.rio.transform()
    assert (t.a, t.e, t.c, t.f) == (cell, -cell, 500_000, 4_000_000)
    assert out.rio.crs == raster.rio.crs
    if fn == "up2":
        expected = np.repeat(np.repeat(raster.values, 2, -1), 2, -2)
    else:
        expected = raster.coarsen(y=4, x=4).mean().values
    np.testing.assert_allclose(out.values, expected, rtol=1e-5)
    assert main([*argv[:-3], "--scale", "y=0", "--no-progress"]) == 2
    assert "not a positive scale factor" in capsys.readouterr().err


def repeat_cells(values: xr.DataArray, factor: int) -> xr.DataArray:
    """Every cell of the patched dims y and x that ``values`` has, ``factor`` times."""
    for dim in ("y", "x"):
        if dim in values.dims:
            values = values.isel({dim: np.repeat(np.arange(values.sizes[dim]), factor)})
    return values


def test_lazy_predictions_with_lazy_anchor_coordinates_reconstruct_scaled():
    da = xr.DataArray(np.arange(64.0).reshape(8, 8), dims=("y", "x")).chunk(4)
    p = da.patch(y=4, x=4)
    bigger = repeat_cells(p.patches().chunk(), 2)  # its anchor coordinates are lazy
    with forbid_compute():
        out = p.reconstruct(bigger)
    np.testing.assert_array_equal(out.values, np.repeat(np.repeat(da.values, 2, 0), 2, 1))
    # anchors that are not this patcher's are still caught, on the output grid too
    wrong = bigger.assign_coords(y_anchor=bigger.y_anchor + 1)
    mismatch = r"carries anchor \[\d+, (\d+)\] where the patch at \[\d+, \1\]"
    with pytest.raises(PredictionError, match=mismatch):
        p.reconstruct(wrong).compute()


def test_dataset_predictions_read_the_scale_off_every_variable():
    ds = xr.Dataset({"a": (("y", "x"), np.arange(64.0).reshape(8, 8)), "b": ("x", np.arange(8.0))})
    p = ds.patch(y=4, x=4)
    bigger = p.patches().map(repeat_cells, factor=2)
    for order in (["a", "b"], ["b", "a"]):  # "b" lacks y: its shape tells nothing of y
        out = p.reconstruct(bigger[order])
        np.testing.assert_array_equal(out["b"], np.repeat(np.arange(8.0), 2))
        assert out["a"].shape == (16, 16)


@pytest.mark.parametrize(
    ("labels", "why"),
    [
        ([0.0, 1.0, np.nan, 3.0, 4.0, 5.0, 6.0, 7.0], "NaN"),
        ([0.0, 1.0, 2.0, 1.5, 4.0, 5.0, 6.0, 7.0], "not strictly increasing or decreasing"),
    ],
)
def test_scale_refuses_labels_it_cannot_interpolate(labels, why):
    # The output's labels are the input's interpolated at the new cell centres: from NaN or
    # labels that turn back they were made up, silently.
    da = xr.DataArray(np.arange(8.0), dims="x", coords={"x": labels})
    p = da.patch(x=4)
    with pytest.raises(xpatch.OptionError, match=why):
        p.apply(lambda b: np.repeat(b, 2, axis=-1), scale=2)
    assert p.apply(lambda b: b).sizes["x"] == 8  # unscaled: the labels are the input's
