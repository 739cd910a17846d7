"""Samplers that read the object: map coordinates, and weight maps.

They place patches where only the labelled object can say: :class:`AtPoints`
and :class:`InBounds` by map coordinates (through the object's transform, points
in another CRS reprojected with pyproj), :class:`WeightedAnchors` by a weight map
read chunk by chunk, once (MONAI's ``RandWeightedCrop`` for arrays larger than
memory; :func:`xpatch.core.weighted_draw.weighted_cells`). Each is an
:class:`ObjectSampler`: :class:`~xpatch.xarray.layout.Layout` resolves it against
the object into anchors.
"""

from __future__ import annotations

import importlib
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dask
import numpy as np
import xarray as xr

from xpatch.core.errors import DimensionError, GeometryError, OptionError
from xpatch.core.geometry import Geometry, as_positive_int
from xpatch.core.plan import chunk_starts
from xpatch.core.samplers import RegularGrid
from xpatch.core.shuffle import check_seed
from xpatch.core.weighted_draw import weighted_cells
from xpatch.xarray.georef import (
    GEO_HINT,
    crs_of,
    patch_extent,
    raster_dims,
    transform_of,
)
from xpatch.xarray.variables import is_dask_backed


class ObjectSampler:
    """A sampler that needs the object itself: the layout resolves it into anchors.

    Subclasses define ``resolve(obj, geometry)``, which returns a sampler of the
    anchors it found (with ``anchors(geometry)``).
    """

    def resolve(self, obj: xr.DataArray | xr.Dataset, geometry: Geometry) -> Any:
        """Return a sampler of the anchors placed on ``obj``."""
        raise NotImplementedError

    def anchors(self, geometry: Geometry) -> np.ndarray:
        """Refuse: this sampler needs the array, so pass it to ``.patch(...)``."""
        raise OptionError(
            f"{type(self).__name__} needs the array's grid; pass it as sampler= to "
            ".patch(...), which places the anchors."
        )


# -- samplers in map coordinates ---------------------------------------------------------


@dataclass(frozen=True)
class _ResolvedAnchors:
    """Anchors a map-coordinate sampler resolved to (a sampler, for the layout)."""

    indices: np.ndarray = field(hash=False, repr=False)
    keeps_order: bool = True

    def anchors(self, geometry: Geometry) -> np.ndarray:
        """Return the resolved anchors, checked against the geometry."""
        return geometry.check_anchors(self.indices, "anchors")

    def __repr__(self) -> str:
        return f"<{len(self.indices)} anchors from map coordinates>"


def _pyproj():
    try:
        return importlib.import_module("pyproj")
    except ImportError as error:
        raise ImportError(f"points in another CRS need pyproj: {GEO_HINT}.") from error


def _to_raster_crs(
    obj: xr.DataArray | xr.Dataset, x: np.ndarray, y: np.ndarray, crs: Any, label: str
) -> tuple[np.ndarray, np.ndarray]:
    if crs is None:
        return x, y
    target = crs_of(obj)
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
class AtPoints(ObjectSampler):
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
class InBounds(ObjectSampler):
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
        ys = np.concatenate(
            [
                np.full(21, bottom),
                bottom + (top - bottom) * t,
                np.full(21, top),
                bottom + (top - bottom) * t,
            ]
        )
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
        too_small = {
            d: extents[d]
            for j, d in enumerate(geometry.dims)
            if extents[d] < size[d] and not geometry.pads(j)
        }
        if too_small:
            raise GeometryError(
                f"InBounds: the box covers {too_small} cells, fewer than the patch size "
                f"{size}; use a larger box or boundary='pad'."
            )
        # A box is a region: along a periodic dim its grid ends where the box does.
        ends = dict(zip(geometry.dims, geometry.ended()))
        inner = Geometry.build(extents, size, dict(zip(geometry.dims, geometry.stride)), ends)
        anchors = RegularGrid().anchors(inner) + np.asarray(starts, dtype=np.int64)
        return _ResolvedAnchors(anchors, keeps_order=False)


# -- samplers that read a weight map --------------------------------------------------------


@dataclass(frozen=True)
class WeightedAnchors(ObjectSampler):
    """``count`` patches whose centre cell is drawn in proportion to a weight map.

    The centre of a patch is its cell ``anchor + size // 2``. Centres are drawn
    with replacement, each cell with probability ``weight / sum(weights)``; a
    centre closer to the edge than half a patch moves the patch inward (the
    cell then stays inside its patch, off-centre), as :class:`~xpatch.AtPoints`
    does. Class-balanced sampling is a weight map built from a label map (say
    ``xr.where(labels == 1, 0.5 / n_pos, 0.5 / n_neg)``); "where the cloud mask is
    clear" is ``(~cloud).astype(float)``.

    Building the patcher reads the weight map once, chunk by chunk in C order,
    never whole: a Dask-backed map is computed one block at a time. The draw
    depends on the seed and on the map's chunks (not on the process): the same
    in every worker.

    Parameters
    ----------
    weights
        A DataArray with exactly the patched dims, on the array's grid (same
        sizes, and the same coordinates where both have them). Values finite and
        >= 0; cells of weight 0 are never drawn.
    count
        Number of patches.
    seed
        Seed of the generator, ``0 <= seed < 2**32``.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xpatch
    >>> image = xr.DataArray(np.zeros((32, 32)), dims=("y", "x"))
    >>> weights = xr.zeros_like(image)
    >>> weights[20, 5] = 1.0  # the only cell with weight
    >>> p = image.patch(y=8, x=8, sampler=xpatch.WeightedAnchors(weights, count=3, seed=0))
    >>> p.anchors().values.tolist()
    [[16, 1], [16, 1], [16, 1]]
    """

    weights: xr.DataArray = field(hash=False, repr=False)
    count: int
    seed: int = 0

    def resolve(self, obj: xr.DataArray | xr.Dataset, geometry: Geometry) -> DrawnAnchors:
        """Draw the anchors on ``obj``'s patch geometry (reads the weight map once)."""
        count = as_positive_int(self.count, "WeightedAnchors(count=...)")
        seed = check_seed(self.seed)
        weights = aligned_weights(self.weights, obj, geometry)
        centres = weighted_cells(weight_chunks(weights), count, seed)
        return DrawnAnchors(geometry.anchors_around(centres))


@dataclass(frozen=True)
class DrawnAnchors(_ResolvedAnchors):
    """The anchors a :class:`WeightedAnchors` drew (a sampler, for the layout)."""

    keeps_order: bool = False

    def __repr__(self) -> str:
        return f"<{len(self.indices)} anchors drawn from a weight map>"


def aligned_weights(
    weights: xr.DataArray, obj: xr.DataArray | xr.Dataset, geometry: Geometry
) -> xr.DataArray:
    """Check that ``weights`` lies on ``obj``'s grid; return it in the patched dims' order."""
    if not isinstance(weights, xr.DataArray):
        raise OptionError(
            f"WeightedAnchors(weights=...) must be an xarray.DataArray on the array's grid; "
            f"got {type(weights).__name__}. Wrap it: xr.DataArray(w, dims={list(geometry.dims)!r})."
        )
    dims = list(geometry.dims)
    if set(weights.dims) != set(dims):
        raise DimensionError(
            f"WeightedAnchors: the weights have dims {list(weights.dims)!r}; they need exactly "
            f"the patched dims {dims!r} (reduce others first, e.g. weights.max('band'))."
        )
    for d, n in zip(dims, geometry.shape):
        if weights.sizes[d] != n:
            raise DimensionError(
                f"WeightedAnchors: the weights have {weights.sizes[d]} cells along {d!r} and "
                f"the array {n}; build the weight map on the array's grid."
            )
        if d in weights.coords and d in obj.coords:
            if not np.array_equal(weights[d].values, obj[d].values):
                raise DimensionError(
                    f"WeightedAnchors: the weights' {d!r} coordinate differs from the array's; "
                    "build the weight map on the array's grid (e.g. weights.reindex_like(obj))."
                )
    real = np.issubdtype(weights.dtype, np.integer) or np.issubdtype(weights.dtype, np.floating)
    if not (real or weights.dtype == bool):
        raise OptionError(
            f"WeightedAnchors: the weights have dtype {weights.dtype}; they must be real "
            "numbers (int, float or bool)."
        )
    return weights.transpose(*dims)


def weight_chunks(weights: xr.DataArray) -> Iterator[tuple[list[int], np.ndarray]]:
    """Yield ``(origin, values)`` of every chunk in C order; a Dask block is computed alone."""
    if not is_dask_backed(weights.variable):
        yield [0] * weights.ndim, np.asarray(weights.values)
        return
    data = weights.data
    starts = [chunk_starts(c) for c in data.chunks]
    for index in itertools.product(*(range(len(c)) for c in data.chunks)):
        (values,) = dask.compute(data.blocks[index])
        yield [s[i] for s, i in zip(starts, index)], np.asarray(values)


def balanced_weights(labels: xr.DataArray, classes: Sequence[Any] | None = None) -> xr.DataArray:
    """Build a weight map giving each class the same total weight, for :class:`WeightedAnchors`.

    A cell of class ``c`` weighs ``1 / (k * n_c)``, where ``n_c`` counts the
    cells of class ``c`` and ``k`` the classes: patches then centre on each class
    equally often (MONAI's ``RandCropByPosNegLabel`` with equal ratios). Cells of
    labels not in ``classes`` weigh 0.

    Counting reads the labels once (one Dask computation for lazy labels); the
    map itself is as lazy as the labels.

    Parameters
    ----------
    labels
        Integer or boolean class labels on the array's grid.
    classes
        The classes to balance (default: every label present). Each must have at
        least one cell.

    Returns
    -------
    xarray.DataArray
        float64, the dims and coordinates of ``labels``, summing to 1.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xpatch
    >>> labels = xr.DataArray(np.array([[0, 0, 0], [0, 0, 1]]), dims=("y", "x"))
    >>> xpatch.balanced_weights(labels).values.round(2).tolist()
    [[0.1, 0.1, 0.1], [0.1, 0.1, 0.5]]
    """
    if not isinstance(labels, xr.DataArray) or not (
        np.issubdtype(labels.dtype, np.integer) or labels.dtype == bool
    ):
        dtype = getattr(labels, "dtype", type(labels).__name__)
        raise OptionError(
            f"balanced_weights(labels=...) needs a DataArray of integer or boolean class "
            f"labels; got {dtype}. Round or cast float labels first: labels.astype(int)."
        )
    if is_dask_backed(labels.variable):
        import dask.array as da

        (found, counts) = dask.compute(*da.unique(labels.data.ravel(), return_counts=True))
    else:
        found, counts = np.unique(labels.values, return_counts=True)
    present = dict(zip(found.tolist(), counts.tolist()))
    chosen = list(present) if classes is None else list(dict.fromkeys(classes))
    absent = [c for c in chosen if c not in present]
    if absent or not chosen:
        raise OptionError(
            f"balanced_weights: classes {absent or chosen!r} have no cells in the labels "
            f"(present: {sorted(present)}); leave them out of classes=."
        )
    keys = np.asarray(sorted(chosen))
    per_cell = np.array([1.0 / (len(keys) * present[c]) for c in keys.tolist()])

    def lookup(values: np.ndarray) -> np.ndarray:
        where = np.clip(np.searchsorted(keys, values), 0, len(keys) - 1)
        return np.where(keys[where] == values, per_cell[where], 0.0)

    return xr.apply_ufunc(lookup, labels, dask="parallelized", output_dtypes=[np.float64])
