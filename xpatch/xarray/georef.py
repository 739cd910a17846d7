"""Georeferencing of patches: grid mappings, transforms and bounds.

A raster's georeferencing lives where rioxarray and GDAL put it: a scalar grid
mapping coordinate (``spatial_ref``) whose attributes hold the CRS (``crs_wkt``)
and the affine transform (``GeoTransform``); the nodata rules live in
:mod:`xpatch.xarray.encoding`. This module reads and writes those attributes itself,
so patches keep their georeferencing whether or not rioxarray is installed;
the samplers in map coordinates (:mod:`xpatch.xarray.samplers`) reproject points
from another CRS with pyproj (``pip install "xarray-patch[geo]"``).

Transforms are 6-tuples in rasterio's ``Affine`` order ``(a, b, c, d, e, f)``:
``x = a * col + b * row + c`` and ``y = d * col + e * row + f`` at a cell's
upper-left corner.
"""

from __future__ import annotations

import importlib
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from xpatch.core.errors import DimensionError, GeometryError

GEO_HINT = 'pip install "xarray-patch[geo]" (rioxarray and pyproj)'

#: Names of the column (x) and row (y) dims, after rioxarray's defaults.
X_NAMES = ("x", "longitude", "lon", "easting")
Y_NAMES = ("y", "latitude", "lat", "northing")

Transform = tuple[float, float, float, float, float, float]


def grid_mapping_name(obj: xr.DataArray | xr.Dataset) -> Hashable | None:
    """Name of the scalar coordinate that holds the CRS and transform, if any.

    Examples
    --------
    >>> da = xr.DataArray([[0.0]], dims=("y", "x"))
    >>> grid_mapping_name(da.assign_coords(spatial_ref=((), 0, {"crs_wkt": "..."})))
    'spatial_ref'
    >>> grid_mapping_name(da) is None
    True
    """
    named = obj.encoding.get("grid_mapping") or obj.attrs.get("grid_mapping")
    if isinstance(obj, xr.Dataset) and named is None:
        for var in obj.data_vars.values():
            named = var.encoding.get("grid_mapping") or var.attrs.get("grid_mapping")
            if named:
                break
    if named is not None and named in obj.coords:
        return named
    for name, coord in obj.coords.items():
        if coord.ndim == 0 and {"crs_wkt", "spatial_ref", "GeoTransform"} & set(coord.attrs):
            return name
    return None


def raster_dims(obj: xr.DataArray | xr.Dataset) -> tuple[Hashable, Hashable] | None:
    """Return the ``(y, x)`` dims of a raster (rows, columns), or None if it has none."""
    y = next((d for d in obj.dims if str(d).lower() in Y_NAMES), None)
    x = next((d for d in obj.dims if str(d).lower() in X_NAMES), None)
    if (y is None or x is None) and grid_mapping_name(obj) is not None:
        # Other names (rows/cols, ...): rioxarray knows them if it is installed.
        try:
            importlib.import_module("rioxarray")
            y, x = obj.rio.y_dim, obj.rio.x_dim
        except Exception:  # not installed, or rioxarray cannot tell either
            return None
    return (y, x) if y is not None and x is not None else None


def _from_gdal(text: str) -> Transform:
    x0, a, b, y0, d, e = (float(v) for v in str(text).split())
    return (a, b, x0, d, e, y0)


def to_gdal(t: Sequence[float]) -> str:
    """GDAL's ``GeoTransform`` text of a transform (``x0 dx rx y0 ry dy``)."""
    a, b, c, d, e, f = t
    return " ".join(repr(float(v)) for v in (c, a, b, f, d, e))


def _regular_step(values: np.ndarray, dim: Hashable) -> tuple[float, float]:
    """First label and step of a regularly spaced 1-D coordinate."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        raise GeometryError(
            f"coordinate {dim!r} has {len(values)} label(s): a transform needs a step; "
            "write one with da.rio.write_transform(...)."
        )
    uneven = irregular_steps(values)
    if uneven is not None:
        raise GeometryError(
            f"coordinate {dim!r} is not regularly spaced (steps from {uneven[0]} to "
            f"{uneven[1]}); bounds need a regular grid or a transform "
            "(da.rio.write_transform(...))."
        )
    return float(values[0]), float(values[1] - values[0])


def irregular_steps(values: np.ndarray) -> tuple[float, float] | None:
    """Return the smallest and largest step of irregularly spaced 1-D labels, else None.

    Steps within a relative 1e-6 of the first count as regular (float labels).

    Examples
    --------
    >>> irregular_steps(np.array([0.0, 1.0, 2.0])) is None, irregular_steps(np.array([0, 1, 3]))
    (True, (1.0, 2.0))
    """
    steps = np.diff(np.asarray(values, dtype=np.float64))
    if len(steps) == 0 or np.allclose(steps, steps[0], rtol=1e-6, atol=0):
        return None
    return float(steps.min()), float(steps.max())


def transform_of(obj: xr.DataArray | xr.Dataset) -> Transform | None:
    """Return the affine transform of a raster, from its x/y labels or its ``GeoTransform``.

    As rioxarray does: numeric x/y coordinates give the origin and the cell size
    (they follow slicing, while a ``GeoTransform`` attribute keeps the parent's
    values after ``isel``), a ``GeoTransform`` gives the rest and is used alone
    for rotated grids or without coordinates. None when there is neither.

    Examples
    --------
    >>> da = xr.DataArray(np.zeros((2, 3)), dims=("y", "x"),
    ...                   coords={"y": [15.0, 5.0], "x": [105.0, 115.0, 125.0]})
    >>> transform_of(da)
    (10.0, 0.0, 100.0, 0.0, -10.0, 20.0)
    """
    name = grid_mapping_name(obj)
    stored = None
    if name is not None and "GeoTransform" in obj.coords[name].attrs:
        stored = _from_gdal(obj.coords[name].attrs["GeoTransform"])
    dims = raster_dims(obj)
    labelled = (
        dims is not None
        and all(d in obj.coords for d in dims)
        and all(np.issubdtype(obj[d].dtype, np.number) for d in dims)
    )
    rotated = stored is not None and (stored[1] != 0 or stored[3] != 0)
    if not labelled or rotated:
        return stored
    y_dim, x_dim = dims
    x0, dx = _first_and_step(obj[x_dim].values, x_dim, None if stored is None else stored[0])
    y0, dy = _first_and_step(obj[y_dim].values, y_dim, None if stored is None else stored[4])
    return (dx, 0.0, x0 - dx / 2, 0.0, dy, y0 - dy / 2)


def _first_and_step(values: np.ndarray, dim: Hashable, stored_step: float | None):
    if len(values) == 1 and stored_step is not None:
        return float(values[0]), float(stored_step)
    return _regular_step(values, dim)


def patch_transforms(
    obj: xr.DataArray | xr.Dataset, dims: Sequence[Hashable], anchors: np.ndarray
) -> np.ndarray | None:
    """``(n, 6)`` transform of every patch, or None if the object has no transform."""
    t = transform_of(obj)
    raster = raster_dims(obj)
    if t is None or raster is None:
        return None
    y_dim, x_dim = raster
    rows = anchors[:, list(dims).index(y_dim)] if y_dim in dims else np.zeros(len(anchors))
    cols = anchors[:, list(dims).index(x_dim)] if x_dim in dims else np.zeros(len(anchors))
    a, b, c, d, e, f = t
    out = np.empty((len(anchors), 6))
    out[:] = t
    out[:, 2] = c + a * cols + b * rows
    out[:, 5] = f + d * cols + e * rows
    return out


def with_transform(obj: Any, transform: Transform) -> Any:
    """Return a copy of ``obj`` whose grid mapping coordinate holds ``transform``.

    Only the grid mapping variable is new; the data are not copied, and the
    caller's object is untouched.
    """
    name = grid_mapping_name(obj)
    if name is None:
        return obj
    coord = obj.coords[name].variable.copy(deep=False)
    coord.attrs = {**coord.attrs, "GeoTransform": to_gdal(transform)}
    return obj.assign_coords({name: coord})


def patch_extent(obj: xr.DataArray | xr.Dataset) -> tuple[float, ...] | None:
    """``(left, bottom, right, top)`` of the whole array, for messages; None if unknown."""
    dims = raster_dims(obj)
    try:
        t = transform_of(obj)
    except GeometryError:
        return None
    if t is None or dims is None:
        return None
    whole = np.zeros((1, 2), dtype=np.int64)
    size = {dims[0]: obj.sizes[dims[0]], dims[1]: obj.sizes[dims[1]]}
    return tuple(round(float(v), 6) for v in patch_bounds(obj, dims, size, whole)[0])


def patch_bounds(
    obj: xr.DataArray | xr.Dataset,
    dims: Sequence[Hashable],
    size: Mapping[Hashable, int],
    anchors: np.ndarray,
) -> np.ndarray:
    """``(n, 4)`` ``(left, bottom, right, top)`` of every patch in map units."""
    raster = raster_dims(obj)
    if raster is None or not set(raster) <= set(dims):
        raise DimensionError(
            f"bounds need the raster's y and x dims among the patched dims {list(dims)!r}; "
            f"the object's dims are {list(obj.dims)!r} (y: one of {Y_NAMES}, x: one of "
            f"{X_NAMES})."
        )
    transforms = patch_transforms(obj, dims, anchors)
    if transforms is None:
        raise GeometryError(
            "bounds need a transform: numeric, regularly spaced y and x coordinates or a "
            "grid mapping with a GeoTransform (da.rio.write_transform(...))."
        )
    y_dim, x_dim = raster
    height, width = size[y_dim], size[x_dim]
    a, b, c, d, e, f = (transforms[:, k] for k in range(6))
    xs = np.stack([c, c + a * width, c + b * height, c + a * width + b * height])
    ys = np.stack([f, f + d * width, f + e * height, f + d * width + e * height])
    return np.stack([xs.min(0), ys.min(0), xs.max(0), ys.max(0)], axis=1)


def crs_of(obj: xr.DataArray | xr.Dataset) -> Any:
    """Return the CRS its grid mapping declares (WKT, as rioxarray writes it), or None."""
    name = grid_mapping_name(obj)
    if name is None:
        return None
    attrs = obj.coords[name].attrs
    return attrs.get("crs_wkt") or attrs.get("spatial_ref")


def same_crs(a: Any, b: Any) -> bool:
    """Whether two declared CRSs are the same: by pyproj when installed, else as text.

    Examples
    --------
    >>> same_crs("EPSG:32633", "EPSG:32633"), same_crs("EPSG:32633", "EPSG:32634")
    (True, False)
    """
    if a == b:
        return True
    try:
        pyproj = importlib.import_module("pyproj")
    except ImportError:
        return False
    try:
        return bool(pyproj.CRS.from_user_input(a) == pyproj.CRS.from_user_input(b))
    except pyproj.exceptions.CRSError:
        return False
