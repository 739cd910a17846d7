"""The grid a result lands on: the input's, or the input's extent at another resolution.

``apply(..., scale=...)`` and ``reconstruct`` (which infers the factors from the
predictions' patch shape) blend on an :class:`OutputGrid`: the scaled plan of
:mod:`xpatch.core.scale`, the window built at the output's patch size, the
input's coordinates at the new cell centres (a raster's transform scaled, its
CRS kept) and the input's nodata cells carried over to the new cells.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import xarray as xr

from xpatch.core.errors import GeometryError, OptionError
from xpatch.core.plan import Plan
from xpatch.core.scale import ScaleSpec, check_scale, scale_plan
from xpatch.core.windows import BlendWindow, make_window
from xpatch.xarray.georef import grid_mapping_name, raster_dims, to_gdal, transform_of
from xpatch.xarray.layout import Layout


@dataclass(frozen=True, eq=False)
class OutputGrid:
    """Where a result is blended: the plan and window on the output grid.

    Attributes
    ----------
    dims
        The patched dims.
    factors
        Output cells per input cell along each of them (1: the input's grid).
    plan
        The plan on the output grid (the patcher's own when nothing is scaled).
    window
        The blending window at the output's patch size.
    """

    dims: tuple[Hashable, ...]
    factors: tuple[Fraction, ...]
    plan: Plan
    window: BlendWindow

    @property
    def identity(self) -> bool:
        """Whether the output grid is the input's."""
        return all(f == 1 for f in self.factors)

    @property
    def size(self) -> dict[Hashable, int]:
        """The output's patch size per patched dim."""
        return dict(zip(self.dims, self.plan.size))

    @property
    def scale(self) -> dict[Hashable, str]:
        """The factors other than 1, as text (``"1/4"``), for messages and provenance."""
        return {d: str(f) for d, f in zip(self.dims, self.factors) if f != 1}

    def factor(self, dim: Hashable) -> Fraction:
        """Return the factor along ``dim`` (1 for a dim that is not patched)."""
        return self.factors[self.dims.index(dim)] if dim in self.dims else Fraction(1)


def output_grid(layout: Layout, scale: ScaleSpec | None) -> OutputGrid:
    """Check ``scale=`` against the patcher's layout and return the output grid.

    Raises :class:`~xpatch.OptionError` before any work when the factors do not
    scale the patch size, the extent and every anchor to whole cells, or when the
    patcher's window is an array of the input's patch shape (a window name or
    ``{dim: name}`` can be built at any size).
    """
    plan = layout.plan
    factors = check_scale(scale, layout.dims, plan.size, plan.grid.shape, plan.anchors)
    if all(f == 1 for f in factors):
        return OutputGrid(tuple(layout.dims), factors, plan, layout.blend_window)
    spec = layout.window
    specs = spec.values() if isinstance(spec, Mapping) else [spec]
    if any(isinstance(s, np.ndarray) for s in specs):
        raise OptionError(
            f"scale={scale!r} needs the blending window at the output's patch size, and this "
            "patcher's window is an array of the input's; build the patcher with a window "
            "name (e.g. window='hann') or {dim: name}, which are made at any size."
        )
    check_interpolable_labels(layout.obj, dict(zip(layout.dims, factors)))
    scaled = scale_plan(plan, factors)
    window = BlendWindow.of(make_window(spec, layout.dims, scaled.size))
    return OutputGrid(tuple(layout.dims), factors, scaled, window)


def check_interpolable_labels(obj: xr.DataArray | xr.Dataset, factors: Mapping) -> None:
    """Refuse 1-D labels along a scaled dim that cannot be interpolated: NaN, or not monotonic.

    The output's labels are the input's taken at the new cell centres (linearly),
    which NaN or labels that turn back would make up.

    Examples
    --------
    >>> da = xr.DataArray(np.zeros(4), dims="x", coords={"x": [0.0, 1.0, np.nan, 3.0]})
    >>> check_interpolable_labels(da, {"x": Fraction(2)})
    Traceback (most recent call last):
    ...
    xpatch.core.errors.OptionError: scale=: the labels of 'x' hold NaN; ...
    """
    for dim, factor in factors.items():
        coord = obj.coords.get(dim)
        if factor == 1 or coord is None or coord.ndim != 1 or coord.dtype.kind not in "iufMm":
            continue
        dates = coord.dtype.kind in "Mm"
        values = coord.values.astype(np.int64) if dates else coord.values
        missing = bool(coord.isnull().any()) if dates else bool(np.isnan(values).any())
        if missing:
            why = "hold NaT" if dates else "hold NaN"
        elif len(values) > 1 and not ((np.diff(values) > 0).all() or (np.diff(values) < 0).all()):
            why = "are not strictly increasing or decreasing"
        else:
            continue
        raise OptionError(
            f"scale=: the labels of {dim!r} {why}; the output's labels are the input's "
            "interpolated at the new cell centres, which would make them up. Fix the labels "
            f"(or drop them: obj.drop_vars({dim!r})) before patching."
        )


def inferred_scale(
    layout: Layout, sizes: Mapping[Hashable, int]
) -> dict[Hashable, Fraction] | None:
    """Return the factors that predictions of patch ``sizes`` imply (None: the input's).

    Only whole factors and their inverses (2, 3, 4, 1/2, 1/4, ...) are read off
    a patch shape: predictions of 8 cells from patches of 10 are far more likely
    cropped (a model without padding) than at 4/5 of the resolution, and are
    left to :func:`~xpatch.xarray.reconstruct.check_prediction` to refuse. With a
    halo, predictions may be of the grown patch (what :meth:`~xpatch.Patcher.patches`
    gives a model) or of the window (a model that crops): a shape read both ways
    (24 cells: 2 x a grown 12, or 3 x a window of 8) is read as the grown patch's;
    ``scale=`` says otherwise.

    Examples
    --------
    >>> import xarray as xr, xpatch
    >>> p = xr.DataArray(np.zeros((8, 8)), dims=("y", "x")).patch(y=4, x=4)
    >>> inferred_scale(p.layout, {"y": 8, "x": 8})
    {'y': Fraction(2, 1), 'x': Fraction(2, 1)}
    >>> inferred_scale(p.layout, {"y": 3, "x": 3}) is None
    True
    >>> q = xr.DataArray(np.zeros((16, 16)), dims=("y", "x")).patch(y=4, x=4, halo=1)
    >>> inferred_scale(q.layout, {"y": 12, "x": 12})  # 2 x the grown 6, not 3 x 4
    {'y': Fraction(2, 1), 'x': Fraction(2, 1)}
    """
    halo = dict(zip(layout.dims, layout.halo)) if any(layout.halo) else {}
    factors = {}
    for d in layout.dims:
        if d not in sizes:
            continue
        n, size, h = int(sizes[d]), layout.size[d], halo.get(d, 0)
        if h and n == size + 2 * h:
            factors[d] = Fraction(1)  # the grown patch itself: cropped as it is
            continue
        readings = [Fraction(n, size + 2 * h)] if h else []
        readings.append(Fraction(n, size))
        whole = [f for f in readings if f != 0 and (f.numerator == 1 or f.denominator == 1)]
        if not whole:
            return None
        factors[d] = whole[0]
    return factors if any(f != 1 for f in factors.values()) else None


def _interpolated(var: xr.Variable, dim: Hashable, factor: Fraction, n_out: int) -> xr.Variable:
    """``var`` at the centres of the output cells along ``dim``, linearly (extrapolated)."""
    n = var.sizes[dim]
    # Output cell j's centre, in input cell units (input cell i's centre is at i).
    position = (np.arange(n_out) + 0.5) / float(factor) - 0.5
    left = np.clip(np.floor(position).astype(np.int64), 0, n - 2)
    fraction = xr.Variable(dim, position - left)
    low, high = var.isel({dim: left}), var.isel({dim: left + 1})
    return low + (high - low) * fraction


def _scaled_coordinate(
    name: Hashable, var: xr.Variable, grid: OutputGrid, sizes: Mapping[Hashable, int]
) -> xr.Variable | None:
    """One coordinate over scaled dims at the output's cell centres, or None if it cannot be."""
    kind = var.dtype.kind
    scaled = [d for d in var.dims if grid.factor(d) != 1]
    short = [d for d in scaled if var.sizes[d] < 2]
    if kind not in "iufMm" or short:
        why = "is not numeric" if kind not in "iufMm" else f"has one label along {short[0]!r}"
        warnings.warn(
            f"the coordinate {name!r} {why}, so it has no values at the output's resolution "
            f"(scale={grid.scale}); the result leaves it out. Assign it to the result "
            "yourself if you need it.",
            UserWarning,
            stacklevel=4,
        )
        return None
    out = var.astype(np.int64) if kind in "Mm" else var
    for d in scaled:
        out = _interpolated(out, d, grid.factor(d), sizes[d])
    if kind in "Mm":
        out = out.round().astype(np.int64).astype(var.dtype)
    out.attrs = dict(var.attrs)
    return out


def grid_coords(layout: Layout, grid: OutputGrid) -> dict[Hashable, xr.Variable]:
    """Return the input's coordinates on the output grid.

    The input's own when nothing is scaled. Otherwise coordinates off the scaled
    dims are kept, numeric ones along them (datetimes included) are taken at the
    new cell centres (linearly: exact for regular grids, extrapolated at the
    edges), a raster's ``GeoTransform`` is scaled (its CRS kept), and others are
    left out with a warning.
    """
    obj = layout.obj
    coords = {name: c.variable for name, c in obj.coords.items()}
    if grid.identity:
        return coords
    sizes = {d: obj.sizes[d] for d in obj.dims}
    sizes.update(zip(grid.dims, grid.plan.grid.shape))
    out: dict[Hashable, xr.Variable] = {}
    for name, var in coords.items():
        if not any(grid.factor(d) != 1 for d in var.dims):
            out[name] = var
            continue
        scaled = _scaled_coordinate(name, var, grid, sizes)
        if scaled is not None:
            out[name] = scaled
    mapping = grid_mapping_name(obj)
    raster = raster_dims(obj)
    if mapping is not None and raster is not None:
        try:
            t = transform_of(obj)
        except GeometryError:  # irregular labels: the stored transform, if any, is stale
            t = None
        coord = out[mapping].copy(deep=False)
        coord.attrs = dict(coord.attrs)
        if t is None:
            coord.attrs.pop("GeoTransform", None)
        else:
            fy, fx = (float(grid.factor(d)) for d in raster)
            a, b, c, d, e, f = t
            coord.attrs["GeoTransform"] = to_gdal((a / fx, b / fy, c, d / fx, e / fy, f))
        out[mapping] = coord
    return out


def resampler(grid: OutputGrid) -> Callable[[xr.DataArray], xr.DataArray] | None:
    """Return a function taking an input-grid validity mask to the output grid (None: same grid).

    An output cell has data where any input cell under it has: a factor ``p/q``
    repeats each cell ``p`` times, then merges runs of ``q`` with ``any``. Lazy
    masks stay lazy.

    Examples
    --------
    >>> import xarray as xr, xpatch
    >>> p = xr.DataArray(np.zeros(8), dims="x").patch(x=4)
    >>> down = resampler(output_grid(p.layout, 0.5))
    >>> down(xr.DataArray([1, 0, 0, 0, 0, 1, 1, 1], dims="x").astype(bool)).values.tolist()
    [True, False, True, True]
    """
    if grid.identity:
        return None

    def resample(valid: xr.DataArray) -> xr.DataArray:
        for dim, f in zip(grid.dims, grid.factors):
            if f == 1 or dim not in valid.dims:
                continue
            if f.numerator > 1:
                valid = valid.isel({dim: np.repeat(np.arange(valid.sizes[dim]), f.numerator)})
            if f.denominator > 1:
                valid = valid.coarsen({dim: f.denominator}).any()
        return valid.drop_vars(list(valid.coords))

    return resample
