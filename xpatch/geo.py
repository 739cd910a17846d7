"""Georeferencing of patches: transforms, bounds, and samplers in map coordinates.

A raster's georeferencing lives where rioxarray and GDAL put it: a scalar grid
mapping coordinate (``spatial_ref``) whose attributes hold the CRS (``crs_wkt``)
and the affine transform (``GeoTransform``); the nodata rules live in
:mod:`xpatch.cf`. This module reads and writes those attributes itself,
so patches keep their georeferencing whether or not rioxarray is installed;
reprojecting points from another CRS needs pyproj (``pip install
"xarray-patch[geo]"``).

Transforms are 6-tuples in rasterio's ``Affine`` order ``(a, b, c, d, e, f)``:
``x = a * col + b * row + c`` and ``y = d * col + e * row + f`` at a cell's
upper-left corner.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from xpatch.core.errors import DimensionError, GeometryError, OptionError
from xpatch.core.geometry import Geometry
from xpatch.core.samplers import RegularGrid

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
    steps = np.diff(values)
    if not np.allclose(steps, steps[0], rtol=1e-6, atol=0):
        raise GeometryError(
            f"coordinate {dim!r} is not regularly spaced (steps from {steps.min()} to "
            f"{steps.max()}); bounds need a regular grid or a transform "
            "(da.rio.write_transform(...))."
        )
    return float(values[0]), float(steps[0])


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


# -- samplers in map coordinates ---------------------------------------------------------


def _pyproj():
    try:
        return importlib.import_module("pyproj")
    except ImportError as error:
        raise ImportError(f"points in another CRS need pyproj: {GEO_HINT}.") from error


def _crs_of(obj: xr.DataArray | xr.Dataset) -> Any:
    name = grid_mapping_name(obj)
    if name is None:
        return None
    attrs = obj.coords[name].attrs
    return attrs.get("crs_wkt") or attrs.get("spatial_ref")


def _to_raster_crs(
    obj: xr.DataArray | xr.Dataset, x: np.ndarray, y: np.ndarray, crs: Any, label: str
) -> tuple[np.ndarray, np.ndarray]:
    if crs is None:
        return x, y
    target = _crs_of(obj)
    if target is None:
        raise GeometryError(
            f"{label}: crs={crs!r} was given but the array has no CRS to reproject to; "
            "write one with da.rio.write_crs(...), or leave crs out for points in the "
            "array's own coordinates."
        )
    pyproj = _pyproj()
    transformer = pyproj.Transformer.from_crs(
        pyproj.CRS.from_user_input(crs), pyproj.CRS.from_user_input(target), always_xy=True
    )
    tx, ty = transformer.transform(np.asarray(x, float), np.asarray(y, float))
    return np.asarray(tx, float), np.asarray(ty, float)


def _cells(obj, x: np.ndarray, y: np.ndarray, label: str) -> tuple[np.ndarray, np.ndarray]:
    """Fractional (row, col) of map points, through the inverse transform."""
    t = transform_of(obj)
    if t is None or raster_dims(obj) is None:
        raise GeometryError(
            f"{label} needs a raster with a transform: numeric, regularly spaced y and x "
            "coordinates or a GeoTransform (da.rio.write_transform(...))."
        )
    a, b, c, d, e, f = t
    det = a * e - b * d
    col = (e * (x - c) - b * (y - f)) / det
    row = (-d * (x - c) + a * (y - f)) / det
    return row, col


def _split_points(points: Any, label: str) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(points, Mapping):
        if set(points) != {"x", "y"}:
            raise OptionError(
                f"{label} points with keys {sorted(points)!r} must be {{'x': [...], 'y': [...]}} "
                "(x: easting or longitude, y: northing or latitude) or an (n, 2) array of (x, y)."
            )
        x, y = np.asarray(points["x"], float).ravel(), np.asarray(points["y"], float).ravel()
    else:
        array = np.asarray(points, dtype=float)
        if array.ndim != 2 or array.shape[1] != 2:
            raise OptionError(
                f"{label} points has shape {array.shape}; give an (n, 2) array of (x, y) map "
                "coordinates, or {'x': [...], 'y': [...]}."
            )
        x, y = array[:, 0], array[:, 1]
    if len(x) != len(y) or len(x) == 0:
        raise OptionError(f"{label} needs at least one point, with as many x as y values.")
    return x, y


@dataclass(frozen=True)
class AtPoints:
    """Patches centred on points given in map coordinates (field plots, labelled sites).

    Each point falls in one cell; its patch starts ``size // 2`` cells before it
    along y and x, moved inward where that would cross the array's edge (the
    point then stays inside its patch, off-centre). Points outside the array are
    refused. Patched dims other than y and x start at 0.

    Parameters
    ----------
    points
        ``(n, 2)`` array of ``(x, y)``, or ``{"x": [...], "y": [...]}``.
    crs
        CRS of the points (anything pyproj reads: ``"EPSG:4326"``, WKT, ...).
        Default: the array's own coordinates. Other CRSs are reprojected.

    Examples
    --------
    >>> da = xr.DataArray(np.zeros((10, 10)), dims=("y", "x"),
    ...                   coords={"y": 95.0 - 10 * np.arange(10), "x": 5.0 + 10 * np.arange(10)})
    >>> p = da.patch(y=4, x=4, sampler=AtPoints([(55.0, 45.0), (1.0, 99.0)]))
    >>> p.anchors().values.tolist()
    [[3, 3], [0, 0]]
    """

    points: Any = field(hash=False)
    crs: Any = None

    def resolve(self, obj: xr.DataArray | xr.Dataset, geometry: Geometry) -> _ResolvedAnchors:
        """Anchors of the patches around the points, in the order of the points."""
        x, y = _split_points(self.points, "AtPoints")
        x, y = _to_raster_crs(obj, x, y, self.crs, "AtPoints")
        row, col = _cells(obj, x, y, "AtPoints")
        y_dim, x_dim = raster_dims(obj)
        shape = dict(zip(geometry.dims, geometry.shape))
        size = dict(zip(geometry.dims, geometry.size))
        # A point on a cell edge belongs to the next cell, as rasterio's rowcol has it;
        # rounding first keeps float error from moving it back.
        row, col = np.round(row, 9), np.round(col, 9)
        inside = (
            np.isfinite(row)
            & np.isfinite(col)
            & (row >= 0)
            & (row < obj.sizes[y_dim])
            & (col >= 0)
            & (col < obj.sizes[x_dim])
        )
        if not inside.all():
            bad = np.flatnonzero(~inside)[:5]
            given = [(float(x[i]), float(y[i])) for i in bad]
            raise GeometryError(
                f"AtPoints: point(s) {bad.tolist()} at {given} (first few, in the raster's CRS) "
                f"fall outside the array's extent {patch_extent(obj)} or are not finite; drop "
                "them first."
            )
        anchors = np.zeros((len(x), geometry.ndim), dtype=np.int64)
        for j, d in enumerate(geometry.dims):
            if d in (y_dim, x_dim):
                cell = np.floor(row if d == y_dim else col).astype(np.int64)
                start = cell - size[d] // 2
                anchors[:, j] = np.clip(start, 0, max(shape[d] - size[d], 0))
        return _ResolvedAnchors(anchors, keeps_order=True)


@dataclass(frozen=True)
class InBounds:
    """Patches on a regular grid over the part of the array inside a bounding box.

    The box is converted to the window of cells it covers (reprojected first if
    it is given in another CRS: the window then covers the box's envelope). The
    grid starts at the window's first cell; with ``boundary="shift"`` its last
    patch ends flush with the window's end.

    Parameters
    ----------
    bounds
        ``(left, bottom, right, top)`` in map units.
    crs
        CRS of the box; default the array's own coordinates.

    Examples
    --------
    >>> da = xr.DataArray(np.zeros((10, 10)), dims=("y", "x"),
    ...                   coords={"y": 95.0 - 10 * np.arange(10), "x": 5.0 + 10 * np.arange(10)})
    >>> p = da.patch(y=2, x=2, sampler=InBounds((20.0, 60.0, 60.0, 100.0)))
    >>> p.anchors().values.tolist()
    [[0, 2], [0, 4], [2, 2], [2, 4]]
    """

    bounds: tuple[float, float, float, float]
    crs: Any = None

    def resolve(self, obj: xr.DataArray | xr.Dataset, geometry: Geometry) -> _ResolvedAnchors:
        """Grid anchors of the window of cells inside the box."""
        try:
            left, bottom, right, top = (float(v) for v in self.bounds)
        except (TypeError, ValueError):
            raise OptionError(
                f"InBounds bounds={self.bounds!r} must be (left, bottom, right, top)."
            ) from None
        if not (left < right and bottom < top):
            raise OptionError(
                f"InBounds bounds={self.bounds!r} must have left < right and bottom < top."
            )
        # Points along the edges, not just the corners: a box reprojected from another
        # CRS has curved edges, and its envelope must hold them.
        t = np.linspace(0.0, 1.0, 21)
        xs = np.concatenate(
            [
                left + (right - left) * t,
                np.full(21, right),
                left + (right - left) * t,
                np.full(21, left),
            ]
        )
        ys = np.concatenate([np.full(21, bottom), bottom + (top - bottom) * t,
                             np.full(21, top), bottom + (top - bottom) * t])  # fmt: skip
        xs, ys = _to_raster_crs(obj, xs, ys, self.crs, "InBounds")
        rows, cols = _cells(obj, xs, ys, "InBounds")
        y_dim, x_dim = raster_dims(obj)
        # Cells whose centres lie in the box.
        window = {
            y_dim: (math.ceil(rows.min() - 0.5), math.floor(rows.max() - 0.5) + 1),
            x_dim: (math.ceil(cols.min() - 0.5), math.floor(cols.max() - 0.5) + 1),
        }
        starts, extents = [], {}
        for d, n in zip(geometry.dims, geometry.shape):
            lo, hi = window.get(d, (0, n))
            lo, hi = max(lo, 0), min(hi, n)
            if hi - lo <= 0:
                raise GeometryError(
                    f"InBounds bounds={self.bounds!r} covers no cell of the array along {d!r}; "
                    f"the array's extent is {patch_extent(obj)} (left, bottom, right, top)."
                )
            starts.append(lo)
            extents[d] = hi - lo
        size = dict(zip(geometry.dims, geometry.size))
        too_small = {d: extents[d] for d in geometry.dims if extents[d] < size[d]}
        if too_small and geometry.boundary != "pad":
            raise GeometryError(
                f"InBounds: the box covers {too_small} cells, fewer than the patch size "
                f"{size}; use a larger box or boundary='pad'."
            )
        inner = Geometry.build(
            extents, size, dict(zip(geometry.dims, geometry.stride)), geometry.boundary
        )
        anchors = RegularGrid().anchors(inner) + np.asarray(starts, dtype=np.int64)
        return _ResolvedAnchors(anchors, keeps_order=False)


@dataclass(frozen=True)
class _ResolvedAnchors:
    """Anchors a map-coordinate sampler resolved to (a sampler, for the Patcher)."""

    indices: np.ndarray = field(hash=False, repr=False)
    keeps_order: bool = True

    def anchors(self, geometry: Geometry) -> np.ndarray:
        """Return the resolved anchors, checked against the geometry."""
        return geometry.check_anchors(self.indices, "anchors")

    def __repr__(self) -> str:
        return f"<{len(self.indices)} anchors from map coordinates>"


# -- GeoTIFF output ------------------------------------------------------------------------

#: dtypes a GeoTIFF stores (GDAL's types, as rasterio writes them).
GEOTIFF_DTYPES = frozenset(
    np.dtype(t)
    for t in (
        "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
        "float32", "float64", "complex64", "complex128",
    )
)  # fmt: skip


def _named_dim(obj: xr.DataArray, names: Sequence[str]) -> Hashable | None:
    """Return the dim whose lower-cased name comes first in ``names`` (None if none does)."""
    found = [d for d in obj.dims if str(d).lower() in names]
    return min(found, key=lambda d: names.index(str(d).lower()), default=None)


def _spatial_dims(obj: xr.DataArray) -> tuple[Hashable, Hashable] | None:
    """Return ``(y, x)`` by name (``y`` before ``latitude``, ...), else as rioxarray has them."""
    y, x = _named_dim(obj, Y_NAMES), _named_dim(obj, X_NAMES)
    if y is None or x is None:
        try:  # CF axis attributes or a grid mapping's dims: rioxarray knows them if installed
            importlib.import_module("rioxarray")
            y, x = obj.rio.y_dim, obj.rio.x_dim
        except Exception:
            return None
    return (y, x) if y in obj.dims and x in obj.dims and y != x else None


def geotiff_layout(result: xr.DataArray) -> tuple[Hashable, Hashable, list[Hashable]]:
    """Return the ``(y dim, x dim, band dims)`` of ``result`` as a GeoTIFF, or raise naming the fix.

    A GeoTIFF holds one 2-D ``(y, x)`` or 3-D ``(band, y, x)`` array of a
    numeric dtype GDAL stores, with at least one row, column and band. The row
    and column dims are found by name (``y``/``x``, ``latitude``/``longitude``,
    ``lat``/``lon``, ``northing``/``easting``, any case), else as rioxarray
    finds them (CF axis attributes) when it is installed. Only metadata is
    read: a lazy result stays lazy.

    Parameters
    ----------
    result
        What is to be written.

    Returns
    -------
    tuple
        The row dim, the column dim, and the other dims (none, or the one band
        dim), in the order of ``result.dims``.

    Raises
    ------
    OptionError
        If ``result`` is not a DataArray, is empty, has fewer than 2 or more than
        3 dims, has no recognisable y and x dims, or has a dtype GeoTIFF cannot
        store.

    Examples
    --------
    >>> da = xr.DataArray(np.zeros((2, 3, 4), "float32"), dims=("band", "lat", "lon"))
    >>> geotiff_layout(da)
    ('lat', 'lon', ['band'])
    >>> geotiff_layout(da.rename(lat="row", lon="col"))
    Traceback (most recent call last):
    ...
    xpatch.core.errors.OptionError: GeoTIFF needs a row (y) and a column (x) dim; ...
    """
    if not isinstance(result, xr.DataArray):
        raise OptionError(
            f"GeoTIFF holds one DataArray; got a {type(result).__name__}. Write one variable "
            "(ds['name']) to GeoTIFF, or the Dataset to zarr instead."
        )
    sizes = ", ".join(f"{d}: {n}" for d, n in result.sizes.items()) or "no dims"
    if result.ndim not in (2, 3):
        spatial = _spatial_dims(result) or result.dims[-2:]
        extra = tuple(d for d in result.dims if d not in spatial)
        fix = (
            f"Select or combine the extra dims first (e.g. result.isel({{{extra[0]!r}: 0}}), "
            f"or result.stack(bands={extra!r})), or write zarr instead."
            if result.ndim > 3
            else "Write it to zarr instead."
        )
        raise OptionError(
            "GeoTIFF holds a 2-D (y, x) or 3-D (band, y, x) array; the result has "
            f"{result.ndim} dim(s) ({sizes}). {fix}"
        )
    dims = _spatial_dims(result)
    if dims is None:
        rows, cols = result.dims[-2], result.dims[-1]
        raise OptionError(
            "GeoTIFF needs a row (y) and a column (x) dim; the result's dims "
            f"{list(result.dims)!r} ({sizes}) have no recognisable pair (y: one of {Y_NAMES}, "
            f"x: one of {X_NAMES}, any case). Rename them first, e.g. "
            f"result.rename({{{rows!r}: 'y', {cols!r}: 'x'}}), or write zarr instead."
        )
    y_dim, x_dim = dims
    band_dims = [d for d in result.dims if d not in dims]
    empty = [d for d in result.dims if result.sizes[d] == 0]
    if empty:
        raise OptionError(
            f"the result is empty along {empty!r} ({sizes}): a GeoTIFF needs at least one row, "
            "one column and one band. Check that the input is not empty and that "
            "output_dims declares sizes >= 1."
        )
    if result.dtype not in GEOTIFF_DTYPES:
        cast = "uint8" if result.dtype.kind == "b" else "float32"
        raise OptionError(
            f"GeoTIFF cannot store the result's dtype {result.dtype}; cast it first "
            f"(result.astype({cast!r}), or declare dtype={cast!r} in apply), or write zarr "
            "instead."
        )
    return y_dim, x_dim, band_dims
