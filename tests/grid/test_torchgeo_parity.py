"""on_grid's labels against torchgeo's ``IntersectionDataset(image, labels)`` (0.8).

An image GeoTIFF in EPSG:32632 (10 m cells) and a class raster GeoTIFF in EPSG:4326
(0.0003 degrees, about 23.6 m x 33.4 m here; classes constant over blocks of
10 x 10 cells, as a land-cover map is over fields), 20 seeded random 32 x 32 patches that
xpatch serves from ``on_grid(image, labels=labels)``, and torchgeo asked for each
patch's bounds at the image's resolution (its ``[xmin:xmax:res, ymin:ymax:res]``
query), nearest on both sides.

They are not equal cell for cell, and not for a half-pixel convention: torchgeo
resamples twice. Read in torchgeo 0.8.1's source (``RasterDataset._load_warp_file``
and ``_merge_files``): each file is first warped into the dataset's CRS at a grid of
its own, ``rasterio.warp.calculate_default_transform``'s (square cells of 27.28 m
here, neither the label's cells nor the image's), through a ``WarpedVRT`` that keeps
GDAL's default transformer approximation (1/8 pixel); ``rasterio.merge.merge`` then
resamples that grid to the query's bounds and resolution. xpatch warps the labels
once, straight onto the image's grid, with the exact transformer. The tests pin
each part:

- the second step has no offset at all: torchgeo's patch equals, at every cell of
  every box, what on_grid serves when handed torchgeo's intermediate raster as the
  labels (same bounds, same cell centres: no half-pixel difference);
- the first step is on_grid's warp onto that intermediate grid except at the cells
  GDAL's approximation moves: each lies within 1/8 of a label cell of a label
  cell's edge;
- so on the labels themselves, torchgeo's patch equals xpatch's at every cell whose
  neighbours within 3 cells (30 m) all hold one class, and differs only near class
  edges (4 % of the cells here, 63 % of them compared; about 40 % on labels
  that change class at every cell). Why 3: torchgeo's value is the label at the
  centre of the 27.28 m cell that holds the cell's centre, displaced by up to 1/8
  of a label cell: a point within 13.64 + 4.2 m of the cell's centre along each
  axis; the label cell there (at least 23.6 m x 33.4 m) holds an image cell centre
  within 30 m along each axis, where xpatch serves that label cell's class.
"""

from __future__ import annotations

import numpy as np
import pytest
import rasterio
import rioxarray
import xarray as xr
from pyproj import Transformer
from rasterio.transform import from_origin
from rasterio.warp import transform_bounds

import xpatch

torch = pytest.importorskip("torch")


def _import_torchgeo():
    """Import torchgeo's datasets, declaring torchvision's NMS operators if they are missing.

    torchvision 0.28.0 from PyPI is the CUDA build: on the CPU build of torch pinned in
    the test extra its operator library does not load, and its import then fails
    registering fake kernels for ``torchvision::nms`` / ``qnms``. torchgeo imports
    torchvision on import but RasterDataset and IntersectionDataset call none of its
    operators, so the two schemas (no kernels) let the import through.
    """
    try:
        import torchvision  # noqa: F401
    except RuntimeError as error:
        if "torchvision::" not in str(error):
            raise
        library = torch.library.Library("torchvision", "FRAGMENT")
        for op in ("nms", "qnms"):
            library.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _import_torchgeo.library = library  # kept alive: the schemas go with it
    datasets = pytest.importorskip("torchgeo.datasets")
    return datasets.RasterDataset, datasets.IntersectionDataset


N = 192  # image cells per side, 10 m
RES = 0.0003  # label cells, degrees
BLOCK = 10  # label cells per class block
SIZE = 32  # patch cells per side
RADIUS = 3  # image cells: see the module's docstring


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("torchgeo")
    image = np.random.default_rng(0).random((3, N, N), dtype=np.float32)
    with rasterio.open(
        folder / "image.tif", "w", driver="GTiff", count=3, height=N, width=N,
        dtype="float32", crs="EPSG:32632", transform=from_origin(400_000.0, 5e6, 10.0, 10.0),
    ) as out:  # fmt: skip
        out.write(image)
    left, bottom, right, top = transform_bounds(
        "EPSG:32632", "EPSG:4326", 400_000.0, 5e6 - 10.0 * N, 400_000.0 + 10.0 * N, 5e6
    )
    ny, nx = int((top - bottom) / RES) + 8, int((right - left) / RES) + 8
    blocks = np.random.default_rng(1).integers(0, 10, (ny // BLOCK + 1, nx // BLOCK + 1))
    classes = blocks.repeat(BLOCK, 0).repeat(BLOCK, 1)[:ny, :nx].astype(np.uint8)
    with rasterio.open(
        folder / "labels.tif", "w", driver="GTiff", count=1, height=ny, width=nx,
        dtype="uint8", crs="EPSG:4326", nodata=255,
        transform=from_origin(left - 0.001, top + 0.001, RES, RES),
    ) as out:  # fmt: skip
        out.write(classes[None])
    return folder / "image.tif", folder / "labels.tif"


@pytest.fixture(scope="module")
def torchgeo_dataset(files):
    raster_dataset, intersection_dataset = _import_torchgeo()
    image_path, labels_path = files

    class Image(raster_dataset):
        filename_glob = image_path.name

    class Labels(raster_dataset):
        filename_glob = labels_path.name
        is_image = False  # served as "mask", nearest, int64

    return intersection_dataset(Image(paths=image_path), Labels(paths=labels_path))


def _open(files):
    image_path, labels_path = files
    image = rioxarray.open_rasterio(image_path, chunks={"band": -1, "y": 64, "x": 64})
    labels = rioxarray.open_rasterio(labels_path, chunks=64).squeeze("band", drop=True)
    return image.rename("image"), labels


def _patches(ds: xr.Dataset) -> xpatch.Patcher:
    return ds.patch(y=SIZE, x=SIZE, sampler=xpatch.RandomAnchors(count=20, seed=0))


def _torchgeo_patch(dataset, bounds) -> np.ndarray:
    left, bottom, right, top = bounds
    return dataset[left:right:10.0, bottom:top:10.0]["mask"].numpy()


def _intermediate(dataset, labels_path) -> xr.DataArray:
    """torchgeo's first step: the label file warped onto its own grid in the image's CRS."""
    with dataset.datasets[1]._load_warp_file(labels_path) as vrt:
        values, t = vrt.read(1), vrt.transform
    rows, cols = np.arange(values.shape[0]) + 0.5, np.arange(values.shape[1]) + 0.5
    return (
        xr.DataArray(values, dims=("y", "x"), coords={"y": t.f + t.e * rows, "x": t.c + t.a * cols})
        .rio.write_crs("EPSG:32632")
        .rio.write_nodata(255)
    )


def test_torchgeo_serves_on_grids_warp_of_its_own_intermediate_grid_without_offset(
    files, torchgeo_dataset
):
    image, _ = _open(files)
    step = _intermediate(torchgeo_dataset, files[1]).chunk(64)
    p = _patches(xpatch.on_grid(image, labels=step))
    assert len(p) == 20
    for i, bounds in enumerate(p.bounds().values):
        served = p[i].labels.values
        assert np.array_equal(_torchgeo_patch(torchgeo_dataset, bounds), served), i


def test_torchgeos_intermediate_grid_is_on_grids_warp_but_where_gdal_approximates(
    files, torchgeo_dataset
):
    _, labels = _open(files)
    step = _intermediate(torchgeo_dataset, files[1])
    template = xr.zeros_like(step, dtype=np.float32).rename("grid").chunk(64)
    exact = xpatch.on_grid(template, labels=labels).labels.values
    rows, cols = np.nonzero(exact != step.values)
    assert len(rows) < 0.01 * exact.size
    # Where they differ, the exact position of the cell's centre in the label raster
    # lies within 1/8 of a label cell of a cell edge: GDAL's approximation moved it over.
    lon, lat = Transformer.from_crs(32632, 4326, always_xy=True).transform(
        step.x.values[cols], step.y.values[rows]
    )
    with rasterio.open(files[1]) as src:
        col, row = ~src.transform * (lon, lat)
    off_edge = np.minimum(np.abs(col - np.round(col)), np.abs(row - np.round(row)))
    assert np.all(off_edge <= 0.125), off_edge.max()


def test_served_labels_equal_torchgeos_away_from_class_edges(files, torchgeo_dataset):
    image, labels = _open(files)
    ds = xpatch.on_grid(image, labels=labels)
    whole = ds.labels.values
    r = RADIUS
    padded = np.pad(whole, r, mode="edge")
    windows = np.lib.stride_tricks.sliding_window_view(padded, (2 * r + 1, 2 * r + 1))
    one_class = (windows == whole[..., None, None]).all(axis=(-2, -1))
    p = _patches(ds)
    compared = differ = 0
    for i, (bounds, anchor) in enumerate(zip(p.bounds().values, p.anchors().values)):
        served = p[i].labels.values
        theirs = _torchgeo_patch(torchgeo_dataset, bounds)
        y0, x0 = anchor
        inside = one_class[y0 : y0 + SIZE, x0 : x0 + SIZE]
        assert np.array_equal(theirs[inside], served[inside]), i
        compared += inside.sum()
        differ += (theirs != served).sum()
    cells = 20 * SIZE * SIZE
    assert compared > 0.5 * cells  # most cells are away from class edges
    assert 0 < differ < 0.15 * cells  # torchgeo's second resampling shows only near them
