"""Run a batched function over the patch groups of a lazy patch stack.

This is the middle of sliding-window inference: patches (one dask chunk per
group) go in, per-patch predictions (same chunks along the patch axis) come out,
and :func:`xpatch.core.overlap_add.overlap_add_dask` puts them back on the grid.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from xpatch.core.errors import PredictionError

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


def _run_group(patches, fn, batch_size, n_patched, lead_shape, dtype):
    return run_batches(patches, fn, batch_size, n_patched, lead_shape, dtype)


def predict_dask(
    patches: da.Array,
    fn: BatchFunction,
    batch_size: int,
    n_patched: int,
    lead_shape: Sequence[int],
    dtype: np.dtype,
) -> da.Array:
    """Apply ``fn`` lazily to each chunk of a ``(n, *lead_in, *patch)`` patch stack.

    One task per chunk along the patch axis (the lead and patch axes are made
    whole first). ``fn`` enters the graph once, under its own key, however many
    tasks use it.
    """
    patches = patches.rechunk({ax: -1 for ax in range(1, patches.ndim)})
    patch_shape = patches.shape[patches.ndim - n_patched :]
    token = tokenize(patches, fn, batch_size, tuple(lead_shape), str(dtype))
    name = f"xpatch-apply-{token}"
    fn_key = (f"xpatch-fn-{token}",)
    layer: dict = {fn_key: fn}
    zeros = (0,) * (patches.ndim - 1)
    out_zeros = (0,) * (len(lead_shape) + n_patched)
    for g in range(patches.numblocks[0]):
        layer[(name, g, *out_zeros)] = (
            _run_group,
            (patches.name, g, *zeros),
            fn_key,
            batch_size,
            n_patched,
            tuple(lead_shape),
            dtype,
        )
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[patches])
    chunks = (
        patches.chunks[0],
        *((int(n),) for n in lead_shape),
        *((int(n),) for n in patch_shape),
    )
    meta = np.empty((0,) * (1 + len(lead_shape) + n_patched), dtype=dtype)
    return da.Array(graph, name, chunks, meta=meta)
