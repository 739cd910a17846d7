"""Blending across a periodic dim's seam: the patches and their wrapped copies.

A patch that runs past the end of a periodic dim goes on with its first cells.
Its result is blended twice (:func:`~xpatch.core.geometry.wrapped_copies`): at its
anchor, where the cells past the end fall off, and a turn back, where the cells
before the start fall off and the rest land on the first cells. Overlap-add of
the patches and their copies, cropped to the grid, is then the periodic blend of
*every* reduction (mean, sum, max, min, vote, argmax), with weights, at any scale
and through every ``apply`` option: each value lands once on its own cell and
every reduction combines as it does anywhere else.

The blend runs on the object extended along its periodic dims by the cells the
copies and the halo reach, repeated from the other side (as a read with
``pad_mode="wrap"`` would see them), then is cropped back to the object's cells.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr

from xpatch.core.geometry import wrapped_copies
from xpatch.xarray.apply import ApplyOptions, BatchFunction
from xpatch.xarray.apply import apply as apply_layout
from xpatch.xarray.georef import grid_mapping_name, transform_of, with_transform
from xpatch.xarray.layout import Layout, layout_of
from xpatch.xarray.padded import padded_object
from xpatch.xarray.reconstruct import prediction_rows
from xpatch.xarray.reconstruct import reconstruct as reconstruct_layout
from xpatch.xarray.views import PATCH_DIM


@dataclass(frozen=True)
class SeamBlend:
    """A periodic layout's blend: the extended layout, the copies' rows and the crop.

    Attributes
    ----------
    layout
        The layout over the object extended along the periodic dims, whose
        anchors are the patches' (in their order) then their copies'.
    rows
        The patch each copy repeats.
    before
        Cells added before the start of each periodic dim.
    """

    layout: Layout
    rows: np.ndarray
    before: dict[Hashable, int]

    @classmethod
    def of(cls, layout: Layout) -> SeamBlend:
        """Build the blend of a layout with periodic dims."""
        g = layout.geometry
        axes = g.periodic_axes
        anchors = layout.plan.anchors
        rows, copies = wrapped_copies(anchors, g.size, g.shape, axes)
        every = np.concatenate([anchors, copies]) if len(copies) else anchors
        widths, before = {}, {}
        for j in axes:
            d, n, h = g.dims[j], g.shape[j], layout.halo[j]
            low = int(max(0, -every[:, j].min())) if len(every) else 0
            high = int(max(0, (every[:, j] + g.size[j]).max() - n)) if len(every) else 0
            widths[d] = (low + h, high + h)
            before[d] = low + h
        extended = padded_object(layout.obj, widths, "wrap", None)
        shift = np.array([before.get(d, 0) for d in g.dims], dtype=np.int64)
        # The extended object has no seam left: its periodic dims end there.
        ended = {
            d: "shift" if g.wraps(j) else m for j, (d, m) in enumerate(zip(g.dims, g.boundaries))
        }
        blend = layout.over(
            extended, every + shift, boundary=ended, pad_mode=_ended_pad_mode(layout)
        )
        return cls(blend, rows, before)

    def expand(self, values: Any) -> Any:
        """Return ``values`` (a row per patch: ``"patch"`` or axis 0) and the copies' rows."""
        if not len(self.rows):
            return values
        if isinstance(values, xr.DataArray | xr.Dataset):
            if PATCH_DIM not in values.dims:
                return values
            return xr.concat([values, values.isel({PATCH_DIM: self.rows})], dim=PATCH_DIM)
        if isinstance(values, da.Array):
            return da.concatenate([values, values[self.rows]], axis=0)
        array = np.asarray(values)
        if array.ndim == 0:  # not per patch: refused, or taken, by the verb as it is
            return values
        return np.concatenate([array, array[self.rows]], axis=0)

    def crop(self, result: Any, extended: Layout, original: Layout) -> Any:
        """Return ``result``, on the extended grid, cropped to the object's cells (any scale)."""
        if isinstance(result, dict):
            return {k: self.crop(v, extended, original) for k, v in result.items()}
        crop = {}
        for d, low in self.before.items():
            if d not in result.dims:
                continue
            factor = Fraction(result.sizes[d], extended.obj.sizes[d])  # the output's scale
            first, stop = low * factor, (low + original.obj.sizes[d]) * factor
            crop[d] = slice(math.floor(first), math.floor(stop))
        out = result.isel(crop)
        for d in crop:
            if out.sizes[d] == original.obj.sizes[d] and d in original.obj.coords:
                out = out.assign_coords({d: original.obj[d]})
        if grid_mapping_name(out) is not None:
            transform = transform_of(out)
            if transform is not None:
                out = with_transform(out, transform)
        return out


def _ended_pad_mode(layout: Layout) -> Any:
    # The extended object has no seam left to read across: its periodic dims end.
    mode = layout.pad_mode
    if not isinstance(mode, dict):
        return mode
    periodic = set(layout.periodic)
    ended = {d: m for d, m in mode.items() if d not in periodic}
    modes = set(ended.values())
    if len(modes) <= 1:
        return modes.pop() if modes else "constant"
    return ended


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
        weights = _rows_of(weights, rows, pred.sizes[PATCH_DIM])
    anchors = [f"{d}_anchor" for d in layout.dims]
    return pred.drop_vars([c for c in anchors if c in pred.coords]), weights


def _rows_of(weights: Any, rows: np.ndarray, count: int) -> Any:
    # Per-patch or per-cell weights (a patch dim, or axis 0 of the patches' count).
    if weights is None:
        return None
    if isinstance(weights, xr.DataArray | xr.Dataset):
        return weights.isel({PATCH_DIM: rows}) if PATCH_DIM in weights.dims else weights
    shape = getattr(weights, "shape", np.shape(weights))
    return weights[rows] if len(shape) and shape[0] == count else weights


def _first_patched(ds: xr.Dataset) -> xr.DataArray:
    return next(v for v in ds.data_vars.values() if PATCH_DIM in v.dims)


def reconstruct_across(
    laid: Any, pred: Any, reduce: Any, *, weights: Any = None, scale: Any = None
) -> Any:
    """:func:`~xpatch.xarray.reconstruct.reconstruct` of a layout with periodic dims."""
    layout = layout_of(laid)
    blend = SeamBlend.of(layout)
    pred, weights = in_layout_order(layout, pred, weights)
    pred = blend.expand(pred)
    weights = None if weights is None else blend.expand(weights)
    out = reconstruct_layout(blend.layout, pred, reduce, weights=weights, scale=scale)
    return blend.crop(out, blend.layout, layout)


def apply_across(laid: Any, fn: BatchFunction, options: ApplyOptions) -> Any:
    """:func:`~xpatch.xarray.apply.apply` of a layout with periodic dims.

    The copies go through ``fn`` too (a patch past the seam is computed twice):
    ``fn`` must be deterministic, as overlap-add of its results assumes anyway.
    """
    layout = layout_of(laid)
    blend = SeamBlend.of(layout)
    if options.weights is not None and not isinstance(options.weights, str):
        weights = options.weights
        if isinstance(weights, xr.DataArray):
            weights = weights.data
        options = replace(options, weights=blend.expand(np.asarray(weights)))
    out = apply_layout(blend.layout, fn, options)
    return blend.crop(out, blend.layout, layout)
