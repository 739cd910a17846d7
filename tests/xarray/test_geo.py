"""Georeferencing: per-patch transforms and CRS, bounds, map-coordinate samplers, nodata."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xpatch
from tests.conftest import run_script

rioxarray = pytest.importorskip("rioxarray")
from rasterio.transform import Affine, from_origin  # noqa: E402
from rasterio.windows import Window  # noqa: E402

CRS = "EPSG:32630"
ORIGIN = from_origin(500000.0, 4000000.0, 10.0, 10.0)


def raster(height=40, width=56, bands=2, coords=True, nodata=None, dtype="float32"):
    values = np.random.default_rng(0).normal(size=(bands, height, width)).astype(dtype)
    da = xr.DataArray(values, dims=("band", "y", "x"), name="scene", attrs={"units": "dn"})
    if coords:
        da = da.assign_coords(
            x=500005.0 + 10.0 * np.arange(width), y=3999995.0 - 10.0 * np.arange(height)
        )
    da = da.rio.write_transform(ORIGIN).rio.write_crs(CRS)
    if nodata is not None:
        da = da.rio.write_nodata(nodata)
    return da


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size=st.tuples(st.integers(1, 20), st.integers(1, 20)),
    step=st.tuples(st.floats(0.1, 1.0), st.floats(0.1, 1.0)),
    boundary=st.sampled_from(["shift", "pad"]),
    coords=st.booleans(),
)
def test_every_patch_has_the_transform_bounds_and_crs_rioxarray_gives_its_window(
    size, step, boundary, coords
):
    stride = [max(1, int(s * f)) for s, f in zip(size, step)]
    da = raster(coords=coords)
    p = da.patch(y=size[0], x=size[1], stride={"y": stride[0], "x": stride[1]}, boundary=boundary)
    bounds = p.bounds().values
    transforms = p.transforms().values
    stacked = p.patches()
    anchors = np.asarray(p.anchors())
    for i in np.unique(np.linspace(0, len(p) - 1, 8).astype(int)):  # first, last, between
        row, col = anchors[i]
        window = Window(col_off=col, row_off=row, width=size[1], height=size[0])
        expected = ORIGIN * Affine.translation(col, row)
        patch = p[i]
        assert patch.rio.transform() == expected
        assert patch.rio.crs == CRS
        assert Affine(*transforms[i]) == expected
        assert (
            Affine.from_gdal(*map(float, str(stacked.geotransform.values[i]).split())) == expected
        )
        np.testing.assert_allclose(bounds[i], patch.rio.bounds())
        if row + size[0] <= da.sizes["y"] and col + size[1] <= da.sizes["x"]:
            assert da.rio.isel_window(window).rio.transform() == expected


def test_rasters_with_other_dim_names_are_found_through_rioxarray():
    da = (
        raster(coords=False).rename(y="row", x="col").rio.set_spatial_dims(x_dim="col", y_dim="row")
    )
    p = da.patch(row=8, col=8, stride=6)
    assert p[3].rio.transform() == ORIGIN * Affine.translation(*np.asarray(p.anchors())[3][::-1])


def test_the_callers_grid_mapping_is_not_touched():
    da = raster()
    before = dict(da.spatial_ref.attrs)
    da.patch(y=8, x=8)[3]
    assert da.spatial_ref.attrs == before


def test_dataset_patches_carry_their_transform_too():
    da = raster(coords=False)  # rioxarray reads the transform from GeoTransform
    ds = xr.Dataset({"image": da, "mask": da.isel(band=0) > 0})
    p = ds.patch(y=8, x=8, stride=6)
    start = dict(zip(p.dims, np.asarray(p.anchors())[4].tolist()))  # a Dataset's dims: x, y
    assert start["x"] != start["y"]
    assert p[4].rio.transform() == ORIGIN * Affine.translation(start["x"], start["y"])
    assert p[4]["mask"].rio.crs == CRS


def test_reconstruct_and_apply_keep_crs_transform_nodata_and_attrs():
    da = raster(nodata=-9999.0)
    p = da.patch(y=16, x=16, stride=12, window="hann")
    back = p.reconstruct(p.patches())
    applied = p.apply(lambda b: b * 2)
    for out in (back, applied):
        assert out.rio.crs == CRS
        assert out.rio.transform() == ORIGIN
        assert out.rio.nodata == -9999.0
        assert out.attrs["units"] == "dn"
    np.testing.assert_allclose(back, da, rtol=1e-6)


def test_predictions_made_of_single_patches_reconstruct_on_the_inputs_transform():
    da = raster(coords=False)  # the transform lives in GeoTransform only
    p = da.patch(y=16, x=16, stride=12)
    order = list(reversed(range(len(p))))  # the first single patch is not at the origin
    singles = xr.concat([p[i] for i in order], dim="patch").assign_coords(
        y_anchor=("patch", np.asarray(p.anchors())[order, 0]),
        x_anchor=("patch", np.asarray(p.anchors())[order, 1]),
    )
    assert singles.rio.transform() != ORIGIN  # concat kept the last patch's grid mapping
    out = p.reconstruct(singles)
    assert out.rio.transform() == ORIGIN
    np.testing.assert_allclose(out, da, rtol=1e-6)


def test_a_clipped_raster_has_the_transform_of_its_coordinates_not_its_parents():
    sub = raster().isel(y=slice(8, None), x=slice(4, None))  # GeoTransform is the parent's
    p = sub.patch(y=8, x=8)
    assert p[0].rio.transform() == ORIGIN * Affine.translation(4, 8)
    assert Affine(*p.transforms().values[0]) == ORIGIN * Affine.translation(4, 8)
    np.testing.assert_allclose(p.bounds().values[0], p[0].rio.bounds())
    centre = ORIGIN * (10 + 0.5, 10 + 0.5)  # cell (10, 10) of the parent = (2, 6) of sub
    at = sub.patch(y=4, x=4, sampler=xpatch.AtPoints([centre]))
    assert at.anchors().values.tolist() == [[0, 4]]


def test_a_masked_raster_keeps_its_encoded_nodata_through_apply_and_write(tmp_path):
    da = nodata_raster()
    da.rio.to_raster(tmp_path / "in.tif")
    masked = rioxarray.open_rasterio(tmp_path / "in.tif", masked=True, chunks={"y": 16, "x": 16})
    assert masked.rio.encoded_nodata == -9999.0
    p = masked.patch(y=10, x=10, stride=5, window="hann")
    back = p.reconstruct(p.patches())
    doubled = p.apply(lambda b: np.nan_to_num(b) * 2)  # the model fills NaN: masked anyway
    for out in (back, doubled):
        assert out.rio.encoded_nodata == -9999.0
    assert np.isnan(doubled.values[:, :20, :20]).all()
    xpatch.write(doubled, tmp_path / "out.tif", progress=False)
    assert rioxarray.open_rasterio(tmp_path / "out.tif").rio.nodata == -9999.0


def test_a_geotiff_written_from_apply_reopens_with_the_same_georeferencing(tmp_path):
    da = raster(nodata=-9999.0)
    path = tmp_path / "in.tif"
    da.rio.to_raster(path, tiled=True, blockxsize=16, blockysize=16)
    opened = rioxarray.open_rasterio(path, chunks={"y": 16, "x": 16})
    p = opened.patch(y=16, x=16, stride=12, window="hann")
    out = tmp_path / "out.tif"
    xpatch.write(p.apply(lambda b: b + 1, dtype="float32"), out, progress=False)
    back = rioxarray.open_rasterio(out)
    assert back.rio.crs == opened.rio.crs
    assert back.rio.transform() == opened.rio.transform()
    assert back.rio.nodata == -9999.0
    np.testing.assert_allclose(back.values, da.values + 1, rtol=1e-5)
    src = p.to_grain(transform=True)
    row, col = src[5]["anchor"]
    assert Affine(*src[5]["transform"]) == ORIGIN * Affine.translation(col, row)


def test_bounds_of_a_plain_array_come_from_its_coordinates():
    da = xr.DataArray(
        np.zeros((4, 6)), dims=("y", "x"), coords={"y": [3.5, 2.5, 1.5, 0.5], "x": np.arange(6.0)}
    )
    bounds = da.patch(y=2, x=3).bounds()
    assert bounds.sel(bound="left").values.tolist() == [-0.5, 2.5, -0.5, 2.5]
    assert bounds.sel(bound="top").values.tolist() == [4.0, 4.0, 2.0, 2.0]


def test_irregular_or_label_coordinates_still_patch_and_reconstruct():
    lat = np.array([0.0, 1.0, 3.0, 7.0, 8.0, 9.5])
    da = xr.DataArray(
        np.arange(36.0).reshape(6, 6), dims=("y", "x"), coords={"y": lat, "x": list("abcdef")}
    )
    geo = da.assign_coords(spatial_ref=((), 0, {"crs_wkt": "..."}))
    for obj in (da, geo):
        p = obj.patch(y=3, x=3, stride=2)
        assert p[1].x.values.tolist() == ["c", "d", "e"]
        np.testing.assert_array_equal(p.reconstruct(p.patches()), obj)


def test_bounds_and_transforms_need_a_raster():
    flat = xr.DataArray(np.zeros((4, 6)), dims=("a", "b"))
    with pytest.raises(xpatch.DimensionError, match="bounds need the raster's y and x dims"):
        flat.patch(a=2, b=3).bounds()
    uneven = xr.DataArray(
        np.zeros((3, 3)), dims=("y", "x"), coords={"y": [0.0, 1.0, 5.0], "x": [0.0, 1.0, 2.0]}
    )
    with pytest.raises(xpatch.GeometryError, match="'y' is not regularly spaced"):
        uneven.patch(y=2, x=2).bounds()
    with pytest.raises(xpatch.GeometryError, match="transforms need a raster"):
        flat.patch(a=2, b=3).transforms()
    with pytest.raises(xpatch.OptionError, match="transform=True needs a raster"):
        flat.patch(a=2, b=3).to_grain(transform=True)


# -- samplers in map coordinates -------------------------------------------------------


def test_patches_centred_on_points_contain_them_and_points_reproject():
    da = raster(height=60, width=80)
    points = np.array([[500205.0, 3999705.0], [500003.0, 3999999.0], [500795.0, 3999405.0]])
    p = da.patch(y=10, x=10, sampler=xpatch.AtPoints(points))
    bounds = p.bounds().values
    for (x, y), (left, bottom, right, top) in zip(points, bounds):
        assert left <= x <= right and bottom <= y <= top
    assert p.anchors().values[0].tolist() == [24, 15]  # cell (29, 20), centred
    assert p.anchors().values[1].tolist() == [0, 0]  # the corner point: moved inward
    pyproj = pytest.importorskip("pyproj")
    to_lonlat = pyproj.Transformer.from_crs(CRS, "EPSG:4326", always_xy=True)
    lon, lat = to_lonlat.transform(points[:, 0], points[:, 1])
    q = da.patch(y=10, x=10, sampler=xpatch.AtPoints({"x": lon, "y": lat}, crs="EPSG:4326"))
    assert q.anchors().values.tolist() == p.anchors().values.tolist()


def test_points_on_cell_edges_go_to_the_next_cell_as_rasterio_puts_them():
    from rasterio.transform import rowcol

    grid = xr.DataArray(
        np.zeros((10, 10)),
        dims=("y", "x"),
        coords={"y": 0.95 - 0.1 * np.arange(10), "x": 0.05 + 0.1 * np.arange(10)},
    )
    for x, y in [(0.3, 0.55), (0.7, 0.2), (0.1, 0.9)]:
        p = grid.patch(y=1, x=1, sampler=xpatch.AtPoints([(x, y)]))
        assert tuple(p.anchors().values[0]) == rowcol(from_origin(0, 1, 0.1, 0.1), x, y)


def test_points_outside_the_raster_or_badly_given_are_refused():
    da = raster()
    with pytest.raises(xpatch.GeometryError, match="are not finite"):
        da.patch(y=8, x=8, sampler=xpatch.AtPoints([[np.nan, np.nan]]))
    with pytest.raises(
        xpatch.GeometryError, match=r"point\(s\) \[1\] at \[\(0.0, 0.0\)\] \(first few"
    ):
        da.patch(y=8, x=8, sampler=xpatch.AtPoints([[500100.0, 3999900.0], [0.0, 0.0]]))
    with pytest.raises(xpatch.OptionError, match="give an \\(n, 2\\) array"):
        da.patch(y=8, x=8, sampler=xpatch.AtPoints([1.0, 2.0, 3.0]))
    plain = xr.DataArray(
        np.zeros((8, 8)), dims=("y", "x"), coords={"y": np.arange(8.0)[::-1], "x": np.arange(8.0)}
    )
    with pytest.raises(xpatch.GeometryError, match="has no CRS to reproject to"):
        plain.patch(y=2, x=2, sampler=xpatch.AtPoints([[1.0, 1.0]], crs="EPSG:4326"))


def test_patches_in_a_bounding_box_tile_the_box():
    da = raster(height=60, width=80)
    box = (500100.0, 3999500.0, 500400.0, 3999800.0)  # 30 x 30 cells from row 20, col 10
    p = da.patch(y=10, x=10, stride=10, sampler=xpatch.InBounds(box))
    anchors = p.anchors().values
    assert anchors[:, 0].min() == 20 and anchors[:, 1].min() == 10
    assert len(p) == 9
    bounds = p.bounds().values
    assert bounds[:, 0].min() == box[0] and bounds[:, 2].max() == box[2]
    assert bounds[:, 1].min() == box[1] and bounds[:, 3].max() == box[3]
    pyproj = pytest.importorskip("pyproj")
    to_lonlat = pyproj.Transformer.from_crs(CRS, "EPSG:4326", always_xy=True)
    lon, lat = to_lonlat.transform([box[0], box[2]], [box[1], box[3]])
    degrees = (lon[0], lat[0], lon[1], lat[1])
    q = da.patch(y=10, x=10, sampler=xpatch.InBounds(degrees, "EPSG:4326"))
    # It covers the box's envelope in the raster's CRS, curved edges included.
    back = pyproj.Transformer.from_crs("EPSG:4326", CRS, always_xy=True)
    envelope = back.transform_bounds(*degrees, densify_pts=21)
    covered = q.bounds().values
    assert covered[:, 0].min() <= envelope[0] + 5 and covered[:, 2].max() >= envelope[2] - 5
    assert covered[:, 1].min() <= envelope[1] + 5 and covered[:, 3].max() >= envelope[3] - 5
    with pytest.raises(xpatch.GeometryError, match="fewer than the patch size"):
        da.patch(y=40, x=40, sampler=xpatch.InBounds(box))
    with pytest.raises(xpatch.OptionError, match="left < right"):
        da.patch(y=10, x=10, sampler=xpatch.InBounds((1.0, 0.0, 0.0, 1.0)))


# -- nodata ------------------------------------------------------------------------------


def nodata_raster():
    da = raster(height=40, width=40, nodata=-9999.0)
    values = da.values.copy()
    values[:, :20, :20] = -9999.0  # a corner without data
    values[0, 30, 30] = -9999.0  # one band of one cell
    return da.copy(data=values)


def test_all_nodata_patches_are_skipped_by_the_validity_filter():
    da = nodata_raster()
    p = da.patch(y=10, x=10, min_valid=0.0)
    assert len(p) == 16 - 4
    assert not any((a < 20).all() for a in np.asarray(p.anchors()))


@pytest.mark.parametrize("chunked", [False, True])
def test_nodata_never_enters_an_average_and_comes_back_as_nodata(chunked):
    da = nodata_raster()
    if chunked:
        da = da.chunk({"y": 16, "x": 16})
    p = da.patch(y=10, x=10, stride=5, window="hann")
    back = p.reconstruct(p.patches()).values
    np.testing.assert_allclose(back, da.values, rtol=1e-6)  # nodata cells included
    doubled = p.apply(lambda b: b * 2).values
    valid = da.values != -9999.0
    np.testing.assert_allclose(doubled[valid], 2 * da.values[valid], rtol=1e-6)
    # Band by band: the cell with data in one band keeps that band's prediction only.
    assert (doubled[:, :20, :20] == -9999.0).all()
    assert doubled[0, 30, 30] == -9999.0
    assert doubled[1, 30, 30] == pytest.approx(2 * da.values[1, 30, 30], rel=1e-6)
    # An output with other dims: no prediction only where no band has data.
    total = p.apply(lambda b: b.sum(axis=1, keepdims=True), output_dims={"score": 1})
    assert (total.values[0, :20, :20] == -9999.0).all()
    assert total.values[0, 30, 30] != -9999.0


NO_GEO = """
import sys
for name in ("rioxarray", "pyproj", "rasterio"):
    sys.modules[name] = None  # as if not installed
import numpy as np, xarray as xr, xpatch
da = xr.DataArray(np.ones((2, 12, 12)), dims=("band", "y", "x"),
                  coords={"y": 11.5 - np.arange(12.0), "x": 0.5 + np.arange(12.0)})
p = da.patch(y=4, x=4, stride=2, window="hann")
assert np.allclose(p.reconstruct(p.patches()), da)
assert p.bounds().shape == (25, 4)
assert p.patch_at([0, 0]).x.values.tolist() == [0.5, 1.5, 2.5, 3.5]
geo = da.assign_coords(spatial_ref=((), 0, {"crs_wkt": "...", "GeoTransform": "0 1 0 12 0 -1"}))
for obj in (geo, geo.drop_vars(["x", "y"])):  # from the labels, or GeoTransform alone
    assert obj.patch(y=4, x=4)[1].spatial_ref.attrs["GeoTransform"].split()[0] == "4.0"
small = geo.isel(band=0)
try:
    small.patch(y=2, x=2, sampler=xpatch.AtPoints([[1.0, 1.0]], crs="EPSG:4326"))
except ImportError as error:
    print(error)
"""


def test_arrays_work_without_rioxarray_and_reprojection_says_what_to_install():
    out = run_script(NO_GEO)
    assert 'pip install "xarray-patch[geo]"' in out


def test_the_geo_paths_stay_lazy_for_dask_input():
    from tests.conftest import forbid_compute

    da = nodata_raster().chunk({"y": 16, "x": 16})
    with forbid_compute():
        p = da.patch(
            y=10,
            x=10,
            stride=5,
            window="hann",
            sampler=xpatch.InBounds((500000.0, 3999600.0, 500400.0, 4000000.0)),
        )
        p[3], p.bounds(), p.transforms(), p.to_grain(transform=True)
        back = p.reconstruct(p.patches())
        doubled = p.apply(lambda b: b * 2)
    np.testing.assert_allclose(back.values, da.values, rtol=1e-6)
    assert doubled.rio.nodata == -9999.0


def test_model_predictions_without_nodata_get_the_inputs_no_data_cells_masked():
    da = nodata_raster()
    p = da.patch(y=10, x=10, stride=5, window="hann")
    scores = xr.DataArray(
        np.ones((len(p), 3, 10, 10)), dims=("patch", "class", "y", "x")
    )  # a model's output: no attributes, a value everywhere
    out = p.reconstruct(scores)
    assert out.rio.nodata == -9999.0
    assert (out.values[:, :20, :20] == -9999.0).all()  # no band had data there
    assert (out.values[:, 30, 30] == 1.0).all()  # one band had data: a prediction


def test_a_uint8_raster_with_nodata_zero():
    values = np.random.default_rng(1).integers(1, 255, size=(3, 24, 24)).astype("uint8")
    values[:, :8, :8] = 0
    da = raster(height=24, width=24, bands=3).copy(data=values).rio.write_nodata(0)
    p = da.patch(y=8, x=8, window="hann")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = p.reconstruct(p.patches())
    assert back.rio.nodata == 0
    np.testing.assert_allclose(back.values, values, rtol=1e-6)  # float32 accumulation
