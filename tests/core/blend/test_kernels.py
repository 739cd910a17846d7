"""The overlap-add kernels against a brute-force reference, NaN and all.

The eager path (fresh writes, normalised separable weights, threaded bands) and
the lazy one (partials per group, overhang pieces, combined per block) must give
the reference's numbers for any layout, grouping and chunking.
"""

from __future__ import annotations

import itertools

import dask.array as dsa
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xpatch.core.blend.overlap_add import overlap_add
from xpatch.core.blend.partials import overlap_add_dask
from xpatch.core.plan import ChunkGrid, Plan


def reference(pred, anchors, grid, window, reduce):
    """Σ w·x / Σ w (or the others) cell by cell, skipping NaN values."""
    k = len(grid)
    lead = pred.shape[1 : pred.ndim - k]
    total = np.zeros((*lead, *grid))
    weight = np.zeros((*lead, *grid))
    best = np.full((*lead, *grid), np.nan)
    for a, x in zip(anchors, pred):
        index = (Ellipsis, *(slice(s, s + n) for s, n in zip(a, window.shape)))
        valid = ~np.isnan(x)
        total[index] += np.where(valid, x * window, 0)
        weight[index] += valid * window
        pick = np.fmax if reduce == "max" else np.fmin
        best[index] = pick(best[index], x)
    if reduce in ("max", "min"):
        return best
    with np.errstate(invalid="ignore", divide="ignore"):
        out = total / weight if reduce == "mean" else total
    out[weight == 0] = np.nan
    return out


@st.composite
def cases(draw):
    k = draw(st.integers(1, 2))
    size = [draw(st.integers(1, 5)) for _ in range(k)]
    grid = [s + draw(st.integers(0, 12)) for s in size]
    grid_layout = draw(st.booleans())
    if grid_layout:  # a product grid (the separable fast paths) with some stride
        stride = [draw(st.integers(1, s + 2)) for s in size]
        starts = [sorted({*range(0, g - s + 1, t), g - s}) for g, s, t in zip(grid, size, stride)]
        anchors = np.array(list(itertools.product(*starts)), dtype=np.int64)
    else:  # scattered anchors, duplicates allowed
        n = draw(st.integers(1, 12))
        anchors = np.array(
            [[draw(st.integers(0, g - s)) for g, s in zip(grid, size)] for _ in range(n)],
            dtype=np.int64,
        )
    lead = draw(st.integers(0, 2))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    pred = rng.normal(size=(len(anchors), *([2] * lead), *size))
    if draw(st.booleans()):
        pred[rng.random(pred.shape) < 0.2] = np.nan
    separable = draw(st.booleans())
    factors = [rng.random(s) + 0.1 for s in size]
    window = np.multiply.outer(*factors) if separable and k == 2 else rng.random(size) + 0.1
    groups = draw(st.integers(1, len(anchors)))
    grid_chunks = [draw(st.integers(1, g)) for g in grid]
    reduce = draw(st.sampled_from(["mean", "sum", "max", "min"]))
    keep_order = draw(st.booleans())
    return pred, anchors, grid, window, reduce, groups, grid_chunks, keep_order


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_eager_and_lazy_kernels_match_the_reference(case):
    pred, anchors, grid, window, reduce, groups, grid_chunks, keep_order = case
    expected = reference(pred, anchors, grid, window, reduce)
    eager = overlap_add(pred, anchors, grid, window, reduce, threads=2)
    np.testing.assert_allclose(eager, expected, rtol=1e-10, atol=1e-12)
    chunks = dsa.core.normalize_chunks(grid_chunks, tuple(grid))
    lazy_pred = dsa.from_array(pred, chunks=(max(1, len(pred) // groups), *pred.shape[1:]))
    # Predictions chunked one way, the plan grouping them by the output's chunks
    # (and, without keep_order, in chunk order: then the rows are given).
    plan = Plan.compile(
        anchors, ChunkGrid.from_chunks(chunks), window.shape, keep_order=keep_order, max_group=3
    )
    rows = None
    if not keep_order:  # patch i of the plan is row rows[i] of the predictions
        rows = np.argsort(plan.grid.block_ids(anchors), kind="stable")
        np.testing.assert_array_equal(plan.anchors, anchors[rows])
    lazy = overlap_add_dask(lazy_pred, plan, window, reduce, rows=rows).compute()
    np.testing.assert_allclose(lazy, expected, rtol=1e-10, atol=1e-12)
