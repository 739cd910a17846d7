"""Several outputs in one GeoTIFF: a band per output (and per class of an output).

A GeoTIFF holds one ``(band, y, x)`` array of one dtype with one nodata value.
:func:`stack_bands` lays the variables of a Dataset (e.g. ``apply``'s several
outputs) out as such an array, exactly or not at all: the common dtype must hold
every variable's values, and cells without data stay without data.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
import xarray as xr

from xpatch.cf import encoded_nodata_of, nodata_of
from xpatch.core.errors import OptionError
from xpatch.geo import geotiff_layout

#: Name of the stacked dim, as rioxarray names a GeoTIFF's bands.
BAND_DIM = "band"


def common_dtype(dataset: xr.Dataset) -> np.dtype:
    """Return the dtype that holds every variable's values exactly, or raise naming them.

    Examples
    --------
    >>> ds = xr.Dataset({"a": ("x", np.zeros(2, "uint8")), "b": ("x", np.zeros(2, "float32"))})
    >>> common_dtype(ds)
    dtype('float32')
    """
    dtypes = {name: var.dtype for name, var in dataset.data_vars.items()}
    common = np.result_type(*dtypes.values())
    # numpy counts int64 -> float64 as safe; it rounds integers beyond 2**53.
    inexact = [
        name
        for name, dtype in dtypes.items()
        if not np.can_cast(dtype, common, "safe")
        or (common.kind in "fc" and dtype.kind in "iu" and dtype.itemsize * 8 > 53)
    ]
    if inexact:
        raise OptionError(
            f"the variables {inexact!r} ({', '.join(str(dtypes[n]) for n in inexact)}) do not "
            f"fit the one dtype a GeoTIFF holds ({common}) exactly; declare narrower dtypes "
            "(out_dtype=...), write each variable to its own GeoTIFF, or write zarr."
        )
    return common


def stack_bands(dataset: xr.Dataset) -> xr.DataArray:
    """Lay a Dataset's variables out as the ``(band, y, x)`` array of one GeoTIFF.

    Each variable gives one band (a ``(y, x)`` variable) or one per entry of its
    other dim (``(class, y, x)``), in the Dataset's order; band ``i`` is
    described as ``"name"`` or ``"name:class=value"`` (``long_name``, which the
    GeoTIFF writer stores as band descriptions). The dtype is the one that holds
    every variable exactly (:func:`common_dtype`). Cells without data keep none:
    with a float dtype every variable's nodata becomes NaN, the file's nodata;
    with an integer dtype the variables must share their nodata value. Lazy
    stays lazy.

    Raises
    ------
    OptionError
        Variables on different grids, of more than 3 dims, with no common exact
        dtype, or with integer nodata values that differ.

    Examples
    --------
    >>> ds = xr.Dataset({
    ...     "seg": (("class", "y", "x"), np.zeros((2, 3, 4), "uint8")),
    ...     "unc": (("y", "x"), np.ones((3, 4), "float32")),
    ... })
    >>> bands = stack_bands(ds)
    >>> bands.dims, bands.dtype, bands.attrs["long_name"]
    (('band', 'y', 'x'), dtype('float32'), ('seg:class=0', 'seg:class=1', 'unc'))
    """
    if not dataset.data_vars:
        raise OptionError("the Dataset has no data variable: there is nothing to write.")
    dtype = common_dtype(dataset)
    floating = dtype.kind == "f"
    pieces, descriptions, fills = [], [], {}
    grid: tuple[Hashable, Hashable, dict] | None = None
    for name, var in dataset.data_vars.items():
        y, x, others = geotiff_layout(var)
        here = (y, x, {y: var.sizes[y], x: var.sizes[x]})
        if grid is None:
            grid = here
        elif here != grid:
            raise OptionError(
                f"variable {name!r} lies on a grid {here[2]} and the first on {grid[2]}: one "
                "GeoTIFF holds one grid. Write them to separate GeoTIFFs, or to zarr."
            )
        fill = nodata_of(var)
        fill = encoded_nodata_of(var) if fill is None else fill
        if others:
            (dim,) = others
            labels = var[dim].values if dim in var.coords else np.arange(var.sizes[dim])
            descriptions += [f"{name}:{dim}={label}" for label in labels.tolist()]
            var = var.transpose(dim, y, x).drop_vars(dim, errors="ignore").rename({dim: BAND_DIM})
        else:
            descriptions.append(str(name))
            var = var.expand_dims(BAND_DIM)
        if floating and fill is not None and not np.isnan(fill):
            var = var.where(var != fill)  # its nodata, in the file's: NaN
        elif not floating:
            fills[name] = fill
        pieces.append(var.astype(dtype).variable)
    if len({None if f is None else float(f) for f in fills.values()}) > 1:
        raise OptionError(
            f"the variables' nodata values differ ({fills}; None: it has none), and a GeoTIFF "
            "has one; give every variable the same (apply's nodata=, or "
            "var.assign_attrs(_FillValue=...)), or write zarr."
        )
    data = xr.Variable.concat(pieces, dim=BAND_DIM)
    coords = {n: c.variable for n, c in dataset.coords.items() if set(c.dims) <= set(data.dims)}
    coords[BAND_DIM] = xr.Variable(BAND_DIM, np.arange(1, len(descriptions) + 1))
    data.attrs = {}  # concat keeps the first variable's: its units or scale would misread others
    out = xr.DataArray(data, coords=coords, name="bands")
    out.attrs["long_name"] = tuple(descriptions)
    nodata = np.nan if floating else next((f for f in fills.values() if f is not None), None)
    if nodata is not None:
        out.attrs["_FillValue"] = nodata
    return out
