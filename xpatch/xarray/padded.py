"""An xarray object padded along some dims, lazily, as numpy.pad pads an array.

What a layout with a halo, or with one pad mode per dim, reads its patches from
(:func:`~xpatch.xarray.layout.grown_layout`): :func:`padded_object` pads every
variable along the dims it has, labels extended at their step
(:func:`padded_labels`) and a raster's transform moved with its first cell.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TypeVar

import numpy as np
import xarray as xr

from xpatch.core.errors import GeometryError
from xpatch.core.padding import PadMode
from xpatch.xarray.georef import raster_dims, transform_of, with_transform
from xpatch.xarray.variables import is_dask_backed, pad_value_for

T = TypeVar("T", xr.DataArray, xr.Dataset)


def padded_object(
    obj: T,
    widths: Mapping[Hashable, tuple[int, int]],
    mode: PadMode | Mapping[Hashable, PadMode],
    fill,
) -> T:
    """Return ``obj`` with its variables padded by ``widths`` cells, labels extended.

    Repeating modes gather the cells that ``numpy.pad`` would repeat (``isel`` with
    the index numpy pads its ``arange`` into: lazy for dask and for files, and right
    for widths past the extent, where ``dask.array.pad`` is not); ``"constant"``
    pads with the fill. A file opened without dask is read by dask's chunks, never
    whole. A raster's transform moves with its first cell.
    """

    def pad(var: xr.DataArray) -> xr.DataArray:
        own = {d: w for d, w in widths.items() if d in var.dims}
        if not own:
            return var
        # Lazily indexed (a file opened without chunks): pad through dask, else it loads.
        if not is_dask_backed(var) and not var.variable._in_memory:
            var = var.chunk("auto")
        for d, (before, after) in own.items():
            if not before and not after:
                continue
            dim_mode = mode.get(d, "constant") if isinstance(mode, Mapping) else mode
            if dim_mode == "constant":
                value = pad_value_for(fill, var.dtype, var.name)
                var = var.pad({d: (before, after)}, mode="constant", constant_values=value)
                continue
            # Only the new cells are gathered, beside the array as it is: its chunks
            # stay the input's, and an edge's cells come from the chunk at that edge.
            n = var.sizes[d]
            index = np.pad(np.arange(n), (before, after), mode=dim_mode)
            parts = [var.isel({d: index[:before]}), var, var.isel({d: index[before + n :]})]
            var = xr.concat([part for part in parts if part.sizes[d]], dim=d)
        return var

    # The labels along the padded dims are extended below, not padded with NaN.
    bare = obj.drop_vars([d for d in widths if d in obj.coords])
    if isinstance(bare, xr.DataArray):
        padded = pad(bare)
    else:
        padded = xr.Dataset({name: pad(bare[name]) for name in bare.data_vars}, attrs=bare.attrs)
        for name in bare.coords:  # those no data variable carries
            if name not in padded.coords:
                padded = padded.assign_coords({name: pad(bare[name].reset_coords(drop=True))})
    coords = {}
    for d, (before, after) in widths.items():
        if d in obj.coords and obj[d].ndim == 1:
            coords[d] = (d, padded_labels(obj[d].values, before, after), obj[d].attrs)
    padded = padded.assign_coords(coords)
    try:
        transform, raster = transform_of(obj), raster_dims(obj)
    except GeometryError:  # irregular labels: no transform to move, the labels say it all
        transform, raster = None, None
    if transform is not None and raster is not None:
        rows, cols = (widths.get(d, (0, 0))[0] for d in raster)
        a, b, c, d_, e, f = transform
        padded = with_transform(
            padded, (a, b, c - a * cols - b * rows, d_, e, f - d_ * cols - e * rows)
        )
    return padded


def padded_labels(values: np.ndarray, before: int, after: int) -> np.ndarray:
    """Return ``values`` with ``before`` and ``after`` labels more, at the end steps.

    Examples
    --------
    >>> padded_labels(np.array([10.0, 20.0, 40.0]), 2, 1).tolist()
    [-10.0, 0.0, 10.0, 20.0, 40.0, 60.0]
    """
    numeric = np.issubdtype(values.dtype, np.number) or np.issubdtype(values.dtype, np.datetime64)
    if len(values) >= 2 and numeric:
        first, last = values[1] - values[0], values[-1] - values[-2]
        head = values[0] - first * np.arange(before, 0, -1)
        tail = values[-1] + last * np.arange(1, after + 1)
        return np.concatenate([head, values, tail])
    fill = np.array([None], dtype=object)
    return np.concatenate([np.repeat(fill, before), values.astype(object), np.repeat(fill, after)])
