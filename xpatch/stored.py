"""What ``apply`` stores: the ``out_dtype`` cast and the ``reduce="argmax"`` label map.

``dtype=`` declares what a model returns; ``out_dtype=`` chooses what the blended
result is stored as. Both steps here are elementwise (the cast) or per cell along one
whole dim (the argmax), so on dask input they are blockwise and stay lazy.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr
from numpy.typing import DTypeLike

from xpatch.cf import NodataOption, encoded_nodata_of, fits_dtype, nodata_of, output_nodata
from xpatch.core.dtypes import plan_covers
from xpatch.core.errors import OptionError, PredictionError


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


def label_dtype(n_classes: int) -> np.dtype:
    """Return the smallest unsigned integer dtype that holds the labels ``0 .. n_classes - 1``.

    Examples
    --------
    >>> [str(label_dtype(n)) for n in (5, 256, 257)]
    ['uint8', 'uint8', 'uint16']
    """
    for dtype in (np.uint8, np.uint16, np.uint32):
        if n_classes - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


def class_dim(output_dims: Mapping[Hashable, int]) -> Hashable:
    """Return the one non-patched output dim along which ``reduce="argmax"`` picks."""
    if len(output_dims) != 1:
        raise OptionError(
            f"reduce='argmax' takes the index of the largest score along one class dim, but "
            f"fn's output has {len(output_dims)} non-patched dims {dict(output_dims)!r}; pass "
            "output_dims={'class': n_classes} for a model returning (b, n_classes, *patch)."
        )
    return next(iter(output_dims))


def argmax_labels(data: Any, axis: int = 0) -> Any:
    """Index of the largest score along ``axis``, as float64 with NaN where a score is NaN.

    Floats so that the nodata rules (NaN, then ``_FillValue``) apply to cells with no
    label before :func:`cast_stored` makes integers; ties go to the first index, as in
    ``numpy.argmax``. Blockwise on dask, with ``axis`` rechunked to one chunk.

    Examples
    --------
    >>> argmax_labels(np.array([[0.1, np.nan, 0.5], [0.9, 0.2, 0.5]])).tolist()
    [1.0, nan, 0.0]
    """
    if isinstance(data, da.Array):
        data = data.rechunk({axis: -1})
        return da.map_blocks(
            argmax_labels, data, axis, drop_axis=axis, dtype=np.float64, meta=np.array((), float)
        )
    data = np.asarray(data)
    missing = np.isnan(data).any(axis=axis) if data.dtype.kind in "fc" else False
    labels = np.argmax(np.nan_to_num(data, nan=0.0), axis=axis).astype(np.float64)
    return np.where(missing, np.nan, labels)


def needs_nodata(p: Any, obj: xr.DataArray | xr.Variable | None) -> bool:
    """Whether some output cell may have no value: uncovered by patches, or nodata in the input."""
    has_nodata = obj is not None and (
        nodata_of(obj) is not None or encoded_nodata_of(obj) is not None
    )
    return has_nodata or not plan_covers(p.plan)


def stored_fill(obj: xr.DataArray, nodata: NodataOption) -> Any:
    """Return the value output cells without data take (``nodata=``'s), or None for NaN."""
    value, encoded = output_nodata(obj, nodata)
    value = value if value is not None else encoded
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def default_out_dtype(
    declared: np.dtype, reduce: str, p: Any, obj: xr.DataArray, nodata: NodataOption
) -> np.dtype | None:
    """``out_dtype`` when not given: integers stay in their dtype where they can.

    A ``"mean"`` of integers rounds back to their dtype, and a ``"max"``, ``"min"``
    or ``"vote"`` keeps it, when every cell gets a value, or when the cells that
    may not (uncovered, or nodata in the input) have a nodata value that the dtype
    holds; otherwise the result is a float with NaN there. ``"sum"`` keeps the
    reduction's own dtype.
    """
    if reduce not in ("mean", "max", "min", "vote") or declared.kind not in "iu":
        return None
    if not needs_nodata(p, obj):
        return declared
    fill = stored_fill(obj, nodata)
    return declared if fill is not None and fits_dtype(fill, declared) else None


def check_stored_nodata(
    out_dtype: np.dtype, p: Any, obj: xr.DataArray, nodata: NodataOption, what: str
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
    if fill is None and needs_nodata(p, obj):
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
    if isinstance(data, da.Array):
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
