"""Sliding-window inference: cut patches, run a batched function, blend the results.

:func:`apply_numpy` does it eagerly, group by group, then blends with the threaded
overlap-add. :func:`apply_dask` builds one lazy graph in which each group of
patches is one task (cut, ``fn`` in batches, added into the group's box) and each
output block combines the boxes that reach it, so predictions never wait in
memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from xpatch.core.errors import PredictionError
from xpatch.core.extract import extract_numpy, extract_task, group_reads
from xpatch.core.overlap_add import (
    BlendWindow,
    Reduction,
    accumulation_dtype,
    overlap_add_groups,
)
from xpatch.core.partials import Partial, assemble_blocks, partial_sums
from xpatch.core.plan import Plan

#: ``fn(batch) -> batch``: numpy ``(b, *lead_in, *patch)`` to ``(b, *lead_out, *patch)``.
BatchFunction = Callable[[np.ndarray], np.ndarray]


def run_batches(
    patches: np.ndarray,
    fn: BatchFunction,
    batch_size: int,
    n_patched: int,
    lead_shape: Sequence[int],
    dtype: np.dtype,
) -> np.ndarray:
    """Call ``fn`` on consecutive batches of ``patches`` and stack what it returns.

    Each patch goes through ``fn`` exactly once. The result of every call is
    checked against the declared ``(b, *lead_shape, *patch)`` shape and cast to
    ``dtype`` (only within a kind: a float result is not truncated to int).

    Parameters
    ----------
    patches
        ``(n, *lead_in, *patch)`` patches with ``n_patched`` patched axes last.
    fn, batch_size
        The function and the largest batch it gets.
    n_patched
        Number of patched axes.
    lead_shape, dtype
        Declared non-patched output shape and dtype.

    Examples
    --------
    >>> x = np.arange(12.0).reshape(3, 1, 4)
    >>> run_batches(x, lambda b: b * 2, 2, 1, (1,), np.dtype("f8"))[:, 0]
    array([[ 0.,  2.,  4.,  6.],
           [ 8., 10., 12., 14.],
           [16., 18., 20., 22.]])
    """
    patch_shape = patches.shape[patches.ndim - n_patched :]
    out = np.empty((len(patches), *lead_shape, *patch_shape), dtype=dtype)
    for start in range(0, len(patches), batch_size):
        batch = patches[start : start + batch_size]
        expected = (len(batch), *lead_shape, *patch_shape)
        result = np.asarray(fn(batch))
        if result.shape != expected:
            raise PredictionError(
                f"fn returned shape {result.shape} for a batch of shape {batch.shape}; "
                f"expected {expected} (batch, *output_dims, *patch). Declare the output's "
                "non-patched dims with output_dims={name: size} and keep the patch shape."
            )
        if not np.can_cast(result.dtype, dtype, casting="same_kind"):
            raise PredictionError(
                f"fn returned dtype {result.dtype}, which does not fit the declared dtype "
                f"{dtype}; pass dtype={str(result.dtype)!r} to apply."
            )
        out[start : start + len(batch)] = result
    return out


def _apply_task(
    nested, crops, axes, local_anchors, size, pad_value, fn, batch_size, lead_shape, dtype,
    anchors, box_origin, box_shape, window, reduce,
) -> Partial:  # fmt: skip
    patches = extract_task(nested, crops, axes, local_anchors, size, pad_value)
    predictions = run_batches(patches, fn, batch_size, len(axes), lead_shape, dtype)
    del patches
    return partial_sums(box_origin, box_shape, anchors, predictions, window, reduce)


def apply_numpy(
    array: np.ndarray,
    plan: Plan,
    pad_value: object,
    fn: BatchFunction,
    batch_size: int,
    lead_shape: Sequence[int],
    dtype: np.dtype,
    window: np.ndarray | BlendWindow,
    reduce: Reduction,
) -> np.ndarray:
    """Sliding-window inference on a numpy array, eagerly.

    Patches are cut group by group of the plan (so that at most one group of
    patches exists at a time), ``fn`` runs on each group in batches, and the
    predictions are blended by the threaded eager overlap-add. ``array`` holds
    its patched axes last. Returns ``(*lead_shape, *grid)`` in the accumulation
    dtype of ``dtype``.

    Examples
    --------
    >>> from xpatch.core.plan import ChunkGrid, Plan
    >>> x = np.arange(6.0)
    >>> plan = Plan.compile(np.array([[0], [2]]), ChunkGrid.from_chunks([(6,)]), [4],
    ...                     keep_order=True)
    >>> apply_numpy(x, plan, np.nan, lambda b: b + 1, 8, [], np.dtype("f8"), np.ones(4),
    ...             "mean").tolist()
    [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    """
    k = plan.ndim
    axes = list(range(array.ndim - k, array.ndim))
    anchor_groups = [plan.group_anchors(g) for g in range(len(plan.groups))]
    prediction_groups = []
    for group in anchor_groups:
        patches = extract_numpy(array, axes, group, plan.size, pad_value)
        prediction_groups.append(run_batches(patches, fn, batch_size, k, lead_shape, dtype))
        del patches
    if not prediction_groups:
        return np.full((*lead_shape, *array.shape[-k:]), np.nan, accumulation_dtype(dtype))
    grid = array.shape[array.ndim - k :]
    return overlap_add_groups(anchor_groups, prediction_groups, grid, window, reduce)


def apply_dask(
    array: da.Array,
    plan: Plan,
    pad_value: object,
    fn: BatchFunction,
    batch_size: int,
    lead_shape: Sequence[int],
    dtype: np.dtype,
    window: np.ndarray | BlendWindow,
    reduce: Reduction,
) -> da.Array:
    """Sliding-window inference as one lazy graph: patches, ``fn``, overlap-add.

    ``array`` holds its patched axes last. Each group of the plan is one task
    that reads the input blocks the group touches, cuts its patches, runs ``fn``
    over them in batches and adds the results into the group's box
    (:func:`~xpatch.core.partials.partial_sums`); the predictions never leave
    the task. Output blocks (the plan's grid) combine the pieces of those
    partials (:func:`~xpatch.core.partials.assemble_blocks`). ``fn`` and the
    window enter the graph once.

    Returns
    -------
    dask.array.Array
        ``(*lead_shape, *grid)`` in the accumulation dtype of ``dtype``.
    """
    k = plan.ndim
    n_carried = array.ndim - k
    axes = list(range(n_carried, array.ndim))
    window = BlendWindow.of(window)
    size = list(plan.size)
    token = tokenize(array, plan, pad_value, fn, batch_size, lead_shape, str(dtype),
                     window.values, reduce)  # fmt: skip
    name = f"xpatch-apply-{token}"
    fn_key = (f"xpatch-fn-{token}",)
    window_key = (f"xpatch-window-{token}",)
    layer: dict = {fn_key: fn, window_key: window}
    partial_keys = {}
    reads = group_reads(array, axes, plan, whole_axes=range(n_carried))
    for g, _, nested, crops, local in reads:
        key = (f"{name}-partial", g)
        lo, shape = plan.boxes[g]
        layer[key] = (
            _apply_task, nested, crops, axes, local, size, pad_value, fn_key, batch_size,
            tuple(lead_shape), dtype, plan.group_anchors(g), lo, shape, window_key, reduce,
        )  # fmt: skip
        partial_keys[(g, (0,) * len(lead_shape))] = key
    acc = accumulation_dtype(dtype)
    lead_chunks = [(int(n),) for n in lead_shape]
    chunks = assemble_blocks(
        layer, partial_keys, plan, lead_chunks, window_key, window, reduce, acc, name
    )
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[array])
    meta = np.empty((0,) * (len(lead_shape) + k), dtype=acc)
    return da.Array(graph, name, chunks, meta=meta)
