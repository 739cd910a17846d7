"""Lazy overlap-add on the plan: a partial sum per group, combined per output block.

Each group of patches of the :class:`~xpatch.core.plan.Plan` is added into the
box it spans (:func:`partial_sums`, a :class:`Partial`); the pieces by which a
box overhangs into neighbouring blocks are copied out once; each output block
adds the pieces that reach it and normalises (:func:`combine_partials`). The
placement and weight code is :mod:`xpatch.core.overlap_add`'s, so the eager and
lazy paths give the same numbers.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import dask.array as da
import numpy as np
from dask.array.core import normalize_chunks
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from xpatch.core.dtypes import (
    Reduction,
    accumulation_dtype,
    check_exact_in_float,
    check_vote_dtype,
    reduction_fill,
    weighted_result_dtype,
    working_dtype,
)
from xpatch.core.dtypes import covers_every_cell as covers_every_cell  # re-exported
from xpatch.core.dtypes import plan_covers as plan_covers
from xpatch.core.dtypes import result_dtype as result_dtype
from xpatch.core.errors import PredictionError
from xpatch.core.lattice import all_positive, lattice_overlap_add, outer_product, product_sums
from xpatch.core.overlap_add import (
    BlendWindow,
    BlockWeights,
    add_patches,
    check_wrapped,
    integer_sum_shadow,
    normalise,
    on_lattice,
    place_patches,
)
from xpatch.core.plan import Plan, chunk_starts, reaching
from xpatch.core.regroup import row_sources
from xpatch.core.vote import vote_partial, vote_pieces
from xpatch.core.weighted import check_weights, weigher, weighted_sums


@dataclass(frozen=True, eq=False)
class Partial:
    """What some patches add to a box of the grid, before normalising.

    A lazy reconstruction adds each group of patches into the box they span (a
    ``Partial``), cuts the box into the pieces that fall on each output block and
    sums the pieces of a block. Where a group overhangs its block the pieces are
    thin strips: only they, never whole groups of predictions, wait for the
    neighbouring block.

    Attributes
    ----------
    origin
        Start of the box along the patched axes.
    total
        ``(*lead, *box)``: Σ w·x for ``"mean"`` and ``"sum"`` (0 where nothing
        landed), or the running max / min (NaN, or for integers the identity
        of the max / min, where nothing landed). For ``"vote"``,
        ``(n_labels, *lead, *box)``: per label of :attr:`labels`, the Σ w of the
        patches voting it (-1 where none does; :mod:`xpatch.core.vote`).
    weight
        Σ w of the valid values when some value was NaN; None when all were valid,
        and the window sums of :attr:`anchors` apply.
    anchors
        Anchors of the patches that reach the box.
    bound, shadow
        For an integer sum: a bound on ``|total|`` and, when that bound does not
        rule out that the sum wraps, Σ w·x in float64 (else None), from which
        the block's sum is checked.
    labels
        For ``"vote"``: the sorted labels present in the group (else None).
    """

    origin: tuple[int, ...]
    total: np.ndarray
    weight: np.ndarray | None
    anchors: np.ndarray
    bound: float = 0.0
    shadow: np.ndarray | None = None
    labels: np.ndarray | None = None

    def crop(self, origin: Sequence[int], shape: Sequence[int], size: Sequence[int]):
        """Return a copy of the part inside ``[origin, origin + shape)``, or None.

        ``size`` is the patch size, to keep the anchors of the patches that reach
        the part. A copy does not keep the whole box alive.
        """
        part = self.view(origin, shape, size)
        if part is None:
            return None
        weight = None if part.weight is None else part.weight.copy()
        shadow = None if part.shadow is None else part.shadow.copy()
        return replace(part, total=part.total.copy(), weight=weight, shadow=shadow)

    def lead_part(self, index: Sequence[slice]) -> Partial:
        """Return a copy of the part at ``index`` along the lead axes (the box whole).

        Lets one group's partial feed output blocks that split the lead axes.
        """
        labels = (slice(None),) if self.labels is not None else ()  # votes: labels first
        total = self.total[(*labels, *index)].copy()
        weight = None if self.weight is None else self.weight[tuple(index)].copy()
        shadow = None if self.shadow is None else self.shadow[tuple(index)].copy()
        return replace(self, total=total, weight=weight, shadow=shadow)

    def view(self, origin: Sequence[int], shape: Sequence[int], size: Sequence[int]):
        """Return the part inside ``[origin, origin + shape)`` (views), or None."""
        k = len(self.origin)
        extent = self.total.shape[-k:]
        lo = [max(a, b) for a, b in zip(self.origin, origin)]
        hi = [min(a + n, b + m) for a, n, b, m in zip(self.origin, extent, origin, shape)]
        if any(h <= low for low, h in zip(lo, hi)):
            return None
        index = (Ellipsis, *(slice(a - o, b - o) for a, b, o in zip(lo, hi, self.origin)))
        reach = reaching(self.anchors, size, lo, hi)
        weight = None if self.weight is None else self.weight[index]
        shadow = None if self.shadow is None else self.shadow[index]
        return Partial(
            tuple(lo), self.total[index], weight, self.anchors[reach], self.bound, shadow,
            self.labels,
        )  # fmt: skip


def partial_sums(
    origin: Sequence[int],
    box_shape: Sequence[int],
    anchors: np.ndarray,
    predictions: np.ndarray,
    window: np.ndarray | BlendWindow,
    reduce: Reduction,
    dtype: np.dtype | None = None,
    weights: np.ndarray | None = None,
) -> Partial:
    """Add one group of patches into the box ``[origin, origin + box_shape)``.

    The counterpart of :func:`accumulate_groups` that does not normalise, so that
    :func:`combine_partials` can add the partials of several groups. ``dtype``
    is the result's (:func:`result_dtype`); by default as if some cell of the
    grid were uncovered. ``weights`` (``(n, *lead, *patch)``, size-1 axes where
    they repeat) multiply the window; they are checked here, so a lazy
    reconstruction checks them task by task (:func:`~xpatch.core.weighted.check_weights`).

    Examples
    --------
    >>> part = partial_sums([0], [4], np.array([[0], [2]]), np.ones((2, 2)), np.ones(2), "mean")
    >>> part.total.tolist(), part.weight
    ([1.0, 1.0, 1.0, 1.0], None)
    """
    window = BlendWindow.of(window)
    k = len(box_shape)
    origin = tuple(int(o) for o in origin)
    lead = predictions.shape[1 : predictions.ndim - k]
    acc = accumulation_dtype(predictions.dtype, reduce) if dtype is None else np.dtype(dtype)
    if acc.kind not in "iub" and weights is None:  # float weights make floats anyway
        check_exact_in_float([predictions], reduce, window)
    acc = working_dtype(acc, reduce, window)  # combine_partials casts back
    patch_cells = int(np.prod(predictions.shape[1:], dtype=np.int64))
    if on_lattice(reduce, acc, window, weights, patch_cells):
        total = lattice_overlap_add(
            [anchors], [predictions], origin, box_shape, window.factors, False, acc,
            nan_uncovered=False,
        )  # fmt: skip
        if total is not None:
            return Partial(origin, total, None, np.asarray(anchors, dtype=np.int64).reshape(-1, k))
    box = (*lead, *(int(n) for n in box_shape))
    placements = place_patches(origin, box_shape, [anchors], window.values.shape)
    reaching = np.array([p.anchor for p in placements], dtype=np.int64).reshape(-1, k)
    weigh = None
    if weights is not None:
        weigh = weigher(window.values, [check_weights(weights)], [predictions])
    if reduce == "vote":
        check_vote_dtype(predictions.dtype)
        labels, votes = vote_partial(box, placements, [predictions], window.values, weigh)
        return Partial(origin, votes, None, reaching, labels=labels)
    out = np.empty(box, dtype=acc)
    if weigh is not None:  # Σ w depends on the data: the partial carries it
        total = weighted_sums(out, placements, [predictions], weigh, reduce == "sum")
        return Partial(origin, out, total, reaching)
    weights, valid = add_patches(
        out, origin, box_shape, placements, [predictions], window, reduce, False
    )
    if weights is None or acc.kind not in "iu":
        return Partial(origin, out, valid, reaching)
    # An integral sum wraps modulo 2**64 and is checked once the block is whole.
    bound, shadow = integer_sum_shadow(out, weights, placements, [predictions], window)
    return Partial(origin, out, valid, reaching, bound, shadow)


def combine_partials(
    origin: Sequence[int],
    block_shape: Sequence[int],
    partials: Sequence[Partial],
    window: np.ndarray | BlendWindow,
    reduce: Reduction,
    template: np.ndarray,
) -> np.ndarray:
    """Add the partials that fall on one block and normalise: the block's result.

    ``template`` is ``(0, *lead, *patch)`` in the result's dtype (:func:`result_dtype`).
    Returns ``(*lead, *block_shape)`` in that dtype, NaN where nothing valid
    landed, as :func:`accumulate_groups` does for the same patches.

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
    acc = template.dtype
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
            pieces.append(piece)

    def region(piece: Partial) -> tuple:
        extent = piece.total.shape[-k:]
        offsets = [a - o for a, o in zip(piece.origin, origin)]
        return (Ellipsis, *(slice(a, a + n) for a, n in zip(offsets, extent)))

    if reduce == "vote":
        out = np.empty(out_shape, dtype=acc)
        return vote_pieces(out, [(p.labels, p.total, region(p)) for p in pieces])
    if reduce in ("max", "min"):
        out = np.full(out_shape, reduction_fill(acc, reduce), dtype=acc)
        combine = np.fmax if reduce == "max" else np.fmin
        for piece in pieces:
            combine(out[region(piece)], piece.total, out=out[region(piece)])
        return out
    out = np.zeros(out_shape, dtype=working_dtype(acc, reduce, window))
    for piece in pieces:
        out[region(piece)] += piece.total
    if acc.kind in "iu":  # an integral sum, every cell covered: exact unless it wrapped
        if sum(piece.bound for piece in pieces) >= np.iinfo(acc).max / 2:
            shadow = np.zeros(out_shape, dtype=np.float64)
            for piece in pieces:
                shadow[region(piece)] += piece.total if piece.shadow is None else piece.shadow
            check_wrapped(out, shadow)
        return out
    real = np.empty(0, dtype=out.dtype).real.dtype

    def window_sums(box_origin, box_shape, anchors) -> BlockWeights:
        placements = place_patches(box_origin, box_shape, [anchors], window.values.shape)
        return BlockWeights(box_origin, box_shape, placements, window, real, normalise=False)

    if all(piece.weight is None for piece in pieces):
        anchors = np.concatenate([np.empty((0, k), np.int64), *(p.anchors for p in pieces)])
        # Σw of a product grid is the outer product of per-axis sums: no loop over patches,
        # and, where it covers every cell, only the dtype the division needs is made.
        sums = product_sums(anchors, window.factors, origin, block_shape)
        if sums is not None and all_positive(sums):
            if reduce == "mean":
                np.divide(out, outer_product(sums, real), out=out)
            return out.astype(acc, copy=False)
        if sums is not None:
            total = outer_product(sums, np.dtype(np.float64))
        else:
            total = window_sums(origin, block_shape, anchors).total()
        if (total > 0).all():
            if reduce == "mean":
                np.divide(out, total.astype(real), out=out)
            return out.astype(acc, copy=False)
        return normalise(out, total, reduce).astype(acc, copy=False)
    # A piece's Σw may be float64 where out's dtype would round it to 0 (masked sums).
    exact = [piece.weight.dtype for piece in pieces if piece.weight is not None]
    weight = np.zeros(out_shape, dtype=np.result_type(real, *exact))
    for piece in pieces:
        if piece.weight is not None:
            weight[region(piece)] += piece.weight
        else:
            extent = piece.total.shape[-k:]
            weight[region(piece)] += window_sums(piece.origin, extent, piece.anchors).total()
    return normalise(out, weight, reduce).astype(acc, copy=False)


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


def _combine_task(block, origin, block_shape, template_shape, dtype, window, reduce, *parts):
    template = np.empty((0, *template_shape), dtype=dtype)
    present = [p for p in (_pick(part, block) for part in parts) if p is not None]
    return combine_partials(origin, block_shape, present, window, reduce, template)


def assemble_blocks(
    layer: dict,
    partial_keys: dict[tuple[int, tuple[int, ...]], tuple],
    plan: Plan,
    lead_chunks: Sequence[Sequence[int]],
    window_key: tuple,
    window: BlendWindow,
    reduce: Reduction,
    dtype: np.dtype,
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
    size = window.values.shape
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
                block,
                grid.origin(block),
                grid.extent(block),
                template_shape,
                dtype,
                window_key,
                reduce,
                *per_block.get((*lead_block, *block), []),
            )
    return tuple(tuple(c) for c in lead_chunks) + grid.chunks


def _partial_task(
    predictions, anchors, origin, box_shape, window, reduce, columns, dtype, weights=None,
    expected=None,
):  # fmt: skip
    carried = None if columns is None else np.stack(columns, axis=1)
    expected = anchors if expected is None else expected
    if carried is not None and not np.array_equal(carried, expected):
        bad = int(np.flatnonzero((np.asarray(carried) != expected).any(axis=1))[0])
        raise PredictionError(
            f"a prediction carries anchor {np.asarray(carried)[bad].tolist()} where the patch "
            f"at {expected[bad].tolist()} belongs: lazy {{dim}}_anchor coordinates are checked, "
            "not matched. Keep the predictions in the order of p.anchors(), or load the "
            "anchor coordinates (pred.assign_coords({c: pred[c].compute() ...})) to have "
            "them put in order."
        )
    return partial_sums(origin, box_shape, anchors, predictions, window, reduce, dtype, weights)


def overlap_add_dask(
    predictions: da.Array,
    plan: Plan,
    window: np.ndarray | BlendWindow,
    reduce: Reduction = "mean",
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
    k = plan.ndim
    n_lead = predictions.ndim - 1 - k
    window = BlendWindow.of(window)
    predictions = predictions.rechunk({ax: -1 for ax in range(1 + n_lead, predictions.ndim)})
    rows = plan.order if rows is None else np.asarray(rows, dtype=np.int64)[plan.order]
    acc = weighted_result_dtype(predictions.dtype, reduce, window, plan, weights is not None)
    if weights is not None:  # lead axes chunked as the predictions' (or 1), patched axes whole
        weights = da.asarray(weights)
        weights = weights.rechunk(
            {ax: predictions.chunks[ax] if weights.shape[ax] > 1 else -1
             for ax in range(1, weights.ndim)}
        )  # fmt: skip
    token = tokenize(predictions, plan, rows, window.values, reduce, carried_anchors, weights)
    name = f"xpatch-overlap-add-{token}"
    window_key = (f"xpatch-window-{token}",)
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
            task = (_partial_task, source, anchors, lo, shape, window_key, reduce, carried)
            layer[key] = (*task, acc)
            if carried_group is not None:
                layer[key] += (None, carried_group)
            if weights is not None:
                index = [b if weights.shape[1 + j] > 1 else 0 for j, b in enumerate(lead_block)]
                layer[key] += (
                    row_sources(
                        weights.name, weights.chunks[0], rows[start:stop], (*index, *[0] * k)
                    ),
                )
            partial_keys[(g, lead_block)] = key
    chunks = assemble_blocks(
        layer, partial_keys, plan, lead_chunks, window_key, window, reduce, acc, name
    )
    dependencies = [predictions, *(carried_anchors or []), *([] if weights is None else [weights])]
    graph = HighLevelGraph.from_collections(name, layer, dependencies=dependencies)
    return da.Array(graph, name, chunks, dtype=acc, meta=np.empty((0,) * (n_lead + k), acc))
