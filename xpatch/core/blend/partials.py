"""Lazy overlap-add on the plan: a partial sum per group, combined per output block.

Each group of patches of the :class:`~xpatch.core.plan.Plan` is added into the
box it spans (:func:`partial_sums`, a :class:`~xpatch.core.blend.placement.Partial`);
the pieces by which a box overhangs into neighbouring blocks are copied out once;
each output block adds the pieces that reach it and finishes
(:func:`combine_partials`). What a partial holds and how pieces combine is the
reduction's (:mod:`xpatch.core.blend.reductions`), which the eager path asks too,
so the eager and lazy paths give the same numbers.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from xpatch.core.blend.lattice import lattice_overlap_add
from xpatch.core.blend.overlap_add import on_lattice
from xpatch.core.blend.placement import Block, Landing, Partial, Piece, place_patches
from xpatch.core.blend.reductions import Reduction, ReductionName, as_reduction
from xpatch.core.blend.weighted import check_weights, weigher
from xpatch.core.errors import PredictionError
from xpatch.core.plan import Plan, chunk_starts
from xpatch.core.regroup import row_sources
from xpatch.core.windows import BlendWindow

if TYPE_CHECKING:
    import dask.array as da


def partial_sums(
    origin: Sequence[int],
    box_shape: Sequence[int],
    anchors: np.ndarray,
    predictions: np.ndarray,
    window: np.ndarray | BlendWindow,
    reduce: Reduction | ReductionName,
    dtype: np.dtype | None = None,
    weights: np.ndarray | None = None,
) -> Partial:
    """Add one group of patches into the box ``[origin, origin + box_shape)``.

    The counterpart of :func:`~xpatch.core.blend.overlap_add.accumulate_groups` that
    does not finish, so that :func:`combine_partials` can add the partials of several
    groups (:meth:`Reduction.partial`). ``dtype`` is the result's
    (:meth:`Reduction.result_dtype`); by default as if some cell of the grid were
    uncovered. ``weights`` (``(n, *lead, *patch)``, size-1 axes where they repeat)
    multiply the window; they are checked here, so a lazy reconstruction checks
    them task by task (:func:`~xpatch.core.blend.weighted.check_weights`).

    Examples
    --------
    >>> part = partial_sums([0], [4], np.array([[0], [2]]), np.ones((2, 2)), np.ones(2), "mean")
    >>> part.total.tolist(), part.weight
    ([1.0, 1.0, 1.0, 1.0], None)
    """
    window = BlendWindow.of(window)
    reduce = as_reduction(reduce)
    k = len(box_shape)
    origin = tuple(int(o) for o in origin)
    lead = predictions.shape[1 : predictions.ndim - k]
    acc = reduce.accumulation_dtype(predictions.dtype) if dtype is None else np.dtype(dtype)
    if acc.kind not in "iub":
        reduce.check_exact_in_float([predictions], window, weighted=weights is not None)
    acc = reduce.working_dtype(acc, window, None if weights is None else [weights])
    # (combine_partials casts back)
    patch_cells = int(np.prod(predictions.shape[1:], dtype=np.int64))
    if on_lattice(reduce, acc, window, weights, patch_cells):
        total = lattice_overlap_add(
            [anchors],
            [predictions],
            (origin, box_shape),
            window.factors,
            False,
            acc,
            nan_uncovered=False,
        )
        if total is not None:
            return Partial(origin, total, None, np.asarray(anchors, dtype=np.int64).reshape(-1, k))
    reduce.check_dtype(predictions.dtype)
    box = (*lead, *(int(n) for n in box_shape))
    placements = place_patches(origin, box_shape, [anchors], window.values.shape)
    reaching = np.array([p.anchor for p in placements], dtype=np.int64).reshape(-1, k)
    weigh = None
    if weights is not None:
        weigh = weigher(window.values, [check_weights(weights)], [predictions])
    landing = Landing(origin, box_shape, [predictions], placements, window, weigh)
    return reduce.partial(landing, box, acc, reaching)


def combine_partials(
    origin: Sequence[int],
    block_shape: Sequence[int],
    partials: Sequence[Partial],
    window: np.ndarray | BlendWindow,
    reduce: Reduction | ReductionName,
    template: np.ndarray,
) -> np.ndarray:
    """Add the partials that fall on one block and finish: the block's result.

    ``template`` is ``(0, *lead, *patch)`` in the result's dtype
    (:meth:`Reduction.result_dtype`). Returns ``(*lead, *block_shape)`` in that
    dtype, NaN where nothing valid landed, as
    :func:`~xpatch.core.blend.overlap_add.accumulate_groups` does for the same
    patches (:meth:`Reduction.combine`).

    Examples
    --------
    >>> w = np.ones(2)
    >>> parts = [partial_sums([0], [3], np.array([[a]]), np.full((1, 2), v), w, "mean")
    ...          for a, v in ((0, 1.0), (1, 3.0))]
    >>> combine_partials([0], [3], parts, w, "mean", np.empty((0, 2))).tolist()
    [1.0, 2.0, 3.0]
    """
    window = BlendWindow.of(window)
    k = len(block_shape)
    lead = template.shape[1 : template.ndim - k]
    out_shape = (*lead, *(int(n) for n in block_shape))
    origin = [int(o) for o in origin]
    pieces = []
    for part in partials:
        extent = part.total.shape[-k:]
        inside = all(
            a >= o and a + n <= o + m
            for a, n, o, m in zip(part.origin, extent, origin, block_shape)
        )
        piece = part if inside else part.view(origin, block_shape, window.values.shape)
        if piece is not None:
            offsets = [a - o for a, o in zip(piece.origin, origin)]
            extent = piece.total.shape[-k:]
            region = (Ellipsis, *(slice(a, a + n) for a, n in zip(offsets, extent)))
            pieces.append(Piece(piece, region))
    block = Block(origin, block_shape, window)
    return as_reduction(reduce).combine(out_shape, template.dtype, pieces, block)


def output_lead_chunks(
    lead_shape: Sequence[int], plan: Plan, itemsize: int, limit: int
) -> tuple[tuple[int, ...], ...]:
    """Chunks of the lead (non-patched) axes that keep an output block within ``limit`` bytes.

    Whole unless the largest output block would pass ``limit``; then the last
    axes are kept whole first and the rest split evenly (a single lead cell per
    block at the least).

    Examples
    --------
    >>> from xpatch.core.plan import ChunkGrid
    >>> plan = Plan.compile(np.zeros((1, 2), int), ChunkGrid.from_chunks([(1024,), (1024,)]),
    ...                     [8, 8], keep_order=True)
    >>> output_lead_chunks([100], plan, 4, 128 * 2**20)
    ((32, 32, 32, 4),)
    >>> output_lead_chunks([3], plan, 4, 128 * 2**20)
    ((3,),)
    """
    from dask.array.core import normalize_chunks

    block_cells = int(np.prod([max(c) if c else 0 for c in plan.grid.chunks], dtype=np.int64))
    budget = max(int(limit) // max(block_cells * int(itemsize), 1), 1)
    sizes = []
    for n in reversed([int(n) for n in lead_shape]):
        size = min(n, budget) if n else 0
        budget = max(budget // max(size, 1), 1)
        sizes.append(size)
    return tuple(
        normalize_chunks((size or n,), (n,))[0] for size, n in zip(reversed(sizes), lead_shape)
    )


def split_lead(
    layer: dict, partial_keys: dict, chunks: Sequence[Sequence[int]], name: str
) -> dict[tuple[int, tuple[int, ...]], tuple]:
    """Add tasks that cut each group's whole-lead partial into the lead ``chunks``' blocks.

    ``partial_keys`` maps ``(g, (0, ...))`` to whole-lead partials; returns the
    keys per ``(g, lead_block)`` for :func:`assemble_blocks` (the same keys when
    the lead axes are one block).
    """
    if all(len(c) == 1 for c in chunks):
        return partial_keys
    starts = [chunk_starts(c) for c in chunks]
    out = {}
    for (g, _), key in partial_keys.items():
        for block in itertools.product(*(range(len(c)) for c in chunks)):
            index = tuple(slice(starts[j][b], starts[j][b + 1]) for j, b in enumerate(block))
            part = (f"{name}-lead", g, *block)
            layer[part] = (Partial.lead_part, key, index)
            out[(g, block)] = part
    return out


def _overhang_task(partial: Partial, blocks: list, size) -> dict:
    # Copies: the pieces must not keep the partial's whole box alive.
    return {block: partial.crop(origin, shape, size) for block, origin, shape in blocks}


def _pick(part: Partial | dict, block: tuple) -> Partial | None:
    return part.get(block) if isinstance(part, dict) else part


class Finish(NamedTuple):
    """How the output blocks of one lazy overlap-add finish.

    Attributes
    ----------
    reduce
        The reduction.
    dtype
        The result's dtype (:meth:`Reduction.result_dtype`).
    window_key
        The key of the blending window in the graph: it enters the graph once.
    size
        The window's shape (the patch size).
    """

    reduce: Reduction
    dtype: np.dtype
    window_key: tuple
    size: tuple[int, ...]


def _combine_task(
    reduce: Reduction,
    dtype: np.dtype,
    window: BlendWindow,
    block: tuple,
    origin: tuple,
    block_shape: tuple,
    template_shape: tuple,
    *parts: Partial | dict,
) -> np.ndarray:
    template = np.empty((0, *template_shape), dtype=dtype)
    present = [p for p in (_pick(part, block) for part in parts) if p is not None]
    return combine_partials(origin, block_shape, present, window, reduce, template)


def assemble_blocks(
    layer: dict,
    partial_keys: dict[tuple[int, tuple[int, ...]], tuple],
    plan: Plan,
    lead_chunks: Sequence[Sequence[int]],
    finish: Finish,
    name: str,
) -> tuple[tuple[int, ...], ...]:
    """Add to ``layer`` one task per output block that combines the partials on it.

    ``partial_keys[(g, lead_block)]`` is the key of group ``g``'s partial (over
    its box in ``plan``) for one block of the lead axes. Output blocks are those
    of ``plan.grid``. The block that holds a group's anchors reads the partial
    itself; the pieces that overhang into other blocks are copied out by one
    ``{name}-overhang`` task per partial, so a neighbouring block waits for those
    thin pieces, not for the whole group. Returns the output's chunks.
    """
    grid = plan.grid
    size = finish.size
    per_block: dict[tuple[int, ...], list[tuple]] = {}
    for (g, lead_block), key in partial_keys.items():
        home, others = plan.reach[g]
        per_block.setdefault((*lead_block, *home), []).append(key)
        if others:
            overhang = (f"{name}-overhang", g, *lead_block)
            pieces = [(block, grid.origin(block), grid.extent(block)) for block in others]
            layer[overhang] = (_overhang_task, key, pieces, size)
            for block in others:
                per_block.setdefault((*lead_block, *block), []).append(overhang)
    for lead_block in itertools.product(*(range(len(c)) for c in lead_chunks)):
        template_shape = (*(lead_chunks[j][b] for j, b in enumerate(lead_block)), *size)
        for block in grid.blocks():
            layer[(name, *lead_block, *block)] = (
                _combine_task,
                finish.reduce,
                finish.dtype,
                finish.window_key,
                block,
                grid.origin(block),
                grid.extent(block),
                template_shape,
                *per_block.get((*lead_block, *block), []),
            )
    return tuple(tuple(c) for c in lead_chunks) + grid.chunks


class GroupBox(NamedTuple):
    """One group's patches in a lazy overlap-add: anchors, box, and the anchors carried."""

    anchors: np.ndarray
    origin: tuple[int, ...]
    shape: tuple[int, ...]
    expected: np.ndarray | None = None


def _partial_task(
    reduce: Reduction,
    dtype: np.dtype,
    window: BlendWindow,
    group: GroupBox,
    predictions: np.ndarray,
    columns: list | None,
    weights: np.ndarray | None = None,
) -> Partial:
    """Check the group's carried anchors, then add its predictions into its box."""
    carried = None if columns is None else np.stack(columns, axis=1)
    expected = group.anchors if group.expected is None else group.expected
    if carried is not None and not np.array_equal(carried, expected):
        bad = int(np.flatnonzero((np.asarray(carried) != expected).any(axis=1))[0])
        raise PredictionError(
            f"a prediction carries anchor {np.asarray(carried)[bad].tolist()} where the patch "
            f"at {expected[bad].tolist()} belongs: lazy {{dim}}_anchor coordinates are checked, "
            "not matched. Keep the predictions in the order of p.anchors(), or load the "
            "anchor coordinates (pred.assign_coords({c: pred[c].compute() ...})) to have "
            "them put in order."
        )
    return partial_sums(
        group.origin,
        group.shape,
        group.anchors,
        predictions,
        window,
        reduce,
        dtype,
        weights,
    )


def overlap_add_dask(
    predictions: da.Array,
    plan: Plan,
    window: np.ndarray | BlendWindow,
    reduce: Reduction | ReductionName = "mean",
    rows: np.ndarray | None = None,
    carried_anchors: Sequence[da.Array] | None = None,
    weights: da.Array | np.ndarray | None = None,
    carried_plan: Plan | None = None,
) -> da.Array:
    """Reconstruct dask predictions lazily: a partial per group, a task per output block.

    The predictions of each group of the plan (for one block of the lead axes)
    are added into the group's box (:func:`partial_sums`), read straight from
    the chunk that holds them when the predictions are chunked as the plan
    groups them, else gathered from the chunks that do (:mod:`~xpatch.core.regroup`):
    predictions chunked any way along the patch axis give the same graph size
    and task memory. Each output block (the plan's grid along the patched axes,
    the prediction's chunks along the lead axes) adds the pieces of the partials
    that reach it and normalises by the window sums of their anchors, which
    depend on geometry alone (:func:`combine_partials`). The window enters the
    graph once.

    Parameters
    ----------
    predictions
        ``(n, *lead, *patch)`` dask array; its patched axes are made whole.
    plan
        The plan over the patched axes (its grid is the output's).
    window, reduce
        As for :func:`accumulate_groups`.
    rows
        The row of ``predictions`` that holds each patch (in the user's order of
        the plan); default: row ``i`` holds patch ``i``.
    carried_anchors
        Per patched axis, ``(n,)`` lazy anchors the predictions carry: each partial
        checks its rows' against the plan's and raises
        :class:`~xpatch.PredictionError` on a mismatch (computing them to match
        them up would compute while building the graph).
    carried_plan
        The plan whose anchors the carried ones are (the input's, when ``plan``
        is on an output grid at another resolution); default ``plan``.
    weights
        Weights multiplied into the window, row for row with ``predictions``:
        ``(n, *lead, *patch)`` with size-1 axes where they repeat, chunked any way
        along the first axis (regrouped as the predictions are). Checked (finite,
        >= 0) by each partial's task.
    """
    import dask.array as da

    k = plan.ndim
    n_lead = predictions.ndim - 1 - k
    window = BlendWindow.of(window)
    reduce = as_reduction(reduce)
    predictions = predictions.rechunk({ax: -1 for ax in range(1 + n_lead, predictions.ndim)})
    rows = plan.order if rows is None else np.asarray(rows, dtype=np.int64)[plan.order]
    acc = reduce.result_dtype(predictions.dtype, window, plan, weights is not None)
    if weights is not None:  # lead axes chunked as the predictions' (or 1), patched axes whole
        weights = da.asarray(weights)
        weights = weights.rechunk(
            {
                ax: predictions.chunks[ax] if weights.shape[ax] > 1 else -1
                for ax in range(1, weights.ndim)
            }
        )
    token = tokenize(predictions, plan, rows, window.values, reduce, carried_anchors, weights)
    name = f"xpatch-overlap-add-{token}"
    window_key = (f"xpatch-window-{token}",)
    finish = Finish(reduce, acc, window_key, window.values.shape)
    layer: dict = {window_key: window}
    lead_chunks = predictions.chunks[1 : 1 + n_lead]
    partial_keys = {}
    for g, ((start, stop), (lo, shape)) in enumerate(zip(plan.groups, plan.boxes)):
        # One array per group, shared by its lead blocks' tasks (a gather, off chunk order).
        anchors = plan.group_anchors(g)
        carried_group = None if carried_plan is None else carried_plan.group_anchors(g)
        for lead_block in itertools.product(*(range(len(c)) for c in lead_chunks)):
            key = (f"{name}-partial", g, *lead_block)
            source = row_sources(
                predictions.name, predictions.chunks[0], rows[start:stop], (*lead_block, *[0] * k)
            )
            carried = None
            if carried_anchors is not None:
                carried = [
                    row_sources(column.name, column.chunks[0], rows[start:stop], ())
                    for column in carried_anchors
                ]
            weight_rows = None
            if weights is not None:
                index = [b if weights.shape[1 + j] > 1 else 0 for j, b in enumerate(lead_block)]
                weight_rows = row_sources(
                    weights.name, weights.chunks[0], rows[start:stop], (*index, *[0] * k)
                )
            group = GroupBox(anchors, lo, shape, carried_group)
            task = (_partial_task, reduce, acc, window_key, group, source, carried, weight_rows)
            layer[key] = task
            partial_keys[(g, lead_block)] = key
    chunks = assemble_blocks(layer, partial_keys, plan, lead_chunks, finish, name)
    dependencies = [predictions, *(carried_anchors or []), *([] if weights is None else [weights])]
    graph = HighLevelGraph.from_collections(name, layer, dependencies=dependencies)
    return da.Array(graph, name, chunks, dtype=acc, meta=np.empty((0,) * (n_lead + k), acc))
