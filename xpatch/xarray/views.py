"""Patches as xarray objects: one patch with its own labels, or the whole stack.

The views of a :class:`~xpatch.Patcher`: every patched variable is cut along
the patched dims it has (:func:`extract_variable`), coordinates that span the
patched dims are cut alongside, and one patch carries its own transform.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import xarray as xr

from xpatch.core.errors import GeometryError
from xpatch.core.extract import extract_dask, extract_numpy
from xpatch.core.plan import ChunkGrid, Plan
from xpatch.xarray.georef import grid_mapping_name, patch_transforms, to_gdal, with_transform
from xpatch.xarray.layout import Layout
from xpatch.xarray.variables import (
    is_dask_backed,
    pad_value_for,
    patched_columns,
)

PATCH_DIM = "patch"


def patch_rows(values: Any, count: int, rows: np.ndarray | slice) -> Any:
    """Return ``rows`` of per-patch ``values``; values that are not per patch as given.

    Per patch: a ``"patch"`` dim of ``count`` patches, or a first axis of ``count``
    (per-patch or per-cell weights, predictions). Anything else (one weight for
    all, a name) passes unchanged, for the verb to take or refuse.

    Examples
    --------
    >>> patch_rows(np.arange(6).reshape(3, 2), 3, np.array([2, 0])).tolist()
    [[4, 5], [0, 1]]
    >>> patch_rows(np.ones(2), 3, slice(0, 1)).tolist()
    [1.0, 1.0]
    """
    if values is None:
        return None
    if isinstance(values, xr.DataArray | xr.Dataset):
        return values.isel({PATCH_DIM: rows}) if values.sizes.get(PATCH_DIM) == count else values
    shape = getattr(values, "shape", None)
    if shape is None:
        shape = np.shape(values)
    if len(shape) and shape[0] == count:
        return (values if hasattr(values, "shape") else np.asarray(values))[rows]
    return values


def extended_labels(values: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Coordinate labels at ``positions``, extrapolated at the end steps outside the array.

    A halo's window starts before the array, and a padded patch ends past it:
    their labels go on at the step of the labels' first (or last) two.

    Examples
    --------
    >>> extended_labels(np.array([0.0, 10.0, 20.0]), np.arange(-1, 4)).tolist()
    [-10.0, 0.0, 10.0, 20.0, 30.0]
    """
    positions = np.asarray(positions, dtype=np.int64)
    n = len(values)
    inside = (positions >= 0) & (positions < n)
    if inside.all():
        return values[positions]
    numeric = np.issubdtype(values.dtype, np.number) or np.issubdtype(values.dtype, np.datetime64)
    if n >= 2 and numeric:
        first, last = values[1] - values[0], values[-1] - values[-2]
        clipped = np.clip(positions, 0, n - 1)
        before = np.minimum(positions, 0)
        after = np.maximum(positions - (n - 1), 0)
        return values[clipped] + first * before + last * after
    out = np.full(len(positions), None, dtype=object)
    out[inside] = values[positions[inside]]
    return out


def extract_variable(
    layout: Layout,
    var: xr.Variable,
    anchors: np.ndarray | None,
    pad_value: Any,
    padded: bool = True,
) -> Any:
    """Stack the patches of one variable along the patched dims it has.

    ``anchors=None`` cuts every patch of the plan (lazily, group by group, for
    dask input); otherwise the patches at ``anchors`` (a few: ``p[i]``).
    Returns ``(n, *var.shape)`` with the patched axes at patch size, cells
    outside the array filled as the layout's pad modes say (``padded=False``:
    with ``pad_value``, as a coordinate is).
    """
    columns, axes = patched_columns(var, layout.dims)
    pad_mode = layout.axis_pad_modes(columns) if padded else "constant"
    size = [layout.geometry.size[j] for j in columns]
    pad_value = pad_value_for(pad_value, var.dtype)
    if anchors is None:
        plan = layout.plan.project(columns)
    else:
        grid = ChunkGrid.from_chunks(
            [var.chunks[ax] if var.chunks else (var.shape[ax],) for ax in axes]
        )
        plan = Plan.compile(anchors[:, columns], grid, size, keep_order=True)
    if is_dask_backed(var):
        return extract_dask(var.data, axes, plan, pad_value, pad_mode)
    return extract_numpy(np.asarray(var.data), axes, plan.anchors, size, pad_value, pad_mode)


def cut(windows: Layout, anchors: np.ndarray | None) -> Any:
    """Return the patches at ``anchors`` (one, unstacked), or all of them stacked (``None``).

    ``anchors`` are the windows' starts; the patches are read as
    ``windows.reading`` reads them (grown by a halo), and ``{dim}_anchor`` says
    the windows' starts.
    """
    layout = windows.reading
    obj = layout.obj
    dims = set(layout.dims)
    stacked = anchors is None
    at = layout.plan.anchors if stacked else windows.read_anchors(anchors)

    def place(var: xr.Variable, data: Any) -> xr.Variable:
        if stacked:
            return xr.Variable((PATCH_DIM, *var.dims), data, var.attrs)
        return xr.Variable(var.dims, data[0], var.attrs)

    read = None if stacked else at
    variables: dict[Hashable, xr.Variable] = {
        name: place(var, extract_variable(layout, var, read, layout.pad_value))
        for name, var in layout.variables.items()
    }
    coords: dict[Hashable, Any] = {}
    for name, coord in obj.coords.items():
        if not dims & set(coord.dims):
            coords[name] = coord.variable
        elif name in dims and stacked:
            column = at[:, layout.dims.index(name)]
            starts = extended_labels(coord.values, column)
            coords[f"{name}_start"] = (PATCH_DIM, starts, coord.attrs)
        elif name in dims:
            start = int(at[0, layout.dims.index(name)])
            positions = np.arange(start, start + layout.size[name])
            labels = extended_labels(coord.values, positions)
            coords[name] = xr.Variable(name, labels, coord.attrs)
        else:
            # Coordinates keep the constant fill: a reflected latitude would say the
            # padded cells are somewhere they are not.
            coords[name] = place(
                coord.variable, extract_variable(layout, coord.variable, read, None, padded=False)
            )
    transforms = None
    if grid_mapping_name(obj) is not None:
        try:
            transforms = patch_transforms(obj, layout.dims, at)
        except GeometryError:  # irregular labels: no single transform to carry
            transforms = None
    if stacked:
        for j, d in enumerate(layout.dims):
            coords[f"{d}_anchor"] = (PATCH_DIM, windows.plan.anchors[:, j].copy())
        if transforms is not None:
            coords["geotransform"] = (PATCH_DIM, [to_gdal(t) for t in transforms])
    if isinstance(obj, xr.DataArray):
        (data,) = variables.values()
        result = xr.DataArray(data, coords=coords, name=obj.name, attrs=obj.attrs)
    else:
        for name, var in obj.data_vars.items():
            variables.setdefault(name, var.variable)
        ordered = {name: variables[name] for name in obj.data_vars}
        result = xr.Dataset(ordered, coords=coords, attrs=obj.attrs)
    if not stacked and transforms is not None:
        # One patch: its grid mapping says where it is, as rioxarray's isel_window does.
        result = with_transform(result, tuple(transforms[0].tolist()))
    return result
