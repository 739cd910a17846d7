"""Which variables of a DataArray or Dataset are patched, and how they are backed.

Shared by the patcher, its views, reconstruction and the Grain source.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Sequence

import dask.array as da
import numpy as np
import xarray as xr
from dask.base import tokenize


def is_dask_backed(var: xr.Variable) -> bool:
    """Whether ``var`` holds a dask array, asked without loading lazily opened data.

    ``Variable.data`` reads a lazily opened (unchunked) file variable whole;
    ``chunks`` is None for it and does not read.
    """
    return var.chunks is not None and isinstance(var.data, da.Array)


def patched_variables(
    obj: xr.DataArray | xr.Dataset, dims: Sequence[Hashable]
) -> dict[Hashable, xr.Variable]:
    """Return the data variables that have at least one patched dim.

    A Dataset's variable with only some of the patched dims is patched along
    those (a static ``mask(lat, lon)`` beside ``t2m(time, lat, lon)``); one with
    none of them is carried whole.

    Examples
    --------
    >>> ds = xr.Dataset({"t": (("time", "y"), np.zeros((2, 3))), "c": ("time", [0, 1])})
    >>> list(patched_variables(ds, ["y"]))
    ['t']
    """
    if isinstance(obj, xr.DataArray):
        return {obj.name: obj.variable}
    return {name: var.variable for name, var in obj.data_vars.items() if set(dims) & set(var.dims)}


def patched_columns(var: xr.Variable, dims: Sequence[Hashable]) -> tuple[list[int], list[int]]:
    """Return the patched dims ``var`` has: their positions in ``dims`` and their axes in ``var``.

    Examples
    --------
    >>> patched_columns(xr.Variable(("x", "b", "y"), np.zeros((1, 1, 1))), ["y", "x", "t"])
    ([0, 1], [2, 0])
    """
    columns = [j for j, d in enumerate(dims) if d in var.dims]
    return columns, [var.dims.index(dims[j]) for j in columns]


def data_token(var: xr.Variable) -> str:
    """Return a deterministic token of a variable's values, never reading a lazy file whole.

    Dask arrays are named by their graph, in-memory arrays by their bytes. A file
    variable opened without dask chunks is identified by its source file (path and
    modification time), shape and dtype: hashing its values would read it whole.
    Attributes are left out: editing metadata does not change the values.
    """
    if is_dask_backed(var):
        return var.data.name
    if getattr(var, "_in_memory", True):
        return tokenize(np.asarray(var.values))
    source = var.encoding.get("source")
    modified = os.stat(source).st_mtime_ns if source and os.path.exists(source) else None
    return tokenize(type(var._data).__name__, source, modified, var.shape, str(var.dtype))
