"""Sliding-window inference with several outputs: ``fn`` returns a dict of arrays.

``fn`` runs once per batch for all outputs; each output is blended exactly as
:mod:`xpatch.core.apply` blends a single one. On dask one task per group of
patches runs ``fn`` and returns a partial per output (a dict of
:class:`~xpatch.core.partials.Partial`); each output's blocks are assembled
from its entry, so the graph holds a few tasks per chunk per output.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from xpatch.core.apply import BatchFunction, block_limit, check_declared, group_weights
from xpatch.core.callables import code_token
from xpatch.core.errors import PredictionError
from xpatch.core.extract import extract_numpy, extract_task, group_reads
from xpatch.core.overlap_add import BlendWindow, Reduction, overlap_add_groups
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
from xpatch.core.weighted import check_weights

#: Per output name: its declared non-patched shape and dtype.
OutputSpecs = Mapping[str, tuple[Sequence[int], np.dtype]]


def check_returned(result: object, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Return ``fn``'s dict result as arrays, or raise :class:`~xpatch.PredictionError`.

    Examples
    --------
    >>> sorted(check_returned({"a": [1], "b": [2]}, ["a", "b"]))
    ['a', 'b']
    >>> check_returned({"a": [1], "c": [2]}, ["a", "b"])
    Traceback (most recent call last):
    ...
    xpatch.core.errors.PredictionError: fn returned the outputs ['a', 'c'] where ...
    """
    declared = ", ".join(repr(n) for n in names)
    if not isinstance(result, Mapping):
        raise PredictionError(
            f"fn returned a {type(result).__name__} where apply was declared several outputs "
            f"({declared}) through dicts of output_dims / dtype / out_dtype; return a dict "
            f"{{{', '.join(f'{n!r}: array' for n in names)}}}, or declare a single output."
        )
    got = list(result)
    if set(got) != set(names):
        extra = [k for k in got if k not in names]
        missing = [n for n in names if n not in result]
        raise PredictionError(
            f"fn returned the outputs {got!r} where apply was declared {list(names)!r} "
            f"(not declared: {extra!r}; missing: {missing!r}). Declare every output fn "
            "returns as a key of output_dims={name: {dim: size}, ...} (or of dtype), "
            "and return all of them from every call."
        )
    return {n: np.asarray(result[n]) for n in names}


def run_batches_outputs(
    patches: np.ndarray,
    fn: BatchFunction,
    batch_size: int,
    n_patched: int,
    outputs: OutputSpecs,
    pad_batch: bool = False,
    out_patch: Sequence[int] | None = None,
    weight_key: str | None = None,
) -> dict[str, np.ndarray]:
    """Call ``fn`` once per batch of ``patches`` and stack each output it returns.

    As :func:`~xpatch.core.apply.run_batches`, for a ``fn`` that returns a dict
    of ``(b, *lead_shape, *patch)`` arrays, one per key of ``outputs``
    (``out_patch``: the output's patch shape, default the input's). With
    ``weight_key``, ``fn`` also returns weights under that key, per patch
    ``(b,)`` or per cell ``(b, *patch)``: returned as ``(n, *patch)`` float64
    under that key, checked finite and >= 0.

    Examples
    --------
    >>> x = np.arange(6.0).reshape(3, 2)
    >>> specs = {"a": ((), np.dtype("f8")), "b": ((1,), np.dtype("f4"))}
    >>> out = run_batches_outputs(x, lambda b: {"a": b, "b": b[:, None] * 2}, 2, 1, specs)
    >>> out["a"].shape, out["b"].shape, out["b"].dtype
    ((3, 2), (3, 1, 2), dtype('float32'))
    """
    patch_shape = patches.shape[patches.ndim - n_patched :] if out_patch is None else out_patch
    patch_shape = tuple(int(n) for n in patch_shape)
    names = list(outputs) + ([weight_key] if weight_key is not None else [])
    out = {
        n: np.empty((len(patches), *lead, *patch_shape), dtype=dtype)
        for n, (lead, dtype) in outputs.items()
    }
    if weight_key is not None:
        out[weight_key] = np.empty((len(patches), *patch_shape), dtype=np.float64)
    for start in range(0, len(patches), batch_size):
        batch = patches[start : start + batch_size]
        n = len(batch)
        if pad_batch and n < batch_size:  # copies of a real patch, as run_batches does
            batch = np.concatenate([batch, np.repeat(batch[-1:], batch_size - n, axis=0)])
        results = check_returned(fn(batch), names)
        if weight_key is not None:
            out[weight_key][start : start + n] = returned_weights(
                results[weight_key], weight_key, len(batch), patch_shape
            )[:n]
        for name, (lead, dtype) in outputs.items():
            result = results[name]
            expected = (len(batch), *lead, *patch_shape)
            if result.shape != expected:
                raise PredictionError(
                    f"fn returned shape {result.shape} for output {name!r} of a batch of shape "
                    f"{batch.shape}; expected {expected} (batch, *output_dims, *patch). Declare "
                    f"its non-patched dims with output_dims={{{name!r}: {{dim: size}}}}, and "
                    "a patch shape other than the input's with scale={dim: factor}."
                )
            result = result[:n]
            check_declared(result, dtype)
            with np.errstate(over="ignore", invalid="ignore"):
                out[name][start : start + n] = result
    return out


def returned_weights(
    weights: np.ndarray, key: str, b: int, patch_shape: tuple[int, ...]
) -> np.ndarray:
    """Return the weights ``fn`` returned under ``key`` per cell, ``(b, *patch)``, checked.

    Examples
    --------
    >>> returned_weights(np.array([1.0, 2.0]), "w", 2, (3,)).tolist()
    [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]
    """
    weights = np.asarray(weights)
    if weights.shape == (b,):
        weights = weights.reshape(b, *(1,) * len(patch_shape))
    elif weights.shape != (b, *patch_shape):
        raise PredictionError(
            f"fn returned weights {key!r} of shape {weights.shape} for a batch of {b}; "
            f"expected ({b},) per patch or {(b, *patch_shape)} per cell."
        )
    return np.broadcast_to(check_weights(weights), (b, *patch_shape))


def _weighing(
    cell_weights: np.ndarray | None, patch_weights: np.ndarray | None, n_lead: int, k: int
) -> np.ndarray | None:
    """Return one output's weights: ``fn``'s per cell times the given per patch, lead axes 1."""
    if cell_weights is None and patch_weights is None:
        return None
    if cell_weights is None:
        return patch_weights.reshape(-1, *(1,) * (n_lead + k))
    weights = cell_weights
    if patch_weights is not None:
        weights = weights * patch_weights.reshape(-1, *(1,) * k)
    return weights.reshape(weights.shape[0], *(1,) * n_lead, *weights.shape[1:])


def _outputs_task(
    nested, crops, axes, local_anchors, size, pad_value, takes, fn, batch_size, pad_batch,
    outputs, anchors, box_origin, box_shape, window, reduce, accs, out_patch=None,
    weight_key=None, patch_weights=None,
) -> dict[str, Partial]:  # fmt: skip
    patches = extract_task(nested, crops, axes, local_anchors, size, pad_value, takes)
    predictions = run_batches_outputs(
        patches, fn, batch_size, len(axes), outputs, pad_batch, out_patch, weight_key
    )
    del patches
    cell_weights = None if weight_key is None else predictions.pop(weight_key)
    return {
        name: partial_sums(
            box_origin, box_shape, anchors, values, window, reduce, accs[name],
            _weighing(cell_weights, patch_weights, len(outputs[name][0]), len(axes)),
        )
        for name, values in predictions.items()
    }  # fmt: skip


def apply_numpy_outputs(
    array: np.ndarray,
    plan: Plan,
    pad_value: object,
    fn: BatchFunction,
    batch_size: int,
    outputs: OutputSpecs,
    window: np.ndarray | BlendWindow,
    reduce: Reduction,
    pad_mode: PadMode = "constant",
    pad_batch: bool = False,
    out_plan: Plan | None = None,
    weights: np.ndarray | None = None,
    weight_key: str | None = None,
) -> dict[str, np.ndarray]:
    """Sliding-window inference of several outputs on a numpy array, eagerly.

    As :func:`~xpatch.core.apply.apply_numpy` (``out_plan`` and ``weights``
    included), with ``fn`` called once per batch for all outputs, and the
    weights it returns under ``weight_key`` multiplied into every output's.
    Returns, per output, ``(*lead_shape, *grid)``.

    Examples
    --------
    >>> from xpatch.core.plan import ChunkGrid, Plan
    >>> plan = Plan.compile(np.array([[0], [2]]), ChunkGrid.from_chunks([(6,)]), [4],
    ...                     keep_order=True)
    >>> specs = {"up": ((), np.dtype("f8")), "down": ((), np.dtype("f8"))}
    >>> out = apply_numpy_outputs(np.arange(6.0), plan, np.nan,
    ...                           lambda b: {"up": b + 1, "down": b - 1}, 8, specs,
    ...                           np.ones(4), "mean")
    >>> out["up"].tolist(), out["down"].tolist()[:2]
    ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [-1.0, 0.0])
    """
    k = plan.ndim
    out_plan = plan if out_plan is None else out_plan
    axes = list(range(array.ndim - k, array.ndim))
    groups: dict[str, list[np.ndarray]] = {name: [] for name in outputs}
    weight_groups: dict[str, list] = {name: [] for name in outputs}
    for g in range(len(plan.groups)):
        anchors = plan.group_anchors(g)
        patches = extract_numpy(array, axes, anchors, plan.size, pad_value, pad_mode)
        predictions = run_batches_outputs(
            patches, fn, batch_size, k, outputs, pad_batch, out_plan.size, weight_key
        )
        del patches
        cell_weights = None if weight_key is None else predictions.pop(weight_key)
        patch_weights = group_weights(weights, plan, g, 1)
        for name, values in predictions.items():
            groups[name].append(values)
            lead = len(outputs[name][0])
            weight_groups[name].append(_weighing(cell_weights, patch_weights, lead, k))
    grid = out_plan.grid.shape
    anchor_groups = [out_plan.group_anchors(g) for g in range(len(out_plan.groups))]
    result = {}
    weighted = weights is not None or weight_key is not None
    for name, (lead, dtype) in outputs.items():
        acc = weighted_result_dtype(dtype, reduce, window, out_plan, weighted)
        if not groups[name]:
            result[name] = np.full((*lead, *grid), np.nan, acc)
        else:
            result[name] = overlap_add_groups(
                anchor_groups, groups[name], grid, window, reduce, dtype=acc,
                weight_groups=weight_groups[name] if weighted else None,
            )  # fmt: skip
    return result


def apply_dask_outputs(
    array: da.Array,
    plan: Plan,
    pad_value: object,
    fn: BatchFunction,
    batch_size: int,
    outputs: OutputSpecs,
    window: np.ndarray | BlendWindow,
    reduce: Reduction,
    pad_mode: PadMode = "constant",
    pad_batch: bool = False,
    out_plan: Plan | None = None,
    weights: np.ndarray | None = None,
    weight_key: str | None = None,
) -> dict[str, da.Array]:
    """Sliding-window inference of several outputs as one lazy graph.

    One task per group of the plan cuts its patches, runs ``fn`` once per batch
    and returns a :class:`~xpatch.core.partials.Partial` per output; per output,
    one task per group picks its partial and the output's blocks are assembled
    from them (:func:`~xpatch.core.partials.assemble_blocks`), as
    :func:`~xpatch.core.apply.apply_dask` assembles a single output. Returns a
    lazy array per output: nothing is computed.
    """
    k = plan.ndim
    n_carried = array.ndim - k
    axes = list(range(n_carried, array.ndim))
    window = BlendWindow.of(window)
    size = list(plan.size)
    specs = {n: (tuple(int(s) for s in lead), np.dtype(d)) for n, (lead, d) in outputs.items()}
    padding = pad_value if pad_mode == "constant" else (pad_value, pad_mode)
    described = [(n, lead, str(d)) for n, (lead, d) in specs.items()]
    # Options that are not the default only when given, so that results keep their names.
    extra = [o for o in (out_plan, weights, weight_key) if o is not None]
    out_plan = plan if out_plan is None else out_plan
    token = tokenize(array, plan, padding, code_token(fn), described, window.values, reduce, *extra)
    weighted = weights is not None or weight_key is not None
    shared = f"xpatch-apply-outputs-{token}"
    fn_key = (f"xpatch-fn-{token}",)
    window_key = (f"xpatch-window-{token}",)
    layer: dict = {fn_key: fn, window_key: window}
    accs = {
        n: weighted_result_dtype(d, reduce, window, out_plan, weighted)
        for n, (_, d) in specs.items()
    }
    group_keys = {}
    reads = group_reads(array, axes, plan, whole_axes=range(n_carried), pad_mode=pad_mode)
    for g, _, nested, crops, local, takes in reads:
        key = (shared, g)
        lo, shape = out_plan.boxes[g]
        layer[key] = (
            _outputs_task, nested, crops, axes, local, size, pad_value, takes, fn_key,
            batch_size, pad_batch, specs, out_plan.group_anchors(g), lo, shape, window_key,
            reduce, accs, out_plan.size, weight_key, group_weights(weights, plan, g, 1),
        )  # fmt: skip
        group_keys[g] = key
    base = HighLevelGraph.from_collections(shared, layer, dependencies=[array])
    limit = block_limit(array)
    result = {}
    for index, (out_name, (lead, _)) in enumerate(specs.items()):
        # The index, not the name, in the dask name: any string is a valid output name.
        name = f"xpatch-apply-{token}-{index}"
        own: dict = {}
        partial_keys = {}
        for g, key in group_keys.items():
            own[(f"{name}-pick", g)] = (operator.getitem, key, out_name)
            partial_keys[(g, (0,) * len(lead))] = (f"{name}-pick", g)
        lead_chunks = output_lead_chunks(lead, out_plan, accs[out_name].itemsize, limit)
        partial_keys = split_lead(own, partial_keys, lead_chunks, name)
        chunks = assemble_blocks(
            own, partial_keys, out_plan, lead_chunks, window_key, window, reduce,
            accs[out_name], name,
        )  # fmt: skip
        graph = HighLevelGraph({**base.layers, name: own}, {**base.dependencies, name: {shared}})
        meta = np.empty((0,) * (len(lead) + k), dtype=accs[out_name])
        result[out_name] = da.Array(graph, name, chunks, meta=meta)
    return result
