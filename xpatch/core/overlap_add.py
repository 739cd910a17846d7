"""Weighted overlap-add of per-patch results back onto the grid.

Layout convention: predictions are ``(n, *lead, *patch)`` with the patched axes
last, in the order of the geometry's dims; the output is ``(*lead, *grid)``.
``lead`` holds the non-patched dims of the predictions (bands, classes, ...).

The eager path adds every patch into the grid in one pass per band of rows
(:func:`accumulate_groups`, :func:`overlap_add`). The dask path
(:mod:`xpatch.core.partials`) adds each group of patches into the box it spans
and combines per output block, with the same placement and weight code of this
module (:func:`place_patches`, :class:`BlockWeights`, :func:`add_patches`). The
total weight Σw always comes from the anchors and the window alone. NaN
predictions are skipped (they add neither value nor weight); cells that no valid
value reaches are NaN.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from xpatch.core import compiled
from xpatch.core.dtypes import REDUCTIONS as REDUCTIONS  # re-exported: the public names
from xpatch.core.dtypes import Reduction as Reduction
from xpatch.core.dtypes import (
    accumulation_dtype,
    check_exact_in_float,
    check_vote_dtype,
    holds_nan,
    reduction_fill,
    value_range,
    working_dtype,
)
from xpatch.core.dtypes import check_reduction as check_reduction
from xpatch.core.errors import PredictionError
from xpatch.core.lattice import lattice_overlap_add
from xpatch.core.vote import present_labels, vote_block
from xpatch.core.weighted import weigher, weighted_sums
from xpatch.core.windows import BlendWindow as BlendWindow


class Placement(NamedTuple):
    """Where one patch lands in a block."""

    group: int
    row: int
    anchor: tuple[int, ...]
    block_index: tuple[slice, ...]
    patch_index: tuple[slice, ...]


def place_patches(
    origin: Sequence[int],
    block_shape: Sequence[int],
    anchor_groups: Sequence[np.ndarray],
    size: Sequence[int],
) -> list[Placement]:
    """List the patches that touch a block, in lexicographic order of their anchors."""
    origin = np.asarray(origin, dtype=np.int64)
    end = origin + np.asarray(block_shape, dtype=np.int64)
    o = origin.tolist()
    placements = []
    for g, anchors in enumerate(anchor_groups):
        lo = np.maximum(anchors, origin)
        hi = np.minimum(anchors + np.asarray(size), end)
        rows = np.flatnonzero((hi > lo).all(axis=1))
        for i, a, lo_i, hi_i in zip(
            rows.tolist(), anchors[rows].tolist(), lo[rows].tolist(), hi[rows].tolist()
        ):
            block = tuple(slice(x - b, y - b) for x, y, b in zip(lo_i, hi_i, o))
            patch = tuple(slice(x - s, y - s) for x, y, s in zip(lo_i, hi_i, a))
            placements.append(Placement(g, i, tuple(a), block, patch))
    placements.sort(key=lambda p: p.anchor)
    return placements


def _is_product(anchors: Sequence[tuple[int, ...]], k: int) -> bool:
    """Whether the anchors are exactly the cartesian product of their per-axis starts."""
    if not anchors:
        return False
    count = 1
    for j in range(k):
        count *= len({a[j] for a in anchors})
        if count > len(anchors):
            return False
    return count == len(anchors) == len(set(anchors))


class BlockWeights:
    """The weights of the patches that touch one block, from geometry alone.

    The total weight Σw of a cell depends only on the anchors and the window, never
    on the data. When the window is separable and the anchors form a product grid
    (every regular grid does, and so does any box cut out of one), Σw is the outer
    product of per-axis sums; ``"mean"`` then folds 1/Σw into per-axis weight
    vectors, so each patch costs one multiply (and one add where it overlaps an
    earlier patch) and there is no division pass. Otherwise Σw is summed over the
    block, one window per patch.
    """

    def __init__(
        self,
        origin: Sequence[int],
        block_shape: Sequence[int],
        placements: Sequence[Placement],
        window: BlendWindow,
        dtype: np.dtype,
        normalise: bool,
    ) -> None:
        self.origin = [int(o) for o in origin]
        self.block_shape = tuple(int(s) for s in block_shape)
        self.window = window.values.astype(dtype, copy=False)
        self.exact_window = window.values  # for the validity weights of masked sums
        self.dtype = dtype
        k = len(self.block_shape)
        anchors = [p.anchor for p in placements]
        self.separable = window.factors is not None and _is_product(anchors, k)
        self.normalised = normalise and self.separable
        self._cache: dict[tuple[int, ...], np.ndarray] = {}
        if self.separable:
            starts = [sorted({a[j] for a in anchors}) for j in range(k)]
            self._axis_sums = [
                self._axis_sum(j, s, f) for j, (s, f) in enumerate(zip(starts, window.factors))
            ]
            self._patterns = [
                self._axis_patterns(j, s, f) for j, (s, f) in enumerate(zip(starts, window.factors))
            ]
            self.factors = window.factors
            self.starts = [np.asarray(s, dtype=np.int64) for s in starts]
        else:
            self._total = np.zeros(self.block_shape, dtype=np.float64)
            for p in placements:
                self._total[p.block_index] += window.values[p.patch_index]

    def _axis_sum(self, axis: int, starts: Sequence[int], factor: np.ndarray) -> np.ndarray:
        total = np.zeros(self.block_shape[axis], dtype=np.float64)
        o = self.origin[axis]
        for s in starts:
            lo, hi = max(s, o), min(s + len(factor), o + len(total))
            total[lo - o : hi - o] += factor[lo - s : hi - s]
        return total

    def _axis_patterns(self, axis: int, starts: Sequence[int], factor: np.ndarray) -> dict:
        """Per start, an id and the 1-D weights it contributes (deduplicated)."""
        o, n = self.origin[axis], self.block_shape[axis]
        ids: dict[tuple[int, bytes], int] = {}
        patterns = {}
        for s in starts:
            lo, hi = max(s, o), min(s + len(factor), o + n)
            line = factor[lo - s : hi - s]
            if self.normalised:
                line = line / self._axis_sums[axis][lo - o : hi - o]
            line = line.astype(self.dtype)
            patterns[s] = (ids.setdefault((lo - s, line.tobytes()), len(ids)), line)
        return patterns

    def patch_weight(self, placement: Placement) -> np.ndarray:
        """Return the weights a patch adds to the block (normalised if ``normalised``)."""
        if not self.separable:
            return self.window[placement.patch_index]
        lines = [self._patterns[j][s] for j, s in enumerate(placement.anchor)]
        key = tuple(line_id for line_id, _ in lines)
        weight = self._cache.get(key)
        if weight is None:
            weight = functools.reduce(np.multiply.outer, [line for _, line in lines])
            self._cache[key] = weight
        return weight

    def fresh_offsets(self, placements: Sequence[Placement]) -> list[list[int]]:
        """Per patch and axis, where its cells no earlier patch reached begin.

        Offsets are within the patch's slice of the block. Along an axis, cells
        past the end of the previous start's patch are reached by no patch with a
        smaller start; with patches in lexicographic order of their anchors (and a
        product grid), cells past that end on every axis are reached by no earlier
        patch at all.
        """
        anchors = np.array([p.anchor for p in placements], dtype=np.int64)
        offsets = np.zeros_like(anchors)
        for j, (factor, starts) in enumerate(zip(self.factors, self.starts)):
            column = anchors[:, j]
            position = np.searchsorted(starts, column)
            previous_end = np.where(position > 0, starts[position - 1] + len(factor), column)
            lo = np.maximum(column, self.origin[j])
            extent = np.minimum(column + len(factor), self.origin[j] + self.block_shape[j]) - lo
            offsets[:, j] = np.clip(previous_end - lo, 0, extent)
        return offsets.tolist()

    def total(self) -> np.ndarray:
        """Σw over the block (float64)."""
        if self.separable:
            return functools.reduce(np.multiply.outer, self._axis_sums)
        return self._total

    def max_total(self) -> float:
        """Return the largest Σw of the block (0 where nothing lands)."""
        if self.separable:
            return float(np.prod([s.max(initial=0.0) for s in self._axis_sums]))
        return float(self._total.max(initial=0.0))

    def covers_all(self) -> bool:
        """Whether every cell of the block is covered by at least one patch."""
        if self.separable:
            return all(bool((s > 0).all()) for s in self._axis_sums)
        return bool((self._total > 0).all())

    def covered(self) -> np.ndarray:
        """Cells of the block that at least one patch covers."""
        if self.separable:
            return functools.reduce(np.logical_and.outer, [s > 0 for s in self._axis_sums])
        return self._total > 0


def accumulate_groups(
    origin: Sequence[int],
    block_shape: Sequence[int],
    anchor_groups: Sequence[np.ndarray],
    prediction_groups: Sequence[np.ndarray],
    window: np.ndarray | BlendWindow,
    reduce: Reduction,
    out: np.ndarray,
    labels: np.ndarray | None = None,
    weight_groups: Sequence[np.ndarray] | None = None,
) -> np.ndarray:
    """Reduce every patch that touches one output block into that block.

    Groups are read in place, never copied or concatenated: the memory of a call
    is the block plus the groups it is given.

    Parameters
    ----------
    origin, block_shape
        Start and extent of the block along the patched axes.
    anchor_groups, prediction_groups
        Groups of patches: ``(n_g, k)`` anchors and ``(n_g, *lead, *patch)`` values.
    window
        Blending window of the patch shape (used by ``"mean"`` and ``"sum"``).
    reduce
        ``"mean"`` (Σ w·x / Σ w), ``"sum"`` (Σ w·x), ``"max"``, ``"min"`` or ``"vote"``
        (per cell, the label with the largest Σ w; :mod:`xpatch.core.vote`).
    out
        Where to write the block (returned): ``(*lead, *block_shape)`` in the
        :func:`accumulation_dtype`, NaN where nothing valid lands. Its content is ignored.
    labels
        For ``"vote"``: the sorted labels of the groups, if known (else found here).
    weight_groups
        Per group, weights multiplied into the window (:mod:`xpatch.core.weighted`):
        ``(n_g, *lead, *patch)`` with size-1 axes where they repeat, finite and >= 0.
    """
    window = BlendWindow.of(window)
    placements = place_patches(origin, block_shape, anchor_groups, window.values.shape)
    weigh = None
    if weight_groups is not None:
        weigh = weigher(window.values, weight_groups, prediction_groups)
    if reduce == "vote":
        if labels is None:
            labels = present_labels([prediction_groups[g] for g in {p.group for p in placements}])
        return vote_block(out, placements, prediction_groups, window.values, labels, weigh)
    if weigh is not None:  # Σ w depends on the data: summed beside Σ w·x
        total = weighted_sums(out, placements, prediction_groups, weigh, reduce == "sum")
        return normalise(out, total, reduce)
    weights, valid = add_patches(
        out, origin, block_shape, placements, prediction_groups, window, reduce, reduce == "mean"
    )
    if weights is None:  # max / min
        return out
    if out.dtype.kind in "iu":  # an integral sum
        _, shadow = integer_sum_shadow(out, weights, placements, prediction_groups, window)
        if shadow is not None:
            check_wrapped(out, shadow)
        return out
    if valid is not None:
        return normalise(out, valid, reduce)
    everywhere = weights.covers_all()
    if not weights.normalised and reduce == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):  # uncovered cells become NaN below
            np.divide(out, weights.total(), out=out)
    if not everywhere:
        out[..., ~weights.covered()] = np.nan
    return out


def integer_sum_shadow(
    out: np.ndarray,
    weights: BlockWeights,
    placements: Sequence[Placement],
    prediction_groups: Sequence[np.ndarray],
    window: BlendWindow,
) -> tuple[float, np.ndarray | None]:
    """Bound ``|Σ w·x|`` in an integer sum's block; if it may not fit, return Σ w·x in float64 too.

    Integer sums wrap modulo 2**64: the result is exact when the true sum fits, which
    the float64 sum tells (:func:`check_wrapped`) where max|x| · max Σw does not.
    """
    info, limit = np.iinfo(prediction_groups[0].dtype), np.iinfo(out.dtype).max / 2
    most = max(-int(info.min), int(info.max))  # first from the dtype alone, without a pass
    if most * weights.max_total() >= limit:
        low, high = value_range([prediction_groups[g] for g in {p.group for p in placements}])
        most = max(-low, high)
    bound = most * weights.max_total()
    if bound < limit:
        return bound, None
    shadow = np.empty(out.shape, dtype=np.float64)
    box = (weights.origin, weights.block_shape)
    add_patches(shadow, *box, placements, prediction_groups, window, "sum", False)
    return bound, shadow


def check_wrapped(out: np.ndarray, shadow: np.ndarray) -> None:
    """Raise if an integer sum wrapped: it then differs from its float64 sum by about 2**64."""
    wrapped = np.abs(out.astype(np.float64) - shadow) >= 2.0**63
    if wrapped.any():
        raise PredictionError(
            f"reduce='sum' of integer predictions reaches {shadow[wrapped].flat[0]:.6g}, outside "
            f"the range of {out.dtype}, in which an integral window sums them exactly. Pass "
            "float predictions (pred.astype('float64')), or a dtype='float64' to apply, to "
            "sum in float64, or use reduce='mean'."
        )


def add_patches(
    out: np.ndarray,
    origin: Sequence[int],
    block_shape: Sequence[int],
    placements: Sequence[Placement],
    prediction_groups: Sequence[np.ndarray],
    window: BlendWindow,
    reduce: Reduction,
    normalise: bool,
) -> tuple[BlockWeights | None, np.ndarray | None]:
    """Add the placed patches into ``out`` (whose content is ignored).

    For ``"max"`` / ``"min"``, the running reduction (NaN where nothing landed);
    returns ``(None, None)``. Otherwise Σ w·x (0 where nothing landed), with the
    weights folded in already normalised when ``normalise`` and the layout allows
    it; returns the block's weights and, if some value was NaN, the Σ w of the
    valid values (``out`` then holds Σ w·x over valid values only).
    """
    lead_index = (slice(None),) * (out.ndim - len(block_shape))
    if reduce in ("max", "min"):
        out.fill(reduction_fill(out.dtype, reduce))
        combine = np.fmax if reduce == "max" else np.fmin
        for p in placements:
            region = out[lead_index + p.block_index]
            values = prediction_groups[p.group][(p.row, *lead_index, *p.patch_index)]
            combine(region, values, out=region)
        return None, None
    real = np.empty(0, dtype=out.dtype).real.dtype
    weights = BlockWeights(origin, block_shape, placements, window, real, normalise)
    if weights.separable:
        _add_fresh_first(out, weights, placements, prediction_groups, lead_index)
    else:
        out.fill(0)
        scratch = np.empty((*out.shape[: len(lead_index)], *window.values.shape), dtype=out.dtype)
        for p in placements:
            values = prediction_groups[p.group][(p.row, *lead_index, *p.patch_index)]
            _add_product(out[lead_index + p.block_index], values, weights.patch_weight(p), scratch)
    if holds_nan(out):
        # Rare: some prediction holds NaN. Redo the sums with per-cell validity so
        # NaN values are skipped rather than spread.
        # A sum's Σw only tells which cells a value reached: in float64, where out's
        # dtype may round the smallest weights (a narrow Gaussian's tails) to 0.
        valid = _masked_sums(out, weights, placements, prediction_groups, reduce == "sum")
        return weights, valid
    return weights, None


def _add_product(region: np.ndarray, values: np.ndarray, weight: np.ndarray, scratch) -> None:
    """``region += values * weight`` through a reused scratch buffer (no temporaries)."""
    product = scratch[tuple(slice(0, n) for n in region.shape)]
    np.multiply(values, weight, out=product)
    np.add(region, product, out=region)


def _add_fresh_first(out, weights, placements, prediction_groups, lead_index) -> None:
    """Separable weights: write each patch's fresh cells, add the rest.

    Patches arrive in lexicographic order of their anchors, so the cells of a
    patch that no earlier patch reached (:meth:`BlockWeights.fresh_offsets`) are
    written (``out = x·w``) instead of added, which spares zeroing the block and a
    read-add pass over most of it.
    """
    lead = out.shape[: len(lead_index)]
    scratch = np.empty((*lead, *weights.window.shape), dtype=out.dtype)
    if not weights.covers_all():
        out[..., ~weights.covered()] = 0
    if not placements:
        return
    for p, offsets in zip(placements, weights.fresh_offsets(placements)):
        values = prediction_groups[p.group][(p.row, *lead_index, *p.patch_index)]
        weight = weights.patch_weight(p)
        region = out[lead_index + p.block_index]
        fresh = tuple(slice(off, None) for off in offsets)
        np.multiply(values[lead_index + fresh], weight[fresh], out=region[lead_index + fresh])
        # The already-reached cells: box j is fresh before axis j, stale on axis j.
        for j, off in enumerate(offsets):
            if off == 0:
                continue
            box = (*fresh[:j], slice(0, off), *(slice(None),) * (len(offsets) - j - 1))
            _add_product(region[lead_index + box], values[lead_index + box], weight[box], scratch)


def _masked_sums(
    out: np.ndarray,
    weights: BlockWeights,
    placements: Sequence[Placement],
    prediction_groups: Sequence[np.ndarray],
    exact_total: bool = False,
) -> np.ndarray:
    """Σ w·x into ``out`` over valid (non-NaN) values only; return Σ w of those values.

    Σ w is summed in the window's dtype for ``out``, or with ``exact_total`` in
    float64, as :func:`~xpatch.core.weighted.weighted_sums` does for a sum.
    """
    k = len(weights.block_shape)
    lead_index = (slice(None),) * (out.ndim - k)
    out.fill(0)
    window = weights.window
    counted = weights.exact_window if exact_total else window
    weight = np.zeros(out.shape, dtype=np.float64 if exact_total else window.dtype)
    for p in placements:
        values = prediction_groups[p.group][(p.row, *lead_index, *p.patch_index)]
        valid = ~np.isnan(values)
        out[lead_index + p.block_index] += np.where(valid, values * window[p.patch_index], 0)
        weight[lead_index + p.block_index] += valid * counted[p.patch_index]
    return weight


def normalise(out: np.ndarray, weight: np.ndarray, reduce: Reduction) -> np.ndarray:
    """Divide by the total weight (for ``"mean"``) and make uncovered cells NaN."""
    covered = weight > 0
    if reduce == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            np.divide(out, weight, out=out, where=covered)
    uncovered = ~np.broadcast_to(covered, out.shape)
    if uncovered.any():
        out[uncovered] = np.nan
    return out


#: Largest patch (cells times lead) that :mod:`xpatch.core.lattice` adds: above it the
#: loop over patches costs little per patch, and its two contiguous numpy passes per
#: patch beat the lattice's three strided ones (measured: 4096² float32, 256² patches,
#: stride 192: 68 ms against 80-94 ms on one thread).
LATTICE_PATCH_CELLS = 16384


def on_lattice(
    reduce: str, acc: np.dtype, window: BlendWindow, weights: object, patch_cells: int
) -> bool:
    """Whether :mod:`xpatch.core.lattice` adds the patches: a float mean or sum.

    Of small patches, or of any 2-D ones with the compiled kernel
    (:mod:`xpatch.core.compiled`, numba). It also needs a separable window and no
    per-patch weights; integer sums keep their exact path, and the other
    reductions theirs.
    """
    fused = compiled.AVAILABLE and window.values.ndim == 2
    return (
        reduce in ("mean", "sum")
        and np.dtype(acc).kind == "f"
        and window.factors is not None
        and weights is None
        and (patch_cells <= LATTICE_PATCH_CELLS or fused)
    )


#: Below this many prediction bytes the eager path stays on one thread.
PARALLEL_BYTES = 8 * 2**20


def worker_count() -> int:
    """Return the number of cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def overlap_add(
    predictions: np.ndarray,
    anchors: np.ndarray,
    grid_shape: Sequence[int],
    window: np.ndarray | BlendWindow,
    reduce: Reduction = "mean",
    *,
    dtype: np.dtype | None = None,
    threads: int | None = None,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """Reconstruct numpy predictions onto the whole grid (eager).

    The grid is cut into bands along its first axis, one per thread; numpy
    releases the GIL, so the bands accumulate in parallel into one output.

    Parameters
    ----------
    predictions, anchors, grid_shape, window, reduce
        As for :func:`accumulate_groups`, with the whole grid as the block.
    dtype
        The result's :func:`accumulation_dtype`; by default as if some cell were
        uncovered. The plan tells (:func:`xpatch.core.partials.result_dtype`).
    threads
        Number of threads; default: the usable cores (one thread for small inputs).
    weights
        Weights multiplied into the window, ``(n, *lead, *patch)`` with size-1 axes
        where they repeat (``(n, 1, ...)`` per patch), finite and >= 0.

    Examples
    --------
    >>> preds = np.ones((2, 3))
    >>> overlap_add(preds, np.array([[0], [2]]), [6], np.ones(3)).tolist()
    [1.0, 1.0, 1.0, 1.0, 1.0, nan]
    """
    return overlap_add_groups(
        [anchors], [predictions], grid_shape, window, reduce, dtype=dtype, threads=threads,
        weight_groups=None if weights is None else [weights],
    )  # fmt: skip


def overlap_add_groups(
    anchor_groups: Sequence[np.ndarray],
    prediction_groups: Sequence[np.ndarray],
    grid_shape: Sequence[int],
    window: np.ndarray | BlendWindow,
    reduce: Reduction = "mean",
    *,
    dtype: np.dtype | None = None,
    threads: int | None = None,
    weight_groups: Sequence[np.ndarray] | None = None,
) -> np.ndarray:
    """:func:`overlap_add` of several groups of predictions (and weights), read in place.

    Examples
    --------
    >>> groups = [np.ones((1, 3)), np.full((1, 3), 3.0)]
    >>> overlap_add_groups([np.array([[0]]), np.array([[2]])], groups, [5], np.ones(3)).tolist()
    [1.0, 1.0, 2.0, 3.0, 3.0]
    """
    window = BlendWindow.of(window)
    grid_shape = [int(n) for n in grid_shape]
    template = prediction_groups[0][:0]
    lead = template.shape[1 : template.ndim - len(grid_shape)]
    acc = accumulation_dtype(template.dtype, reduce) if dtype is None else np.dtype(dtype)
    if threads is None:
        nbytes = sum(p.nbytes for p in prediction_groups)
        threads = worker_count() if nbytes >= PARALLEL_BYTES else 1
    patch_cells = int(np.prod(template.shape[1:], dtype=np.int64))
    if on_lattice(reduce, acc, window, weight_groups, patch_cells):
        zero = [0] * len(grid_shape)
        out = lattice_overlap_add(
            anchor_groups, prediction_groups, zero, grid_shape, window.factors,
            reduce == "mean", working_dtype(acc, reduce, window), threads,
        )  # fmt: skip
        if out is not None:
            return out.astype(acc, copy=False)
    # Found once, not per band: a vote sums each label present in its own pass.
    labels = None
    if reduce == "vote":
        check_vote_dtype(template.dtype)
        labels = present_labels(prediction_groups)
    out = np.empty((*lead, *grid_shape), dtype=working_dtype(acc, reduce, window))
    if acc.kind not in "iub" and weight_groups is None:  # float weights make floats anyway
        check_exact_in_float(prediction_groups, reduce, window)
    edges = np.linspace(0, grid_shape[0], max(1, min(threads, grid_shape[0])) + 1).astype(int)
    bands = [(int(lo), int(hi)) for lo, hi in itertools.pairwise(edges.tolist())]
    lead_index = (slice(None),) * len(lead)

    def accumulate_band(band: tuple[int, int]) -> None:
        lo, hi = band
        origin = [lo] + [0] * (len(grid_shape) - 1)
        shape = [hi - lo, *grid_shape[1:]]
        view = out[(*lead_index, slice(lo, hi))]
        accumulate_groups(
            origin, shape, anchor_groups, prediction_groups, window, reduce, view, labels,
            weight_groups,
        )  # fmt: skip

    if len(bands) == 1:
        accumulate_band(bands[0])
    else:
        with ThreadPoolExecutor(len(bands)) as pool:
            list(pool.map(accumulate_band, bands))
    return out.astype(acc, copy=False)
