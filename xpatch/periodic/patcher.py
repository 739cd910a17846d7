"""Periodic dims: patches that run across a global grid's seam, blended back onto their cells.

``obj.patch(lat=32, lon=64, boundary={"lon": "periodic"})`` builds a
:class:`PeriodicPatcher`. Along a periodic dim of ``N`` cells the patches start at
``0, stride, 2 stride, ...`` below ``N``, and those that run past the last cell go on
with the first ones. Underneath is an ordinary :class:`~xpatch.Patcher` over the
object extended along each periodic dim by the cells those patches (and their halo)
reach, repeated from the other side (``pad_mode="wrap"``), its labels continued at
their step (``..., 354.375, 360.0, 365.625``). Blending runs on that extended grid as
sums (Σ w·x and Σ w over the valid results), which are then folded: every cell past
``N`` is added to the cell it repeats, and only then divided. So a cell by the seam
gets the same weighted mean as any other, and a round trip is exact everywhere.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import numpy as np
import xarray as xr

from xpatch.core.blend.reductions import MAX, MEAN, MIN, SUM, Reduction, as_reduction
from xpatch.core.errors import (
    GeometryError,
    OptionError,
    UncoveredCellsWarning,
)
from xpatch.core.geometry import (
    BOUNDARIES,
    Geometry,
    as_positive_int,
    cartesian,
    covered_cells,
)
from xpatch.core.samplers import Anchors
from xpatch.patcher import Patcher
from xpatch.xarray.layout import (
    boundary_modes,
    check_halo,
    check_size_dims,
    patched_dims,
    size_mapping,
)
from xpatch.xarray.padded import padded_object

PERIODIC = "periodic"
#: Options ``obj.patch(...)`` takes besides sizes.
_OPTIONS = ("boundary", "window", "sampler", "min_valid", "pad_value", "pad_mode", "halo")
#: Reductions that fold: sums add across the seam, extremes compare.
_FOLDED = (MEAN, SUM, MAX, MIN)


def is_periodic(boundary: object) -> bool:
    """Whether ``boundary`` makes some dim periodic (``"periodic"`` or ``{dim: "periodic"}``).

    Examples
    --------
    >>> is_periodic({"lon": "periodic", "lat": "shift"}), is_periodic("shift")
    (True, False)
    """
    if isinstance(boundary, Mapping):
        return any(mode == PERIODIC for mode in boundary.values())
    return boundary == PERIODIC


def split_boundary(boundary: object, dims: tuple[Hashable, ...]) -> tuple[list, str]:
    """Return the periodic dims and the one boundary mode of the others (left out: shift).

    Examples
    --------
    >>> split_boundary({"lon": "periodic"}, ("lat", "lon"))
    (['lon'], 'shift')
    >>> split_boundary("periodic", ("lat", "lon"))
    (['lat', 'lon'], 'shift')
    """
    modes = boundary_modes(boundary, dims)
    others = {m for m in modes.values() if m != PERIODIC}
    bad = [m for m in others if m not in BOUNDARIES]
    if bad:
        raise OptionError(
            f"boundary={boundary!r}: {bad[0]!r} is not a boundary mode; use "
            f"'periodic' or one of {BOUNDARIES}."
        )
    if len(others) > 1:
        raise OptionError(
            f"boundary={boundary!r} gives the dims that are not periodic different modes "
            f"{sorted(others)!r} (dims left out take 'shift'); give them one."
        )
    return [d for d in dims if modes[d] == PERIODIC], (others.pop() if others else "shift")


class PeriodicPatcher:
    """Patches of an object with periodic dims: across the seam, blended back onto it.

    Built by ``obj.patch(..., boundary={dim: "periodic", ...})`` (or
    ``boundary="periodic"`` for every patched dim); the other dims take one of the
    usual modes (default ``"shift"``). ``len``, ``p[i]``, :meth:`patches`,
    :meth:`anchors`, :meth:`reconstruct`, :meth:`apply` and :meth:`to_grain` work as a
    :class:`~xpatch.Patcher`'s do. A patch across the seam has continuous labels
    (``354.375, 360.0, 365.625`` on a grid of ``0 ... 354.375``); its anchor is the
    index of its first cell. Other samplers than the regular grid are not taken.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xpatch
    >>> lon = np.arange(8) * 45.0
    >>> da = xr.DataArray(np.arange(8.0), dims="lon", coords={"lon": lon})
    >>> p = da.patch(lon=4, stride=3, boundary={"lon": "periodic"})
    >>> p.anchors().values.ravel().tolist()
    [0, 3, 6]
    >>> p[2].values.tolist(), p[2].lon.values.tolist()
    ([6.0, 7.0, 0.0, 1.0], [270.0, 315.0, 360.0, 405.0])
    >>> bool((p.reconstruct(p.patches()) == da).all())
    True
    """

    def __init__(
        self,
        obj: xr.DataArray | xr.Dataset,
        size: Mapping[Hashable, Any] | None,
        stride: int | Mapping[Hashable, int] | None,
        options: Mapping[str, Any],
    ) -> None:
        sizes = size_mapping(size, {k: v for k, v in options.items() if k not in _OPTIONS})
        options = {k: v for k, v in options.items() if k in _OPTIONS}
        if options.get("sampler") is not None:
            raise OptionError(
                "sampler= with periodic dims: only the regular grid is laid across the "
                "seam for now; leave sampler out."
            )
        check_size_dims(obj, sizes)
        dims = patched_dims(obj, sizes)
        self.periodic, base = split_boundary(options.get("boundary"), dims)
        halo = dict(zip(dims, check_halo(options.get("halo"), dims)))
        # The grid in the object's own cells: periodic dims start below their extent.
        shape = {d: obj.sizes[d] for d in dims}
        for d in self.periodic:
            width = as_positive_int(sizes[d], f"size[{d!r}]")
            if width > shape[d]:
                raise GeometryError(
                    f"size[{d!r}]={width} is larger than the periodic dim {d!r} "
                    f"({shape[d]} cells): a patch would hold some cells twice."
                )
        geometry = Geometry.build(shape, sizes, stride, base)
        starts = list(geometry.grid_starts())
        widths = {}
        for j, d in enumerate(dims):
            if d not in self.periodic:
                continue
            extent, width, step = shape[d], geometry.size[j], geometry.stride[j]
            if halo[d] > extent:
                raise GeometryError(
                    f"halo[{d!r}]={halo[d]} reaches past a whole turn of {d!r} ({extent} cells)."
                )
            starts[j] = np.arange(0, extent, step, dtype=np.int64)
            reach = max(0, int(starts[j][-1]) + width - extent)
            widths[d] = (halo[d], reach + halo[d])
        _warn_uncovered(dims, shape, geometry, starts, self.periodic)
        anchors = cartesian(starts)
        self._shift = np.array([widths.get(d, (0, 0))[0] for d in dims], dtype=np.int64)
        self._widths = widths
        self._extent = {d: shape[d] for d in self.periodic}
        self._obj = obj
        extended = padded_object(obj, widths, "wrap", None) if widths else obj
        inner = {**options, "boundary": base, "sampler": Anchors(anchors + self._shift)}
        self.patcher = Patcher(extended, sizes, stride, **inner)

    # -- the patches: those of the extended object ------------------------------------

    def __len__(self) -> int:
        return len(self.patcher)

    def __repr__(self) -> str:
        return f"<xpatch.PeriodicPatcher periodic {self.periodic!r}, {self.patcher!r}>"

    def __getitem__(self, index: int) -> xr.DataArray | xr.Dataset:
        """Patch ``index``; across the seam its labels go on past the last one."""
        return self.patcher[index]

    @property
    def obj(self) -> xr.DataArray | xr.Dataset:
        """The patched object (not extended)."""
        return self._obj

    @property
    def dims(self) -> tuple[Hashable, ...]:
        """The patched dims."""
        return self.patcher.dims

    def anchors(self) -> xr.DataArray:
        """Start index of every patch in the object's own cells (below ``N`` when periodic)."""
        return self.patcher.anchors() - xr.DataArray(self._shift, dims="dim")

    def patches(self) -> xr.DataArray | xr.Dataset:
        """All patches along a leading ``"patch"`` dim (see :meth:`xpatch.Patcher.patches`)."""
        return self.patcher.patches()

    def bounds(self) -> xr.DataArray:
        """Extent of every patch in map units (see :meth:`xpatch.Patcher.bounds`).

        Across the seam the extent goes on past the last label, as the patch's
        labels do (a patch from 337.5 to 427.5 degrees east, say).
        """
        return self.patcher.bounds()

    def transforms(self) -> xr.DataArray:
        """Affine transform of every patch (see :meth:`xpatch.Patcher.transforms`)."""
        return self.patcher.transforms()

    def to_grain(self, **options: Any) -> Any:
        """Return a Grain source of the patches (:meth:`xpatch.Patcher.to_grain`'s options)."""
        return self.patcher.to_grain(**options)

    # -- back onto the grid, folded ---------------------------------------------------

    def reconstruct(
        self, pred: xr.DataArray, reduce: str | Reduction = "mean", *, weights: Any = None
    ) -> xr.DataArray:
        """Blend ``pred`` (one result per patch) onto the object's grid, across the seam.

        ``reduce`` is ``"mean"``, ``"sum"``, ``"max"`` or ``"min"``, as
        :meth:`xpatch.Patcher.reconstruct` has them (``weights=`` for the sums).
        """
        kind = _folded_reduction(reduce)
        if kind in (MAX, MIN):
            return self._fold_extreme(self.patcher.reconstruct(pred, kind), kind)
        valid = pred.notnull().astype("float64")
        total = self.patcher.reconstruct(pred, SUM, weights=weights)
        count = self.patcher.reconstruct(valid, SUM, weights=weights)
        return self._fold_sums(total, count, kind)

    def apply(
        self,
        fn: Callable,
        batch_size: int = 64,
        *,
        reduce: str | Reduction = "mean",
        output_dims: Mapping[Hashable, int] | None = None,
        dtype: Any = None,
        **options: Any,
    ) -> xr.DataArray:
        """Run ``fn`` over every patch and blend the results across the seam.

        As :meth:`xpatch.Patcher.apply` (``fn(batch) -> batch``, lazy for lazy input,
        ``batch_size``, ``pad_batch``, ``task_memory``), for ``reduce`` ``"mean"``,
        ``"sum"``, ``"max"`` or ``"min"``. ``output_dims`` left out means that ``fn``
        keeps the input's non-patched dims.

        Examples
        --------
        >>> import numpy as np, xarray as xr, xpatch
        >>> da = xr.DataArray(np.arange(12.0), dims="lon")
        >>> p = da.patch(lon=5, stride=3, boundary="periodic")
        >>> bool((p.apply(lambda batch: batch * 2) == da * 2).all())
        True
        """
        kind = _folded_reduction(reduce)
        refused = [o for o in ("out_dtype", "nodata", "scale", "weights") if o in options]
        if refused:
            raise OptionError(
                f"{refused[0]}= is not taken by apply with periodic dims (yet); blend the "
                "result first, then cast or mask it."
            )
        if kind in (MAX, MIN):
            out = self.patcher.apply(
                fn, batch_size, reduce=kind, output_dims=output_dims, dtype=dtype, **options
            )
            return self._fold_extreme(out, kind)

        def with_validity(batch: np.ndarray) -> dict[str, np.ndarray]:
            result = np.asarray(fn(batch))
            valid = np.isfinite(result) if result.dtype.kind in "fc" else np.ones(result.shape)
            return {"value": result, "valid": valid.astype(np.float64)}

        dims = {"value": output_dims, "valid": output_dims}
        dtypes = {"value": dtype if dtype is not None else "float64", "valid": "float64"}
        sums = self.patcher.apply(
            with_validity, batch_size, reduce=SUM, output_dims=dims, dtype=dtypes, **options
        )
        return self._fold_sums(sums["value"], sums["valid"], kind)

    def _fold(self, values: xr.DataArray, combine: Callable) -> xr.DataArray:
        # Every cell past the object's extent onto the cell it repeats; labels the object's.
        for d in self.periodic:
            if d not in values.dims:
                continue
            before, after = self._widths[d]
            extent = self._extent[d]
            home = values.isel({d: slice(before, before + extent)})
            # Past the seam, the patches' windows reach `after - before` cells (the halo
            # beyond is read, never kept).
            past = values.isel({d: slice(before + extent, extent + after)})
            if past.sizes[d]:
                head = combine(home.isel({d: slice(0, past.sizes[d])}), past)
                home = xr.concat([head, home.isel({d: slice(past.sizes[d], None)})], dim=d)
            values = home.assign_coords({d: self._obj[d]} if d in self._obj.coords else {})
        return values

    def _fold_sums(self, total: xr.DataArray, count: xr.DataArray, kind: Reduction) -> xr.DataArray:
        # A cell no valid result reaches sums to NaN: it adds nothing across the seam.
        count = count.fillna(0.0)
        total = total.where(count > 0, 0.0)
        total = self._fold(total, _add)
        count = self._fold(count, _add)
        if kind is MEAN:
            return (total / count).where(count > 0)
        return total.where(count > 0)

    def _fold_extreme(self, values: xr.DataArray, kind: Reduction) -> xr.DataArray:
        return self._fold(values, _fmax if kind is MAX else _fmin)


def _warn_uncovered(dims, shape, geometry: Geometry, starts: list, periodic: list) -> None:
    # As a grid elsewhere warns: cells no patch covers come back NaN (a stride > size).
    covered = 1
    for d, width, axis_starts in zip(dims, geometry.size, starts):
        if d in periodic:
            cells = (axis_starts[:, None] + np.arange(width)[None, :]) % shape[d]
            covered *= len(np.unique(cells))
        else:
            covered *= covered_cells(shape[d], width, axis_starts)
    total = int(np.prod([shape[d] for d in dims]))
    if covered < total:
        warnings.warn(
            f"{total - covered} of {total} cells along {list(dims)!r} are covered by no "
            f"patch (size={dict(zip(dims, geometry.size))}, "
            f"stride={dict(zip(dims, geometry.stride))}); they reconstruct to NaN. Use a "
            "stride <= size to cover every cell.",
            UncoveredCellsWarning,
            stacklevel=4,
        )


def _folded_reduction(reduce: object) -> Reduction:
    kind = as_reduction(reduce)
    if kind not in _FOLDED:
        names = [r.name for r in _FOLDED]
        raise OptionError(
            f"reduce={reduce!r} with periodic dims: use one of {names} (votes and argmax "
            "across the seam are not built yet)."
        )
    return kind


def _aligned(home: xr.DataArray, past: xr.DataArray) -> xr.DataArray:
    # The cells past the seam, labelled as the cells they repeat.
    return past.assign_coords({d: home[d] for d in home.dims if d in home.coords})


def _add(home: xr.DataArray, past: xr.DataArray) -> xr.DataArray:
    return home + _aligned(home, past)


def _fmax(home: xr.DataArray, past: xr.DataArray) -> xr.DataArray:
    return xr.apply_ufunc(np.fmax, home, _aligned(home, past), dask="allowed")


def _fmin(home: xr.DataArray, past: xr.DataArray) -> xr.DataArray:
    return xr.apply_ufunc(np.fmin, home, _aligned(home, past), dask="allowed")
