"""xpatch.on_grid: sources from other files on the image's grid, lazily per output chunk.

The scene is in EPSG:32632 (4 x 256 x 256 float32, dask chunks of 64), a label raster
in EPSG:4326 (uint8, dask) that stops short of the scene's east edge, the same labels
as float, and polygons in EPSG:3857. The references are whole-raster calls of the
libraries: rasterio's warp of the whole source onto the whole grid (GDAL's exact
transformer, as on_grid uses per chunk), rioxarray's ``reproject_match`` (GDAL's
default 1/8 pixel approximation: equal but for the cells that approximation moves),
and ``rasterio.features.rasterize`` of the whole scene.
"""

from __future__ import annotations

import dask.array as da
import geopandas
import numpy as np
import pytest
import rasterio
import rasterio.features
import rioxarray  # noqa: F401  (registers .rio)
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st
from rasterio.enums import Resampling
from rasterio.io import MemoryFile
from rasterio.vrt import WarpedVRT
from shapely.geometry import Polygon, box

import xpatch
from tests.conftest import forbid_compute
from xpatch.core.errors import DimensionError, GeometryError, OptionError

N = 256
RES = 0.0003  # degrees, about 33 m x 23 m at 45 N against the scene's 10 m


def make_scene(chunks: int | None = 64) -> xr.DataArray:
    rng = np.random.default_rng(0)
    scene = xr.DataArray(
        rng.random((4, N, N), dtype=np.float32),
        dims=("band", "y", "x"),
        coords={
            "band": [1, 2, 3, 4],
            "y": 5_000_000.0 - 5.0 - 10.0 * np.arange(N),
            "x": 400_000.0 + 5.0 + 10.0 * np.arange(N),
        },
        name="image",
    ).rio.write_crs("EPSG:32632")
    return scene.chunk({"band": -1, "y": chunks, "x": chunks}) if chunks else scene


def make_labels(chunks: int | None = 50) -> xr.DataArray:
    """Classes 0-9 in EPSG:4326 over the scene, except a strip along its east edge."""
    left, bottom, right, top = make_scene(None).rio.transform_bounds("EPSG:4326")
    right = left + 0.8 * (right - left)
    ny, nx = int((top - bottom) / RES) + 6, int((right - left) / RES) + 4
    values = np.random.default_rng(1).integers(0, 10, (ny, nx)).astype(np.uint8)
    labels = xr.DataArray(
        values,
        dims=("y", "x"),
        coords={
            "y": top + 0.001 - RES / 2 - RES * np.arange(ny),
            "x": left - 0.0005 + RES / 2 + RES * np.arange(nx),
        },
    ).rio.write_crs("EPSG:4326")
    return labels.chunk(chunks) if chunks else labels


def make_polygons() -> geopandas.GeoDataFrame:
    """Boxes and triangles over the scene (some overlapping, one outside), in EPSG:3857."""
    rng = np.random.default_rng(2)
    shapes, classes = [], []
    for k in range(12):
        x0 = 400_000 + rng.uniform(-300, 2_400)
        y0 = 4_997_440 + rng.uniform(-300, 2_400)
        w, h = rng.uniform(80, 700, 2)
        shapes.append(
            box(x0, y0, x0 + w, y0 + h)
            if k % 2
            else Polygon([(x0, y0), (x0 + w, y0), (x0 + w / 3, y0 + h)])
        )
        classes.append(k + 1)
    shapes.append(box(500_000, 5_100_000, 500_100, 5_100_100))  # far outside the scene
    classes.append(99)
    frame = geopandas.GeoDataFrame({"class": classes}, geometry=shapes, crs="EPSG:32632")
    return frame.to_crs("EPSG:3857")


def whole_warp(source: xr.DataArray, grid: xr.DataArray, resampling: str, nodata) -> np.ndarray:
    """Rasterio's warp of the whole source onto the whole grid: one call, exact transformer."""
    values = np.asarray(source.values)
    with MemoryFile() as memory:
        with memory.open(
            driver="GTiff",
            count=1,
            height=values.shape[0],
            width=values.shape[1],
            dtype=values.dtype,
            crs=source.rio.crs,
            transform=source.rio.transform(),
            nodata=source.rio.nodata,
        ) as dataset:
            dataset.write(values, 1)
        with (
            memory.open() as dataset,
            WarpedVRT(
                dataset,
                crs=grid.rio.crs,
                transform=grid.rio.transform(),
                width=grid.rio.width,
                height=grid.rio.height,
                resampling=Resampling[resampling],
                tolerance=1e-9,
                nodata=nodata,
            ) as warped,
        ):
            return warped.read(1)


def whole_rasterize(frame, grid: xr.DataArray, column=None, all_touched=False) -> np.ndarray:
    frame = frame.to_crs(grid.rio.crs)
    values = frame[column] if column else [1] * len(frame)
    return rasterio.features.rasterize(
        list(zip(frame.geometry, values)),
        out_shape=(grid.rio.height, grid.rio.width),
        transform=grid.rio.transform(),
        fill=0,
        all_touched=all_touched,
        dtype=np.asarray(values).dtype if column else "uint8",
    )


@pytest.fixture(scope="module")
def built():
    scene, labels = make_scene(), make_labels()
    ndvi = (labels.astype(np.float32) * 0.37).rio.write_crs("EPSG:4326")
    polygons = make_polygons()
    with forbid_compute():
        ds = xpatch.on_grid(
            scene,
            labels=labels,
            ndvi=ndvi,
            fields=(polygons, "class"),
            mask=polygons,
            resampling={"labels": "nearest", "ndvi": "bilinear"},
        )
    return ds, scene, labels, ndvi, polygons


def test_building_computes_nothing_and_keeps_the_image_grid_and_chunks(built):
    ds, scene, *_ = built
    assert list(ds.data_vars) == ["image", "labels", "ndvi", "fields", "mask"]
    for name in ("labels", "ndvi", "fields", "mask"):
        var = ds[name]
        assert isinstance(var.data, da.Array)
        assert var.dims == ("y", "x")
        assert var.chunks == scene.chunks[1:]
        np.testing.assert_array_equal(var.y, scene.y)
        np.testing.assert_array_equal(var.x, scene.x)
    assert ds.rio.crs == scene.rio.crs
    assert ds.labels.rio.transform() == scene.rio.transform()
    assert ds.image.data is scene.data


def test_dtypes_are_kept(built):
    ds, _, labels, ndvi, polygons = built
    assert ds.labels.dtype == labels.dtype == np.uint8
    assert ds.ndvi.dtype == ndvi.dtype == np.float32
    assert ds.fields.dtype == polygons["class"].dtype
    assert ds.mask.dtype == np.uint8


def test_nearest_equals_the_whole_raster_warp_and_reproject_match_but_its_approximation(built):
    ds, scene, labels, *_ = built
    got = ds.labels.values
    np.testing.assert_array_equal(got, whole_warp(labels, scene, "nearest", 255))
    matched = labels.rio.reproject_match(scene).values
    differ = got != matched
    # reproject_match moves samples by up to 1/8 pixel (GDAL's default approximation):
    # measured 160 of 65,536 cells, each a neighbouring label.
    assert differ.mean() < 0.005, differ.sum()
    np.testing.assert_array_equal(got == 255, matched == 255)


def test_bilinear_within_float_tolerance_of_the_whole_raster_warp(built):
    ds, scene, _, ndvi, *_ = built
    got = ds.ndvi.values
    np.testing.assert_allclose(got, whole_warp(ndvi, scene, "bilinear", np.nan), atol=1e-5)
    matched = ndvi.rio.reproject_match(scene, resampling=Resampling.bilinear).values
    np.testing.assert_array_equal(np.isnan(got), np.isnan(matched))
    # The approximation's 1/8 pixel at most, on values 0.37 apart from one label to the next.
    assert np.nanmax(np.abs(got - matched)) < 0.37 / 8


def test_cells_the_source_does_not_cover_are_its_nodata(built):
    ds, *_ = built
    east = slice(int(0.85 * N), None)
    assert (ds.labels.values[:, east] == 255).all()
    assert ds.labels.attrs["_FillValue"] == 255
    assert np.isnan(ds.ndvi.values[:, east]).all()
    assert (ds.labels.values[:, : N // 2] != 255).all()


def test_a_source_nodata_value_is_carried_through():
    scene = make_scene()
    labels = make_labels().rio.write_nodata(0)
    ds = xpatch.on_grid(scene, labels=labels)
    got = ds.labels.values
    assert ds.labels.attrs["_FillValue"] == 0
    assert (got[:, int(0.85 * N) :] == 0).all()
    np.testing.assert_array_equal(got, whole_warp(labels, scene, "nearest", 0))


def test_polygons_in_another_crs_equal_rasterize_of_the_whole_scene(built):
    ds, scene, *_, polygons = built
    np.testing.assert_array_equal(ds.fields.values, whole_rasterize(polygons, scene, "class"))
    np.testing.assert_array_equal(ds.mask.values, whole_rasterize(polygons, scene))
    assert 0 < ds.mask.values.mean() < 1
    assert 99 not in ds.fields.values


def test_all_touched_and_a_path_geopandas_reads(tmp_path):
    scene, polygons = make_scene(), make_polygons()
    path = tmp_path / "fields.gpkg"
    polygons.to_file(path)
    ds = xpatch.on_grid(scene, fields=(str(path), "class"), all_touched=True)
    expected = whole_rasterize(polygons, scene, "class", all_touched=True)
    np.testing.assert_array_equal(ds.fields.values, expected)
    assert (expected != whole_rasterize(polygons, scene, "class")).any()


def test_numpy_and_dask_inputs_agree(built):
    ds, *_, polygons = built
    eager = xpatch.on_grid(
        make_scene(None),
        labels=make_labels(None),
        ndvi=(make_labels(None).astype(np.float32) * 0.37).rio.write_crs("EPSG:4326"),
        fields=(polygons, "class"),
        mask=polygons,
    )
    for name in ("labels", "ndvi", "fields", "mask"):
        assert isinstance(eager[name].data, np.ndarray)
        np.testing.assert_array_equal(eager[name].values, ds[name].values)


def test_a_numpy_image_with_a_dask_source_stays_lazy():
    with forbid_compute():
        ds = xpatch.on_grid(make_scene(None), labels=make_labels())
    assert isinstance(ds.labels.data, da.Array)


def test_extra_dims_of_a_source_are_warped_band_by_band():
    scene, labels = make_scene(), make_labels()
    stack = xr.concat([labels, labels + 1], dim="time").assign_coords(time=[10, 20])
    stack = stack.rio.write_crs("EPSG:4326")
    ds = xpatch.on_grid(scene, labels=stack)
    assert ds.labels.dims == ("time", "y", "x")
    assert ds.labels.time.values.tolist() == [10, 20]
    single = xpatch.on_grid(scene, labels=labels).labels.values
    np.testing.assert_array_equal(ds.labels.values[0], single)


@st.composite
def chunkings(draw):
    def axis():
        cuts = sorted(draw(st.sets(st.integers(1, N - 1), max_size=5)))
        return tuple(b - a for a, b in zip([0, *cuts], [*cuts, N]))

    return axis(), axis()


@settings(max_examples=12, deadline=None)
@given(chunks=chunkings(), method=st.sampled_from(["nearest", "bilinear"]))
def test_any_chunking_gives_the_whole_raster_result(chunks, method):
    scene = make_scene(None).chunk({"band": -1, "y": chunks[0], "x": chunks[1]})
    source = make_labels(None).astype(np.float32).rio.write_crs("EPSG:4326")
    ds = xpatch.on_grid(scene, labels=source, mask=make_polygons(), resampling=method)
    assert ds.labels.chunks == chunks
    np.testing.assert_allclose(
        ds.labels.values, whole_warp(source, make_scene(None), method, np.nan), atol=1e-5
    )
    np.testing.assert_array_equal(ds.mask.values, whole_rasterize(make_polygons(), scene))


def test_each_chunk_reads_only_its_source_window():
    scene = make_scene(None).chunk({"band": -1, "y": 64, "x": 64})
    labels = make_labels(None)
    reads = []

    class Recording(np.ndarray):
        def __getitem__(self, key):
            reads.append(key)
            return np.asarray(self).__getitem__(key)

    source = labels.copy(data=da.from_array(labels.values.view(Recording), chunks=16))
    warped = xpatch.on_grid(scene, labels=source).labels.data
    warped.blocks[0, 0].compute(scheduler="synchronous")
    rows = [k[0] for k in reads]
    cols = [k[1] for k in reads]
    # The north-west chunk is a sixteenth of the scene: a few source chunks of 16 x 16.
    assert 0 < len(reads) <= 9, len(reads)
    assert max(r.stop for r in rows) <= 64 and max(c.stop for c in cols) <= 64


@pytest.mark.parametrize("method", ["average", "mode"])
@pytest.mark.parametrize("chunks", [32, 5, 7])
def test_average_and_mode_shrinking_equal_the_whole_raster_warp(method, chunks):
    full = make_scene(None)
    coarse = full.isel(y=slice(None, None, 8), x=slice(None, None, 8))  # 80 m cells
    coarse = coarse.assign_coords(y=full.y.values[::8] - 35, x=full.x.values[::8] + 35)
    source = make_labels(None).astype(np.float32).rio.write_crs("EPSG:4326")
    ds = xpatch.on_grid(coarse.chunk({"y": chunks, "x": chunks}), labels=source, resampling=method)
    expected = whole_warp(source, coarse, method, np.nan)
    np.testing.assert_allclose(ds.labels.values, expected, atol=1e-5)
    assert np.isfinite(expected).mean() > 0.7


def test_a_source_without_a_crs_is_refused_with_the_fix():
    labels = make_labels().drop_vars("spatial_ref")
    with pytest.raises(GeometryError, match=r"source labels= has no CRS.*write_crs"):
        xpatch.on_grid(make_scene(), labels=labels)
    image = make_scene().drop_vars("spatial_ref")
    with pytest.raises(GeometryError, match=r"image= has no CRS.*write_crs"):
        xpatch.on_grid(image, labels=make_labels())


def test_an_unknown_resampling_is_refused_naming_it_and_the_choices():
    with pytest.raises(OptionError, match=r"resampling='cubic' for source 'labels'.*'nearest'"):
        xpatch.on_grid(make_scene(), labels=make_labels(), resampling={"labels": "cubic"})
    with pytest.raises(OptionError, match=r"resampling= names 'lables'.*\['labels'\]"):
        xpatch.on_grid(make_scene(), labels=make_labels(), resampling={"lables": "nearest"})


def test_a_source_named_like_an_image_variable_is_refused():
    with pytest.raises(DimensionError, match=r"source image= has the name of the image's"):
        xpatch.on_grid(make_scene(), image=make_labels())
    with pytest.raises(DimensionError, match=r"source red="):
        xpatch.on_grid(make_scene().to_dataset("band").rename({1: "red"}), red=make_labels())


def test_a_resampling_for_polygons_is_refused():
    with pytest.raises(OptionError, match=r"names 'fields', which is not a raster source"):
        xpatch.on_grid(make_scene(), fields=make_polygons(), resampling={"fields": "nearest"})


def test_a_bad_source_is_refused_before_any_other_source_is_read(tmp_path, monkeypatch):
    path = tmp_path / "fields.gpkg"
    make_polygons().to_file(path)
    read = []
    original = geopandas.read_file
    monkeypatch.setattr(geopandas, "read_file", lambda *a, **k: read.append(a) or original(*a, **k))
    labels = make_labels().drop_vars("spatial_ref")
    with forbid_compute(), pytest.raises(GeometryError, match="source labels= has no CRS"):
        xpatch.on_grid(make_scene(), fields=str(path), labels=labels)
    assert read == []


def test_other_bad_sources_are_refused_naming_them():
    with pytest.raises(OptionError, match=r"source labels= is a list"):
        xpatch.on_grid(make_scene(), labels=[1, 2])
    with pytest.raises(OptionError, match=r"column 'klass' is not in the frame.*'class'"):
        xpatch.on_grid(make_scene(), fields=(make_polygons(), "klass"))
    with pytest.raises(GeometryError, match=r"source fields= has no CRS"):
        xpatch.on_grid(make_scene(), fields=make_polygons().set_crs(None, allow_override=True))


def test_the_result_patches_and_min_valid_skips_uncovered_cells(built):
    ds, *_ = built
    p = ds[["image", "ndvi"]].patch(y=64, x=64, min_valid=1.0)
    assert 0 < len(p) < 16


def make_mask(chunks: int | None = 50) -> xr.DataArray:
    """A boolean mask in EPSG:4326 (every third class of the labels)."""
    return (make_labels(chunks) % 3 == 0).rio.write_crs("EPSG:4326")


def test_a_boolean_mask_is_warped_nearest_and_stays_bool():
    scene, mask = make_scene(), make_mask()
    with forbid_compute():
        ds = xpatch.on_grid(scene, mask=mask)
    assert isinstance(ds.mask.data, da.Array)
    assert ds.mask.dtype == bool
    assert "_FillValue" not in ds.mask.attrs
    got = ds.mask.values
    as_uint8 = mask.astype(np.uint8).rio.write_crs("EPSG:4326")
    np.testing.assert_array_equal(got, whole_warp(as_uint8, scene, "nearest", 0).astype(bool))
    assert not got[:, int(0.85 * N) :].any()  # past the mask's east edge: False
    assert 0.2 < got.mean() < 0.5
    numpy = xpatch.on_grid(make_scene(None), mask=make_mask(None))
    np.testing.assert_array_equal(numpy.mask.values, got)
    assert numpy.mask.dtype == bool


@settings(max_examples=6, deadline=None)
@given(chunks=chunkings(), seed=st.integers(0, 2**16))
def test_a_boolean_mask_at_any_chunking_is_the_whole_raster_warp(chunks, seed):
    scene = make_scene(None).chunk({"band": -1, "y": chunks[0], "x": chunks[1]})
    labels = make_labels(None)
    flags = np.random.default_rng(seed).random(labels.shape) < 0.5
    mask = labels.copy(data=flags).rio.write_crs("EPSG:4326")
    got = xpatch.on_grid(scene, mask=mask).mask.values
    as_uint8 = mask.astype(np.uint8).rio.write_crs("EPSG:4326")
    np.testing.assert_array_equal(got, whole_warp(as_uint8, scene, "nearest", 0).astype(bool))


@pytest.mark.parametrize("resampling", ["bilinear", {"mask": "average"}, {"mask": "mode"}])
def test_a_boolean_mask_with_another_resampling_is_refused_before_any_read(resampling):
    with forbid_compute(), pytest.raises(OptionError) as caught:
        xpatch.on_grid(make_scene(), mask=make_mask(), resampling=resampling)
    message = str(caught.value)
    assert "for source 'mask', a boolean mask: a mask is warped nearest only" in message
    assert "mask.astype('float32') with resampling={'mask': 'average'}" in message
