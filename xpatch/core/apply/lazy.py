"""Sliding-window inference as one lazy graph: one task per group of patches.

Each group's task cuts its patches, runs ``fn`` on them in batches and adds each
output's results into the group's box; each output block combines the boxes that
reach it (:mod:`xpatch.core.blend.partials`), so predictions never wait in memory.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

import dask
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph
from dask.utils import parse_bytes

from xpatch.core.apply.batches import (
    BatchFunction,
    InferenceSetup,
    group_weights,
    result_dtypes,
    run_batches,
    weighing,
)
from xpatch.core.apply.memory import working_plans
from xpatch.core.blend.batch_blend import (
    BatchBlend,
    batch_kernel,
    slab_kernel,
    slab_patches,
)
from xpatch.core.blend.partials import (
    Finish,
    assemble_blocks,
    output_lead_chunks,
    partial_sums,
    split_lead,
)
from xpatch.core.blend.placement import Partial
from xpatch.core.callables import code_token
from xpatch.core.extract import (
    cut_from_pieces,
    extract_numpy,
    group_reads,
    join_input,
    strip_reads,
)
from xpatch.core.plan import Plan
from xpatch.core.windows import BlendWindow

if TYPE_CHECKING:
    import dask.array as da


def block_limit(array: da.Array) -> int:
    """Bytes an output block may take: the input's largest block, or dask's chunk size if larger.

    Output dims that are not patched (``output_dims={"class": 100}``) are split
    into chunks to stay within it (:func:`~xpatch.core.blend.partials.output_lead_chunks`).
    """
    largest = int(np.prod([max(c) if c else 0 for c in array.chunks], dtype=np.int64))
    return max(largest * array.dtype.itemsize, parse_bytes(dask.config.get("array.chunk-size")))


@dataclass(frozen=True, eq=False)
class GroupTask:
    """What every group's task of one lazy apply shares (a few small values).

    Attributes
    ----------
    apply
        The inference, less ``fn`` and the window: they enter the graph under keys
        of their own, which every task names.
    axes, size
        The input's patched axes and its patch size.
    out_patch
        The output's patch size (the input's unless scaled).
    accs
        Each output's result dtype.
    """

    apply: InferenceSetup
    axes: tuple[int, ...]
    size: tuple[int, ...]
    out_patch: tuple[int, ...]
    accs: Mapping[str | None, np.dtype]


class Group(NamedTuple):
    """One group of patches in a task: its output anchors, its box, its per-patch weights."""

    anchors: np.ndarray
    origin: tuple[int, ...]
    shape: tuple[int, ...]
    weights: np.ndarray | None


def _apply_task(
    task: GroupTask,
    fn: BatchFunction,
    window: BlendWindow,
    nested: list,
    crops: list,
    local_anchors: np.ndarray,
    takes: tuple,
    group: Group,
) -> Partial | dict[str | None, Partial]:
    """Cut a group's patches, run ``fn`` on them in batches and add the results into its box.

    One output: its :class:`~xpatch.core.blend.placement.Partial`; several: a dict.
    One output without weights is blended batch by batch (large patches) or slab
    by slab (a large group of small ones) where the kernels allow; else the group
    is cut whole.
    """
    task = replace(task, apply=replace(task.apply, fn=fn, window=window))
    apply = task.apply
    one = apply.single and apply.weight_key is None and group.weights is None
    if one:
        blended = _blend_batches(task, nested, crops, local_anchors, takes, group)
        if blended is not None:
            return blended
    source = join_input(nested, crops, takes)
    if one:
        blended = _blend_slabs(task, source, local_anchors, group)
        if blended is not None:
            return blended
    patches = extract_numpy(source, task.axes, local_anchors, task.size, apply.pad_value)
    source = None  # before fn runs
    predictions = run_batches(patches, apply, task.out_patch, into_patches=True)
    del patches
    cell_weights = None if apply.weight_key is None else predictions.pop(apply.weight_key)
    k = len(task.axes)
    partials = {}
    for name, values in predictions.items():
        weights = weighing(cell_weights, group.weights, len(apply.outputs[name].lead), k)
        partials[name] = partial_sums(
            group.origin,
            group.shape,
            group.anchors,
            values,
            apply.window,
            apply.reduce,
            task.accs[name],
            weights,
        )
    return partials[None] if apply.single else partials


def _run_single(task: GroupTask, patches: np.ndarray, split: bool) -> np.ndarray:
    """One output's results of ``patches``: one batch's (``split``), or stacked over them."""
    (result,) = run_batches(patches, task.apply, task.out_patch, split, not split).values()
    return result[0] if split else result


def _batch_blend(task: GroupTask, group: Group, kernel: str | None) -> BatchBlend | None:
    """Start blending one output's batches into the group's box with ``kernel``, or None."""
    if kernel is None:
        return None
    apply = task.apply
    ((lead, _),) = apply.outputs.values()
    sums = apply.reduce.working_dtype(task.accs[None], apply.window)
    return BatchBlend.start(
        group.anchors, group.origin, group.shape, apply.window.factors, False, lead, sums, kernel
    )


def _blend_batches(
    task: GroupTask,
    nested: list,
    crops: list,
    local_anchors: np.ndarray,
    takes: tuple,
    group: Group,
) -> Partial | None:
    """One output's large patches blended batch by batch: the task holds one batch, or None."""
    apply = task.apply
    ((lead, dtype),) = apply.outputs.values()
    cells = int(np.prod([*lead, *task.out_patch], dtype=np.int64))
    kernel = batch_kernel(apply.reduce, task.accs[None], apply.window, dtype, cells, in_task=True)
    blend = _batch_blend(task, group, kernel)
    if blend is None:
        return None
    joined = None  # made only for patches past the pieces, or padded

    def cut_batch(batch: slice) -> np.ndarray:
        nonlocal joined
        patches = None
        if not takes:
            patches = cut_from_pieces(nested, crops, task.axes, local_anchors[batch], task.size)
        if patches is None:
            if joined is None:
                joined = join_input(nested, crops, takes)
            patches = extract_numpy(
                joined, task.axes, local_anchors[batch], task.size, apply.pad_value
            )
        if batch.stop >= len(group.anchors):
            joined = None  # all cut: its memory is free before fn runs
        return patches

    run = functools.partial(_run_single, task, split=True)
    return _blend_in_parts(blend, group, apply.batch_size, cut_batch, run)


def _blend_slabs(
    task: GroupTask, source: np.ndarray, local_anchors: np.ndarray, group: Group
) -> Partial | None:
    """Blend a large group of one output's small patches a slab at a time (None: whole)."""
    apply = task.apply
    ((lead, dtype),) = apply.outputs.values()
    cells = int(np.prod([*lead, *task.out_patch], dtype=np.int64))
    carried = int(np.prod(source.shape[: source.ndim - len(task.axes)], dtype=np.int64))
    patch_cells = carried * int(np.prod(task.size))
    patch_bytes = patch_cells * source.itemsize
    if patch_cells != cells or source.dtype != dtype:  # fn's results take arrays of their own
        patch_bytes += cells * dtype.itemsize
    group_bytes = len(group.anchors) * patch_bytes
    kernel = slab_kernel(apply.reduce, task.accs[None], apply.window, dtype, group_bytes)
    blend = _batch_blend(task, group, kernel)
    if blend is None:
        return None

    def cut_slab(part: slice) -> np.ndarray:
        return extract_numpy(source, task.axes, local_anchors[part], task.size, apply.pad_value)

    run = functools.partial(_run_single, task, split=False)
    return _blend_in_parts(blend, group, slab_patches(apply.batch_size, patch_bytes), cut_slab, run)


def _blend_in_parts(
    blend: BatchBlend,
    group: Group,
    step: int,
    cut: Callable[[slice], np.ndarray],
    run: Callable[[np.ndarray], np.ndarray],
) -> Partial:
    """Cut, run and blend ``step`` patches at a time: the task holds one part, never its group."""
    anchors = group.anchors
    for start in range(0, len(anchors), step):
        part = slice(start, start + step)
        result = run(cut(part))  # the patches go when fn is done (unless they are its result)
        blend.add(anchors[part], result)
        result = None
    total, valid = blend.finish(group.origin, group.shape)
    return Partial(tuple(int(o) for o in group.origin), total, valid, anchors)


def apply_dask(
    array: da.Array,
    plan: Plan,
    apply: InferenceSetup,
    out_plan: Plan | None = None,
    weights: np.ndarray | None = None,
    budget: int | None = None,
    inner: Plan | None = None,
) -> dict[str | None, da.Array]:
    """Sliding-window inference as one lazy graph: patches, ``fn``, overlap-add.

    ``array`` holds its patched axes last. Each group of the plan is one task
    that reads the input blocks the group touches, cuts its patches, runs ``fn``
    over them in batches and adds each output's results into the group's box
    (:meth:`Reduction.partial`); the predictions never leave the task, and a task
    holds one batch of large patches, or one slab of small ones when its group's
    would pass 16 MiB (:func:`~xpatch.core.blend.batch_blend.slab_kernel`). Output
    blocks (the plan's grid) combine the pieces of those partials
    (:func:`~xpatch.core.blend.partials.assemble_blocks`). The task's shared
    arguments (``fn`` and the window among them) enter the graph once. With
    ``out_plan`` (the plan on an output grid at another resolution) the patches
    are cut on ``plan`` and blended on it; ``weights`` (per patch, the user's
    order) enter each group's task as its share. With ``budget`` (bytes) the
    input's chunks are cut into working blocks small enough that the largest
    task's estimate fits (:func:`~xpatch.core.apply.memory.working_plans`); the
    output's blocks are then those, and each group cuts its part of a chunk in a
    task of its own, so that the chunk is freed once the parts are cut. With a
    halo, ``plan`` reads the grown windows (starting a halo before the patches,
    read past the edges as ``pad_mode`` says) and ``inner`` is the plan of the
    inner windows (the one the budget splits).

    Returns
    -------
    dict
        Per output name, ``(*lead, *grid)`` in the reduction's
        :meth:`~xpatch.core.blend.reductions.Reduction.result_dtype` of its
        dtype, decided while building: nothing is computed.
    """
    import dask.array as da

    k = plan.ndim
    n_carried = array.ndim - k
    axes = tuple(range(n_carried, array.ndim))
    accs = result_dtypes(apply, plan if out_plan is None else out_plan, weights)
    if budget is not None:
        plan, scaled = working_plans(
            array.shape, array.dtype.itemsize, plan, apply, out_plan or plan, accs, budget, inner
        )
        out_plan = None if out_plan is None else scaled
    name, token = _graph_name(array, plan, apply, out_plan, weights)
    out_plan = plan if out_plan is None else out_plan
    # Working blocks smaller than the chunks: each group cuts its own part of a chunk.
    own_cuts = plan.grid.chunks != tuple(array.chunks[ax] for ax in axes)
    # fn and the window enter the graph once, under keys of their own; each task carries
    # the rest of what they share (a few small values).
    fn_key, window_key = (f"xpatch-fn-{token}",), (f"xpatch-window-{token}",)
    shared = replace(apply, fn=None, window=None)
    task = GroupTask(shared, axes, tuple(plan.size), tuple(out_plan.size), accs)
    layer: dict = {fn_key: apply.fn, window_key: apply.window}
    group_keys = {}
    reads = group_reads(array, list(axes), plan, range(n_carried), apply.pad_mode)
    for g, _, nested, crops, local, takes in strip_reads(list(reads), array, name, layer, own_cuts):
        lo, shape = out_plan.boxes[g]
        group = Group(out_plan.group_anchors(g), lo, shape, group_weights(weights, plan, g))
        group_keys[g] = (f"{name}-partial", g)
        task_args = (task, fn_key, window_key, nested, crops, local, takes, group)
        layer[group_keys[g]] = (_apply_task, *task_args)
    limit = block_limit(array)
    own_layers = {}
    for index, (out_name, (lead, _)) in enumerate(apply.outputs.items()):
        # One output's blocks read its group's partial itself; several pick theirs. The
        # index, not the name, is in the dask name: any string is a valid output name.
        own_name = name if apply.single else f"xpatch-apply-{token}-{index}"
        own = layer if apply.single else {}
        partial_keys = {}
        for g, key in group_keys.items():
            if not apply.single:
                own[(f"{own_name}-pick", g)] = (operator.getitem, key, out_name)
                key = (f"{own_name}-pick", g)
            partial_keys[(g, (0,) * len(lead))] = key
        lead_chunks = output_lead_chunks(lead, out_plan, accs[out_name].itemsize, limit)
        partial_keys = split_lead(own, partial_keys, lead_chunks, own_name)
        finish = Finish(apply.reduce, accs[out_name], window_key, apply.window.values.shape)
        chunks = assemble_blocks(own, partial_keys, out_plan, lead_chunks, finish, own_name)
        own_layers[out_name] = (own_name, own, chunks)
    base = HighLevelGraph.from_collections(name, layer, dependencies=[array])
    result = {}
    for out_name, (own_name, own, chunks) in own_layers.items():
        graph = base
        if own is not layer:
            graph = HighLevelGraph(
                {**base.layers, own_name: own}, {**base.dependencies, own_name: {name}}
            )
        meta = np.empty((0,) * (len(apply.outputs[out_name].lead) + k), dtype=accs[out_name])
        result[out_name] = da.Array(graph, own_name, chunks, meta=meta)
    return result


def _graph_name(
    array: da.Array,
    plan: Plan,
    apply: InferenceSetup,
    out_plan: Plan | None,
    weights: np.ndarray | None,
) -> tuple[str, str]:
    """Return the graph's name and token: they identify the values, as before one path.

    ``fn`` by its code (dask would name a module's function by its name alone), and
    not ``batch_size`` or ``pad_batch``, which change no value, so a resumed write may
    use another batch size. The pad mode only when not the default, and the output
    plan or weights only when given, so that results keep the names they had.
    """
    padding = apply.pad_value
    if apply.pad_mode != "constant":
        padding = (apply.pad_value, apply.pad_mode)
    common = (array, plan, padding, code_token(apply.fn))
    if apply.single:
        ((lead, dtype),) = apply.outputs.values()
        scaled = () if out_plan is None else (out_plan,)
        weighted = () if weights is None else (weights,)
        token = tokenize(
            *common, tuple(lead), str(dtype), apply.window.values, apply.reduce, *scaled, *weighted
        )
        return f"xpatch-apply-{token}", token
    described = [(n, tuple(lead), str(d)) for n, (lead, d) in apply.outputs.items()]
    extra = [o for o in (out_plan, weights, apply.weight_key) if o is not None]
    token = tokenize(*common, described, apply.window.values, apply.reduce, *extra)
    return f"xpatch-apply-outputs-{token}", token
