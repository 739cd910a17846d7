"""The lattice kernel (one strided pass per phase) against the brute-force reference.

Eager and lazy, on regular grids with a shifted last patch, gaps, padding past the
end, several groups, lead dims, means and sums; it must be the path taken for them,
and NaN predictions must fall back to the exact per-cell path.
"""

from __future__ import annotations

import functools
import itertools
from unittest import mock

import dask.array as dsa
import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import xpatch  # noqa: F401 (registers .patch)
from tests.core.blend.test_kernels import reference as grid_reference
from xpatch.core.blend import compiled, lattice
from xpatch.core.blend.overlap_add import overlap_add, overlap_add_groups
from xpatch.core.blend.partials import overlap_add_dask
from xpatch.core.plan import ChunkGrid, Plan


@st.composite
def lattices(draw):
    k = draw(st.integers(1, 3))
    size = [draw(st.integers(1, 6)) for _ in range(k)]
    stride = [draw(st.integers(1, s + 3)) for s in size]  # overlaps, abutting, gaps
    grid = [s + draw(st.integers(0, 14)) for s in size]
    pad = draw(st.booleans())  # patches past the end, as boundary="pad" makes them
    starts = []
    for g, s, t in zip(grid, size, stride):
        regular = list(range(0, g if pad else g - s + 1, t))
        if not pad and draw(st.booleans()):
            regular.append(g - s)  # boundary="shift": the last patch flush with the end
        starts.append(sorted(set(regular)))
    anchors = np.array(list(itertools.product(*starts)), dtype=np.int64)
    lead = draw(st.integers(0, 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    pred = rng.normal(size=(len(anchors), *([2] * lead), *size))
    factors = [rng.random(s) + 0.1 for s in size]
    window = factors[0] if k == 1 else np.multiply.outer(factors[0], factors[1])
    if k == 3:
        window = np.multiply.outer(window, factors[2])
    chunks = [draw(st.integers(1, g)) for g in grid]
    reduce = draw(st.sampled_from(["mean", "sum"]))
    return pred, anchors, grid, window, reduce, chunks


def reference(pred, anchors, grid, window, reduce):
    """The brute force of tests/test_kernels.py, on a grid that holds the overhang, cropped."""
    extended = [max(g, int(anchors[:, j].max()) + n)
                for j, (g, n) in enumerate(zip(grid, window.shape))]  # fmt: skip
    out = grid_reference(pred, anchors, extended, window, reduce)
    return out[(Ellipsis, *(slice(0, g) for g in grid))]


@pytest.fixture(params=["numpy", "rows", "patches"])
def kernel(request, monkeypatch):
    """Run a test with the numpy passes, and with numba's kernels if it is installed:
    row by row of the output, and patch by patch (short patch rows take it)."""
    compiled_kernel = request.param != "numpy"
    if compiled_kernel and not compiled.AVAILABLE:
        pytest.skip("numba is not installed (the [fast] extra)")
    monkeypatch.setattr(compiled, "AVAILABLE", compiled_kernel)
    # The cases' patches are short: by default all would go patch by patch.
    monkeypatch.setattr(lattice, "PATCH_MAJOR_BYTES", 0 if request.param == "rows" else 2**20)
    return request.param


def counted(kernel: str = "numpy"):
    """Count the lattice's adds: of the numpy passes, or of a compiled kernel (2-D)."""
    if kernel == "rows":
        return mock.patch.object(compiled, "blend_2d", wraps=compiled.blend_2d)
    if kernel == "patches":
        return mock.patch.object(compiled, "blend_patches", wraps=compiled.blend_patches)
    return mock.patch.object(lattice, "lattice_add", wraps=lattice.lattice_add)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=lattices())
def test_lattice_matches_the_reference_eager_grouped_and_lazy(kernel, case):
    pred, anchors, grid, window, reduce, chunks = case
    # The compiled kernel takes 2-D lattices; others stay with the numpy passes.
    kernel = kernel if window.ndim == 2 else "numpy"
    expected = reference(pred, anchors, grid, window, reduce)
    with counted(kernel) as calls:
        eager = overlap_add(pred, anchors, grid, window, reduce, threads=2)
    assert calls.call_count == 1  # the lattice took it
    np.testing.assert_allclose(eager, expected, rtol=1e-10, atol=1e-12)

    # Several groups, one per chunk (as apply_numpy hands them over).
    plan = Plan.compile(anchors, ChunkGrid.from_chunks(
        dsa.core.normalize_chunks(chunks, tuple(grid))), window.shape, keep_order=True)  # fmt: skip
    groups = [plan.group_members(g) for g in range(len(plan.groups))]
    with counted(kernel) as calls:
        grouped = overlap_add_groups(
            [anchors[g] for g in groups], [pred[g] for g in groups], grid, window, reduce
        )
    assert calls.call_count == len(groups)
    np.testing.assert_allclose(grouped, expected, rtol=1e-10, atol=1e-12)

    lazy_pred = dsa.from_array(pred, chunks=(5, *pred.shape[1:]))
    with counted(kernel) as calls:
        lazy = overlap_add_dask(lazy_pred, plan, window, reduce).compute(scheduler="sync")
    assert calls.call_count == len(groups)
    np.testing.assert_allclose(lazy, expected, rtol=1e-10, atol=1e-12)


def test_nan_predictions_fall_back_to_the_exact_path(kernel):
    anchors = np.array(list(itertools.product(range(0, 9, 3), range(0, 9, 3))))
    pred = np.random.default_rng(0).normal(size=(len(anchors), 4, 4))
    pred[0, 1, 1] = np.nan
    pred[4, 0, :] = np.nan
    window = np.multiply.outer(np.hanning(6)[1:5], np.hanning(6)[1:5])
    for reduce in ("mean", "sum"):
        expected = reference(pred, anchors, (10, 10), window, reduce)
        out = overlap_add(pred, anchors, (10, 10), window, reduce)
        np.testing.assert_allclose(out, expected, rtol=1e-12)
        lazy = overlap_add_dask(
            dsa.from_array(pred, chunks=4),
            Plan.compile(anchors, ChunkGrid.from_chunks([(5, 5), (5, 5)]), [4, 4],
                         keep_order=True),
            window, reduce,
        ).compute()  # fmt: skip
        np.testing.assert_allclose(lazy, expected, rtol=1e-12)


def test_irregular_and_unordered_layouts_are_left_to_the_loop(kernel):
    """Scattered patches go to the loop; a product grid out of C order too, but for the
    compiled patch-by-patch kernel, which takes patches in any order."""
    window = np.ones((2, 2))
    scattered = np.array([[0, 0], [1, 3], [4, 1]])
    unordered = np.array([[2, 0], [0, 0], [2, 2], [0, 2]])
    for anchors in (scattered, unordered):
        pred = np.random.default_rng(1).normal(size=(len(anchors), 2, 2))
        with counted(kernel) as calls:
            out = overlap_add(pred, anchors, (6, 6), window, "mean")
        assert calls.call_count == (kernel == "patches" and anchors is unordered)
        np.testing.assert_allclose(out, reference(pred, anchors, (6, 6), window, "mean"))


def test_runs_split_overlapping_progressions_and_irregular_tails():
    assert lattice.axis_runs(np.arange(0, 40, 8), 8) == [slice(0, 5, 1)]
    assert lattice.axis_runs(np.arange(0, 40, 4), 8) == [slice(0, 10, 2), slice(1, 10, 2)]
    assert lattice.axis_runs(np.array([0, 8, 16, 20]), 8) == [slice(0, 3, 1), slice(3, 4, 1)]
    assert lattice.axis_runs(np.arange(0, 100), 40) is None  # 40 runs: too many


def test_apply_blends_batches_in_place_and_equals_the_numpy_passes(monkeypatch):
    """Large patches go batch by batch through a reused buffer: a fn returning its input
    (or a view of it) must not see later batches overwrite its results."""
    values = np.random.default_rng(5).random((2, 300, 260)).astype("float32")
    da = xr.DataArray(values, dims=("band", "y", "x"))
    p = da.patch(y=64, x=64, stride=48, window="hann")
    results = {}
    for name, on in (("compiled", compiled.AVAILABLE), ("numpy", False)):
        monkeypatch.setattr(compiled, "AVAILABLE", on)
        identity = p.apply(lambda b: b, batch_size=3)
        view = p.apply(lambda b: b[:, ::-1][:, ::-1], batch_size=5)
        model = p.apply(lambda b: np.sqrt(b) * 2, batch_size=4)
        np.testing.assert_allclose(identity.values, values, rtol=1e-6)
        np.testing.assert_allclose(view.values, values, rtol=1e-6)
        results[name] = model.values
    np.testing.assert_allclose(results["compiled"], results["numpy"], rtol=1e-5)
    np.testing.assert_allclose(results["numpy"], np.sqrt(values) * 2, rtol=1e-5)


#: Per-axis sums: zeros, values whose products underflow float64 or float32, ordinary.
AXIS_SUMS = st.lists(
    st.lists(
        st.sampled_from([0.0, 1e-160, 1e-45, 3e-39, 0.5, 1.0, 7.25, 1e3]), max_size=6, min_size=1
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=200, deadline=None)
@given(AXIS_SUMS, st.sampled_from(["float32", "float64"]))
def test_the_outer_product_and_its_positivity_match_numpys(axes, dtype):
    sums = [np.array(a, dtype=np.float64) for a in axes]
    full = functools.reduce(np.multiply.outer, sums)
    np.testing.assert_array_equal(lattice.outer_product(sums, np.dtype(dtype)), full.astype(dtype))
    assert lattice.all_positive(sums) == bool((full > 0).all())


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(-60, 60), max_size=40),
    st.sampled_from([1, 7, 1000, 10**9]),
    st.sampled_from(["int64", "int32", "int16", "int8", "uint16", "uint64"]),
)
@example(values=[-100, 100] + [0] * 40, scale=1, dtype="int8")  # a range the table takes
@example(values=[-300, 300] + [0] * 15_000, scale=100, dtype="int16")
@example(values=[-1, -2, -1], scale=1, dtype="uint64")  # past 2**63, a short range
def test_unique_inverse_is_numpys(values, scale, dtype):
    """The table for a short range and the sort for a long one give np.unique's answer.

    Narrow integers span more than their maximum (int8 -100 and 100), and uint64
    holds values past 2**63 (negative ones cast): neither may wrap.
    """
    column = np.array(values, dtype=np.int64) * scale
    if dtype == "uint16":
        column = np.abs(column) % 60000
    column = column.astype(dtype)  # int8 and int16 wrap here: still a column to take
    starts, ranks = lattice.unique_inverse(column)
    unique, inverse = np.unique(column, return_inverse=True)
    assert starts.dtype == unique.dtype
    np.testing.assert_array_equal(starts, unique)
    np.testing.assert_array_equal(ranks, inverse.reshape(-1))


def test_product_and_covering_starts_take_grids_and_refuse_the_rest():
    grid = np.array([[y, x] for y in (0, 8, 16) for x in (-4, 4)])
    assert [s.tolist() for s in lattice.product_starts(grid)] == [[0, 8, 16], [-4, 4]]
    assert lattice.product_starts(grid[::-1]) is None  # a product grid, not in C order
    assert [s.tolist() for s in lattice.covering_starts(grid[::-1])] == [[0, 8, 16], [-4, 4]]
    holed = grid.copy()
    holed[1] = holed[0]  # six anchors, one twice: not the product
    assert lattice.product_starts(holed) is None
    assert lattice.covering_starts(holed) is None
    assert lattice.product_starts(grid[:5]) is None  # 5 of 6: no product


@st.composite
def fresh_blends(draw):
    """A 2-D product grid of patches into a buffer with rows above and below their reach."""
    dtype = np.dtype(draw(st.sampled_from(["float32", "float64"])))
    size = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    counts = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    strides = [draw(st.integers(1, s + 2)) for s in size]
    above, below = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    starts = [np.arange(c) * t for c, t in zip(counts, strides)]
    starts[0] = starts[0] + above
    lead = (2,) * draw(st.integers(0, 1))
    shape = (*lead, int(starts[0][-1]) + size[0] + below,
             int(starts[1][-1]) + size[1] + draw(st.integers(0, 3)))  # fmt: skip
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    values = rng.normal(size=(counts[0] * counts[1], *lead, *size)).astype(dtype)
    # NaN (either sign) and infinities among the predictions, or in a row they do not reach.
    specials = [np.nan, -np.nan, np.inf, -np.inf]
    for _ in range(draw(st.integers(0, 2))):
        values.flat[draw(st.integers(0, values.size - 1))] = draw(st.sampled_from(specials))
    prior = rng.normal(size=shape).astype(dtype)
    unreached = [*range(above), *range(shape[-2] - below, shape[-2])]
    if unreached and draw(st.booleans()):
        prior[..., draw(st.sampled_from(unreached)), 0] = np.nan
    weights = [rng.random((c, s)) for c, s in zip(counts, size)]
    return starts, values, weights, prior


@pytest.mark.skipif(not compiled.AVAILABLE, reason="the compiled kernel needs numba")
@pytest.mark.filterwarnings("error::RuntimeWarning")  # the numpy twin is as silent
@settings(max_examples=300, deadline=None)
@given(fresh_blends(), st.booleans(), st.sampled_from([None, 2, 3]))
def test_the_row_kernel_zeroes_fresh_rows_and_tells_nan_exactly(case, fresh, threads):
    """``blend_2d(fresh=True)`` overwrites garbage as adds into zeros would; its NaN
    answer is ``holds_nan`` of the whole buffer (sign bits, infinities, unreached rows,
    every thread's band of rows)."""
    starts, values, weights, prior = case
    anchors = np.array(list(itertools.product(*starts)), dtype=np.int64)
    rows = tuple(np.array([list(s).index(a) for a in anchors[:, j]]) for j, s in
                 enumerate(starts))  # fmt: skip
    expected = np.zeros_like(prior) if fresh else prior.copy()
    lattice.blend_patches_numpy(expected, (0, 0), anchors, values, rows, weights)
    out = prior.copy()
    pool = None if threads is None else compiled.Pool(threads)
    try:
        told = compiled.blend_2d(
            out, (0, 0), starts, values, weights, pool, fresh=fresh, tell_nan=True
        )
    finally:
        if pool is not None:
            pool.shutdown()
    np.testing.assert_array_equal(out, expected)
    assert told == bool(np.isnan(expected).any())


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_the_numpy_twin_adds_opposite_infinities_to_nan_without_a_warning():
    out = np.zeros((1, 2, 4), dtype="f4")
    values = np.stack([np.full((1, 2, 3), np.inf), np.full((1, 2, 3), -np.inf)]).astype("f4")
    weights = [np.ones((1, 2)), np.ones((2, 3))]
    rows = (np.array([0, 0]), np.array([0, 1]))
    lattice.blend_patches_numpy(out, (0, 0), np.array([[0, 0], [0, 1]]), values, rows, weights)
    np.testing.assert_array_equal(out[0, 0], [np.inf, np.nan, np.nan, -np.inf])


@pytest.mark.skipif(not compiled.AVAILABLE, reason="the compiled kernel needs numba")
def test_patch_rows_of_256_bytes_go_row_by_row_and_shorter_ones_patch_by_patch():
    for width, kernel in ((64, "rows"), (63, "patches")):  # float32: 256 and 252 bytes
        starts = [np.array([0, 48]), np.arange(0, 2 * width, width // 2)]
        anchors = np.array(list(itertools.product(*starts)))
        pred = np.random.default_rng(width).random((len(anchors), 64, width), dtype="f4")
        window = np.ones((64, width))
        grid = (112, int(starts[1][-1]) + width)
        with counted(kernel) as calls:
            out = overlap_add(pred, anchors, grid, window, "mean")
        assert calls.call_count == 1, (width, kernel)
        np.testing.assert_allclose(out, reference(pred, anchors, grid, window, "mean"), rtol=1e-5)


@pytest.mark.skipif(not compiled.AVAILABLE, reason="the compiled kernel needs numba")
def test_the_row_kernel_zeroes_fresh_integer_rows_and_has_no_nan_to_tell():
    starts = [np.array([1, 3, 5]), np.array([0, 4])]
    values = np.arange(6 * 2 * 3, dtype=np.int64).reshape(6, 2, 3)
    weights = [np.ones((3, 2)), np.ones((2, 3))]
    expected = np.zeros((9, 8), np.int64)
    assert not compiled.blend_2d(expected, (0, 0), starts, values, weights, tell_nan=True)
    garbage = np.full((9, 8), -(2**40), np.int64)
    assert not compiled.blend_2d(
        garbage, (0, 0), starts, values, weights, fresh=True, tell_nan=True
    )
    np.testing.assert_array_equal(garbage, expected)
    assert expected[0].sum() == 0 and expected[1, 0] == values[0, 0, 0]
