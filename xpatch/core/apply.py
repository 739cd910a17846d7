"""Sliding-window inference: cut patches, run a batched function, blend the results.

:func:`apply_numpy` does it eagerly: large 2-D patches on a grid are blended batch
by batch as ``fn`` returns them (:mod:`xpatch.core.batch_blend`), others group by
group, then by the threaded overlap-add. :func:`apply_dask` builds one lazy graph
in which each group of patches is one task (cut, ``fn`` in batches, added into the
group's box) and each output block combines the boxes that reach it, so
predictions never wait in memory.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph
from dask.utils import parse_bytes

from xpatch.core.batch_blend import (
    BatchBlend,
    SharedCut,
    batch_kernel,
    blend_as_they_come,
    slab_kernel,
    slab_patches,
)
from xpatch.core.callables import code_token
from xpatch.core.dtypes import working_dtype
from xpatch.core.errors import PredictionError
from xpatch.core.extract import (
    cut_from_pieces,
    extract_numpy,
    group_reads,
    join_input,
    strip_reads,
)
from xpatch.core.overlap_add import (
    BlendWindow,
    Reduction,
    overlap_add_groups,
    worker_count,
)
from xpatch.core.padding import PadMode
from xpatch.core.partials import (
    Partial,
    assemble_blocks,
    output_lead_chunks,
    partial_sums,
    split_lead,
    weighted_result_dtype,
)
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
    pad_batch: bool = False,
    out_patch: Sequence[int] | None = None,
    split: bool = False,
    into_patches: bool = False,
) -> np.ndarray | list[np.ndarray]:
    """Call ``fn`` on consecutive batches of ``patches`` and stack what it returns.

    Each patch goes through ``fn`` exactly once. The result of every call is
    checked against the declared ``(b, *lead_shape, *patch)`` shape and dtype
    (:func:`check_declared`), then cast to that dtype. With ``pad_batch`` a
    short last batch is filled up to ``batch_size`` with copies of its last
    patch, whose results are dropped: ``fn`` sees one batch shape only, so a
    compiled function (``jax.jit``) compiles once.

    Parameters
    ----------
    patches
        ``(n, *lead_in, *patch)`` patches with ``n_patched`` patched axes last.
    fn, batch_size
        The function and the largest batch it gets.
    pad_batch
        Give ``fn`` batches of exactly ``batch_size`` patches.
    n_patched
        Number of patched axes.
    lead_shape, dtype
        Declared non-patched output shape and dtype.
    out_patch
        The output's patch shape (default: the input's).
    split
        Return each batch's result (cast) in a list instead of one stacked
        array: the batch blend (:mod:`xpatch.core.batch_blend`, numba's kernel
        or its numpy twin) adds batches where they are, sparing a copy of every
        prediction.
    into_patches
        Write each batch's results over its patches when they have the
        declared shape and dtype (``patches`` is the caller's own scratch):
        a batch is only valid during ``fn``'s call, as with a reused buffer.

    Examples
    --------
    >>> x = np.arange(12.0).reshape(3, 1, 4)
    >>> run_batches(x, lambda b: b * 2, 2, 1, (1,), np.dtype("f8"))[:, 0]
    array([[ 0.,  2.,  4.,  6.],
           [ 8., 10., 12., 14.],
           [16., 18., 20., 22.]])
    >>> seen = []
    >>> _ = run_batches(x, lambda b: seen.append(len(b)) or b, 2, 1, (1,), np.dtype("f8"), True)
    >>> seen
    [2, 2]
    """
    patch_shape = patches.shape[patches.ndim - n_patched :] if out_patch is None else out_patch
    stacked = (len(patches), *lead_shape, *patch_shape)
    if split:
        out = []
    elif into_patches and patches.shape == stacked and patches.dtype == dtype:
        # Each batch's results over its own patches, which fn is done with: fresh pages
        # for a second array of the group cost more than the small patches' arithmetic.
        out = patches
    else:
        out = np.empty(stacked, dtype=dtype)
    for start in range(0, len(patches), batch_size):
        batch = patches[start : start + batch_size]
        n = len(batch)
        if pad_batch and n < batch_size:
            # Copies of a real patch, not zeros: values the model has seen, no NaN or
            # out-of-range input that could trip it; their results are dropped below.
            batch = np.concatenate([batch, np.repeat(batch[-1:], batch_size - n, axis=0)])
        expected = (len(batch), *lead_shape, *patch_shape)
        result = np.asarray(fn(batch))
        if result.shape != expected:
            raise PredictionError(
                f"fn returned shape {result.shape} for a batch of shape {batch.shape}; "
                f"expected {expected} (batch, *output_dims, *patch). Declare the output's "
                "non-patched dims with output_dims={name: size}, and a patch shape other "
                "than the input's with scale={dim: factor}."
            )
        result = result[:n]
        if result.dtype != dtype:  # the common case, no cast, skips the check and errstate
            check_declared(result, dtype)
            with np.errstate(over="ignore", invalid="ignore"):  # checked; inf and NaN pass
                result = result.astype(dtype)
        if split:
            out.append(result)
        else:
            out[start : start + n] = result
    return out


#: Per declared kind, the kinds ``fn`` may return: the same, and the exact cases of a
#: bool or an integer of the other signedness declared as an integer dtype.
ACCEPTED_KINDS = {"b": "b", "i": "iub", "u": "iub", "f": "f", "c": "c"}
KIND_NAMES = {"b": "bool", "i": "int", "u": "uint", "f": "float", "c": "complex"}


def check_declared(result: np.ndarray, dtype: np.dtype) -> None:
    """Raise :class:`~xpatch.PredictionError` unless ``result`` fits the declared ``dtype``.

    ``result`` must be of the declared kind (bool, integer, float, complex; a
    bool or an integer of either signedness may be declared as any integer
    dtype), and its values must fit: integers within the dtype's range, finite
    floats not overflowing to inf (NaN and inf that ``fn`` returns pass, and a
    float may round to a narrower float). The check costs a min and a max.

    Examples
    --------
    >>> check_declared(np.array([0, 255], dtype=np.int64), np.dtype("uint8"))
    >>> check_declared(np.array([-3, 300], dtype=np.int64), np.dtype("uint8"))
    Traceback (most recent call last):
    ...
    xpatch.core.errors.PredictionError: fn returned int64 values from -3 to 300, ...
    """
    dtype, kind = np.dtype(dtype), result.dtype.kind
    if kind not in ACCEPTED_KINDS.get(dtype.kind, dtype.kind):
        raise PredictionError(
            f"fn returned dtype {result.dtype} ({KIND_NAMES.get(kind, kind)}), another kind "
            f"than the declared dtype={str(dtype)!r} ({KIND_NAMES.get(dtype.kind, dtype.kind)}); "
            f"apply casts within a kind only: pass dtype={str(result.dtype)!r} to apply, or "
            f"return {dtype} values from fn (out.astype({str(dtype)!r}))."
        )
    if result.size == 0 or result.dtype == dtype or dtype.kind not in "iuf" or kind == "b":
        return
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        low, high = int(result.min()), int(result.max())
        if info.min <= low and high <= info.max:
            return
        limits, clip = (info.min, info.max), f"np.clip(out, {info.min}, {info.max})"
    else:
        low, high = np.fmin.reduce(result, axis=None), np.fmax.reduce(result, axis=None)
        if not np.isfinite([low, high]).all():  # NaN and inf from fn pass: check the others
            finite = result[np.isfinite(result)]
            if not finite.size:
                return
            low, high = finite.min(), finite.max()
        with np.errstate(over="ignore"):
            if np.isfinite(np.array([low, high], dtype=result.dtype).astype(dtype)).all():
                return
        info = np.finfo(dtype)
        limits, clip = (float(info.min), float(info.max)), f"np.clip(out, {info.min}, {info.max})"
    raise PredictionError(
        f"fn returned {result.dtype} values from {low} to {high}, which do not fit the declared "
        f"dtype={str(dtype)!r} ({limits[0]} to {limits[1]}): they would "
        f"{'wrap around' if dtype.kind in 'iu' else 'overflow to inf'}. Declare a dtype that "
        f"holds them (dtype={str(result.dtype)!r}), or clip or cast in fn "
        f"(e.g. {clip}.astype({str(dtype)!r}))."
    )


def block_limit(array: da.Array) -> int:
    """Bytes an output block may take: the input's largest block, or dask's chunk size if larger.

    Output dims that are not patched (``output_dims={"class": 100}``) are split
    into chunks to stay within it (:func:`~xpatch.core.partials.output_lead_chunks`).
    """
    largest = int(np.prod([max(c) if c else 0 for c in array.chunks], dtype=np.int64))
    return max(largest * array.dtype.itemsize, parse_bytes(dask.config.get("array.chunk-size")))


def _apply_task(
    nested, crops, axes, local_anchors, size, pad_value, takes, fn, batch_size, pad_batch,
    lead_shape, dtype, anchors, box_origin, box_shape, window, reduce, acc, out_patch=None,
    patch_weights=None,
) -> Partial:  # fmt: skip
    cells = int(np.prod([*lead_shape, *(out_patch or size)], dtype=np.int64))
    sums = working_dtype(acc, reduce, window)

    def run(patches: np.ndarray, split: bool) -> np.ndarray:
        result = run_batches(patches, fn, batch_size, len(axes), lead_shape, dtype, pad_batch,
                             out_patch, split, into_patches=not split)  # fmt: skip
        return result[0] if split else result

    kernel = batch_kernel(reduce, acc, window, dtype, cells, in_task=True)
    if patch_weights is None and kernel is not None:
        blend = BatchBlend.start(anchors, box_origin, box_shape, window.factors, False,
                                 lead_shape, sums, kernel)  # fmt: skip
        if blend is not None:  # batch by batch: the task holds one batch, never the group's
            joined = None  # made only for patches past the pieces, or padded

            def cut_batch(batch: slice) -> np.ndarray:
                nonlocal joined
                patches = None if takes else cut_from_pieces(
                    nested, crops, axes, local_anchors[batch], size)  # fmt: skip
                if patches is None:
                    if joined is None:
                        joined = join_input(nested, crops, takes)
                    patches = extract_numpy(joined, axes, local_anchors[batch], size, pad_value)
                if batch.stop >= len(anchors):
                    joined = None  # all cut: its memory is free before fn runs
                return patches

            return _blend_in_parts(blend, anchors, batch_size, cut_batch,
                                   lambda p: run(p, True), box_origin, box_shape)  # fmt: skip
    source = join_input(nested, crops, takes)
    dtype = np.dtype(dtype)
    carried = int(np.prod(source.shape[: source.ndim - len(axes)], dtype=np.int64))
    patch_cells = carried * int(np.prod(size))
    patch_bytes = patch_cells * source.itemsize
    if patch_cells != cells or source.dtype != dtype:  # fn's results take arrays of their own
        patch_bytes += cells * dtype.itemsize
    kernel = slab_kernel(reduce, acc, window, dtype, len(anchors) * patch_bytes)
    if patch_weights is None and kernel is not None:
        blend = BatchBlend.start(anchors, box_origin, box_shape, window.factors, False,
                                 lead_shape, sums, kernel)  # fmt: skip
        if blend is not None:  # a slab of whole batches at a time, cut from the join
            step = slab_patches(batch_size, patch_bytes)
            return _blend_in_parts(
                blend, anchors, step,
                lambda part: extract_numpy(source, axes, local_anchors[part], size, pad_value),
                lambda p: run(p, False), box_origin, box_shape,
            )  # fmt: skip
    patches = extract_numpy(source, axes, local_anchors, size, pad_value)
    source = None  # before fn runs
    predictions = run_batches(
        patches, fn, batch_size, len(axes), lead_shape, dtype, pad_batch, out_patch,
        into_patches=True,
    )  # fmt: skip
    del patches
    return partial_sums(
        box_origin, box_shape, anchors, predictions, window, reduce, acc, patch_weights
    )


def _blend_in_parts(
    blend: BatchBlend,
    anchors: np.ndarray,
    step: int,
    cut: Callable[[slice], np.ndarray],
    run: Callable[[np.ndarray], np.ndarray],
    box_origin: Sequence[int],
    box_shape: Sequence[int],
) -> Partial:
    """Cut, run and blend ``step`` patches at a time: the task holds one part, never its group."""
    for start in range(0, len(anchors), step):
        part = slice(start, start + step)
        result = run(cut(part))  # the patches go when fn is done (unless they are its result)
        blend.add(anchors[part], result)
        result = None
    total, valid = blend.finish(box_origin, box_shape)
    return Partial(tuple(int(o) for o in box_origin), total, valid, anchors)


def group_weights(weights: np.ndarray | None, plan: Plan, group: int, ndim: int):
    """Per-patch ``weights`` (the user's order) of one group, shaped to weigh ``ndim``-D results."""
    if weights is None:
        return None
    return weights[plan.group_members(group)].reshape(-1, *(1,) * (ndim - 1))


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
    pad_mode: PadMode = "constant",
    pad_batch: bool = False,
    out_plan: Plan | None = None,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """Sliding-window inference on a numpy array, eagerly.

    Large 2-D patches on a product grid are cut batch by batch into one reused
    buffer and each batch is blended as ``fn`` returns it, on a second thread
    that also helps cut (:func:`~xpatch.core.batch_blend.blend_as_they_come`).
    Otherwise patches are cut group by group of the plan (so that at most one
    group of patches exists at a time), ``fn`` runs on each group in batches,
    and the predictions are blended by the threaded eager overlap-add. ``array`` holds
    its patched axes last. ``out_plan`` is the plan on the output grid when
    ``fn`` returns patches of another size (:func:`~xpatch.core.scale.scale_plan`;
    default ``plan``); ``weights``, per patch in the user's order, multiply
    the window (checked, float64). Returns ``(*lead_shape, *grid)`` in the
    :func:`~xpatch.core.partials.result_dtype` of ``dtype``.

    Examples
    --------
    >>> from xpatch.core.plan import ChunkGrid, Plan
    >>> x = np.arange(6.0)
    >>> plan = Plan.compile(np.array([[0], [2]]), ChunkGrid.from_chunks([(6,)]), [4],
    ...                     keep_order=True)
    >>> apply_numpy(x, plan, np.nan, lambda b: b + 1, 8, [], np.dtype("f8"), np.ones(4),
    ...             "mean").tolist()
    [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]

    Integers stay integers where :func:`~xpatch.core.partials.result_dtype` says so:

    >>> big = np.array([2**60 + 1, 2**60 + 3, 5, 7, 9, 11], dtype=np.int64)
    >>> apply_numpy(big, plan, 0, lambda b: b, 8, [], big.dtype, np.ones(4), "max").tolist()[:2]
    [1152921504606846977, 1152921504606846979]
    """
    k = plan.ndim
    out_plan = plan if out_plan is None else out_plan
    axes = list(range(array.ndim - k, array.ndim))
    acc = weighted_result_dtype(dtype, reduce, window, out_plan, weights is not None)
    patch_cells = int(np.prod([*lead_shape, *out_plan.size], dtype=np.int64))
    kernel = batch_kernel(reduce, acc, BlendWindow.of(window), dtype, patch_cells, in_task=False)
    if weights is None and kernel is not None:
        blended = _apply_blending_batches(
            array, plan, out_plan, pad_value, pad_mode, fn, batch_size, lead_shape, dtype,
            pad_batch, BlendWindow.of(window), reduce, acc, kernel,
        )  # fmt: skip
        if blended is not None:
            return blended
    prediction_groups, weight_groups, anchor_groups = [], [], []
    for g in range(len(plan.groups)):
        anchors, out_anchors = plan.group_anchors(g), out_plan.group_anchors(g)
        patches = extract_numpy(array, axes, anchors, plan.size, pad_value, pad_mode)
        predictions = run_batches(
            patches, fn, batch_size, k, lead_shape, dtype, pad_batch, out_plan.size,
            into_patches=True,
        )  # fmt: skip
        del patches
        prediction_groups.append(predictions)
        anchor_groups.append(out_anchors)
        weight_groups.append(group_weights(weights, plan, g, 1 + len(lead_shape) + k))
    grid = out_plan.grid.shape
    if not prediction_groups:  # no patch: nothing is covered, and acc is a float
        return np.full((*lead_shape, *grid), np.nan, acc)
    return overlap_add_groups(
        anchor_groups, prediction_groups, grid, window, reduce, dtype=acc,
        weight_groups=None if weights is None else weight_groups,
    )  # fmt: skip


def _apply_blending_batches(
    array, plan, out_plan, pad_value, pad_mode, fn, batch_size, lead_shape, dtype, pad_batch,
    window, reduce, acc, kernel,
) -> np.ndarray | None:  # fmt: skip
    """:func:`apply_numpy` blending each batch as ``fn`` returns it; None off a product grid.

    Batches are cut in the plan's order into one reused buffer (constant padding),
    and each is blended on a second thread while the next is cut and run.
    """
    k = plan.ndim
    axes = list(range(array.ndim - k, array.ndim))
    groups = range(len(plan.groups))
    out_anchors = [out_plan.group_anchors(g) for g in groups]
    blend = BatchBlend.start(
        np.concatenate(out_anchors), [0] * k, out_plan.grid.shape, window.factors,
        reduce == "mean", lead_shape, working_dtype(acc, reduce, window), kernel,
    )  # fmt: skip
    if blend is None:
        return None
    carried = [array.shape[ax] for ax in range(array.ndim - k)]
    buffer = None
    if pad_mode == "constant":  # no fresh pages per batch
        buffer = np.empty((batch_size, *carried, *plan.size), array.dtype)

    grid = np.asarray(array.shape[array.ndim - k :])

    def batches():
        for g in groups:
            anchors = plan.group_anchors(g)
            for start in range(0, len(anchors), batch_size):
                batch = anchors[start : start + batch_size]
                out = out_anchors[g][start : start + batch_size]
                if buffer is None or (batch < 0).any() or (batch + plan.size > grid).any():
                    cut_all = functools.partial(
                        extract_numpy, array, axes, batch, plan.size, pad_value, pad_mode
                    )
                    yield out, cut_all, None  # padded: cut by numpy, here
                    continue
                shared = SharedCut(len(batch), functools.partial(cut, batch.tolist()))
                yield out, functools.partial(shared_patches, shared, len(batch)), shared

    def cut(batch: list[list[int]], i: int) -> None:  # the patched axes are last
        buffer[i] = array[(..., *[slice(a, a + n) for a, n in zip(batch[i], plan.size)])]

    def shared_patches(shared: SharedCut, count: int) -> np.ndarray:
        shared.run()
        return buffer[:count]

    def run(patches: np.ndarray) -> np.ndarray:
        (result,) = run_batches(
            patches, fn, batch_size, k, lead_shape, dtype, pad_batch, out_plan.size, True
        )
        if buffer is not None and np.may_share_memory(result, buffer):
            result = result.copy()  # fn returned (a view of) the buffer the next batch fills
        return result

    blend_as_they_come(batches(), run, blend, overlap=worker_count() > 1)
    return blend.reduced([0] * k, out_plan.grid.shape).astype(acc, copy=False)


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
    pad_mode: PadMode = "constant",
    pad_batch: bool = False,
    out_plan: Plan | None = None,
    weights: np.ndarray | None = None,
) -> da.Array:
    """Sliding-window inference as one lazy graph: patches, ``fn``, overlap-add.

    ``array`` holds its patched axes last. Each group of the plan is one task
    that reads the input blocks the group touches, cuts its patches, runs ``fn``
    over them in batches and adds the results into the group's box
    (:func:`~xpatch.core.partials.partial_sums`); the predictions never leave
    the task, and a task holds one batch of large patches, or one slab of small
    ones when its group's would pass 16 MiB
    (:func:`~xpatch.core.batch_blend.slab_kernel`). Output blocks (the plan's
    grid) combine the pieces of those partials
    (:func:`~xpatch.core.partials.assemble_blocks`). ``fn`` and the
    window enter the graph once. With ``out_plan`` (the plan on an output grid
    at another resolution) the patches are cut on ``plan`` and blended on it;
    ``weights`` (per patch, the user's order) enter each group's task as its share.

    Returns
    -------
    dask.array.Array
        ``(*lead_shape, *grid)`` in the :func:`~xpatch.core.partials.result_dtype`
        of ``dtype``, decided while building: nothing is computed.
    """
    k = plan.ndim
    n_carried = array.ndim - k
    axes = list(range(n_carried, array.ndim))
    window = BlendWindow.of(window)
    size = list(plan.size)
    # The name identifies the values: fn by its code (dask would name a module's
    # function by its name alone), and not batch_size or pad_batch, which change no
    # value, so a resumed write may use another batch size. The pad mode only when
    # not the default, so that constant padding keeps the names it had.
    padding = pad_value if pad_mode == "constant" else (pad_value, pad_mode)
    # The output plan only when scaled, so that unscaled results keep their names.
    scaled = () if out_plan is None else (out_plan,)
    out_plan = plan if out_plan is None else out_plan
    weighted = () if weights is None else (weights,)
    token = tokenize(array, plan, padding, code_token(fn), lead_shape, str(dtype),
                     window.values, reduce, *scaled, *weighted)  # fmt: skip
    name = f"xpatch-apply-{token}"
    fn_key = (f"xpatch-fn-{token}",)
    window_key = (f"xpatch-window-{token}",)
    layer: dict = {fn_key: fn, window_key: window}
    acc = weighted_result_dtype(dtype, reduce, window, out_plan, weights is not None)
    partial_keys = {}
    reads = group_reads(array, axes, plan, whole_axes=range(n_carried), pad_mode=pad_mode)
    reads = strip_reads(list(reads), array, name, layer)
    for g, _, nested, crops, local, takes in reads:
        key = (f"{name}-partial", g)
        lo, shape = out_plan.boxes[g]
        layer[key] = (
            _apply_task, nested, crops, axes, local, size, pad_value, takes, fn_key, batch_size,
            pad_batch, tuple(lead_shape), dtype, out_plan.group_anchors(g), lo, shape,
            window_key, reduce, acc, out_plan.size if scaled else None,
            group_weights(weights, plan, g, 1 + len(lead_shape) + k),
        )  # fmt: skip
        partial_keys[(g, (0,) * len(lead_shape))] = key
    lead_chunks = output_lead_chunks(lead_shape, out_plan, acc.itemsize, block_limit(array))
    partial_keys = split_lead(layer, partial_keys, lead_chunks, name)
    chunks = assemble_blocks(
        layer, partial_keys, out_plan, lead_chunks, window_key, window, reduce, acc, name
    )
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[array])
    meta = np.empty((0,) * (len(lead_shape) + k), dtype=acc)
    return da.Array(graph, name, chunks, meta=meta)
