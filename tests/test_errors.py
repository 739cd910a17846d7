"""Every bad input raises an XPatchError (a ValueError) naming argument, value and fix."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xpatch
from tests.conftest import forbid_compute


@pytest.fixture
def da() -> xr.DataArray:
    return xr.DataArray(np.zeros((2, 30, 40)), dims=("band", "y", "x")).chunk({"y": 10})


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            dict(y=31, x=8),
            xpatch.GeometryError,
            r"size\['y'\]=31 is larger than the array along 'y' \(extent 30\)"
            r".*at most 30.*boundary='pad'",
        ),
        (dict(y=8, x=8, stride=0), xpatch.GeometryError, r"stride=0 must be a positive integer"),
        (
            dict(y=8, x=8, stride={"x": -2}),
            xpatch.GeometryError,
            r"stride\['x'\]=-2 must be a positive integer",
        ),
        (dict(y=8, x=8, stride=2.5), xpatch.GeometryError, r"stride=2.5 is not an integer"),
        (dict(y=0, x=8), xpatch.GeometryError, r"size\['y'\]=0 must be a positive integer"),
        (dict(y=True, x=8), xpatch.GeometryError, r"size\['y'\]=True is a bool"),
        (
            dict(z=8),
            xpatch.DimensionError,
            r"size names dimension\(s\) \['z'\].*\['band', 'y', 'x'\]",
        ),
        (
            dict(y=8, stride={"x": 2}),
            xpatch.OptionError,
            r"stride names dimension\(s\) \['x'\] that are not patched",
        ),
        (
            dict(y=8, x=8, boundary="wrap"),
            xpatch.OptionError,
            r"boundary='wrap'.*'shift', 'pad', 'drop', 'raise'",
        ),
        (
            dict(y=8, x=8, stride=7, boundary="raise"),
            xpatch.GeometryError,
            r"boundary='raise'.*'y'.*divides 22",
        ),
        (dict(y=8, x=8, window="hanning-ish"), xpatch.OptionError, r"window='hanning-ish'.*'hann'"),
        (dict(y=8, x=8, min_valid=1.5), xpatch.OptionError, r"min_valid=1.5 must be a fraction"),
        (dict(y=8, x=8, sampler="random"), xpatch.OptionError, r"sampler='random' has no anchors"),
        (dict(), xpatch.OptionError, r"no patch size given"),
        (dict(size=256), xpatch.OptionError, r"size=256 must map dimension names"),
        (dict(size={"y": 8}, x=8), xpatch.OptionError, r"patch size was given twice"),
    ],
)
def test_bad_layouts_raise_before_any_work(da, kwargs, error, match):
    with forbid_compute(), pytest.raises(error, match=match) as info:
        da.patch(**kwargs)
    assert isinstance(info.value, xpatch.XPatchError)
    assert isinstance(info.value, ValueError)


def test_bad_reduction_lists_the_valid_ones(da):
    p = da.patch(y=10, x=10)
    with pytest.raises(xpatch.OptionError, match=r"reduce='median'.*'mean', 'sum', 'max', 'min'"):
        p.reconstruct(p.patches(), reduce="median")


def test_predictions_with_the_wrong_number_of_patches(da):
    p = da.patch(y=10, x=10)
    with pytest.raises(
        xpatch.PredictionError, match=r"pred has 11 patches along 'patch'; this patcher has 12"
    ):
        p.reconstruct(p.patches().isel(patch=slice(0, 11)))


def test_predictions_with_the_wrong_patch_shape_say_both(da):
    p = da.patch(y=10, x=10)
    with pytest.raises(
        xpatch.PredictionError,
        match=r"patch shape \{'y': 8, 'x': 10\}; this patcher's patches are \{'y': 10, 'x': 10\}",
    ):
        p.reconstruct(p.patches().isel(y=slice(0, 8)))


def test_predictions_missing_a_patched_dim(da):
    p = da.patch(y=10, x=10)
    with pytest.raises(xpatch.DimensionError, match=r"lacks the patched dimension\(s\) \['x'\]"):
        p.reconstruct(p.patches().mean("x"))
    with pytest.raises(xpatch.PredictionError, match=r"needs a 'patch' dim"):
        p.reconstruct(p[0])


def test_predictions_that_are_not_xarray(da):
    p = da.patch(y=10, x=10)
    with pytest.raises(
        xpatch.PredictionError, match=r"pred is a ndarray; pass an xarray.DataArray"
    ):
        p.reconstruct(np.zeros((12, 2, 10, 10)))


def test_bad_item_and_anchor(da):
    p = da.patch(y=10, x=10)
    with pytest.raises(IndexError, match=r"patch index 12 is out of range for 12 patches"):
        p[12]
    with pytest.raises(TypeError, match=r"must be an int"):
        p[1:3]
    with pytest.raises(xpatch.DimensionError, match=r"missing \['x'\]"):
        p.patch_at({"y": 0})
    with pytest.raises(xpatch.GeometryError, match=r"anchor has shape \(1, 3\)"):
        p.patch_at((0, 0, 0))


def test_not_an_xarray_object():
    with pytest.raises(
        xpatch.OptionError, match=r"obj is a ndarray.*xr.DataArray\(arr, dims=...\)"
    ):
        xpatch.patch(np.zeros((4, 4)), size={"y": 2})


def test_dataset_without_a_variable_holding_any_patched_dim():
    ds = xr.Dataset({"a": ("t", np.zeros(3))}, coords={"y": np.arange(4)})
    with pytest.raises(xpatch.DimensionError, match=r"no data variable.*any.*\['y'\]"):
        ds.patch(y=2)
