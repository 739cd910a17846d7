"""Declared dtypes are checked, not cast blindly, and integer results stay exact.

``p.apply(fn, dtype=...)`` refuses what ``fn`` returns when it is of another kind
than the declared dtype or does not fit it, naming the batch's range. Integer
predictions reduced by ``"max"``, ``"min"`` or a ``"boxcar"`` ``"sum"`` stay
integers when every cell is covered (decided from the layout while the graph is
built), and numpy and dask input agree on values and dtypes.
"""

from __future__ import annotations

import functools
import itertools
import re
import warnings

import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import xpatch
from tests.conftest import forbid_compute
from xpatch.core.blend.dtypes import covers_every_cell
from xpatch.core.blend.overlap_add import overlap_add
from xpatch.core.blend.reductions import accumulation_dtype

BIG = 2**60  # far above 2**53, where float64 stops holding every integer


def grid_2d(dtype="int16", ny: int = 40, nx: int = 50) -> xr.DataArray:
    return xr.DataArray(np.arange(ny * nx).reshape(ny, nx).astype(dtype), dims=("y", "x"))


def both_inputs(da: xr.DataArray, chunks: dict | None = None) -> list[xr.DataArray]:
    """The array in memory and chunked (several chunks along every dim)."""
    return [da, da.chunk(chunks or {d: max(1, n // 2) for d, n in da.sizes.items()})]


def compute(out: xr.DataArray) -> np.ndarray:
    return np.asarray(out.values)


# -- apply: what fn returns must fit the declared dtype -----------------------------------


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_integers_that_do_not_fit_the_declared_dtype_are_refused_with_their_range(lazy):
    da = grid_2d("int16")
    obj = da.chunk({"y": 20, "x": 25}) if lazy else da
    p = obj.patch(y=10, x=10, stride=5)

    def triple(batch):  # int16 values up to 3 * 1999 = 5997: they wrap in int8
        return (batch * 3).astype(np.int16)

    if lazy:  # the check runs in the tasks: building computes nothing
        with forbid_compute():
            out = p.apply(triple, dtype="int8", reduce="max")
        assert out.dtype == np.int8
    with pytest.raises(xpatch.PredictionError) as caught:
        compute(p.apply(triple, dtype="int8", reduce="max"))
    message = str(caught.value)
    low, high = (int(v) for v in re.search(r"values from (-?\d+) to (-?\d+)", message).groups())
    assert 127 < high <= 5997 and 0 <= low <= high  # one batch's range, not a wrapped one
    assert "dtype='int8' (-128 to 127)" in message
    assert "dtype='int16'" in message and "np.clip(out, -128, 127)" in message
    assert isinstance(caught.value, xpatch.XPatchError)


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_floats_that_overflow_the_declared_dtype_are_refused(lazy):
    da = grid_2d("float64")
    obj = da.chunk({"y": 20, "x": 25}) if lazy else da
    p = obj.patch(y=10, x=10, stride=5)
    with pytest.raises(xpatch.PredictionError, match=r"overflow to inf") as caught:
        compute(p.apply(lambda b: b * 1e6 / 3, dtype="float16"))  # up to 6.7e8: inf in float16
    message = str(caught.value)
    assert "dtype='float16' (-65504.0 to 65504.0)" in message
    high = float(re.search(r"values from \S+ to (\S+),", message).group(1))
    assert high > 65504.0
    assert "dtype='float64'" in message


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_nan_and_inf_from_fn_pass_and_narrower_floats_round(lazy):
    da = grid_2d("float64", 8, 10)
    obj = da.chunk({"y": 4, "x": 5}) if lazy else da
    p = obj.patch(y=4, x=5)  # no overlap: every cell is one prediction

    def model(batch):
        out = batch / 3.0
        out[batch == 7] = np.inf
        out[batch == 8] = np.nan
        return out

    values = compute(p.apply(model, dtype="float16", reduce="max"))
    expected = (np.arange(80.0) / 3).astype(np.float16).astype(np.float32)
    expected[7], expected[8] = np.inf, np.nan
    np.testing.assert_array_equal(values.ravel(), expected)


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_another_kind_than_declared_is_refused(lazy):
    da = grid_2d("float32", 8, 10)
    obj = da.chunk({"y": 4, "x": 5}) if lazy else da
    p = obj.patch(y=4, x=5)
    with pytest.raises(xpatch.PredictionError, match=r"another kind.*pass dtype='int64'"):
        compute(p.apply(lambda b: b.astype(np.int64), dtype="float32"))
    with pytest.raises(xpatch.PredictionError, match=r"dtype float32 \(float\).*'int32' \(int\)"):
        compute(p.apply(lambda b: b * 1.5, dtype="int32"))
    with pytest.raises(xpatch.PredictionError, match=r"dtype int8 \(int\).*'bool' \(bool\)"):
        compute(p.apply(lambda b: (b > 3).astype(np.int8), dtype="bool"))


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_bool_and_the_other_signedness_are_accepted_when_they_fit(lazy):
    da = grid_2d("float32", 8, 10)
    obj = da.chunk({"y": 4, "x": 5}) if lazy else da
    p = obj.patch(y=4, x=5, stride=2)
    mask = p.apply(lambda b: b >= 40, dtype="uint8", reduce="max")
    assert mask.dtype == np.uint8
    np.testing.assert_array_equal(compute(mask).ravel(), (np.arange(80) >= 40).astype(np.uint8))
    counts = p.apply(lambda b: (b // 2).astype(np.int64), dtype="uint8", reduce="min")
    assert counts.dtype == np.uint8
    np.testing.assert_array_equal(compute(counts).ravel(), np.arange(80) // 2)
    with pytest.raises(xpatch.PredictionError, match=r"values from -\d+ to -?\d+.*\(0 to 255\)"):
        compute(p.apply(lambda b: -(b.astype(np.int64)), dtype="uint8", reduce="min"))


# -- exact integers through reconstruct and apply ------------------------------------------


def big_predictions(p: xpatch.Patcher, lazy: bool) -> tuple[xr.DataArray, np.ndarray]:
    """int64 predictions above 2**53 that differ per patch (so max != min != any one)."""
    n, size = len(p), p.size["x"]
    rng = np.random.default_rng(1)
    values = BIG + rng.integers(-1000, 1000, size=(n, size)) * 2**20 + np.arange(n)[:, None]
    pred = xr.DataArray(values.astype(np.int64), dims=("patch", "x"))
    if lazy:
        pred = pred.chunk({"patch": 2})
    return pred, values


def brute_force(anchors, values, extent: int, reduce: str) -> list:
    """Per cell, Python ints reduced over the patches that cover it (None if none do)."""
    cells: list[list[int]] = [[] for _ in range(extent)]
    for (a,), row in zip(anchors.tolist(), values.tolist()):
        for j, v in enumerate(row):
            if a + j < extent:
                cells[a + j].append(int(v))
    pick = {"max": max, "min": min, "sum": sum}[reduce]
    return [pick(c) if c else None for c in cells]


@pytest.mark.parametrize("reduce", ["max", "min", "sum"])
@pytest.mark.parametrize("lazy_input", [False, True], ids=["numpy", "dask"])
@pytest.mark.parametrize("lazy_pred", [False, True], ids=["numpy-pred", "dask-pred"])
def test_int64_above_2_53_stays_exact(reduce, lazy_input, lazy_pred):
    da = xr.DataArray(np.zeros(23, dtype=np.int64), dims="x")
    obj = da.chunk({"x": 7}) if lazy_input else da
    p = obj.patch(x=6, stride=4)  # overlaps of 2, the last patch shifted
    pred, values = big_predictions(p, lazy_pred)
    with forbid_compute():
        out = p.reconstruct(pred, reduce=reduce)
    assert out.dtype == np.int64
    expected = brute_force(p.anchors().values, values, 23, reduce)
    assert compute(out).tolist() == expected


@pytest.mark.parametrize("reduce", ["max", "min", "sum"])
def test_apply_keeps_int64_above_2_53_exact_on_numpy_and_dask_input(reduce):
    rng = np.random.default_rng(3)
    values = BIG + rng.integers(0, 2**40, size=(5, 30), dtype=np.int64)
    da = xr.DataArray(values, dims=("y", "x"))
    results = []
    for obj in both_inputs(da, {"y": 2, "x": 11}):
        p = obj.patch(y=3, x=7, stride={"y": 1, "x": 4})

        def model(batch):  # a per-patch offset, so that overlapping predictions differ
            return batch + batch[:, :1, :1] % 5

        with forbid_compute():
            out = p.apply(model, dtype="int64", reduce=reduce)
        assert out.dtype == np.int64
        results.append(compute(out))
    np.testing.assert_array_equal(results[0], results[1])
    # Brute force over the patches, in Python ints.
    p = da.patch(y=3, x=7, stride={"y": 1, "x": 4})
    pick = {"max": max, "min": min, "sum": sum}[reduce]
    cells: dict = {}
    for y, x in p.anchors().values.tolist():
        patch = values[y : y + 3, x : x + 7]
        offset = int(patch[0, 0]) % 5
        for (i, j), v in np.ndenumerate(patch):
            cells.setdefault((y + i, x + j), []).append(int(v) + offset)
    expected = [[pick(cells[(i, j)]) for j in range(30)] for i in range(5)]
    assert results[0].tolist() == expected


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_uint8_sum_is_exact_in_uint64(lazy):
    da = xr.DataArray(np.full(400, 255, dtype=np.uint8), dims="x")
    obj = da.chunk({"x": 50}) if lazy else da
    p = obj.patch(x=300, stride=1)  # up to 101 patches over a cell: 101 x 255 wraps uint8
    out = p.reconstruct(p.patches(), reduce="sum")
    assert out.dtype == np.uint64
    coverage = np.array([min(c, 100) - max(0, c - 299) + 1 for c in range(400)])
    np.testing.assert_array_equal(compute(out), 255 * coverage)
    assert compute(out).max() == 255 * 101


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_mean_of_integers_stays_float64(lazy):
    values = np.array([2**40 + 1, 2**40 + 3, 7, 9, 11, 13], dtype=np.int64)
    obj = xr.DataArray(values, dims="x")
    obj = obj.chunk({"x": 3}) if lazy else obj
    p = obj.patch(x=2, stride=1)
    pred = p.patches() + xr.DataArray(np.arange(len(p)), dims="patch")  # patch i adds i
    out = p.reconstruct(pred, reduce="mean")
    assert out.dtype == np.float64
    expected = values + np.array([0, 0.5, 1.5, 2.5, 3.5, 4])
    np.testing.assert_array_equal(compute(out), expected)


def test_a_weighted_sum_of_integers_is_float64():
    da = xr.DataArray(np.arange(10, dtype=np.int32), dims="x")
    p = da.patch(x=4, stride=2, window="hann")
    out = p.reconstruct(p.patches(), reduce="sum")
    assert out.dtype == np.float64
    weights = p.weights().values
    expected = np.zeros(10)
    for (a,), row in zip(p.anchors().values.tolist(), p.patches().values):
        expected[a : a + 4] += weights * row
    np.testing.assert_allclose(compute(out), expected, rtol=1e-12)


@pytest.mark.parametrize(
    ("window", "dtype"),
    [
        ([[1, 2], [2, 4]], "int64"),  # whole separable factors
        ([[1, 2], [3, 1]], "int64"),  # whole, not separable
        ([[2, 3], [4, 6]], "float64"),  # whole, but its factors are [2, 4] and [1, 1.5]
    ],
)
@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_an_integer_sum_weighs_with_whole_weights_exactly(window, dtype, lazy):
    da = xr.DataArray(np.arange(30, dtype=np.int32).reshape(5, 6) * 1000 + 7, dims=("y", "x"))
    obj = da.chunk({"y": 2, "x": 3}) if lazy else da
    p = obj.patch(y=2, x=2, stride=1, window=np.array(window, dtype=np.float64))
    out = p.reconstruct(p.patches(), reduce="sum")
    assert out.dtype == np.dtype(dtype)
    expected = np.zeros((5, 6), dtype=np.int64)
    for (y, x), patch in zip(p.anchors().values.tolist(), np.asarray(p.patches().values)):
        expected[y : y + 2, x : x + 2] += np.array(window) * patch
    np.testing.assert_array_equal(compute(out), expected)


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_uncovered_cells_make_integer_results_float64_with_nan(lazy):
    da = xr.DataArray(np.arange(10, dtype=np.int16), dims="x")
    obj = da.chunk({"x": 4}) if lazy else da
    with pytest.warns(xpatch.UncoveredCellsWarning, match="2 of 10 cells"):
        p = obj.patch(x=4, boundary="drop")
    for reduce in ("max", "min", "sum"):
        out = p.reconstruct(p.patches(), reduce=reduce)
        assert out.dtype == np.float64
        values = compute(out)
        np.testing.assert_array_equal(values[:8], np.arange(8.0))
        assert np.isnan(values[8:]).all()


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_integers_float64_would_round_are_refused_where_cells_are_uncovered(lazy):
    da = xr.DataArray(np.arange(10, dtype=np.int64) + BIG, dims="x")
    obj = da.chunk({"x": 4}) if lazy else da
    with pytest.warns(xpatch.UncoveredCellsWarning):
        p = obj.patch(x=4, boundary="drop")
    with pytest.raises(xpatch.PredictionError, match=r"2\*\*53.*boundary='shift' or 'pad'"):
        compute(p.reconstruct(p.patches(), reduce="max"))
    mean = compute(p.reconstruct(p.patches(), reduce="mean"))  # a mean is not exact anyway
    np.testing.assert_allclose(mean[:8], float(BIG), rtol=1e-15)


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_an_integer_sum_that_would_wrap_raises(lazy):
    values = np.full(12, 2**62, dtype=np.int64)
    pred_values = np.stack([values[a : a + 4] for a in (0, 2, 4, 6, 8)])
    da = xr.DataArray(np.zeros(12, dtype=np.int64), dims="x")
    obj = da.chunk({"x": 5}) if lazy else da
    p = obj.patch(x=4, stride=2)
    pred = xr.DataArray(pred_values, dims=("patch", "x"))
    pred = pred.chunk({"patch": 2}) if lazy else pred
    with pytest.raises(xpatch.PredictionError, match=r"outside the range of int64.*'mean'"):
        compute(p.reconstruct(pred, reduce="sum"))  # 2 x 2**62 = 2**63 wraps to -2**63


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_an_integer_sum_near_the_limit_that_fits_is_exact(lazy):
    # +-(2**62 + i) by turns: where two patches overlap the signs cancel. max|x| times
    # the most patches over a cell does not rule out a wrap, the true sums fit.
    da = xr.DataArray(np.zeros(12, dtype=np.int64), dims="x")
    obj = da.chunk({"x": 5}) if lazy else da
    p = obj.patch(x=4, stride=2)
    signs = np.array([1, -1, 1, -1, 1])[: len(p)]
    pred_values = (signs * (2**62 + 7 + np.arange(len(p))))[:, None] * np.ones(4, np.int64)
    pred = xr.DataArray(pred_values, dims=("patch", "x"))
    out = compute(p.reconstruct(pred.chunk({"patch": 2}) if lazy else pred, reduce="sum"))
    expected = brute_force(p.anchors().values, pred_values, 12, "sum")
    assert max(abs(v) for v in expected) > 2**62  # the single-patch cells
    assert out.tolist() == expected


@pytest.mark.parametrize("reduce", ["max", "min", "sum"])
def test_the_threaded_eager_kernel_is_exact_in_every_band(reduce):
    rng = np.random.default_rng(2)
    anchors = np.array(list(itertools.product(range(0, 17, 3), range(0, 9, 2))), dtype=np.int64)
    values = BIG + rng.integers(-(2**40), 2**40, size=(len(anchors), 5, 4))
    dtype = np.dtype(np.int64)
    out = overlap_add(values, anchors, (20, 12), np.ones((5, 4)), reduce, dtype=dtype, threads=4)
    assert out.dtype == dtype
    pick = {"max": max, "min": min, "sum": sum}[reduce]
    cells: dict = {}
    for (y, x), patch in zip(anchors.tolist(), values):
        for (i, j), v in np.ndenumerate(patch):
            cells.setdefault((y + i, x + j), []).append(int(v))
    assert out.tolist() == [[pick(cells[(i, j)]) for j in range(12)] for i in range(20)]


@pytest.mark.parametrize("kind", ["grid", "random"])
def test_building_integer_graphs_computes_nothing(kind):
    rng = np.random.default_rng(5)
    da = xr.DataArray(rng.integers(0, 100, (3, 60, 70)).astype("int16"), dims=("band", "y", "x"))
    sampler = xpatch.RegularGrid() if kind == "grid" else xpatch.RandomAnchors(count=30, seed=1)
    reduces = ("max", "min", "sum", "mean")
    with forbid_compute():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", xpatch.UncoveredCellsWarning)
            p = da.chunk({"y": 25, "x": 30}).patch(y=16, x=16, stride=12, sampler=sampler)
        applied = [p.apply(np.negative, dtype="int16", reduce=r) for r in reduces]
        pred = p.patches().astype("uint32")
        reconstructed = [p.reconstruct(pred, reduce=r) for r in reduces]
    assert all(out.chunks is not None for out in applied + reconstructed)
    dtypes = [str(out.dtype) for out in applied + reconstructed]
    if raster_covers(p.anchors().values, (16, 16), (60, 70)):
        assert kind == "grid"
        # apply's mean of int16 rounds back to int16 (its default out_dtype); reconstruct's
        # mean stays float64.
        assert dtypes == [
            "int16",
            "int16",
            "int64",
            "int16",
            "uint32",
            "uint32",
            "uint64",
            "float64",
        ]
    else:  # 30 random patches of 16 x 16 leave cells of 60 x 70 uncovered: NaN there
        assert kind == "random"
        assert dtypes == ["float64"] * 8
    # And the numbers: the lazy results equal the eager ones, dtype and all.
    eager = da.patch(y=16, x=16, stride=12, sampler=sampler) if kind == "grid" else None
    if eager is not None:
        for r, out in zip(reduces, applied):
            expected = eager.apply(np.negative, dtype="int16", reduce=r)
            assert expected.dtype == out.dtype
            np.testing.assert_array_equal(out.values, expected.values)


# -- accumulation dtypes and coverage, from the layout alone ---------------------------


@pytest.mark.parametrize(
    ("dtype", "reduce", "window", "covered", "expected"),
    [
        ("int8", "max", np.ones(3), True, "int8"),
        ("uint16", "min", np.full(3, 0.5), True, "uint16"),
        ("int32", "sum", np.array([1.0, 2.0, 1.0]), True, "int64"),
        ("uint8", "sum", np.ones(3), True, "uint64"),
        ("int32", "sum", np.full(3, 0.5), True, "float64"),
        ("int64", "mean", np.ones(3), True, "float64"),
        ("int64", "max", np.ones(3), False, "float64"),
        ("bool", "max", np.ones(3), True, "float64"),
        ("float16", "max", np.ones(3), True, "float32"),
    ],
)
def test_accumulation_dtype(dtype, reduce, window, covered, expected):
    got = accumulation_dtype(np.dtype(dtype), reduce, window=window, covered=covered)
    assert got == np.dtype(expected)


def raster_covers(anchors: np.ndarray, size, shape) -> bool:
    covered = np.zeros(shape, dtype=bool)
    for a in anchors.tolist():
        covered[tuple(slice(max(s, 0), s + n) for s, n in zip(a, size))] = True
    return bool(covered.all())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_coverage_matches_a_raster(data):
    k = data.draw(st.integers(1, 3), label="k")
    shape = [data.draw(st.integers(1, 12)) for _ in range(k)]
    size = [data.draw(st.integers(1, n)) for n in shape]
    if data.draw(st.booleans(), label="grid"):
        stride = [data.draw(st.integers(1, s + 1)) for s in size]
        starts = [range(0, n - s + 1, t) for n, s, t in zip(shape, size, stride)]
        anchors = np.array(list(itertools.product(*starts)), dtype=np.int64).reshape(-1, k)
    else:
        n = data.draw(st.integers(0, 30), label="n")
        anchors = np.array(
            [[data.draw(st.integers(0, e - s)) for e, s in zip(shape, size)] for _ in range(n)],
            dtype=np.int64,
        ).reshape(-1, k)
    assert covers_every_cell(anchors, size, shape) == raster_covers(anchors, size, shape)


@pytest.mark.parametrize("drop", [0, 1])
def test_coverage_of_many_scattered_patches_matches_a_raster(drop):
    # More than 2**20 cells on the compressed grid: the boxes are halved first.
    rng = np.random.default_rng(drop)
    shape, size = (1480, 1390), (40, 40)
    base = [(y, x) for y in range(0, 1441, 30) for x in range(0, 1351, 30)]
    extra = np.stack([rng.integers(0, 1441, 3000), rng.integers(0, 1351, 3000)], axis=1)
    anchors = np.concatenate([np.array(base), extra]).astype(np.int64)
    if drop:  # a hole: drop every patch over one cell
        cell = np.array([700, 700])
        anchors = anchors[~((anchors <= cell) & (anchors + 40 > cell)).all(axis=1)]
    assert covers_every_cell(anchors, size, shape) == raster_covers(anchors, size, shape)
    assert covers_every_cell(anchors, size, shape) == (not drop)


# -- property: integer max / min equal the covering patches' own --------------------------


@st.composite
def integer_layouts(draw):
    dtype = draw(st.sampled_from(["int8", "uint16", "int32", "int64", "uint64"]))
    ny, nx = draw(st.integers(1, 14)), draw(st.integers(1, 14))
    sy, sx = draw(st.integers(1, ny)), draw(st.integers(1, nx))
    kind = draw(st.sampled_from(["grid", "random", "anchors"]))
    boundary = draw(st.sampled_from(["shift", "pad", "drop"]))
    stride = {"y": draw(st.integers(1, sy + 2)), "x": draw(st.integers(1, sx + 2))}
    seed = draw(st.integers(0, 2**16))
    chunks = {"y": draw(st.integers(1, ny)), "x": draw(st.integers(1, nx))}
    return dtype, (ny, nx), (sy, sx), kind, boundary, stride, seed, chunks


def patch_values(anchor, shape, dtype, seed) -> np.ndarray:
    """A patch's predictions, a function of its anchor (repeated anchors predict alike)."""
    info = np.iinfo(dtype)
    low, high = max(int(info.min), -(2**62)), min(int(info.max), 2**62)
    rng = np.random.default_rng([seed, *anchor])
    return rng.integers(low, high, size=shape, endpoint=True, dtype=np.int64).astype(dtype)


def outcome(build) -> tuple[np.dtype | None, np.ndarray | xpatch.PredictionError]:
    """The result's dtype and values, or the error (numpy input computes, and raises, at once)."""
    try:
        out = build()
    except xpatch.PredictionError as error:
        return None, error
    try:
        return out.dtype, compute(out.transpose("y", "x"))
    except xpatch.PredictionError as error:
        return out.dtype, error


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(integer_layouts(), st.sampled_from(["max", "min"]), st.booleans())
def test_integer_max_and_min_equal_the_covering_patches(case, reduce, through_apply):
    dtype, (ny, nx), (sy, sx), kind, boundary, stride, seed, chunks = case
    rng = np.random.default_rng(seed)
    sampler = {
        "grid": xpatch.RegularGrid(),
        "random": xpatch.RandomAnchors(count=int(rng.integers(1, 8)), seed=seed),
        "anchors": xpatch.Anchors(
            {"y": rng.integers(0, ny - sy + 1, 4), "x": rng.integers(0, nx - sx + 1, 4)}
        ),
    }[kind]
    # For apply, the input holds each cell's (y, x): fn reads a patch's anchor off its corner.
    yy, xx = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
    da = xr.DataArray(np.stack([yy, xx]), dims=("c", "y", "x"))
    results = []
    for obj in (da, da.chunk({"c": 2, **chunks})):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", xpatch.UncoveredCellsWarning)
            p = obj.patch(y=sy, x=sx, stride=stride, boundary=boundary, sampler=sampler)
        anchors = p.anchors().values
        values = np.stack([patch_values(a, (sy, sx), dtype, seed) for a in anchors.tolist()])
        if through_apply:

            def model(batch):  # (b, c, y, x) -> (b, y, x)
                corner = batch[:, :, 0, 0].tolist()
                return np.stack([patch_values(a, (sy, sx), dtype, seed) for a in corner])

            build = functools.partial(
                p.apply, model, batch_size=3, output_dims={}, dtype=dtype, reduce=reduce
            )
        else:
            pred = xr.DataArray(values, dims=("patch", "y", "x"))
            pred = pred.chunk({"patch": 2}) if obj.chunks else pred
            build = functools.partial(p.reconstruct, pred, reduce=reduce)
        results.append(outcome(build))
    (dtype_eager, eager), (dtype_lazy, lazy) = results
    assert dtype_eager in (dtype_lazy, None)  # decided from the layout, the same for both
    # Brute force, in Python ints, over the patches that cover each cell.
    cells: dict = {}
    for (y, x), patch in zip(anchors.tolist(), values):
        for (i, j), v in np.ndenumerate(patch):
            if y + i < ny and x + j < nx:
                cells.setdefault((y + i, x + j), []).append(int(v))
    pick = max if reduce == "max" else min
    event(f"covered: {len(cells) == ny * nx}, refused: {isinstance(lazy, Exception)}")
    if len(cells) == ny * nx:  # every cell covered: exact, in the predictions' dtype
        assert dtype_lazy == np.dtype(dtype)
        expected = [[pick(cells[(i, j)]) for j in range(nx)] for i in range(ny)]
        assert eager.tolist() == expected
        np.testing.assert_array_equal(eager, lazy)
        return
    assert dtype_lazy == np.float64  # NaN where no patch lands
    if max(abs(v) for c in cells.values() for v in c) > 2**53:  # float64 would round
        assert isinstance(eager, xpatch.PredictionError)
        assert isinstance(lazy, xpatch.PredictionError)
        return
    for i, j in itertools.product(range(ny), range(nx)):
        expected = pick(cells[(i, j)]) if (i, j) in cells else np.nan
        np.testing.assert_array_equal(eager[i, j], expected)
    np.testing.assert_array_equal(eager, lazy)


def test_an_integer_sum_of_uncovered_cells_refuses_rounding_on_the_lattice_too():
    # A sum of integers with uncovered cells is float64; the eager lattice kernel took
    # such sums without the 2**53 check that the other paths make.
    da = xr.DataArray(np.arange(64, dtype=np.int64).reshape(8, 8) + BIG, dims=("y", "x"))
    with pytest.warns(xpatch.UncoveredCellsWarning):
        p = da.patch(y=3, x=3, stride=3, boundary="drop")
    with pytest.raises(xpatch.PredictionError, match=r"2\*\*53.*boundary='shift' or 'pad'"):
        p.reconstruct(p.patches(), reduce="sum")
