"""The guard: ``.patch()`` refuses a Dataset whose variables are not on one grid.

``xr.Dataset({"image": scene, "labels": labels})`` with the scene in metres and the
labels in degrees is the union of both coordinate sets (issue 40): refused before any
work, naming the variables and the fix. Datasets on one grid, irregular coordinates
without a CRS and lat/lon labels with float noise pass.
"""

from __future__ import annotations

import numpy as np
import pytest
import rioxarray  # noqa: F401  (registers .rio)
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

import xpatch
from tests.conftest import forbid_compute
from xpatch.core.errors import GeometryError
from xpatch.grid.guard import check_one_grid


def utm_scene(n: int = 64, chunks: int | None = 32) -> xr.DataArray:
    scene = xr.DataArray(
        np.random.default_rng(0).random((4, n, n), dtype=np.float32),
        dims=("band", "y", "x"),
        coords={
            "y": 5_000_000.0 - 5.0 - 10.0 * np.arange(n),
            "x": 400_000.0 + 5.0 + 10.0 * np.arange(n),
        },
    ).rio.write_crs("EPSG:32632")
    return scene.chunk({"y": chunks, "x": chunks}) if chunks else scene


def degree_labels(chunks: int | None = 16) -> xr.DataArray:
    labels = xr.DataArray(
        np.ones((30, 40), dtype=np.uint8),
        dims=("y", "x"),
        coords={
            "y": 45.13 - 0.00015 - 0.0003 * np.arange(30),
            "x": 7.73 + 0.00015 + 0.0003 * np.arange(40),
        },
    ).rio.write_crs("EPSG:4326")
    return labels.chunk(chunks) if chunks else labels


def test_the_silent_union_of_the_issue_is_refused_before_any_work():
    mixed = xr.Dataset({"image": utm_scene(), "labels": degree_labels()})
    assert mixed.sizes["y"] == 64 + 30  # xarray's outer join: metres and degrees on one axis
    with forbid_compute(), pytest.raises(GeometryError) as caught:
        mixed.patch(y=16, x=16)
    message = str(caught.value)
    assert "'y' coordinate is not one regular grid" in message
    assert "['image', 'labels']" in message
    assert "EPSG:32632" in message
    assert "xpatch.on_grid(image, labels=labels)" in message


def test_variables_with_grid_mappings_in_different_crss_are_refused_naming_each():
    labels = degree_labels(None).rename(spatial_ref="crs")
    labels.encoding["grid_mapping"] = "crs"
    mixed = xr.Dataset({"image": utm_scene(chunks=None), "labels": labels})
    with pytest.raises(GeometryError) as caught:
        mixed.patch(y=16, x=16)
    message = str(caught.value)
    assert "different CRSs ('image' in EPSG:32632; 'labels' in EPSG:4326)" in message
    assert "xpatch.on_grid" in message


def test_the_same_crs_written_twice_passes():
    scene = utm_scene(chunks=None)
    other = (scene.isel(band=0) * 2).rename(spatial_ref="crs")
    other.encoding["grid_mapping"] = "crs"
    ds = xr.Dataset({"image": scene, "other": other})
    assert len(ds.patch(y=16, x=16)) == 16


def test_the_result_of_on_grid_patches():
    ds = xpatch.on_grid(utm_scene().rename("image"), labels=degree_labels())
    assert len(ds.patch(y=16, x=16)) == 16


def test_latitudes_and_longitudes_with_float32_noise_pass():
    lat = (45.0 - 0.0003 * np.arange(200)).astype(np.float32)
    lon = (7.0 + 0.0003 * np.arange(300)).astype(np.float32)
    assert np.ptp(np.diff(lat.astype(np.float64))) > 0  # the noise is there
    ds = xr.Dataset(
        {"t": (("lat", "lon"), np.zeros((200, 300), np.float32))},
        coords={"lat": lat, "lon": lon},
    ).rio.write_crs("EPSG:4326")
    assert len(ds.patch(lat=50, lon=50)) == 24


def test_irregular_coordinates_without_a_crs_pass():
    # A model grid's Gaussian-like latitudes and a log-spaced x: no CRS, no evidence.
    lat = np.degrees(np.arcsin(np.linspace(-0.99, 0.99, 64)))
    x = np.logspace(0, 3, 32)
    ds = xr.Dataset(
        {"t": (("lat", "x"), np.zeros((64, 32)))},
        coords={"lat": lat, "x": x},
    )
    assert len(ds.patch(lat=16, x=16)) == 8
    check_one_grid(ds)


def test_a_dataarray_and_variables_without_raster_dims_pass():
    scene = utm_scene(chunks=None)
    assert len(scene.patch(y=16, x=16)) == 16
    ds = xr.Dataset({"image": scene, "weights": ("band", np.ones(4))})
    assert len(ds.patch(y=16, x=16)) == 16


@settings(max_examples=60, deadline=None)
@given(
    start=st.floats(-1e6, 1e6),
    step=st.floats(1e-4, 1e3).flatmap(lambda s: st.sampled_from([s, -s])),
    n=st.integers(3, 300),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_a_regular_grid_with_a_crs_is_never_refused(start, step, n, dtype):
    values = (start + step * np.arange(n)).astype(dtype)
    if len(np.unique(values)) < n:  # float32 cannot tell the labels apart: not a grid
        return
    ds = xr.Dataset(
        {"v": (("y", "x"), np.zeros((n, 3)))}, coords={"y": values, "x": [0.0, 1.0, 2.0]}
    ).rio.write_crs("EPSG:32632")
    check_one_grid(ds)


@settings(max_examples=60, deadline=None)
@given(
    metres=st.floats(1.0, 100.0),
    degrees=st.floats(1e-5, 1e-2),
    n=st.integers(3, 50),
    m=st.integers(3, 50),
)
def test_the_union_of_two_grids_in_different_units_is_always_refused(metres, degrees, n, m):
    scene = xr.DataArray(
        np.zeros((n, 3)), dims=("y", "x"), coords={"y": 5e6 - metres * np.arange(n), "x": [0, 1, 2]}
    ).rio.write_crs("EPSG:32632")
    labels = xr.DataArray(
        np.zeros((m, 3)), dims=("y", "x"), coords={"y": 45 - degrees * np.arange(m), "x": [0, 1, 2]}
    ).rio.write_crs("EPSG:4326")
    with pytest.raises(GeometryError, match="not one regular grid"):
        check_one_grid(xr.Dataset({"image": scene, "labels": labels}))


@pytest.mark.parametrize("spatial", [{"y": 16, "x": 16}, {}])
def test_a_forecast_over_a_dataset_mixing_crss_is_refused_before_any_work(monkeypatch, spatial):
    from xpatch.forecast import patcher as forecast_patcher

    def no_work(*args, **kwargs):
        raise AssertionError("the forecast's origins were planned before the guard ran")

    monkeypatch.setattr(forecast_patcher, "plan_origins", no_work)
    times = np.arange("2020-01-01", "2020-01-05", dtype="datetime64[D]").astype("datetime64[ns]")
    image = utm_scene(chunks=None).isel(band=0, drop=True).expand_dims(time=times)
    labels = degree_labels(None).rename(spatial_ref="crs").expand_dims(time=times)
    labels.encoding["grid_mapping"] = "crs"
    mixed = xr.Dataset({"image": image, "labels": labels})
    forecast = xpatch.Forecast(inputs=["0D"], targets=["1D"])
    with forbid_compute(), pytest.raises(GeometryError) as caught:
        mixed.patch(time=forecast, **spatial)
    message = str(caught.value)
    assert "different CRSs ('image' in EPSG:32632; 'labels' in EPSG:4326)" in message
    assert "xpatch.on_grid" in message
