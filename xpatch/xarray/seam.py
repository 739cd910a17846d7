"""Blending across a periodic dim's seam: the patches and their wrapped copies.

A patch that runs past the end of a periodic dim goes on with its first cells.
Its result is blended twice (:func:`~xpatch.core.geometry.wrapped_copies`): at its
anchor, where the cells past the end fall off, and a turn back, where the cells
before the start fall off and the rest land on the first cells. Overlap-add of
the patches and their copies, cropped to the grid, is then the periodic blend of
*every* reduction (mean, sum, max, min, vote, argmax), with weights, at any scale
and through every ``apply`` option: each value lands once on its own cell and
every reduction combines as it does anywhere else.

The blend runs on the object itself: a copy starts before the grid (a negative
anchor) and is read through the wrapped indices like any window past the seam;
every blend crops patches to the grid.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import xarray as xr

from xpatch.core.dask_arrays import is_dask_array
from xpatch.core.plan import Plan
from xpatch.xarray.apply import ApplyOptions, BatchFunction
from xpatch.xarray.apply import apply as apply_layout
from xpatch.xarray.layout import Layout, grown_layout, layout_of
from xpatch.xarray.reconstruct import prediction_rows
from xpatch.xarray.reconstruct import reconstruct as reconstruct_layout
from xpatch.xarray.views import PATCH_DIM, patch_rows


@dataclass(frozen=True)
class SeamBlend:
    """A periodic layout's blend: the extended layout, the copies' rows and the crop.

    Attributes
    ----------
    layout
        The layout whose anchors are the patches' (in their order) then their
        copies' (a turn back: before the grid).
    rows
        The patch each copy repeats.
    """

    layout: Layout
    rows: np.ndarray

    @classmethod
    def of(cls, layout: Layout) -> SeamBlend:
        """Build the blend of a layout with periodic dims."""
        g = layout.geometry
        anchors = layout.plan.anchors
        rows, copies = g.seam_copies(anchors)
        if not len(copies):
            return cls(layout, rows)
        every = np.concatenate([anchors, copies])
        # The copies start before the grid (negative anchors): the blend crops every
        # patch to the grid, so the part a patch runs past the seam lands at the start.
        plan = Plan.compile(
            every, layout.plan.grid, g.size, keep_order=True, max_group=_group_limit(layout)
        )
        blend = replace(layout, plan=plan, grown=None)
        if layout.grown is not None:
            blend = replace(blend, grown=grown_layout(blend))
        return cls(blend, rows)

    def expand(self, values: Any) -> Any:
        """Return ``values`` (a row per patch: ``"patch"`` or axis 0) and the copies' rows."""
        if not len(self.rows):
            return values
        if isinstance(values, xr.DataArray | xr.Dataset):
            if PATCH_DIM not in values.dims:
                return values
            return xr.concat([values, values.isel({PATCH_DIM: self.rows})], dim=PATCH_DIM)
        if is_dask_array(values):
            import dask.array as da

            return da.concatenate([values, values[self.rows]], axis=0)
        array = np.asarray(values)
        if array.ndim == 0:  # not per patch: refused, or taken, by the verb as it is
            return values
        return np.concatenate([array, array[self.rows]], axis=0)


def _group_limit(layout: Layout) -> int:
    # The copies' groups are no larger than the patches' (a task's bytes stay bounded).
    return max((stop - start for start, stop in layout.plan.groups), default=1)


def in_layout_order(layout: Layout, pred: Any, weights: Any) -> tuple[Any, Any]:
    """Return ``pred`` and its ``weights`` with their rows in the layout's order.

    Predictions gathered out of order carry their anchors; the weights, taken row for
    row with them, move with them.
    """
    if not isinstance(pred, xr.DataArray | xr.Dataset) or PATCH_DIM not in pred.dims:
        return pred, weights
    first = pred if isinstance(pred, xr.DataArray) else _first_patched(pred)
    rows, _ = prediction_rows(layout, first, "pred")
    if rows is not None:
        pred = pred.isel({PATCH_DIM: rows})
        weights = patch_rows(weights, pred.sizes[PATCH_DIM], rows)
    anchors = [f"{d}_anchor" for d in layout.dims]
    return pred.drop_vars([c for c in anchors if c in pred.coords]), weights


def _first_patched(ds: xr.Dataset) -> xr.DataArray:
    return next(v for v in ds.data_vars.values() if PATCH_DIM in v.dims)


def reconstruct_across(
    laid: Any, pred: Any, reduce: Any, *, weights: Any = None, scale: Any = None
) -> Any:
    """:func:`~xpatch.xarray.reconstruct.reconstruct` of a layout with periodic dims."""
    layout = layout_of(laid)
    blend = SeamBlend.of(layout)
    if not len(blend.rows):  # no patch crosses a seam: the blend of the patches alone
        return reconstruct_layout(layout, pred, reduce, weights=weights, scale=scale)
    pred, weights = in_layout_order(layout, pred, weights)
    pred = blend.expand(pred)
    weights = None if weights is None else blend.expand(weights)
    return reconstruct_layout(blend.layout, pred, reduce, weights=weights, scale=scale)


def apply_across(laid: Any, fn: BatchFunction, options: ApplyOptions) -> Any:
    """:func:`~xpatch.xarray.apply.apply` of a layout with periodic dims.

    The copies go through ``fn`` too (a patch past the seam is computed twice):
    ``fn`` must be deterministic, as overlap-add of its results assumes anyway.
    """
    layout = layout_of(laid)
    blend = SeamBlend.of(layout)
    if not len(blend.rows):
        return apply_layout(layout, fn, options)
    if options.weights is not None and not isinstance(options.weights, str):
        weights = options.weights
        if isinstance(weights, xr.DataArray):
            weights = weights.data
        options = replace(options, weights=blend.expand(np.asarray(weights)))
    return apply_layout(blend.layout, fn, options)
