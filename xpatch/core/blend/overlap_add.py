"""Weighted overlap-add of per-patch results back onto the grid, eagerly.

Layout convention: predictions are ``(n, *lead, *patch)`` with the patched axes
last, in the order of the geometry's dims; the output is ``(*lead, *grid)``.
``lead`` holds the non-patched dims of the predictions (bands, classes, ...).

The eager path cuts the grid into bands of rows, one per thread, and asks the
reduction (:mod:`xpatch.core.blend.reductions`) to reduce every patch that lands on
each band (:func:`accumulate_groups`); a float mean or sum of a product grid goes
through the lattice kernels instead (:mod:`xpatch.core.blend.lattice`). The dask
path (:mod:`xpatch.core.blend.partials`) asks the same reductions, box by box, so
the two give the same numbers. The total weight Σw always comes from the anchors
and the window alone. NaN predictions are skipped (they add neither value nor
weight); cells that no valid value reaches are NaN.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from xpatch.core.blend import compiled
from xpatch.core.blend.lattice import lattice_overlap_add
from xpatch.core.blend.placement import Landing, place_patches
from xpatch.core.blend.reductions import Reduction, ReductionName, as_reduction
from xpatch.core.blend.sums import narrowed
from xpatch.core.blend.weighted import weigher
from xpatch.core.cores import worker_count
from xpatch.core.windows import BlendWindow


class PatchGroups(NamedTuple):
    """Groups of patches, read in place, never copied or concatenated.

    ``anchors[g]`` are ``(n_g, k)``, ``predictions[g]`` ``(n_g, *lead, *patch)``,
    and ``weights[g]`` (or None) multiply the window
    (:mod:`xpatch.core.blend.weighted`): ``(n_g, *lead, *patch)`` with size-1 axes
    where they repeat, finite and >= 0.
    """

    anchors: Sequence[np.ndarray]
    predictions: Sequence[np.ndarray]
    weights: Sequence[np.ndarray] | None = None


def accumulate_groups(
    origin: Sequence[int],
    block_shape: Sequence[int],
    groups: PatchGroups,
    window: np.ndarray | BlendWindow,
    reduce: Reduction | ReductionName,
    out: np.ndarray,
    shared: object = None,
) -> np.ndarray:
    """Reduce every patch that touches one output block into that block.

    Groups are read in place, never copied or concatenated: the memory of a call
    is the block plus the groups it is given.

    Parameters
    ----------
    origin, block_shape
        Start and extent of the block along the patched axes.
    groups
        The patches, their predictions and weights (:class:`PatchGroups`).
    window
        Blending window of the patch shape (used by ``"mean"``, ``"sum"`` and ``"vote"``).
    reduce
        The reduction (:mod:`xpatch.core.blend.reductions`), or its name: ``"mean"``
        (Σ w·x / Σ w), ``"sum"`` (Σ w·x), ``"max"``, ``"min"`` or ``"vote"`` (per
        cell, the label with the largest Σ w; :mod:`xpatch.core.blend.vote`).
    out
        Where to write the block (returned): ``(*lead, *block_shape)`` in the
        reduction's working dtype, NaN where nothing valid lands. Its content is ignored.
    shared
        What the reduction reads from all the groups once
        (:meth:`~xpatch.core.blend.reductions.Reduction.shared`: a vote's labels),
        if known (else found here).
    """
    window = BlendWindow.of(window)
    placements = place_patches(origin, block_shape, groups.anchors, window.values.shape)
    weigh = None
    if groups.weights is not None:
        weigh = weigher(window.values, groups.weights, groups.predictions)
    landing = Landing(origin, block_shape, groups.predictions, placements, window, weigh)
    return as_reduction(reduce).block(out, landing, shared)


#: Largest patch (cells times lead) that :mod:`xpatch.core.blend.lattice` adds: above it the
#: loop over patches costs little per patch, and its two contiguous numpy passes per
#: patch beat the lattice's three strided ones (measured: 4096² float32, 256² patches,
#: stride 192: 68 ms against 80-94 ms on one thread).
LATTICE_PATCH_CELLS = 16384


def on_lattice(
    reduce: Reduction, acc: np.dtype, window: BlendWindow, weights: object, patch_cells: int
) -> bool:
    """Whether :mod:`xpatch.core.blend.lattice` adds the patches: a float mean or sum.

    Of small patches, or of any 2-D ones with the compiled kernel
    (:mod:`xpatch.core.blend.compiled`, numba). It also needs a separable window and no
    per-patch weights; integer sums keep their exact path, and the other
    reductions theirs.
    """
    fused = compiled.AVAILABLE and window.values.ndim == 2
    return (
        reduce.sums
        and np.dtype(acc).kind == "f"
        and window.factors is not None
        and weights is None
        and (patch_cells <= LATTICE_PATCH_CELLS or fused)
    )


#: Below this many prediction bytes the eager path stays on one thread.
PARALLEL_BYTES = 8 * 2**20


def overlap_add(
    predictions: np.ndarray,
    anchors: np.ndarray,
    grid_shape: Sequence[int],
    window: np.ndarray | BlendWindow,
    reduce: Reduction | ReductionName = "mean",
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
        The result's dtype (:meth:`~xpatch.core.blend.reductions.Reduction.accumulation_dtype`);
        by default as if some cell were uncovered. The plan tells
        (:meth:`~xpatch.core.blend.reductions.Reduction.result_dtype`).
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
        [anchors],
        [predictions],
        grid_shape,
        window,
        reduce,
        dtype=dtype,
        threads=threads,
        weight_groups=None if weights is None else [weights],
    )


def overlap_add_groups(
    anchor_groups: Sequence[np.ndarray],
    prediction_groups: Sequence[np.ndarray],
    grid_shape: Sequence[int],
    window: np.ndarray | BlendWindow,
    reduce: Reduction | ReductionName = "mean",
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
    reduce = as_reduction(reduce)
    grid_shape = [int(n) for n in grid_shape]
    template = prediction_groups[0][:0]
    lead = template.shape[1 : template.ndim - len(grid_shape)]
    acc = reduce.accumulation_dtype(template.dtype) if dtype is None else np.dtype(dtype)
    if acc.kind not in "iub":  # integers that a float result would round are refused
        reduce.check_exact_in_float(prediction_groups, window, weighted=weight_groups is not None)
    if threads is None:
        nbytes = sum(p.nbytes for p in prediction_groups)
        threads = worker_count() if nbytes >= PARALLEL_BYTES else 1
    patch_cells = int(np.prod(template.shape[1:], dtype=np.int64))
    if on_lattice(reduce, acc, window, weight_groups, patch_cells):
        zero = [0] * len(grid_shape)
        out = lattice_overlap_add(
            anchor_groups,
            prediction_groups,
            (zero, grid_shape),
            window.factors,
            reduce.normalised,
            reduce.working_dtype(acc, window),
            threads,
        )
        if out is not None:
            return narrowed(out, acc)
    # Found once, not per band: a vote sums each label present in its own pass.
    reduce.check_dtype(template.dtype)
    shared = reduce.shared(prediction_groups)
    working = reduce.working_dtype(acc, window, weight_groups)
    out = np.empty((*lead, *grid_shape), dtype=working)
    groups = PatchGroups(anchor_groups, prediction_groups, weight_groups)
    edges = np.linspace(0, grid_shape[0], max(1, min(threads, grid_shape[0])) + 1).astype(int)
    bands = [(int(lo), int(hi)) for lo, hi in itertools.pairwise(edges.tolist())]
    lead_index = (slice(None),) * len(lead)

    def accumulate_band(band: tuple[int, int]) -> None:
        lo, hi = band
        origin = [lo] + [0] * (len(grid_shape) - 1)
        shape = [hi - lo, *grid_shape[1:]]
        view = out[(*lead_index, slice(lo, hi))]
        accumulate_groups(origin, shape, groups, window, reduce, view, shared)

    if len(bands) == 1:
        accumulate_band(bands[0])
    else:
        with ThreadPoolExecutor(len(bands)) as pool:
            list(pool.map(accumulate_band, bands))
    return narrowed(out, acc)
