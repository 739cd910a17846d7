"""Geometry of a DataTree of co-registered resolutions, for :class:`~xpatch.TreePatcher`.

Each patched node of the tree is a grid over the same footprint at its own
resolution. This module finds, before any data is read, each node's cell size
and extent along the patched dims (from regularly spaced numeric 1-D
coordinates, or from a ``GeoTransform`` when a raster dim has no coordinate),
checks that the footprints agree and that the cell sizes are in exact rational
ratios, converts sizes given in map units to cells, and scales a layout given in
the reference node's cells to every other node, refusing anything that would not
land on whole cells.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from numbers import Real

import numpy as np
import xarray as xr

from xpatch.core.errors import DimensionError, GeometryError, OptionError
from xpatch.xarray.georef import crs_of, raster_dims, same_crs, transform_of

#: Largest denominator of a factor between two nodes' cell sizes (60 m / 10 m is 6).
MAX_DENOMINATOR = 1000
#: Footprint edges must agree to this fraction of the finest cell. Loose enough for
#: coordinates that went through float32, tight enough to catch a half-cell shift
#: (corner labels read as centres), which is at least half a finest cell.
FOOTPRINT_TOLERANCE = 0.01


def node_path(path: object, argument: str = "reference") -> str:
    """Return a node path in the absolute form DataTree uses (``"10m"`` -> ``"/10m"``).

    Examples
    --------
    >>> node_path("10m"), node_path("/r/10m/"), node_path("/")
    ('/10m', '/r/10m', '/')
    """
    if not isinstance(path, str) or not path.strip():
        raise OptionError(
            f"{argument}={path!r} must be the path of a node of the tree, e.g. '/10m'."
        )
    return "/" + path.strip().strip("/")


def patched_nodes(tree: xr.DataTree, dims: tuple[Hashable, ...]) -> dict[str, xr.Dataset]:
    """Return ``{path: dataset}`` of the nodes with a data variable along a patched dim.

    Each dataset includes the coordinates the node inherits. A node that has one
    patched dim but not all of them is refused: its grid would be ambiguous.
    """
    found = {}
    for node in tree.subtree:
        own = node.to_dataset(inherit=False)
        if not any(set(var.dims) & set(dims) for var in own.data_vars.values()):
            continue
        ds = node.to_dataset()
        missing = [d for d in dims if d not in ds.dims]
        if missing:
            raise DimensionError(
                f"node {node.path!r} has data along some of the patched dims {list(dims)!r} but "
                f"not along {missing!r} (its dims are {list(ds.dims)!r}); every patched node "
                "needs all of them. Patch fewer dims, or move that node out of the tree."
            )
        found[node.path] = ds
    return found


@dataclass(frozen=True)
class Axis:
    """One node's grid along one patched dim.

    Attributes
    ----------
    extent
        Number of cells.
    step
        Signed cell size in map units (negative for north-up rows); None when
        the dim has neither coordinate nor transform.
    edge
        Outer edge of the first cell, in map units (None with ``step``).
    """

    extent: int
    step: float | None = None
    edge: float | None = None

    @property
    def far_edge(self) -> float | None:
        """Outer edge of the last cell."""
        return None if self.step is None else self.edge + self.step * self.extent

    def extent_text(self) -> str:
        """Describe the footprint for messages: ``[first edge, last edge] (n cells of step)``."""
        if self.step is None:
            return f"{self.extent} cells (no coordinate)"
        return f"[{self.edge:.10g}, {self.far_edge:.10g}] ({self.extent} cells of {self.step:g})"


def node_axis(ds: xr.Dataset, path: str, dim: Hashable) -> Axis:
    """Return the grid of node ``path`` along ``dim``: extent, cell size, first edge.

    Examples
    --------
    >>> ds = xr.Dataset(coords={"x": [5.0, 15.0, 25.0]})
    >>> node_axis(ds, "/10m", "x")
    Axis(extent=3, step=10.0, edge=0.0)
    """
    extent = int(ds.sizes[dim])
    if dim in ds.coords and ds[dim].ndim == 1 and np.issubdtype(ds[dim].dtype, np.number):
        values = np.asarray(ds[dim].values, dtype=np.float64)
        if extent >= 2:
            step = float(values[-1] - values[0]) / (extent - 1)
            steps = np.diff(values)
            if step == 0 or not np.allclose(steps, step, rtol=1e-6, atol=0):
                raise GeometryError(
                    f"node {path!r}: the coordinate {dim!r} is not regularly spaced (steps "
                    f"from {steps.min():g} to {steps.max():g}), so its cell size is unknown; "
                    "a tree of resolutions needs cell-centre coordinates on a regular grid."
                )
            return Axis(extent, step, float(values[0]) - step / 2)
    transformed = _transform_axis(ds, dim, extent)
    if transformed is not None:
        return transformed
    if dim in ds.coords and np.issubdtype(ds[dim].dtype, np.number):
        raise GeometryError(
            f"node {path!r} has {extent} cell along {dim!r}: one label gives no cell size; "
            "write a transform (rio.write_transform) or patch a larger grid."
        )
    return Axis(extent)


def _transform_axis(ds: xr.Dataset, dim: Hashable, extent: int) -> Axis | None:
    raster = raster_dims(ds)
    if raster is None or dim not in raster:
        return None
    try:
        t = transform_of(ds)
    except GeometryError:
        return None
    if t is None or t[1] != 0 or t[3] != 0:  # rotated grids have no per-dim cell size
        return None
    a, _, c, _, e, f = t
    if dim == raster[0]:
        return Axis(extent, float(e), float(f))
    return Axis(extent, float(a), float(c))


def node_factors(
    axes: Mapping[str, Mapping[Hashable, Axis]], reference: str, dims: tuple[Hashable, ...]
) -> dict[str, dict[Hashable, Fraction]]:
    """Return ``{path: {dim: reference cell / node cell}}``, the footprints checked.

    Along a dim where no node has a coordinate the footprints are taken to be
    equal and the factor is the ratio of the extents; where some nodes have one
    and others not, or cell sizes are not in a rational ratio, or footprints
    differ, a :class:`~xpatch.GeometryError` names both nodes and both extents.

    Examples
    --------
    >>> axes = {"/10m": {"x": Axis(12, 10.0, 0.0)}, "/60m": {"x": Axis(2, 60.0, 0.0)}}
    >>> node_factors(axes, "/10m", ("x",))
    {'/10m': {'x': Fraction(1, 1)}, '/60m': {'x': Fraction(1, 6)}}
    """
    factors: dict[str, dict[Hashable, Fraction]] = {path: {} for path in axes}
    for dim in dims:
        unlabelled = [p for p in axes if axes[p][dim].step is None]
        if unlabelled and len(unlabelled) < len(axes):
            labelled = [p for p in axes if p not in unlabelled]
            raise GeometryError(
                f"along {dim!r} the nodes {labelled!r} have numeric coordinates (or a transform) "
                f"and {unlabelled!r} do not, so their footprints cannot be compared; give every "
                f"patched node cell-centre coordinates along {dim!r}, or none."
            )
        ref = axes[reference][dim]
        finest = min((abs(axes[p][dim].step or 1.0) for p in axes), default=1.0)
        for path in axes:
            node = axes[path][dim]
            if unlabelled:
                factors[path][dim] = Fraction(node.extent, ref.extent)
                continue
            factors[path][dim] = _factor(path, reference, dim, ref, node)
            tolerance = FOOTPRINT_TOLERANCE * finest
            if (
                abs(node.edge - ref.edge) > tolerance
                or abs(node.far_edge - ref.far_edge) > tolerance
                or factors[path][dim] * ref.extent != node.extent
            ):
                raise GeometryError(
                    f"the footprints of {reference!r} and {path!r} differ along {dim!r}: "
                    f"{reference!r} covers {ref.extent_text()}, {path!r} covers "
                    f"{node.extent_text()}. A tree of resolutions needs one footprint: crop "
                    "the nodes to the same extent (and check that the coordinates of each are "
                    "at cell centres)."
                )
    return factors


def _factor(path: str, reference: str, dim: Hashable, ref: Axis, node: Axis) -> Fraction:
    if (ref.step > 0) != (node.step > 0):
        raise GeometryError(
            f"the coordinate {dim!r} increases at {reference!r} (step {ref.step:g}) and "
            f"decreases at {path!r} (step {node.step:g}), or the reverse; flip one of them "
            f"(.isel({dim}=slice(None, None, -1))) so that index 0 is the same edge everywhere."
        )
    raw = abs(ref.step) / abs(node.step)
    factor = Fraction(raw).limit_denominator(MAX_DENOMINATOR)
    if abs(float(factor) - raw) > 1e-6 * raw:
        raise GeometryError(
            f"the cell sizes along {dim!r} of {reference!r} ({abs(ref.step):g}) and {path!r} "
            f"({abs(node.step):g}) are not in a ratio of small whole numbers ({raw:.10g}), so "
            "a patch cannot cover whole cells at both; resample one node to a compatible grid."
        )
    return factor


def to_cells(value: object, dim: Hashable, axis: Axis, reference: str, argument: str) -> int:
    """Convert a size or stride in map units (``units="crs"``) to reference cells.

    Examples
    --------
    >>> to_cells(600.0, "x", Axis(240, 10.0, 0.0), "/10m", "size")
    60
    """
    if isinstance(value, bool) or not isinstance(value, Real | np.integer | np.floating):
        raise OptionError(
            f"{argument}[{dim!r}]={value!r} must be a positive number of map units with "
            "units='crs', e.g. 1200.0 for 1200 m."
        )
    if axis.step is None:
        raise OptionError(
            f"units='crs' needs numeric coordinates (or a transform) along {dim!r} at the "
            f"reference {reference!r}, which has none; give {argument} in cells (units='cells') "
            "or assign cell-centre coordinates."
        )
    cell = abs(axis.step)
    cells = float(value) / cell
    whole = round(cells)
    if not math.isfinite(cells) or whole <= 0 or abs(cells - whole) > 1e-6 * max(whole, 1):
        low = math.floor(cells) * cell
        raise GeometryError(
            f"{argument}[{dim!r}]={value!r} (units='crs') is {cells:g} cells of {cell:g} at "
            f"the reference {reference!r}, not a positive whole number; give a multiple of "
            f"{cell:g} (e.g. {max(low, cell):g} or {math.ceil(cells) * cell:g})."
        )
    return int(whole)


def crs_layout(
    size: Mapping[Hashable, object],
    stride: object,
    axes: Mapping[Hashable, Axis],
    reference: str,
) -> tuple[dict[Hashable, int], int | dict[Hashable, int] | None]:
    """Return size and stride given in map units as reference cells."""
    cells = {d: to_cells(v, d, axes[d], reference, "size") for d, v in size.items()}
    if stride is None:
        return cells, None
    if isinstance(stride, Mapping):
        return cells, {
            d: to_cells(v, d, axes[d], reference, "stride") if d in axes else v
            for d, v in stride.items()
        }
    return cells, {d: to_cells(stride, d, axes[d], reference, "stride") for d in cells}


def _lcm_denominator(factors: Mapping[str, Mapping[Hashable, Fraction]], dim: Hashable) -> int:
    return math.lcm(*(f[dim].denominator for f in factors.values()))


def _multiple(cells: int, unit: float) -> str:
    if unit == 1:
        return f"{cells} reference cells"
    return f"{cells * unit:g} map units ({cells} reference cells)"


def _suggestion(n: int, multiple: int, unit: float) -> str:
    low = n - n % multiple
    choices = [c for c in (low, low + multiple) if c > 0]
    return " or ".join(f"{c * unit:g}" for c in choices)


def scale_layout(
    values: Mapping[Hashable, int],
    factors: Mapping[str, Mapping[Hashable, Fraction]],
    reference: str,
    argument: str,
    unit: Mapping[Hashable, float],
) -> dict[str, dict[Hashable, int]]:
    """Return ``{path: {dim: value * factor}}``, refusing a value that is not whole cells.

    ``unit`` is the size of one reference cell in the units the caller used
    (1 for cells, the cell size for ``units="crs"``), for the suggested fix.

    Examples
    --------
    >>> f = {"/10m": {"x": Fraction(1)}, "/60m": {"x": Fraction(1, 6)}}
    >>> scale_layout({"x": 60}, f, "/10m", "size", {"x": 1})
    {'/10m': {'x': 60}, '/60m': {'x': 10}}
    >>> scale_layout({"x": 64}, f, "/10m", "size", {"x": 1})
    Traceback (most recent call last):
    ...
    xpatch.core.errors.GeometryError: size 64 along 'x' at '/10m' is 64 * 1/6 = 32/3 (10.67) ...
    """
    out: dict[str, dict[Hashable, int]] = {path: {} for path in factors}
    for path, per_dim in factors.items():
        for dim, n in values.items():
            scaled = n * per_dim[dim]
            if scaled.denominator != 1:
                multiple = _lcm_denominator(factors, dim)
                given = "" if unit[dim] == 1 else f" ({n * unit[dim]:g} map units)"
                raise GeometryError(
                    f"{argument} {n}{given} along {dim!r} at {reference!r} is {n} * "
                    f"{per_dim[dim]} = {scaled} ({float(scaled):.4g}) cells at {path!r}, not a "
                    f"whole number: every node must cut whole cells. Use a {argument} along "
                    f"{dim!r} that is a multiple of {_multiple(multiple, unit[dim])} (e.g. "
                    f"{_suggestion(n, multiple, unit[dim])})."
                )
            out[path][dim] = int(scaled)
    return out


def snapped_anchors(
    anchors: np.ndarray,
    dims: tuple[Hashable, ...],
    factors: Mapping[str, Mapping[Hashable, Fraction]],
) -> np.ndarray:
    """Return ``anchors`` moved down to the coarsest node's grid: whole cells at every node.

    For samplers that draw their anchors (jittered, random, weighted): an odd anchor
    would be half a cell at a node of half the resolution. Each anchor moves to the
    multiple of the denominators' least common multiple at or below it, so the patch
    stays inside the array and moves by less than one coarse cell.

    Examples
    --------
    >>> f = {"/10m": {"x": Fraction(1)}, "/20m": {"x": Fraction(1, 2)}}
    >>> snapped_anchors(np.array([[0], [5]]), ("x",), f).ravel().tolist()
    [0, 4]
    """
    multiples = np.array([_lcm_denominator(factors, d) for d in dims], dtype=np.int64)
    return np.asarray(anchors, dtype=np.int64) // multiples * multiples


def scale_anchors(
    anchors: np.ndarray,
    dims: tuple[Hashable, ...],
    factors: Mapping[str, Mapping[Hashable, Fraction]],
    reference: str,
    sampler: object,
) -> dict[str, np.ndarray]:
    """Return each node's anchors (the reference's times the factors), all whole cells.

    Examples
    --------
    >>> f = {"/10m": {"x": Fraction(1)}, "/20m": {"x": Fraction(1, 2)}}
    >>> scale_anchors(np.array([[0], [4]]), ("x",), f, "/10m", None)["/20m"].ravel().tolist()
    [0, 2]
    """
    out = {}
    for path, per_dim in factors.items():
        scaled = np.empty_like(anchors)
        for j, dim in enumerate(dims):
            f = per_dim[dim]
            off = np.flatnonzero((anchors[:, j] * f.numerator) % f.denominator)
            if off.size:
                k, a = int(off[0]), int(anchors[off[0], j])
                multiple = _lcm_denominator(factors, dim)
                raise GeometryError(
                    f"patch {k} starts at cell {a} along {dim!r} at {reference!r}, which is "
                    f"{a} * {f} = {a * f} ({float(a * f):.4g}) cells at {path!r}, not a whole "
                    f"number (sampler {sampler!r}). Every anchor along {dim!r} must be a "
                    f"multiple of {multiple} reference cells: use RegularGrid with a stride "
                    f"divisible by {multiple}, or explicit Anchors that are."
                )
            scaled[:, j] = anchors[:, j] * f.numerator // f.denominator
        out[path] = scaled
    return out


def check_one_crs(nodes: Mapping[str, xr.Dataset]) -> None:
    """Refuse nodes whose grid mappings declare different CRSs: they are not one footprint.

    Coordinates in two CRSs can hold the same numbers for different ground, which
    the footprint checks (by the numbers) cannot tell apart.
    """
    declared = {path: crs_of(ds) for path, ds in nodes.items()}
    declared = {path: crs for path, crs in declared.items() if crs is not None}
    first = next(iter(declared.items()), None)
    for path, crs in declared.items():
        if not same_crs(first[1], crs):
            raise GeometryError(
                f"nodes {first[0]!r} and {path!r} are in different CRSs, so their "
                "coordinates are not one footprint even where the numbers agree. Reproject "
                f"the nodes to one CRS first (node.rio.reproject_match(tree[{first[0]!r}]))."
            )
