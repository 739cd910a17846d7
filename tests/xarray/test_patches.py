from __future__ import annotations

import dask.array as dsa
import numpy as np
import pytest
import xarray as xr

import xpatch


def test_item_and_patch_at_carry_their_own_coordinates(scene):
    p = scene.patch(y=16, x=20, stride=12)
    anchors = np.asarray(p.anchors())
    i = 4
    y0, x0 = anchors[i]
    item = p[i]
    xr.testing.assert_identical(item, scene.isel(y=slice(y0, y0 + 16), x=slice(x0, x0 + 20)))
    xr.testing.assert_identical(p.patch_at((y0, x0)), item)
    xr.testing.assert_identical(p.patch_at({"x": x0, "y": y0}), item)
    xr.testing.assert_identical(p[-1], p[len(p) - 1])
    np.testing.assert_array_equal(p.patches()[i].values, item.values)


def test_patches_carry_anchor_and_start_label_coordinates(scene):
    p = scene.patch(y=16, x=20, stride=12)
    patches = p.patches()
    anchors = np.asarray(p.anchors())
    np.testing.assert_array_equal(patches.y_anchor, anchors[:, 0])
    np.testing.assert_array_equal(patches.x_anchor, anchors[:, 1])
    np.testing.assert_array_equal(patches.y_start, scene.y.values[anchors[:, 0]])
    np.testing.assert_array_equal(patches.x_start, scene.x.values[anchors[:, 1]])
    assert patches.band.values.tolist() == ["r", "g", "b"]
    assert patches.attrs == scene.attrs
    assert patches.name == scene.name


def test_non_index_coordinates_on_patched_dims_are_patched_too():
    lat = np.linspace(40, 50, 12)[:, None] + np.zeros((12, 10))
    da = xr.DataArray(np.zeros((12, 10)), dims=("y", "x"), coords={"lat": (("y", "x"), lat)})
    p = da.patch(y=4, x=5)
    assert p.patches().lat.dims == ("patch", "y", "x")
    np.testing.assert_array_equal(p[2].lat.values, lat[4:8, 0:5])  # anchor (4, 0)
    np.testing.assert_array_equal(p.patches().lat[2].values, lat[4:8, 0:5])
    np.testing.assert_array_equal(p.patch_at((4, 5)).lat.values, lat[4:8, 5:10])


def test_padded_patch_coordinates_are_extrapolated():
    da = xr.DataArray(
        np.arange(5.0),
        dims="x",
        coords={"x": [10.0, 20.0, 30.0, 40.0, 50.0], "t": ("x", np.arange(5))},
    )
    p = da.patch(x=4, stride=3, boundary="pad")
    assert np.asarray(p.anchors()).ravel().tolist() == [0, 3]
    last = p[1]
    assert last.x.values.tolist() == [40.0, 50.0, 60.0, 70.0]
    assert np.isnan(last.values[2:]).all()
    assert last.t.values[:2].tolist() == [3, 4]
    times = xr.DataArray(
        np.arange(3),
        dims="time",
        coords={"time": np.array(["2020-01-01", "2020-01-02", "2020-01-03"], "M8[ns]")},
    )
    tail = times.patch(time=2, boundary="pad")[1]
    assert tail.time.values[1] == np.datetime64("2020-01-04")
    assert tail.values.tolist() == [2, 0]  # integer data pads with 0


def test_pad_value_is_used_and_checked():
    da = xr.DataArray(np.arange(5, dtype="int16"), dims="x")
    p = da.patch(x=4, stride=3, boundary="pad", pad_value=-1)
    assert p[1].values.tolist() == [3, 4, -1, -1]
    with pytest.raises(xpatch.OptionError, match=r"pad_value=nan cannot be stored.*int16"):
        da.patch(x=4, boundary="pad", pad_value=np.nan)


def test_anchors_and_weights_are_labelled_copies(scene):
    p = scene.patch(y=16, x=20, stride=12, window="hann")
    anchors = p.anchors()
    assert anchors.dims == ("patch", "dim")
    assert anchors.dtype == np.int64
    anchors[0, 0] = 99
    assert int(p.anchors()[0, 0]) == 0
    weights = p.weights()
    assert weights.dims == ("y", "x")
    assert weights.shape == (16, 20)
    weights[:] = 0
    assert float(p.weights().min()) > 0
    assert p.window == "hann"
    assert (p.size, p.stride, p.boundary) == ({"y": 16, "x": 20}, {"y": 12, "x": 12}, "shift")


def test_accessor_methods_forward(scene):
    p = scene.patch(y=16, x=20, stride=12)
    xr.testing.assert_identical(scene.patch.anchors(y=16, x=20, stride=12), p.anchors())
    xr.testing.assert_identical(scene.patch.patches({"y": 16, "x": 20}, 12), p.patches())
    xr.testing.assert_identical(
        scene.patch.weights(y=16, x=20, window="hann"),
        scene.patch(y=16, x=20, window="hann").weights(),
    )
    functional = xpatch.patch(scene, size={"y": 16, "x": 20}, stride=12)
    xr.testing.assert_identical(functional.anchors(), p.anchors())


def test_iteration_and_repr(scene):
    p = scene.patch(y=20, x=25)
    items = list(p)
    assert len(items) == len(p) == 4
    assert "4 patches" in repr(p)
    assert "size=(y: 20, x: 25)" in repr(p)


def test_predictions_in_another_order_are_matched_back_by_anchor(scene):
    p = scene.patch(y=16, x=20, stride=12)
    shuffled = p.patches().isel(patch=np.random.default_rng(0).permutation(len(p)))
    np.testing.assert_allclose(p.reconstruct(shuffled), scene)
    lazy_data = shuffled.copy(data=dsa.from_array(shuffled.values, chunks=3))
    np.testing.assert_allclose(p.reconstruct(lazy_data), scene)
    # Lazy anchor coordinates (.chunk chunks them too) are checked, not read: reading
    # them would compute while building. Out of order, the computation says so.
    with pytest.raises(xpatch.PredictionError, match=r"lazy .*_anchor coordinates"):
        p.reconstruct(shuffled.chunk({"patch": 3})).compute()
    as_dataset = xr.Dataset({"a": shuffled, "b": shuffled * 2})
    np.testing.assert_allclose(p.reconstruct(as_dataset["b"]), scene * 2)


def test_predictions_from_another_patcher_are_refused(scene):
    p = scene.patch(y=16, x=20, stride=12)
    other = scene.patch(y=16, x=20, stride=11).patches().isel(patch=slice(0, len(p)))
    with pytest.raises(xpatch.PredictionError, match=r"not an anchor of this patcher"):
        p.reconstruct(other.assign_coords(y=p.patches().y, x=p.patches().x))


def test_a_datasets_patched_dims_keep_the_callers_order_whatever_variables_join():
    # A (lat, lon) mask put before a (time, lat, lon) field reordered the Dataset's dims,
    # and with them the anchors' columns: code reading anchor[0] as time read lat.
    field = xr.DataArray(np.arange(96.0).reshape(2, 6, 8), dims=("time", "lat", "lon"))
    alone = xr.Dataset({"t": field})
    with_mask = xr.Dataset({"mask": field.isel(time=0) > 10, "t": field})
    layout = dict(time=1, lat=3, lon=4)
    a, b = alone.patch(**layout), with_mask.patch(**layout)
    assert a.dims == b.dims == ("time", "lat", "lon")
    np.testing.assert_array_equal(a.anchors().values, b.anchors().values)
    assert list(b.anchors().dim.values) == ["time", "lat", "lon"]
    assert b[5]["t"].equals(a[5]["t"])
    # A DataArray keeps its own order, whatever the order of the sizes.
    assert field.patch(lon=4, lat=3, time=1).dims == ("time", "lat", "lon")
