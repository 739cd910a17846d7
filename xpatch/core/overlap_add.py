"""Weighted overlap-add of per-patch results back onto the grid.

Layout convention: predictions are ``(n, *lead, *patch)`` with the patched axes
last, in the order of the geometry's dims; the output is ``(*lead, *grid)``.
``lead`` holds the non-patched dims of the predictions (bands, classes, ...).

The eager and the dask paths share one kernel, :func:`accumulate_block`, which
adds every patch that touches an output block into that block. NaN predictions
are skipped (they add neither value nor weight); cells that no valid value
reaches are NaN.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Literal, get_args

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from xpatch.core.checks import check_choice

Reduction = Literal["mean", "sum", "max", "min"]
REDUCTIONS: tuple[str, ...] = get_args(Reduction)


def check_reduction(reduce: object) -> Reduction:
    """Return ``reduce`` if it is known, else raise listing the valid ones."""
    return check_choice("reduce", reduce, REDUCTIONS)  # type: ignore[return-value]


def accumulation_dtype(dtype: np.dtype) -> np.dtype:
    """float32 for half/single floats, float64 for doubles and integers (and complex).

    Examples
    --------
    >>> [str(accumulation_dtype(np.dtype(t))) for t in ("float16", "float32", "uint8", "int64")]
    ['float32', 'float32', 'float64', 'float64']
    """
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.inexact):
        return np.result_type(dtype, np.float32)
    return np.dtype(np.float64)


def accumulate_block(
    origin: Sequence[int],
    block_shape: Sequence[int],
    anchors: np.ndarray,
    predictions: np.ndarray,
    window: np.ndarray,
    reduce: Reduction,
) -> np.ndarray:
    """Reduce every patch that touches one output block into that block.

    Parameters
    ----------
    origin, block_shape
        Start and extent of the block along the patched axes.
    anchors
        ``(n, k)`` anchors of the patches in ``predictions``.
    predictions
        ``(n, *lead, *patch)`` per-patch values.
    window
        Blending window of the patch shape (used by ``"mean"`` and ``"sum"``).
    reduce
        ``"mean"`` (Σ w·x / Σ w), ``"sum"`` (Σ w·x), ``"max"`` or ``"min"``.

    Returns
    -------
    numpy.ndarray
        ``(*lead, *block_shape)`` in the accumulation dtype; NaN where nothing
        valid landed.

    Examples
    --------
    >>> preds = np.array([[1.0, 1.0], [3.0, 3.0]])
    >>> accumulate_block([0], [3], np.array([[0], [1]]), preds, np.ones(2), "mean").tolist()
    [1.0, 2.0, 3.0]
    """
    k = len(block_shape)
    origin = np.asarray(origin, dtype=np.int64)
    block_end = origin + np.asarray(block_shape, dtype=np.int64)
    size = np.asarray(window.shape, dtype=np.int64)
    lead = predictions.shape[1 : predictions.ndim - k]
    acc = accumulation_dtype(predictions.dtype)
    can_be_nan = np.issubdtype(predictions.dtype, np.inexact)
    weighted = reduce in ("mean", "sum")
    out_shape = (*lead, *block_shape)
    if weighted:
        total = np.zeros(out_shape, dtype=acc)
        window = window.astype(acc.type(0).real.dtype, copy=False)
        # The weight sum has no lead axes until a NaN prediction makes it vary by lead.
        weight = np.zeros((1,) * len(lead) + tuple(block_shape), dtype=window.dtype)
    else:
        total = np.full(out_shape, np.nan, dtype=acc)
        combine = np.fmax if reduce == "max" else np.fmin
    lo = np.maximum(anchors, origin)
    hi = np.minimum(anchors + size, block_end)
    touching = np.flatnonzero((hi > lo).all(axis=1))
    lead_index = (slice(None),) * len(lead)
    for i in touching:
        block_index = lead_index + tuple(
            slice(start - o, stop - o) for start, stop, o in zip(lo[i], hi[i], origin)
        )
        patch_index = tuple(
            slice(start - a, stop - a) for start, stop, a in zip(lo[i], hi[i], anchors[i])
        )
        values = predictions[(i, *lead_index, *patch_index)]
        if not weighted:
            combine(total[block_index], values, out=total[block_index])
            continue
        w = window[patch_index]
        # A sum is a cheap NaN test: it allocates nothing (inf - inf gives a false
        # alarm, which only sends the patch down the exact masked path).
        if can_be_nan and np.isnan(values.sum(dtype=acc)):
            if weight.shape != out_shape:
                weight = np.broadcast_to(weight, out_shape).copy()
            valid = ~np.isnan(values)
            total[block_index] += np.where(valid, values * w, 0)
            weight[block_index] += valid * w
        else:
            total[block_index] += values * w
            weight[block_index] += w
    if not weighted:
        return total
    covered = weight > 0
    if reduce == "mean":
        np.divide(total, weight, out=total, where=covered)
    if not covered.all():
        total[~np.broadcast_to(covered, out_shape)] = np.nan
    return total


def overlap_add(
    predictions: np.ndarray,
    anchors: np.ndarray,
    grid_shape: Sequence[int],
    window: np.ndarray,
    reduce: Reduction = "mean",
) -> np.ndarray:
    """Reconstruct numpy predictions onto the whole grid (eager).

    Examples
    --------
    >>> preds = np.ones((2, 3))
    >>> overlap_add(preds, np.array([[0], [2]]), [6], np.ones(3)).tolist()
    [1.0, 1.0, 1.0, 1.0, 1.0, nan]
    """
    return accumulate_block([0] * len(grid_shape), grid_shape, anchors, predictions, window, reduce)


def _block_task(origin, block_shape, empty, window, reduce, anchor_groups, *prediction_groups):
    # `empty` is a (0, *lead, *patch) array: it carries lead shape and dtype for
    # blocks that no patch touches.
    predictions = np.concatenate([empty, *prediction_groups], axis=0)
    anchors = np.concatenate([np.empty((0, len(block_shape)), np.int64), *anchor_groups])
    return accumulate_block(origin, block_shape, anchors, predictions, window, reduce)


def overlap_add_dask(
    predictions: da.Array,
    anchors: np.ndarray,
    grid_shape: Sequence[int],
    grid_chunks: Sequence[Sequence[int]],
    window: np.ndarray,
    reduce: Reduction = "mean",
) -> da.Array:
    """Reconstruct dask predictions lazily, one task per output block.

    Each output block (``grid_chunks`` along the patched axes, the lead axes whole)
    is computed by one task from the prediction chunks (groups of patches along
    axis 0) whose patches touch it. The window enters the graph once.

    Parameters
    ----------
    predictions
        ``(n, *lead, *patch)`` dask array; it is rechunked to whole patches.
    anchors
        ``(n, k)`` anchors.
    grid_shape, grid_chunks
        Shape of the output grid and its chunks along the patched axes.
    window, reduce
        As for :func:`accumulate_block`.
    """
    k = len(grid_shape)
    lead_shape = predictions.shape[1 : predictions.ndim - k]
    predictions = predictions.rechunk({ax: -1 for ax in range(1, predictions.ndim)})
    group_ends = np.cumsum(predictions.chunks[0])
    group_starts = group_ends - np.asarray(predictions.chunks[0])
    size = np.asarray(window.shape)
    group_lo = np.array(
        [
            anchors[s:e].min(axis=0) if e > s else np.full(k, 2**62)
            for s, e in zip(group_starts, group_ends)
        ]
    ).reshape(-1, k)
    group_hi = np.array(
        [
            anchors[s:e].max(axis=0) + size if e > s else np.full(k, -1)
            for s, e in zip(group_starts, group_ends)
        ]
    ).reshape(-1, k)

    acc = accumulation_dtype(predictions.dtype)
    token = tokenize(predictions, anchors, grid_shape, grid_chunks, window, reduce)
    name = f"xpatch-overlap-add-{token}"
    window_key = (f"xpatch-window-{token}",)
    layer: dict = {window_key: window}
    lead_index = (0,) * len(lead_shape)
    empty = np.empty((0, *predictions.shape[1:]), dtype=predictions.dtype)
    block_starts = [np.concatenate([[0], np.cumsum(c)[:-1]]) for c in grid_chunks]
    for block in itertools.product(*(range(len(c)) for c in grid_chunks)):
        origin = [int(block_starts[j][b]) for j, b in enumerate(block)]
        shape = [int(grid_chunks[j][b]) for j, b in enumerate(block)]
        end = np.asarray(origin) + np.asarray(shape)
        touching = np.flatnonzero(((group_lo < end) & (group_hi > origin)).all(axis=1))
        anchor_groups = [anchors[group_starts[g] : group_ends[g]] for g in touching]
        keys = [(predictions.name, int(g), *([0] * (predictions.ndim - 1))) for g in touching]
        layer[(name, *lead_index, *block)] = (
            _block_task,
            origin,
            shape,
            empty,
            window_key,
            reduce,
            anchor_groups,
            *keys,
        )
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[predictions])
    chunks = tuple((n,) for n in lead_shape) + tuple(tuple(c) for c in grid_chunks)
    return da.Array(
        graph, name, chunks, dtype=acc, meta=np.empty((0,) * (len(lead_shape) + k), acc)
    )
