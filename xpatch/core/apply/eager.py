"""Sliding-window inference on a numpy array, eagerly.

Large 2-D patches on a grid, for one output, are blended batch by batch as ``fn``
returns them (:mod:`xpatch.core.blend.batch_blend`); others group by group, then by
the threaded overlap-add (:mod:`xpatch.core.blend.overlap_add`).
"""

from __future__ import annotations

import functools

import numpy as np

from xpatch.core.apply.batches import (
    InferenceSetup,
    group_weights,
    result_dtypes,
    run_batches,
    weighing,
)
from xpatch.core.blend.batch_blend import (
    BatchBlend,
    SharedCut,
    batch_kernel,
    blend_as_they_come,
)
from xpatch.core.blend.overlap_add import overlap_add_groups
from xpatch.core.cores import worker_count
from xpatch.core.extract import (
    extract_numpy,
)
from xpatch.core.plan import Plan


def apply_numpy(
    array: np.ndarray,
    plan: Plan,
    apply: InferenceSetup,
    out_plan: Plan | None = None,
    weights: np.ndarray | None = None,
) -> dict[str | None, np.ndarray]:
    """Sliding-window inference on a numpy array, eagerly.

    Large 2-D patches on a product grid, for one output, are cut batch by batch
    into one reused buffer and each batch is blended as ``fn`` returns it, on a
    second thread that also helps cut
    (:func:`~xpatch.core.blend.batch_blend.blend_as_they_come`). Otherwise patches
    are cut group by group of the plan (so that at most one group of patches
    exists at a time), ``fn`` runs on each group in batches, and each output's
    predictions are blended by the threaded eager overlap-add. ``array`` holds
    its patched axes last. ``out_plan`` is the plan on the output grid when ``fn``
    returns patches of another size (:func:`~xpatch.core.scale.scale_plan`;
    default ``plan``); ``weights``, per patch in the user's order, multiply the
    window (checked, float64). Returns per output ``(*lead, *grid)`` in the
    reduction's result dtype.

    Examples
    --------
    >>> from xpatch.core.apply.batches import InferenceSetup, Output
    >>> from xpatch.core.blend.reductions import MAX, MEAN
    >>> from xpatch.core.plan import ChunkGrid, Plan
    >>> from xpatch.core.windows import BlendWindow
    >>> x = np.arange(6.0)
    >>> plan = Plan.compile(np.array([[0], [2]]), ChunkGrid.from_chunks([(6,)]), [4],
    ...                     keep_order=True)
    >>> f8 = {None: Output((), np.dtype("f8"))}
    >>> one = InferenceSetup(lambda b: b + 1, 8, f8, BlendWindow.of(np.ones(4)), MEAN, np.nan)
    >>> apply_numpy(x, plan, one)[None].tolist()
    [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]

    Integers stay integers where the reduction's result dtype says so:

    >>> big = np.array([2**60 + 1, 2**60 + 3, 5, 7, 9, 11], dtype=np.int64)
    >>> i8 = {None: Output((), big.dtype)}
    >>> same = InferenceSetup(lambda b: b, 8, i8, BlendWindow.of(np.ones(4)), MAX, 0)
    >>> apply_numpy(big, plan, same)[None].tolist()[:2]
    [1152921504606846977, 1152921504606846979]
    """
    k = plan.ndim
    out_plan = plan if out_plan is None else out_plan
    axes = list(range(array.ndim - k, array.ndim))
    accs = result_dtypes(apply, out_plan, weights)
    if apply.single and apply.weight_key is None and weights is None:
        blended = _apply_blending_batches(array, plan, out_plan, apply, accs[None])
        if blended is not None:
            return {None: blended}
    groups: dict[str | None, list[np.ndarray]] = {name: [] for name in apply.outputs}
    weight_groups: dict[str | None, list] = {name: [] for name in apply.outputs}
    for g in range(len(plan.groups)):
        anchors = plan.group_anchors(g)
        patches = extract_numpy(array, axes, anchors, plan.size, apply.pad_value, apply.pad_mode)
        predictions = run_batches(patches, apply, out_plan.size, into_patches=True)
        del patches
        cell_weights = None if apply.weight_key is None else predictions.pop(apply.weight_key)
        patch_weights = group_weights(weights, plan, g)
        for name, values in predictions.items():
            groups[name].append(values)
            lead = len(apply.outputs[name].lead)
            weight_groups[name].append(weighing(cell_weights, patch_weights, lead, k))
    grid = out_plan.grid.shape
    anchor_groups = [out_plan.group_anchors(g) for g in range(len(out_plan.groups))]
    weighted = weights is not None or apply.weight_key is not None
    result = {}
    for name, (lead, _) in apply.outputs.items():
        if not groups[name]:  # no patch: nothing is covered, and the result is a float
            result[name] = np.full((*lead, *grid), np.nan, accs[name])
            continue
        result[name] = overlap_add_groups(
            anchor_groups,
            groups[name],
            grid,
            apply.window,
            apply.reduce,
            dtype=accs[name],
            weight_groups=weight_groups[name] if weighted else None,
        )
    return result


def _apply_blending_batches(
    array: np.ndarray, plan: Plan, out_plan: Plan, apply: InferenceSetup, acc: np.dtype
) -> np.ndarray | None:
    """:func:`apply_numpy` blending each batch as ``fn`` returns it; None off a product grid.

    Batches are cut in the plan's order into one reused buffer (constant padding),
    and each is blended on a second thread while the next is cut and run.
    """
    ((lead_shape, dtype),) = apply.outputs.values()
    window, reduce, batch_size = apply.window, apply.reduce, apply.batch_size
    patch_cells = int(np.prod([*lead_shape, *out_plan.size], dtype=np.int64))
    kernel = batch_kernel(reduce, acc, window, dtype, patch_cells, in_task=False)
    if kernel is None:
        return None
    k = plan.ndim
    axes = list(range(array.ndim - k, array.ndim))
    groups = range(len(plan.groups))
    out_anchors = [out_plan.group_anchors(g) for g in groups]
    blend = BatchBlend.start(
        np.concatenate(out_anchors),
        [0] * k,
        out_plan.grid.shape,
        window.factors,
        reduce.normalised,
        lead_shape,
        reduce.working_dtype(acc, window),
        kernel,
    )
    if blend is None:
        return None
    carried = [array.shape[ax] for ax in range(array.ndim - k)]
    buffer = None
    if apply.pad_mode == "constant":  # no fresh pages per batch
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
                        extract_numpy,
                        array,
                        axes,
                        batch,
                        plan.size,
                        apply.pad_value,
                        apply.pad_mode,
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
        (result,) = run_batches(patches, apply, out_plan.size, True).values()
        (result,) = result
        if buffer is not None and np.may_share_memory(result, buffer):
            result = result.copy()  # fn returned (a view of) the buffer the next batch fills
        return result

    blend_as_they_come(batches(), run, blend, overlap=worker_count() > 1)
    return blend.reduced([0] * k, out_plan.grid.shape).astype(acc, copy=False)
