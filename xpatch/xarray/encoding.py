"""Values as stored: the CF / GDAL nodata and packing rules, and ``apply``'s stored dtype.

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
  value is chosen with ``nodata=`` (:func:`output_nodata`);
- ``dtype=`` declares what a model returns, ``out_dtype=`` what the blended result
  is stored as (:func:`cast_stored`: rounded, clipped, NaN to nodata; elementwise,
  so lazy stays lazy).
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Literal

import numpy as np
import xarray as xr
from numpy.typing import DTypeLike

from xpatch.core.blend.dtypes import plan_covers
from xpatch.core.blend.reductions import Reduction
from xpatch.core.dask_arrays import is_dask_array
from xpatch.core.errors import NodataCollisionWarning, OptionError, PredictionError
from xpatch.core.plan import Plan

#: Attributes that give a raster's nodata value, in the order rioxarray reads them.
NODATA_ATTRS = ("_FillValue", "missing_value", "fill_value", "nodata")

#: Attributes that say how to read an array's stored values (CF packing, fill
#: values); ``apply`` does not pass them on to a function's output.
VALUE_ENCODING_ATTRS = frozenset(
    {
        "_FillValue",
        "missing_value",
        "fill_value",
        "scale_factor",
        "add_offset",
        "_Unsigned",
        "valid_range",
        "valid_min",
        "valid_max",
        "nodata",
    }
)

NodataOption = float | Literal["input"] | None

#: Takes the input's validity mask to a result at another resolution
#: (:mod:`xpatch.xarray.output_grids`).
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
    """Cells no valid prediction reached (NaN) take the nodata value of ``attrs``, if any.

    Valid cells that hold that value already would read as missing: they are
    counted, with a :class:`~xpatch.NodataCollisionWarning` (in the same pass).
    """
    nodata = nodata_in(attrs)
    if nodata is None or not fits_dtype(nodata, variable.dtype):
        return variable
    if isinstance(nodata, float) and np.isnan(nodata):
        return variable
    data = variable.data
    if is_dask_array(data):
        label = data.name
        data = data.map_blocks(filled_block, nodata, label, dtype=data.dtype, meta=data._meta)
    else:
        data = filled_block(np.asarray(data), nodata, None)
    return variable.copy(data=data)


def filled_block(block: np.ndarray, nodata: Any, label: str | None) -> np.ndarray:
    """NaN cells of ``block`` as ``nodata``; valid cells equal to it are counted and warned."""
    missing = np.isnan(block)
    warn_collisions(int(np.count_nonzero((block == nodata) & ~missing)), nodata, label)
    return np.where(missing, nodata, block) if missing.any() else block


#: The lazy outputs that warned of nodata collisions already (one warning each).
_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()


def warn_collisions(count: int, nodata: Any, label: str | None) -> None:
    """Warn that ``count`` valid cells hold the nodata value (once per lazy output ``label``)."""
    if not count:
        return
    if label is not None:
        with _WARNED_LOCK:
            if label in _WARNED:
                return
            _WARNED.add(label)
    where = "in the whole output" if label is None else "in a block of the output (at least)"
    warnings.warn(
        f"{count} cells {where} hold the nodata value {nodata!r} as a valid result: any "
        "reader takes them for missing. Pass nodata= a value the model never outputs "
        "(NaN for a float output), or nodata=None.",
        NodataCollisionWarning,
        stacklevel=3,
    )


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


# -- what apply stores ----------------------------------------------------------------------


def check_out_dtype(out_dtype: DTypeLike | None) -> np.dtype | None:
    """Return ``out_dtype`` as a dtype (None stays None), refusing what cannot hold a result.

    Examples
    --------
    >>> check_out_dtype("uint8"), check_out_dtype(None)
    (dtype('uint8'), None)
    """
    if out_dtype is None:
        return None
    try:
        dtype = np.dtype(out_dtype)
    except TypeError:
        raise OptionError(
            f"out_dtype={out_dtype!r} is not a numpy dtype; pass e.g. 'uint8' or 'float32'."
        ) from None
    if dtype.kind not in "iufc":
        raise OptionError(
            f"out_dtype={out_dtype!r} ({dtype}) cannot store a blended result; pass an "
            "integer, float or complex dtype (for class labels, reduce='argmax')."
        )
    return dtype


def class_dim(output_dims: Mapping[Hashable, int]) -> Hashable:
    """Return the one non-patched output dim along which ``reduce="argmax"`` picks."""
    if len(output_dims) != 1:
        raise OptionError(
            f"reduce='argmax' takes the index of the largest score along one class dim, but "
            f"fn's output has {len(output_dims)} non-patched dims {dict(output_dims)!r}; pass "
            "output_dims={'class': n_classes} for a model returning (b, n_classes, *patch)."
        )
    return next(iter(output_dims))


def needs_nodata(plan: Plan, obj: xr.DataArray | xr.Variable | None) -> bool:
    """Whether some output cell may have no value: uncovered by patches, or nodata in the input."""
    has_nodata = obj is not None and (
        nodata_of(obj) is not None or encoded_nodata_of(obj) is not None
    )
    return has_nodata or not plan_covers(plan)


def stored_fill(obj: xr.DataArray, nodata: NodataOption) -> Any:
    """Return the value output cells without data take (``nodata=``'s), or None for NaN."""
    value, encoded = output_nodata(obj, nodata)
    value = value if value is not None else encoded
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def default_out_dtype(
    declared: np.dtype, reduce: Reduction, plan: Plan, obj: xr.DataArray, nodata: NodataOption
) -> np.dtype | None:
    """``out_dtype`` when not given: integers stay in their dtype where they can.

    A ``"mean"`` of integers rounds back to their dtype, and a ``"max"``, ``"min"``
    or ``"vote"`` keeps it, when every cell gets a value, or when the cells that
    may not (uncovered, or nodata in the input) have a nodata value that the dtype
    holds; otherwise the result is a float with NaN there. ``"sum"`` keeps the
    reduction's own dtype.
    """
    if not reduce.keeps_integers or declared.kind not in "iu":
        return None
    if not needs_nodata(plan, obj):
        return declared
    fill = stored_fill(obj, nodata)
    return declared if fill is not None and fits_dtype(fill, declared) else None


def check_stored_nodata(
    out_dtype: np.dtype, plan: Plan, obj: xr.DataArray, nodata: NodataOption, what: str
) -> None:
    """Refuse an integer ``out_dtype`` that has no nodata value for the cells without data."""
    if out_dtype.kind not in "iu":
        return
    fill = stored_fill(obj, nodata)
    if fill is not None and not fits_dtype(fill, out_dtype):
        raise OptionError(
            f"the output's nodata value {fill!r} (nodata={nodata!r}) does not fit {what} "
            f"({out_dtype}, range {np.iinfo(out_dtype).min}..{np.iinfo(out_dtype).max}); "
            "pass nodata= a value in that range (e.g. "
            f"nodata={np.iinfo(out_dtype).max}) or a wider out_dtype."
        )
    if fill is None and needs_nodata(plan, obj):
        raise OptionError(
            f"{what} ({out_dtype}) cannot hold NaN, and some output cells have no value "
            "(no patch covers them, or the input has nodata there); pass nodata= a value "
            f"the model never outputs (e.g. nodata={np.iinfo(out_dtype).max}), or a float "
            "out_dtype."
        )


def cast_stored(out: xr.DataArray, dtype: np.dtype) -> xr.DataArray:
    """``out`` cast to ``dtype``: rounded to nearest for integers, clipped to the range.

    NaN cells take the output's ``_FillValue`` (attribute or encoding); a NaN left
    without one raises a :class:`~xpatch.PredictionError` (when computed, on dask).
    Lazy stays lazy: one elementwise task per block.

    Examples
    --------
    >>> out = xr.DataArray([-3.0, 1.5, 2.5, 300.0], dims="x")
    >>> cast_stored(out, np.dtype("uint8")).values.tolist()
    [0, 2, 2, 255]
    """
    if out.dtype == dtype:
        return out
    fill = out.attrs.get("_FillValue", out.encoding.get("_FillValue"))
    if fill is not None and (isinstance(fill, float) and math.isnan(fill)):
        fill = None
    data = out.data
    if is_dask_array(data):
        data = data.map_blocks(cast_block, dtype, fill, dtype=dtype, meta=np.array((), dtype))
    else:
        data = cast_block(np.asarray(data), dtype, fill)
    cast = out.copy(data=data)
    for where in (cast.attrs, cast.encoding):
        if "_FillValue" in where and dtype.kind in "iu":
            # The nodata value in the stored dtype (-9999.0 -> -9999), so writers agree.
            if fill is None:
                del where["_FillValue"]
            else:
                where["_FillValue"] = np.asarray(fill).astype(dtype).item()
    return cast


def cast_block(block: np.ndarray, dtype: np.dtype, fill: Any = None) -> np.ndarray:
    """Cast one block: NaN to ``fill``, round (integers), clip to ``dtype``'s range, cast."""
    if block.dtype.kind == "c" and dtype.kind != "c":
        raise PredictionError(
            f"out_dtype={str(dtype)!r} would drop the imaginary part of a complex result; "
            "pass a complex out_dtype, or take .real / abs() in fn."
        )
    if dtype.kind == "c":
        return block.astype(dtype)
    if dtype.kind in "iu":
        if block.dtype.kind == "f" and np.iinfo(dtype).bits > 53:
            check_exact_integers(block, dtype)
        if block.dtype.kind == "f":
            nan = np.isnan(block)
            if nan.any():
                if fill is None:
                    raise PredictionError(
                        f"{int(nan.sum())} output cells are NaN (fn returned NaN there), "
                        f"which out_dtype={str(dtype)!r} cannot hold; pass nodata= a value "
                        "in its range to store them as, or a float out_dtype."
                    )
                block = np.where(nan, fill, block)
            block = np.rint(block)
        info = np.iinfo(dtype)
        if block.dtype.kind in "iub":
            # Bounds in the block's own dtype: no float rounding, no overflow of the bounds.
            have = np.iinfo(block.dtype) if block.dtype.kind != "b" else np.iinfo(np.uint8)
            lo, hi = max(info.min, have.min), min(info.max, have.max)
            return np.clip(block, lo, hi).astype(dtype)
        # float(2**63 - 1) rounds up to 2**63, past int64: clip to the float just below.
        hi = float(info.max)
        hi = hi if hi <= info.max else float(np.nextafter(hi, 0))
        return np.clip(block, info.min, hi).astype(dtype)
    info = np.finfo(dtype)
    if block.dtype.kind == "f":
        return np.clip(block, info.min, info.max).astype(dtype)  # NaN stays NaN
    return block.astype(dtype)


def check_exact_integers(block: np.ndarray, dtype: np.dtype) -> None:
    """Refuse a float blend beyond 2**53 stored as a 64-bit integer: it was rounded.

    float64 holds every integer only up to 2**53; past it, a blend of integers (a
    mean of ns timestamps) has been rounded, and an int64 would not show it.
    """
    largest = np.fmax.reduce(np.abs(block), axis=None, initial=0.0)
    if largest > 2**53:
        raise PredictionError(
            f"the result reaches {largest:.6g}, past 2**53, where float64 (in which "
            f"reduce='mean' blends integers) holds integers only in steps of "
            f"{np.spacing(largest):g}: stored as {dtype} it would look exact and be rounded. "
            "Subtract an offset first (e.g. timestamps minus the first), take reduce='max' "
            "or 'min' (exact for integers), or store a float (out_dtype='float64')."
        )
