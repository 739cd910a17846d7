"""``apply(..., out_dtype=)`` and ``reduce="argmax"``: what the blended result is stored as."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xpatch
from tests.conftest import forbid_compute
from xpatch.core.errors import OptionError, PredictionError

pytestmark = pytest.mark.filterwarnings("ignore::xpatch.UncoveredCellsWarning")


def five_class(batch: np.ndarray) -> np.ndarray:
    """(b, 2, y, x) -> (b, 5, y, x) scores that differ from patch to patch."""
    base = batch[:, :1] * np.arange(1, 6)[None, :, None, None] - batch[:, 1:2] * 2.0
    shift = batch.mean(axis=(1, 2, 3))[:, None, None, None]
    return np.sin(base + shift * np.arange(5)[None, :, None, None])


@pytest.fixture
def image() -> xr.DataArray:
    rng = np.random.default_rng(7)
    return xr.DataArray(
        rng.random((2, 30, 37)), dims=("band", "y", "x"), coords={"y": np.arange(30.0)}
    )


def both(da: xr.DataArray, **patch):
    """The same layout over numpy and dask input (chunks smaller than the grid)."""
    return da.patch(**patch), da.chunk({"y": 13, "x": 16}).patch(**patch)


def test_rounding_and_clipping_numpy_and_dask_agree(image):
    def big(b):  # values past uint8's range at both ends, and halves
        return (b - 0.5) * 700.0

    eager, lazy = both(image, y=8, x=8, stride=5, window="hann")
    with forbid_compute():
        out_lazy = lazy.apply(big, out_dtype="uint8")
    assert out_lazy.chunks is not None and out_lazy.dtype == np.uint8
    out = eager.apply(big, out_dtype="uint8")
    blended = eager.apply(big)
    assert out.dtype == np.uint8 and blended.dtype == np.float64
    expected = np.clip(np.rint(blended.values), 0, 255).astype("uint8")
    np.testing.assert_array_equal(out.values, expected)
    np.testing.assert_array_equal(out_lazy.values, expected)
    assert (out.values == 0).any() and (out.values == 255).any()
    # A float out_dtype clips to the finite range instead of overflowing to inf.
    huge = eager.apply(lambda b: b * 1e300, out_dtype="float32")
    assert huge.dtype == np.float32 and np.isfinite(huge.values).all()


def test_integer_mean_keeps_the_input_dtype_by_default(image):
    counts = (image * 60000).astype("uint16")
    eager, lazy = both(counts, y=8, x=8, stride=5, window="hann")
    with forbid_compute():
        out_lazy = lazy.apply(lambda b: b)
    out = eager.apply(lambda b: b)
    assert out.dtype == out_lazy.dtype == np.uint16
    np.testing.assert_array_equal(out.values, counts.values)  # a mean of equal values
    np.testing.assert_array_equal(out_lazy.values, counts.values)
    asked = eager.apply(lambda b: b, out_dtype="float64")
    assert asked.dtype == np.float64
    np.testing.assert_array_equal(out.values, np.rint(asked.values))
    # Float input, and other reductions, keep their dtype.
    assert eager.apply(lambda b: b, reduce="max").dtype == np.uint16
    assert image.patch(y=8, x=8, stride=5).apply(lambda b: b).dtype == np.float64


def test_uncovered_cells_need_a_nodata_value_for_integers(image):
    counts = (image * 1000).astype("int16")
    p = counts.patch(y=8, x=8, stride=10, boundary="drop")  # gaps between the patches
    assert p.apply(lambda b: b).dtype == np.float64  # default: no nodata, so NaN as before
    with pytest.raises(OptionError, match=r"out_dtype='int16'.*pass nodata="):
        p.apply(lambda b: b, out_dtype="int16")
    out = p.apply(lambda b: b, out_dtype="int16", nodata=-1)
    assert out.dtype == np.int16 and out.attrs["_FillValue"] == -1
    assert (out.values[:, 8:10] == -1).all()
    assert p.apply(lambda b: b, nodata=-1).dtype == np.int16  # the default, now possible
    with pytest.raises(OptionError, match=r"nodata value -1 .*does not fit.*uint8"):
        p.apply(lambda b: b, out_dtype="uint8", nodata=-1)


def test_nan_from_fn_without_nodata_is_refused_when_computed(image):
    p = image.chunk({"y": 13, "x": 16}).patch(y=8, x=8, stride=5)

    def holes(b):
        b = b.copy()
        b[:, :, 0, 0] = np.nan
        return b

    out = p.apply(holes, out_dtype="uint8")
    with pytest.raises(PredictionError, match="fn returned NaN"):
        out.compute()
    filled = image.patch(y=8, x=8, stride=8).apply(holes, out_dtype="uint8", nodata=255)
    assert (filled.values[:, 0, 0] == 255).all()


def brute_force_labels(p, fn, n):
    blended = p.apply(fn, output_dims={"class": n}, dtype="float64", out_dtype="float64")
    return np.argmax(blended.values, axis=0)


@pytest.mark.parametrize("window", ["hann", "boxcar"])
def test_argmax_equals_the_argmax_of_the_blended_scores(image, window):
    eager, lazy = both(image, y=8, x=8, stride=5, window=window)
    with forbid_compute():
        labels_lazy = lazy.apply(
            five_class, batch_size=7, output_dims={"class": 5}, reduce="argmax"
        )
    labels = eager.apply(five_class, output_dims={"class": 5}, reduce="argmax")
    assert labels.dims == labels_lazy.dims == ("y", "x")
    assert labels.dtype == labels_lazy.dtype == np.uint8
    expected = brute_force_labels(eager, five_class, 5)
    assert len(np.unique(expected)) > 2
    np.testing.assert_array_equal(labels.values, expected)
    np.testing.assert_array_equal(labels_lazy.values, expected)
    np.testing.assert_array_equal(labels.y, image.y)


def test_argmax_label_dtype_ties_and_options(image):
    p = image.patch(y=8, x=8, stride=5)
    many = p.apply(lambda b: np.zeros((len(b), 300, 8, 8)), output_dims={"c": 300}, reduce="argmax")
    assert many.dtype == np.uint16 and (many.values == 0).all()  # ties: the first index
    wide = p.apply(five_class, output_dims={"class": 5}, reduce="argmax", out_dtype="int16")
    assert wide.dtype == np.int16
    with pytest.raises(OptionError, match=r"one class dim.*output_dims=\{'class'"):
        p.apply(lambda b: b[:, :1], output_dims={"a": 1, "b": 1}, reduce="argmax")
    with pytest.raises(OptionError, match=r"cannot hold the labels 0\.\.299"):
        p.apply(lambda b: b, output_dims={"c": 300}, reduce="argmax", out_dtype="uint8")
    with pytest.raises(OptionError, match="cannot hold the labels"):
        p.apply(five_class, output_dims={"class": 5}, reduce="argmax", out_dtype="float32")
    gaps = image.patch(y=8, x=8, stride=10, boundary="drop")
    # Uncovered cells have no label: a value no class takes marks them (the input's
    # nodata, a value a class may take, never does).
    auto = gaps.apply(five_class, output_dims={"class": 5}, reduce="argmax")
    assert auto.dtype == np.uint8 and auto.attrs["_FillValue"] == 255
    assert (auto.values[8:10] == 255).all() and (auto.values[:8, :8] < 5).all()
    out = gaps.apply(five_class, output_dims={"class": 5}, reduce="argmax", nodata=254)
    assert out.dtype == np.uint8 and (out.values[8:10] == 254).all()
    with pytest.raises(OptionError, match=r"nodata=3 is one of the labels 0\.\.4"):
        gaps.apply(five_class, output_dims={"class": 5}, reduce="argmax", nodata=3)


@pytest.mark.parametrize("bad", ["uint9", "bool", "U3"])
def test_bad_out_dtype_names_the_fix(image, bad):
    with pytest.raises(OptionError, match=f"out_dtype='{bad}'"):
        image.patch(y=8, x=8).apply(lambda b: b, out_dtype=bad)


@pytest.mark.parametrize("lazy", [False, True])
def test_reconstruct_argmax_equals_apply_argmax(image, lazy):
    """reconstruct(reduce='argmax') of the class scores of p.patches() is apply's label map."""
    p = (image.chunk({"y": 13, "x": 16}) if lazy else image).patch(y=8, x=8, stride=5)
    pred = p.patches()
    class_scores = xr.apply_ufunc(
        five_class, pred, input_core_dims=[["band", "y", "x"]],
        output_core_dims=[["class", "y", "x"]], dask="parallelized",
        dask_gufunc_kwargs={"output_sizes": {"class": 5}}, output_dtypes=[float],
    )  # fmt: skip
    with forbid_compute():
        labels = p.reconstruct(class_scores, reduce="argmax")
    applied = p.apply(five_class, output_dims={"class": 5}, reduce="argmax")
    assert labels.dims == ("y", "x") and labels.dtype == np.uint8
    np.testing.assert_array_equal(labels.values, applied.values)
    blended = p.reconstruct(class_scores).values
    np.testing.assert_array_equal(labels.values, blended.argmax(axis=0))


def test_reconstruct_argmax_marks_cells_without_a_label_with_a_value_no_class_takes(image):
    p = image.patch(y=8, x=8, stride=10, boundary="drop")  # gaps: uncovered cells
    scores = xr.concat([p.patches().isel(band=0), p.patches().isel(band=1)], dim="class")
    labels = p.reconstruct(scores, reduce="argmax")
    assert labels.dtype == np.uint8 and labels.attrs["_FillValue"] == 255
    covered = labels.values != 255
    assert not covered.all()
    expected = (image.values[1] > image.values[0]).astype(np.uint8)
    np.testing.assert_array_equal(labels.values[covered], expected[covered])
    with pytest.raises(PredictionError, match=r"one class dim; pred has 0 dims"):
        p.reconstruct(p.patches().isel(band=0), reduce="argmax")


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_argmax_gives_no_class_to_cells_whose_scores_are_all_nan_or_weighed_0(image, lazy):
    # Every cell covered, no nodata in the input: the labels were uint8 without a
    # nodata value, and cells whose scores were all NaN came out as class 0.
    p = (image.chunk({"y": 13, "x": 16}) if lazy else image).patch(y=8, x=8, stride=8)
    scores = xr.concat([p.patches().isel(band=0), p.patches().isel(band=1)], dim="class")
    scores = scores.where(xr.DataArray(np.arange(len(p)) != 0, dims="patch"))  # patch 0: NaN
    labels = p.reconstruct(scores, reduce="argmax").compute()
    assert (labels.values[:8, :8] == labels.attrs["_FillValue"]).all()
    assert (labels.values[8:] < 2).all()
    weights = np.ones(len(p))
    weights[0] = 0.0
    weighed = p.apply(five_class, output_dims={"class": 5}, reduce="argmax", weights=weights)
    assert (weighed.values[:8, :8] == weighed.attrs["_FillValue"]).all()  # not "fn returned NaN"
    assert (weighed.values[8:] < 5).all()


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_a_mean_of_integers_beyond_2_53_is_not_stored_as_an_exact_looking_int64(lazy):
    # Nanosecond timestamps: the mean through float64 came back 21 ns off, as an int64.
    stamps = np.datetime64("2026-11-26T12:00:00", "ns").astype(np.int64) + 3 * np.arange(24)
    da = xr.DataArray(stamps, dims="x")
    p = (da.chunk(8) if lazy else da).patch(x=4, stride=2)
    with pytest.raises(xpatch.PredictionError, match=r"past 2\*\*53.*int64"):
        p.apply(lambda b: b).compute()
    as_float = p.apply(lambda b: b, out_dtype="float64").compute()  # a float says so
    np.testing.assert_allclose(as_float.values, stamps, rtol=1e-15)
    exact = p.apply(lambda b: b, reduce="max").compute()
    assert exact.dtype == np.int64 and (exact.values == stamps).all()
    small = xr.DataArray(np.arange(24, dtype=np.int64), dims="x").patch(x=4, stride=2)
    assert small.apply(lambda b: b).values.tolist() == list(range(24))  # below 2**53: exact


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_outputs_of_another_meaning_do_not_take_the_inputs_nodata(lazy):
    # uint16 imagery whose nodata is 0: a label map written with nodata 0 read class 0 as
    # missing (half of a 2-class map), and an NDVI output hid its valid zeros.
    rng = np.random.default_rng(7)
    bands = rng.integers(1, 4000, (2, 24, 24)).astype(np.uint16)
    bands[:, :2, :2] = 0  # the input's own nodata
    image = xr.DataArray(bands, dims=("band", "y", "x"), attrs={"_FillValue": 0})
    p = (image.chunk({"y": 12}) if lazy else image).patch(y=8, x=8, stride=8)

    def two_classes(b):  # class 1 where the first band is brighter
        first, second = b[:, 0].astype(float), b[:, 1].astype(float)
        return np.stack([second, first], axis=1)

    labels = p.apply(two_classes, output_dims={"class": 2}, dtype="float64", reduce="argmax")
    labels = labels.compute()
    no_label = labels.attrs["_FillValue"]
    assert no_label not in (0, 1)
    assert (labels.values[:2, :2] == no_label).all()  # the input's nodata: no label
    valid = labels.values[2:, 2:]
    assert set(np.unique(valid)) == {0, 1}  # class 0 is a class, not nodata

    def ndvi(b):
        b = b.astype(np.float32)
        return ((b[:, :1] - b[:, 1:]) / (b[:, :1] + b[:, 1:] + 1)).round(1)

    index = p.apply(ndvi, output_dims={"index": 1}, dtype="float32").compute()
    assert "_FillValue" not in index.attrs or np.isnan(index.attrs["_FillValue"])
    assert np.isnan(index.values[0, :2, :2]).all()  # no data where the input had none
    zeros = (index.values == 0) & ~np.isnan(index.values)
    assert zeros.any()  # valid zeros stay zeros


def test_a_nodata_value_that_valid_results_hold_is_counted_and_warned():
    image = xr.DataArray(np.arange(64.0).reshape(8, 8) % 5, dims=("y", "x"))
    p = image.patch(y=4, x=4)
    with pytest.warns(xpatch.NodataCollisionWarning, match=r"^13 cells in the whole output"):
        out = p.apply(lambda b: b, nodata=0.0)
    assert (out.values == 0).sum() == 13  # written, but any reader takes them for missing
    lazy = image.chunk(4).patch(y=4, x=4).apply(lambda b: b, nodata=0.0)
    with pytest.warns(xpatch.NodataCollisionWarning, match="in a block of the output"):
        lazy.compute()
