"""Which variables of a DataArray or Dataset are patched, how they are backed, and read.

Shared by the patcher, its views, reconstruction and the Grain source: the
patched variables, the chunk grid a patcher plans on, the bytes of a patch, and
the one pass over the data that ``min_valid`` needs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Hashable, Mapping, Sequence

import dask.array as da
import numpy as np
import xarray as xr
from dask.base import tokenize

from xpatch.cf import valid_cells
from xpatch.core.geometry import Geometry
from xpatch.core.plan import ChunkGrid, auto_grid
from xpatch.core.validity import window_sums

#: A validity pass taking longer than this many seconds shows dask's progress bar.
PROGRESS_AFTER_SECONDS = 5.0


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


def plan_grid(variables: Mapping[Hashable, xr.Variable], dims, shape) -> ChunkGrid:
    """Return the chunk grid to plan on: the input's dask chunks, else dask's auto chunks.

    Per patched dim, the chunks of the first dask-backed variable that has it
    (one chunk where none has); for input in memory, the grid that
    ``chunks="auto"`` would give the largest variable.
    """
    chunks: dict[Hashable, tuple[int, ...]] = {}
    for var in variables.values():
        if is_dask_backed(var):
            for d in dims:
                if d in var.dims and d not in chunks:
                    chunks[d] = var.chunks[var.dims.index(d)]
    if chunks:
        return ChunkGrid.from_chunks([chunks.get(d, (n,)) for d, n in zip(dims, shape)])
    largest = max(variables.values(), key=lambda v: v.size * v.dtype.itemsize)
    carried = math.prod(n for d, n in largest.sizes.items() if d not in dims)
    return auto_grid(shape, carried, largest.dtype)


def patch_bytes(var: xr.Variable, size: Mapping[Hashable, int]) -> int:
    """Bytes of one patch of ``var`` (patch extents along the patched dims it has)."""
    return math.prod(size.get(d, n) for d, n in var.sizes.items()) * var.dtype.itemsize


def valid_fraction(
    variables: Mapping[Hashable, xr.Variable], geometry: Geometry, anchors: np.ndarray
) -> np.ndarray:
    """Fraction of valid (not NaN, not nodata) cells in each patch: the ``min_valid`` pass.

    Reads every variable once (one dask computation for dask input, with dask's
    progress bar when it takes longer than :data:`PROGRESS_AFTER_SECONDS`).
    Cells past the array's edge count as invalid.
    """
    from dask.diagnostics import ProgressBar

    dims = geometry.dims
    counts = 0
    per_patch = 0
    for var in variables.values():
        present = [d for d in dims if d in var.dims]
        carried = [d for d in var.dims if d not in dims]
        valid = valid_cells(var).sum(carried).transpose(*present)
        # A variable without some patched dims is the same along them.
        valid = valid.expand_dims({d: n for d, n in zip(dims, geometry.shape) if d not in present})
        counts = counts + valid.transpose(*dims).data
        per_cell = math.prod(var.sizes[d] for d in carried)
        per_patch += per_cell * math.prod(geometry.size)
    with ProgressBar(minimum=PROGRESS_AFTER_SECONDS):
        inside = window_sums(counts, anchors, geometry.size)
    return inside / per_patch
