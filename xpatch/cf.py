"""The CF / GDAL value rules: what ``_FillValue``, ``nodata`` and packing attributes mean.

One home for the rules that ``reconstruct``, ``apply``, :func:`xpatch.write` and
the ``xpatch apply`` command follow:

- a cell whose value is NaN or the variable's nodata value (``_FillValue``,
  ``missing_value``, ``fill_value`` or ``nodata``, read in that order, as
  rioxarray reads them) has no data: it enters no average, and the result is
  masked there;
- a masked raster (``rioxarray.open_rasterio(..., masked=True)``) keeps its
  nodata value in ``encoding["_FillValue"]``, which writers use: results keep it;
- ``apply`` makes a new quantity: the input's packing attributes
  (:data:`VALUE_ENCODING_ATTRS`) would misread it and are dropped; its nodata
  value is chosen with ``nodata=`` (:func:`output_nodata`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
import xarray as xr

from xpatch.core.errors import OptionError

#: Attributes that give a raster's nodata value, in the order rioxarray reads them.
NODATA_ATTRS = ("_FillValue", "missing_value", "fill_value", "nodata")

#: Attributes that say how to read an array's stored values (CF packing, fill
#: values); ``apply`` does not pass them on to a function's output.
VALUE_ENCODING_ATTRS = frozenset(
    {"_FillValue", "missing_value", "fill_value", "scale_factor", "add_offset", "_Unsigned",
     "valid_range", "valid_min", "valid_max", "nodata"}
)  # fmt: skip

NodataOption = float | Literal["input"] | None

#: Takes the input's validity mask to a result at another resolution (:mod:`xpatch.scaled`).
Resample = Callable[[xr.DataArray], xr.DataArray]


def nodata_in(attrs: Mapping) -> Any:
    """Return the nodata value that ``attrs`` give (``_FillValue`` and friends), or None.

    A NaN nodata is returned as NaN; cells that are NaN are missing anyway.

    Examples
    --------
    >>> nodata_in({"units": "m", "_FillValue": np.float32(-9999)})
    -9999.0
    """
    for key in NODATA_ATTRS:
        if attrs.get(key) is not None:
            value = np.asarray(attrs[key])
            return value.item() if value.ndim == 0 else value.ravel()[0].item()
    return None


def nodata_of(obj: xr.DataArray | xr.Variable) -> Any:
    """Return the nodata value of a raster variable's attributes, or None."""
    return nodata_in(obj.attrs)


def encoded_nodata_of(obj: xr.DataArray | xr.Variable) -> Any:
    """Return the nodata value a masked raster keeps in its encoding, or None.

    ``rioxarray.open_rasterio(..., masked=True)`` turns nodata cells into NaN and
    moves the value to ``encoding["_FillValue"]``, where writers find it.
    """
    value = obj.encoding.get("_FillValue")
    return None if value is None else np.asarray(value).item()


def valid_cells(var: xr.Variable | xr.DataArray) -> Any:
    """Boolean array (same dims): not NaN and not the nodata value.

    Examples
    --------
    >>> da = xr.DataArray([1.0, np.nan, -1.0], dims="x", attrs={"_FillValue": -1.0})
    >>> valid_cells(da).values.tolist()
    [True, False, False]
    """
    valid = xr.DataArray(var).notnull()
    nodata = nodata_of(var)
    if nodata is not None and not (isinstance(nodata, float) and math.isnan(nodata)):
        valid = valid & (xr.DataArray(var) != nodata)
    return valid


def fits_dtype(value: Any, dtype: np.dtype) -> bool:
    """Whether ``value`` can be stored exactly in ``dtype``.

    Examples
    --------
    >>> fits_dtype(-9999, np.dtype("int16")), fits_dtype(-9999, np.dtype("uint8"))
    (True, False)
    """
    if value is None:
        return False
    with np.errstate(invalid="ignore", over="ignore"):
        converted = np.asarray(value).astype(dtype)
    return bool(np.array_equal(converted, np.asarray(value), equal_nan=True))


def missing_as_nan(pred: xr.DataArray) -> xr.DataArray:
    """Predictions with their nodata cells turned into NaN, which overlap-add skips."""
    if nodata_of(pred) is None:
        return pred
    return pred.where(valid_cells(pred.variable))


def fill_nodata(variable: xr.Variable, attrs: Mapping) -> xr.Variable:
    """Cells no valid prediction reached (NaN) take the nodata value of ``attrs``, if any."""
    nodata = nodata_in(attrs)
    if nodata is None or not fits_dtype(nodata, variable.dtype):
        return variable
    if isinstance(nodata, float) and np.isnan(nodata):
        return variable
    return variable.fillna(nodata)


def mask_input_nodata(
    result: xr.Variable, source: xr.Variable | None, resample: Resample | None = None
) -> xr.Variable:
    """NaN where the input ``source`` has no data, if it has a nodata value.

    Band by band when ``result`` keeps the input's dims and sizes; otherwise a
    cell has no data when no band of the input has any. ``resample`` takes the
    input's validity to a result at another resolution.
    """
    if source is None or (nodata_of(source) is None and encoded_nodata_of(source) is None):
        return result
    valid = valid_cells(source)
    if resample is not None:
        valid = resample(valid)
    if set(result.dims) == set(valid.dims) and all(
        result.sizes[d] == valid.sizes[d] for d in valid.dims
    ):
        return result.where(valid.transpose(*result.dims).variable)
    carried = [d for d in valid.dims if d not in result.dims or result.sizes[d] != valid.sizes[d]]
    spatial = valid.any(carried) if carried else valid
    return result.where(spatial.variable)


def carry_encoded_nodata(source: xr.Variable | None, target: xr.Variable | xr.DataArray) -> None:
    """Give ``target`` the masked input's ``encoding["_FillValue"]``, which writers use."""
    value = None if source is None else encoded_nodata_of(source)
    if value is not None and fits_dtype(value, target.dtype):
        target.encoding["_FillValue"] = value


def reconstructed(
    result: xr.Variable,
    template: xr.Variable | None,
    attrs: Mapping,
    resample: Resample | None = None,
):
    """Apply the rules to a reconstructed variable: mask, fill, attributes, encoding."""
    variable = fill_nodata(mask_input_nodata(result, template, resample), attrs)
    variable.attrs = dict(attrs)
    carry_encoded_nodata(template, variable)
    return variable


def check_nodata_option(nodata: object) -> NodataOption:
    """Return ``apply``'s ``nodata=`` if valid: ``"input"``, a number, or None."""
    if nodata is None or nodata == "input":
        return nodata  # type: ignore[return-value]
    if isinstance(nodata, bool | str) or not isinstance(nodata, int | float | np.number):
        raise OptionError(
            f"nodata={nodata!r} must be 'input' (the input's nodata value), a number, or None."
        )
    return nodata  # type: ignore[return-value]


def output_nodata(source: xr.DataArray, nodata: NodataOption) -> tuple[Any, Any]:
    """Return ``apply``'s output nodata value and the encoded one it keeps, from ``nodata=``.

    ``"input"`` takes the input's nodata value; a masked input (NaN cells) has
    it in its encoding, and so does the output.
    """
    if nodata != "input":
        return nodata, None
    value = nodata_of(source)
    return value, encoded_nodata_of(source) if value is None else None


def applied(
    result: xr.Variable,
    source: xr.DataArray,
    coords: Mapping,
    nodata: NodataOption,
    resample: Resample | None = None,
) -> xr.DataArray:
    """Apply the rules to ``apply``'s output: mask, packing attributes, nodata, encoding."""
    value, encoded = output_nodata(source, nodata)
    attrs = {k: v for k, v in source.attrs.items() if k not in VALUE_ENCODING_ATTRS}
    masked = mask_input_nodata(result, source.variable, resample)
    out = xr.DataArray(masked, coords=coords, name=source.name, attrs=attrs)
    if encoded is not None and fits_dtype(encoded, out.dtype):
        out.encoding["_FillValue"] = encoded
    if value is None or not fits_dtype(value, out.dtype):
        return out  # none, or the input's cannot be stored in the output: NaN it is
    out.attrs["_FillValue"] = value
    return out.copy(data=fill_nodata(out.variable, out.attrs).data)


def file_nodata(result: xr.DataArray) -> Any:
    """Return the nodata value to store in a file for ``result``.

    Its ``_FillValue`` (attribute or encoding), else rioxarray's ``nodata``, else
    NaN for float data, else None.
    """
    value = result.attrs.get("_FillValue", result.encoding.get("_FillValue"))
    if value is None:
        value = result.rio.nodata
    if value is None and np.issubdtype(result.dtype, np.floating):
        value = np.nan
    return value
