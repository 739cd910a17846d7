"""Which variables of a DataArray or Dataset are patched, how they are backed, and read.

Shared by the patcher, its views, reconstruction and the Grain source: the
patched variables, the chunk grid a patcher plans on, the bytes of a patch, the
one pass over the data that ``min_valid`` needs, and the dtype checks: which
values weighted overlap-add can blend (:func:`check_blendable`) and which pad
values a variable can hold (:func:`pad_value_for`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Hashable, Mapping, Sequence

import numpy as np
import pandas as pd
import xarray as xr
from dask.base import tokenize

from xpatch.core.dask_arrays import is_dask_array
from xpatch.core.errors import OptionError, PredictionError, XPatchError
from xpatch.core.extract import check_pad_value
from xpatch.core.geometry import Geometry
from xpatch.core.plan import ChunkGrid, auto_grid
from xpatch.core.validity import window_sums
from xpatch.xarray.encoding import valid_cells

#: Wrappers xarray puts around a zarr array it opened and did not decode (no scale,
#: offset or fill value to mask): reading under them changes nothing. The outermost
#: is dask's adapter when opened with dask chunks, else the in-memory cache (until it
#: holds the values), or none (``cache=False``).
_OUTER_WRAPPERS = ("ImplicitToExplicitIndexingAdapter", "MemoryCachedArray")
_PLAIN_WRAPPERS = ("CopyOnWriteArray", "LazilyIndexedArray")

#: A validity pass taking longer than this many seconds shows dask's progress bar.
PROGRESS_AFTER_SECONDS = 5.0


def is_dask_backed(var: xr.Variable) -> bool:
    """Whether ``var`` holds a dask array, asked without loading lazily opened data.

    ``Variable.data`` reads a lazily opened (unchunked) file variable whole;
    ``chunks`` is None for it and does not read.
    """
    return var.chunks is not None and is_dask_array(var.data)


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


def zarr_array_under(stored: object) -> object | None:
    """Return the zarr array that xarray's lazy ``stored`` reads unchanged, or None.

    ``stored`` is what a dask array's chunks are sliced from
    (:func:`~xpatch.core.chunk_cache.stored_array`), or the ``_data`` of a variable
    opened without dask chunks. None when anything between them changes the values
    or the indexing: CF decoding (a scale, an offset, a fill value to mask), a lazy
    selection, another backend, values already held in memory.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> from zarr.storage import MemoryStore
    >>> from xpatch.core.chunk_cache import stored_array
    >>> store = MemoryStore()
    >>> _ = xr.Dataset({"v": ("x", np.arange(8.0))}).to_zarr(store, consolidated=False)
    >>> lazy = xr.open_zarr(store, consolidated=False)["v"].data
    >>> type(zarr_array_under(stored_array(lazy))).__name__
    'Array'
    >>> unchunked = xr.open_zarr(store, consolidated=False, chunks=None)["v"].variable
    >>> type(zarr_array_under(unchunked._data)).__name__
    'Array'
    """
    node = stored
    if type(node).__name__ in _OUTER_WRAPPERS:
        node = getattr(node, "array", None)
    for name in _PLAIN_WRAPPERS:
        if type(node).__name__ != name:
            return None
        if name == "LazilyIndexedArray":
            key = getattr(node.key, "tuple", None)
            if key is None or any(k != slice(None) for k in key):
                return None
        node = getattr(node, "array", None)
    if type(node).__name__ != "ZarrArrayWrapper" or not hasattr(node, "get_array"):
        return None
    array = node.get_array()
    if getattr(array, "dtype", None) != node.dtype or array.shape != node.shape:
        return None  # xarray casts it (strings, for one)
    return array


def data_token(var: xr.Variable) -> str:
    """Return a deterministic token of a variable's values, never reading a lazy file whole.

    Dask arrays are named by their graph, in-memory arrays by their values in C
    order, whatever their memory layout (dask hashes the bytes as they lie, so a
    Fortran-order copy, e.g. from pandas, would name other values). A file
    variable opened without dask chunks is identified by its source file (path and
    modification time), shape and dtype: hashing its values would read it whole.
    Attributes are left out: editing metadata does not change the values.
    """
    if is_dask_backed(var):
        return var.data.name
    if getattr(var, "_in_memory", True):
        return tokenize(np.asarray(var.values, order="C"))
    stored = zarr_array_under(var._data)
    if stored is not None:  # a zarr read directly: its store names it (a memory store by id)
        root = getattr(stored.store_path.store, "root", None)
        modified = os.stat(root).st_mtime_ns if root is not None and os.path.exists(root) else None
        return tokenize("zarr", str(stored.store_path), modified, var.shape, str(var.dtype))
    source = var.encoding.get("source")
    modified = os.stat(source).st_mtime_ns if source and os.path.exists(source) else None
    return tokenize(type(var._data).__name__, source, modified, var.shape, str(var.dtype))


def plan_grid(variables: Mapping[Hashable, xr.Variable], dims, shape) -> ChunkGrid:
    """Return the chunk grid to plan on: the input's chunks, else dask's auto chunks.

    Per patched dim, the chunks of the first dask-backed variable by name that has
    it, else of the first zarr opened without dask chunks (its stored chunks, or
    shards); one chunk where none has (by name, as xarray may open a zarr's
    variables in another order each time). For input in memory, the grid that
    ``chunks="auto"`` would give the largest variable.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> from zarr.storage import MemoryStore
    >>> store = MemoryStore()
    >>> data = xr.Dataset({"v": (("y", "x"), np.zeros((5, 6)))})
    >>> _ = data.to_zarr(store, encoding={"v": {"chunks": (2, 6)}}, consolidated=False)
    >>> var = xr.open_zarr(store, consolidated=False, chunks=None)["v"].variable
    >>> plan_grid({"v": var}, ("y", "x"), (5, 6)).chunks
    ((2, 2, 1), (6,))
    """
    chunks: dict[Hashable, tuple[int, ...]] = {}
    for name in sorted(variables, key=str):
        var = variables[name]
        if is_dask_backed(var):
            for d in dims:
                if d in var.dims and d not in chunks:
                    chunks[d] = var.chunks[var.dims.index(d)]
    for name in sorted(variables, key=str):
        var = variables[name]
        stored = None if getattr(var, "_in_memory", True) else zarr_array_under(var._data)
        if stored is not None:
            steps = getattr(stored, "shards", None) or stored.chunks
            for d, step, n in zip(var.dims, steps, var.shape):
                if d in dims and d not in chunks:
                    chunks[d] = (step,) * (n // step) + ((n % step,) if n % step else ())
    if chunks:
        return ChunkGrid.from_chunks([chunks.get(d, (n,)) for d, n in zip(dims, shape)])
    largest = max(variables.values(), key=lambda v: v.size * v.dtype.itemsize)
    carried = math.prod(n for d, n in largest.sizes.items() if d not in dims)
    # Dask cannot size object cells; plan them as the 8-byte pointers numpy stores.
    dtype = np.dtype(np.float64) if largest.dtype.hasobject else largest.dtype
    return auto_grid(shape, carried, dtype)


def patch_bytes(var: xr.Variable, size: Mapping[Hashable, int]) -> int:
    """Bytes of one patch of ``var`` (patch extents along the patched dims it has)."""
    return math.prod(size.get(d, n) for d, n in var.sizes.items()) * var.dtype.itemsize


def _missing_objects_as_nan(block: np.ndarray) -> np.ndarray:
    """Return a copy of an object block with its missing cells (None, NaT, pd.NA) as NaN."""
    block = block.copy()
    block[pd.isnull(block)] = np.nan
    return block


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
        if var.dtype.kind == "O" and is_dask_backed(var):
            # xarray tests lazy object cells with x != x, which misses None: make it NaN.
            var = var.copy(data=var.data.map_blocks(_missing_objects_as_nan, dtype=var.dtype))
        valid = valid_cells(var).sum(carried).transpose(*present)
        # A variable without some patched dims is the same along them.
        valid = valid.expand_dims({d: n for d, n in zip(dims, geometry.shape) if d not in present})
        counts = counts + valid.transpose(*dims).data
        per_cell = math.prod(var.sizes[d] for d in carried)
        per_patch += per_cell * math.prod(geometry.size)
    reach = geometry.seam_reach()
    if any(reach):
        # A patch past a seam counts the first cells again.
        widths = [(0, r) for r in reach]
        if is_dask_array(counts):
            import dask.array as da

            counts = da.pad(counts, widths, mode="wrap")
        else:
            counts = np.pad(counts, widths, mode="wrap")
    with ProgressBar(minimum=PROGRESS_AFTER_SECONDS):
        inside = window_sums(counts, anchors, geometry.size)
    return inside / per_patch


#: dtype kinds weighted overlap-add can blend: bool, integers, floats and complex.
BLENDABLE_KINDS = "biufc"


def numeric_hint(dtype: np.dtype) -> str:
    """How to turn values of a non-numeric ``dtype`` into numbers, for error messages.

    Examples
    --------
    >>> numeric_hint(np.dtype("datetime64[ns]"))[:29]
    'encode the datetimes as numbe'
    """
    kind = np.dtype(dtype).kind
    if kind == "M":
        return (
            "encode the datetimes as numbers first, e.g. float seconds since 1970: "
            "(x - np.datetime64('1970-01-01')) / np.timedelta64(1, 's') (NaT becomes NaN, "
            "which is skipped; x.astype('int64') also works where there is no NaT), and "
            "decode the result"
        )
    if kind == "m":
        return (
            "encode the durations as numbers first, e.g. x / np.timedelta64(1, 's') (NaT "
            "becomes NaN, which is skipped; x.astype('int64') also works where there is no NaT)"
        )
    if kind in "US":
        return (
            "map the strings to numbers first (e.g. class codes from "
            "np.unique(x, return_inverse=True))"
        )
    if kind == "O":
        return "convert the objects to numbers first, e.g. x.astype('float64') (None becomes NaN)"
    return "convert the values to a numeric dtype first"


def check_blendable(
    dtype: np.dtype, what: str, error: type[XPatchError], or_else: str | None = None
) -> None:
    """Raise ``error`` unless values of ``dtype`` can be blended by weighted overlap-add.

    Overlap-add multiplies values by the window and adds them, which needs bool,
    integer, float or complex values. Only the dtype is read: lazy data stay lazy.

    Parameters
    ----------
    dtype
        The dtype to check.
    what
        What holds the values, for the message: ``"pred['t']"``, ``"dtype='<U1'"``.
    error
        The :class:`~xpatch.XPatchError` subclass to raise.
    or_else
        Another way out, if there is one (``"leave it out: pred.drop_vars('t')"``).

    Examples
    --------
    >>> check_blendable(np.dtype("int16"), "pred", OptionError)
    >>> check_blendable(np.dtype("<U3"), "pred", OptionError)
    Traceback (most recent call last):
    ...
    xpatch.core.errors.OptionError: pred has dtype <U3: ...
    """
    dtype = np.dtype(dtype)
    if dtype.kind in BLENDABLE_KINDS:
        return
    hint = numeric_hint(dtype)
    out = f"; or {or_else}" if or_else else ""
    raise error(
        f"{what} has dtype {dtype}: weighted overlap-add multiplies values by the window and "
        f"adds them, which needs numbers (bool, int, float or complex). "
        f"{hint[:1].upper()}{hint[1:]}{out}."
    )


def pad_value_for(value: object, dtype: np.dtype, name: Hashable = None) -> object:
    """Return the fill of padded cells for a variable of ``dtype``, or raise naming the fix.

    Numbers, datetimes and durations as :func:`~xpatch.core.extract.check_pad_value`
    has them. Strings take a string (bytes for bytes) that fits the dtype
    unchanged; object arrays take any value. ``None`` gives the default
    (:func:`~xpatch.core.extract.default_pad_value`).

    Examples
    --------
    >>> pad_value_for("", np.dtype("<U3"))
    ''
    >>> pad_value_for(None, np.dtype("float32"))
    nan
    """
    dtype = np.dtype(dtype)
    if value is None or dtype.kind in BLENDABLE_KINDS + "mM":
        return check_pad_value(value, dtype)
    if dtype.kind == "O":
        return value
    kind_fits = {"U": isinstance(value, str), "S": isinstance(value, bytes)}
    try:
        converted = np.asarray(value).astype(dtype).item()
        fits = kind_fits.get(dtype.kind, True) and bool(converted == value)
    except (TypeError, ValueError):
        fits = False
    if not fits:
        of = "" if name is None else f" {name!r}"
        sample = {"U": "''", "S": "b''"}.get(dtype.kind, "a value of that dtype")
        raise OptionError(
            f"pad_value={value!r} cannot be stored unchanged in the dtype {dtype} of the "
            f"variable{of}; pass a value of that dtype (e.g. pad_value={sample}), or cast the "
            f"variable first (e.g. da.astype('<U16') for longer strings)."
        )
    return converted


def check_blendable_predictions(
    pred: object, obj: xr.DataArray | xr.Dataset, patch_dim: Hashable
) -> None:
    """Refuse predictions that ``reconstruct`` cannot blend, naming the variable and the fix.

    Checks the variables with a ``patch_dim`` (those reconstruct puts back) of a
    DataArray, or of a Dataset for a Dataset patcher; anything else is left to
    reconstruct's own checks. Reads dtypes only.
    """
    if isinstance(pred, xr.DataArray) and patch_dim in pred.dims:
        label = "pred" if pred.name is None else f"pred ({pred.name!r})"
        check_blendable(pred.dtype, label, PredictionError)
    elif isinstance(pred, xr.Dataset) and isinstance(obj, xr.Dataset):
        for name, var in pred.data_vars.items():
            if patch_dim in var.dims:
                leave_out = f"leave it out: pred.drop_vars({name!r})"
                check_blendable(var.dtype, f"pred[{name!r}]", PredictionError, leave_out)


def check_apply_dtype(obj: xr.DataArray | xr.Dataset, dtype: object) -> None:
    """Refuse an ``apply`` whose declared output dtype overlap-add cannot blend.

    ``dtype`` is ``apply``'s argument (None: the input's dtype). Text that is no
    dtype, and Dataset input, are left to ``apply``'s own checks. Reads dtypes only.
    """
    if not isinstance(obj, xr.DataArray) or isinstance(dtype, Mapping):
        return  # several outputs: apply checks each output's dtype
    if dtype is not None:
        try:
            declared = np.dtype(dtype)
        except TypeError:
            return
        check_blendable(declared, f"dtype={dtype!r} (fn's declared output)", OptionError)
        return
    if obj.dtype.kind not in BLENDABLE_KINDS:
        name = "" if obj.name is None else f" {obj.name!r}"
        raise OptionError(
            f"the input{name} has dtype {obj.dtype} and dtype= was not given, so fn's output "
            f"is declared {obj.dtype}, which weighted overlap-add cannot blend (it needs bool, "
            "int, float or complex values): pass dtype= the numeric dtype fn returns (e.g. "
            f"dtype='float32'), or {numeric_hint(obj.dtype)}, before patching."
        )
