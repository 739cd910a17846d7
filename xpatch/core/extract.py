"""Cut patches out of numpy and dask arrays.

Layout convention of the core: the patched axes of the input are given by
position; the stacked output has a leading patch axis and otherwise keeps the
input's axis order, with each patched axis shortened to the patch size.
"""

from __future__ import annotations

from collections.abc import Sequence

import dask.array as da
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from xpatch.core.errors import OptionError

#: Upper bound of the bytes one dask task of patches produces.
GROUP_BYTES = 64 * 2**20


def default_pad_value(dtype: np.dtype) -> float | int | bool:
    """NaN for inexact dtypes, 0 (False) for integer and boolean ones.

    Examples
    --------
    >>> default_pad_value(np.dtype("float32")), default_pad_value(np.dtype("int16"))
    (nan, 0)
    """
    if np.issubdtype(dtype, np.inexact):
        return np.nan
    if np.issubdtype(dtype, np.bool_):
        return False
    return 0


def check_pad_value(value: object, dtype: np.dtype) -> object:
    """Return a pad value that ``dtype`` can hold, or raise naming the fix."""
    if value is None:
        return default_pad_value(dtype)
    with np.errstate(invalid="ignore"):
        converted = np.asarray(value).astype(dtype)
    if not np.array_equal(converted, np.asarray(value), equal_nan=True):
        raise OptionError(
            f"pad_value={value!r} cannot be stored in the array's dtype {dtype}; pass a value "
            f"of that dtype, or cast the array first (e.g. da.astype('float32'))."
        )
    return converted.item()


def _pad_widths(ndim: int, axes: Sequence[int], after: Sequence[int]) -> list[tuple[int, int]]:
    widths = [(0, 0)] * ndim
    for axis, extra in zip(axes, after):
        widths[axis] = (0, int(extra))
    return widths


def _crop(array, axes: Sequence[int], anchors: np.ndarray, size: Sequence[int]):
    """Slice ``array`` to the box spanned by the patches at ``anchors``.

    Returns the slice, the anchors relative to it, and per patched axis how many
    cells must be padded past its end.
    """
    lo = anchors.min(axis=0)
    hi = anchors.max(axis=0) + np.asarray(size)
    index = [slice(None)] * array.ndim
    pad_after = []
    for j, ax in enumerate(axes):
        stop = min(int(hi[j]), array.shape[ax])
        index[ax] = slice(int(lo[j]), stop)
        pad_after.append(int(hi[j]) - stop)
    return array[tuple(index)], anchors - lo, pad_after


def extract_numpy(
    array: np.ndarray,
    axes: Sequence[int],
    anchors: np.ndarray,
    size: Sequence[int],
    pad_value: object = None,
) -> np.ndarray:
    """Stack the patches of a numpy array (a copy; the input is untouched).

    Parameters
    ----------
    array
        The input.
    axes
        Positions of the patched axes; ``anchors`` and ``size`` follow their order.
    anchors
        ``(n, len(axes))`` start indices.
    size
        Patch size per patched axis.
    pad_value
        Fill for cells past the end of an axis (patches of ``boundary="pad"``).

    Examples
    --------
    >>> a = np.arange(12).reshape(3, 4)
    >>> extract_numpy(a, [1], np.array([[0], [2]]), [2]).tolist()
    [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [10, 11]]]
    """
    patch_shape = list(array.shape)
    for ax, s in zip(axes, size):
        patch_shape[ax] = s
    if len(anchors) == 0:
        return np.empty((0, *patch_shape), dtype=array.dtype)
    array, anchors, pad_after = _crop(array, axes, anchors, size)
    if any(pad_after):
        array = np.pad(array, _pad_widths(array.ndim, axes, pad_after), constant_values=pad_value)
    k = len(axes)
    front = np.moveaxis(array, list(axes), list(range(k)))
    views = sliding_window_view(front, tuple(size), axis=tuple(range(k)))
    # views: (*starts, *carried, *window) -> (n, *carried, *window)
    stacked = views[tuple(anchors[:, j] for j in range(k))]
    carried = [ax for ax in range(array.ndim) if ax not in axes]
    # Position of each original axis in `stacked` (axis 0 is the patch axis).
    source = {ax: 1 + i for i, ax in enumerate(carried)}
    source.update({ax: 1 + len(carried) + j for j, ax in enumerate(axes)})
    order = [0] + [source[ax] for ax in range(array.ndim)]
    return np.ascontiguousarray(stacked.transpose(order))


def patch_groups(
    anchors: np.ndarray, chunk_bounds: Sequence[np.ndarray], max_group: int
) -> list[tuple[int, int]]:
    """Split the patch index into runs of consecutive patches anchored in one chunk.

    Parameters
    ----------
    anchors
        ``(n, k)`` anchors.
    chunk_bounds
        Per patched axis, the cumulative chunk ends of the input.
    max_group
        Largest number of patches in one run.

    Examples
    --------
    >>> a = np.array([[0], [3], [6], [9], [12]])
    >>> patch_groups(a, [np.array([5, 10, 15])], max_group=10)
    [(0, 2), (2, 4), (4, 5)]
    """
    n = len(anchors)
    if n == 0:
        return []
    chunk_ids = np.stack(
        [np.searchsorted(b, anchors[:, j], side="right") for j, b in enumerate(chunk_bounds)],
        axis=1,
    )
    change = np.flatnonzero((np.diff(chunk_ids, axis=0) != 0).any(axis=1)) + 1
    starts = np.concatenate([[0], change])
    stops = np.concatenate([change, [n]])
    groups = []
    for start, stop in zip(starts.tolist(), stops.tolist()):
        groups.extend((s, min(s + max_group, stop)) for s in range(start, stop, max_group))
    return groups


def extract_dask(
    array: da.Array,
    axes: Sequence[int],
    anchors: np.ndarray,
    size: Sequence[int],
    pad_value: object = None,
) -> da.Array:
    """Stack the patches of a dask array lazily, one task per group of patches.

    Patches are grouped into runs of consecutive patch indices whose anchors lie in
    the same input chunk (:func:`patch_groups`); each group reads only the input
    region its patches span, so the number of tasks follows the number of chunks
    (for grid samplers), not of patches. The patch axis is chunked by group.
    Arguments are as for :func:`extract_numpy`.
    """
    patch_shape = list(array.shape)
    for ax, s in zip(axes, size):
        patch_shape[ax] = s
    patch_bytes = max(int(np.prod(patch_shape)) * array.dtype.itemsize, 1)
    bounds = [np.cumsum(array.chunks[ax]) for ax in axes]
    groups = patch_groups(anchors, bounds, max(GROUP_BYTES // patch_bytes, 1))
    if not groups:
        return da.empty((0, *patch_shape), dtype=array.dtype, chunks=-1)
    carried = [ax for ax in range(array.ndim) if ax not in axes]
    parts = []
    for start, stop in groups:
        region, local, pad_after = _crop(array, axes, anchors[start:stop], size)
        if any(pad_after):
            widths = _pad_widths(array.ndim, axes, pad_after)
            region = da.pad(region, widths, constant_values=pad_value)
        region = region.rechunk({ax: -1 for ax in axes})
        out_chunks = [(stop - start,)] + [
            region.chunks[ax] if ax in carried else (patch_shape[ax],) for ax in range(array.ndim)
        ]
        parts.append(
            da.map_blocks(
                extract_numpy,
                region,
                axes=list(axes),
                anchors=local,
                size=list(size),
                new_axis=0,
                chunks=tuple(out_chunks),
                dtype=array.dtype,
                meta=np.empty((0,) * (array.ndim + 1), dtype=array.dtype),
            )
        )
    return da.concatenate(parts, axis=0)
