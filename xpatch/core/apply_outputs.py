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

from xpatch.core.apply import BatchFunction, check_declared
from xpatch.core.callables import code_token
from xpatch.core.errors import PredictionError
from xpatch.core.extract import extract_numpy, extract_task, group_reads
from xpatch.core.overlap_add import BlendWindow, Reduction, overlap_add_groups
from xpatch.core.padding import PadMode
from xpatch.core.partials import Partial, assemble_blocks, partial_sums, result_dtype
from xpatch.core.plan import Plan

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
) -> dict[str, np.ndarray]:
    """Call ``fn`` once per batch of ``patches`` and stack each output it returns.

    As :func:`~xpatch.core.apply.run_batches`, for a ``fn`` that returns a dict
    of ``(b, *lead_shape, *patch)`` arrays, one per key of ``outputs``.

    Examples
    --------
    >>> x = np.arange(6.0).reshape(3, 2)
    >>> specs = {"a": ((), np.dtype("f8")), "b": ((1,), np.dtype("f4"))}
    >>> out = run_batches_outputs(x, lambda b: {"a": b, "b": b[:, None] * 2}, 2, 1, specs)
    >>> out["a"].shape, out["b"].shape, out["b"].dtype
    ((3, 2), (3, 1, 2), dtype('float32'))
    """
    patch_shape = patches.shape[patches.ndim - n_patched :]
    names = list(outputs)
    out = {
        n: np.empty((len(patches), *lead, *patch_shape), dtype=dtype)
        for n, (lead, dtype) in outputs.items()
    }
    for start in range(0, len(patches), batch_size):
        batch = patches[start : start + batch_size]
        n = len(batch)
        if pad_batch and n < batch_size:  # copies of a real patch, as run_batches does
            batch = np.concatenate([batch, np.repeat(batch[-1:], batch_size - n, axis=0)])
        results = check_returned(fn(batch), names)
        for name, (lead, dtype) in outputs.items():
            result = results[name]
            expected = (len(batch), *lead, *patch_shape)
            if result.shape != expected:
                raise PredictionError(
                    f"fn returned shape {result.shape} for output {name!r} of a batch of shape "
                    f"{batch.shape}; expected {expected} (batch, *output_dims, *patch). Declare "
                    f"its non-patched dims with output_dims={{{name!r}: {{dim: size}}}} and "
                    "keep the patch shape."
                )
            result = result[:n]
            check_declared(result, dtype)
            with np.errstate(over="ignore", invalid="ignore"):
                out[name][start : start + n] = result
    return out


def _outputs_task(
    nested, crops, axes, local_anchors, size, pad_value, takes, fn, batch_size, pad_batch,
    outputs, anchors, box_origin, box_shape, window, reduce, accs,
) -> dict[str, Partial]:  # fmt: skip
    patches = extract_task(nested, crops, axes, local_anchors, size, pad_value, takes)
    predictions = run_batches_outputs(patches, fn, batch_size, len(axes), outputs, pad_batch)
    del patches
    return {
        name: partial_sums(box_origin, box_shape, anchors, values, window, reduce, accs[name])
        for name, values in predictions.items()
    }


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
) -> dict[str, np.ndarray]:
    """Sliding-window inference of several outputs on a numpy array, eagerly.

    As :func:`~xpatch.core.apply.apply_numpy`, with ``fn`` called once per batch
    for all outputs. Returns, per output, ``(*lead_shape, *grid)``.

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
    axes = list(range(array.ndim - k, array.ndim))
    anchor_groups = [plan.group_anchors(g) for g in range(len(plan.groups))]
    groups: dict[str, list[np.ndarray]] = {name: [] for name in outputs}
    for group in anchor_groups:
        patches = extract_numpy(array, axes, group, plan.size, pad_value, pad_mode)
        for name, values in run_batches_outputs(
            patches, fn, batch_size, k, outputs, pad_batch
        ).items():
            groups[name].append(values)
        del patches
    grid = array.shape[array.ndim - k :]
    result = {}
    for name, (lead, dtype) in outputs.items():
        acc = result_dtype(dtype, reduce, window, plan)
        if not groups[name]:
            result[name] = np.full((*lead, *grid), np.nan, acc)
        else:
            result[name] = overlap_add_groups(
                anchor_groups, groups[name], grid, window, reduce, dtype=acc
            )
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
    token = tokenize(array, plan, padding, code_token(fn), described, window.values, reduce)
    shared = f"xpatch-apply-outputs-{token}"
    fn_key = (f"xpatch-fn-{token}",)
    window_key = (f"xpatch-window-{token}",)
    layer: dict = {fn_key: fn, window_key: window}
    accs = {n: result_dtype(d, reduce, window, plan) for n, (_, d) in specs.items()}
    group_keys = {}
    reads = group_reads(array, axes, plan, whole_axes=range(n_carried), pad_mode=pad_mode)
    for g, _, nested, crops, local, takes in reads:
        key = (shared, g)
        lo, shape = plan.boxes[g]
        layer[key] = (
            _outputs_task, nested, crops, axes, local, size, pad_value, takes, fn_key,
            batch_size, pad_batch, specs, plan.group_anchors(g), lo, shape, window_key,
            reduce, accs,
        )  # fmt: skip
        group_keys[g] = key
    base = HighLevelGraph.from_collections(shared, layer, dependencies=[array])
    result = {}
    for index, (out_name, (lead, _)) in enumerate(specs.items()):
        # The index, not the name, in the dask name: any string is a valid output name.
        name = f"xpatch-apply-{token}-{index}"
        own: dict = {}
        partial_keys = {}
        for g, key in group_keys.items():
            own[(f"{name}-pick", g)] = (operator.getitem, key, out_name)
            partial_keys[(g, (0,) * len(lead))] = (f"{name}-pick", g)
        chunks = assemble_blocks(
            own, partial_keys, plan, [(n,) for n in lead], window_key, window, reduce,
            accs[out_name], name,
        )  # fmt: skip
        graph = HighLevelGraph({**base.layers, name: own}, {**base.dependencies, name: {shared}})
        meta = np.empty((0,) * (len(lead) + k), dtype=accs[out_name])
        result[out_name] = da.Array(graph, name, chunks, meta=meta)
    return result
