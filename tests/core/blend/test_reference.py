"""Brute-force reference checks of anchors, patches, reconstruct and apply.

Everything goes through the public API (``da.patch``, ``p.anchors()``, ``p.weights()``,
``p.patches()``, ``p.reconstruct``, ``p.apply`` and the exported samplers), and is
compared with a plain numpy loop over the patches. The predictions are random per
patch, so that a wrong weight, a misplaced or permuted patch, or a lost border cell
changes the result (predictions equal to the patches, or any pointwise function of
the input, reconstruct to the same thing whatever the weights).
"""

from __future__ import annotations

import itertools
import warnings

import dask.array as dsa
import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xpatch

DTYPES = ["int8", "uint16", "float16", "float32", "float64"]
BOUNDARIES = ["shift", "pad", "drop", "raise"]
REDUCES = ["mean", "sum", "max", "min"]
SAMPLERS = ["grid", "jitter", "random", "anchors", "labels", "points", "bounds"]
NAMED_WINDOWS = ["boxcar", "hann", ("tukey", 0.5), ("gaussian", 1.5)]
STEP = 10.0  # cell size of the y/x coordinates (y descending, x ascending, as a raster)
MAX_PATCHES = 250  # keeps the brute force and the dask graphs small

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- small numpy helpers ---------------------------------------------------------------


def starts_1d(extent: int, size: int, stride: int, boundary: str) -> list[int]:
    """Regular grid starts along one axis, written from the boundary modes' definitions."""
    starts = [0]
    if boundary == "pad":
        while starts[-1] + size < extent:
            starts.append(starts[-1] + stride)
        return [s for s in starts if s < extent]  # a patch of padding only is no patch
    while starts[-1] + stride + size <= extent:
        starts.append(starts[-1] + stride)
    if boundary == "shift" and starts[-1] + size < extent:
        starts.append(extent - size)
    return starts


def cartesian(axes) -> np.ndarray:
    """All combinations of the per-axis starts, C order, as ``(n, ndim)`` int64."""
    rows = list(itertools.product(*axes))
    return np.array(rows, dtype=np.int64).reshape(len(rows), len(axes))


def partition(rng: np.random.Generator, n: int) -> tuple[int, ...]:
    """Random chunk sizes summing to ``n`` (chunks of 1 are frequent)."""
    sizes = []
    while n > 0:
        take = min(n, int(rng.choice([1, 1, 2, 3, 5, 8, n])))
        sizes.append(take)
        n -= take
    return tuple(sizes)


def random_values(rng, shape, dtype, nan_fraction=0.0) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, int(info.max) + 1, size=shape).astype(dtype)
    values = rng.normal(0.0, 10.0, size=shape)
    if nan_fraction:
        values[rng.random(shape) < nan_fraction] = np.nan
        if len(shape) and shape[0] > 1 and rng.random() < 0.5:
            values[rng.integers(shape[0])] = np.nan  # one patch predicts nothing at all
    return values.astype(dtype)


def sort_rows(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a[np.lexsort(a.T[::-1])] if len(a) else a


def cut(values: np.ndarray, anchor, size, fill) -> np.ndarray:
    """The patch at ``anchor`` of ``values`` (patched dims last), filled past the end."""
    ndim = len(anchor)
    lead = values.shape[: values.ndim - ndim]
    out = np.full((*lead, *size), fill, dtype=values.dtype)
    shape = values.shape[values.ndim - ndim :]
    stop = [min(a + s, n) for a, s, n in zip(anchor, size, shape)]
    src = tuple(slice(a, e) for a, e in zip(anchor, stop))
    dst = tuple(slice(0, e - a) for a, e in zip(anchor, stop))
    out[(..., *dst)] = values[(..., *src)]
    return out


def blend(anchors, window, preds, shape, reduce):
    """Brute-force overlap-add of ``preds`` (n, *lead, *size) onto a grid of ``shape``.

    Returns the result (float64, NaN where no valid prediction lands) and a scale for
    the tolerance (largest |prediction| times the largest total weight).
    """
    preds = np.asarray(preds, dtype=np.float64)
    ndim = len(shape)
    lead = preds.shape[1 : preds.ndim - ndim]
    size = preds.shape[preds.ndim - ndim :]
    num = np.zeros((*lead, *shape))
    den = np.zeros((*lead, *shape))
    ext = np.full((*lead, *shape), np.nan)
    pick = np.fmax if reduce == "max" else np.fmin
    for anchor, pred in zip(anchors, preds):
        stop = [min(a + s, n) for a, s, n in zip(anchor, size, shape)]
        dst = (..., *(slice(a, e) for a, e in zip(anchor, stop)))
        src = (..., *(slice(0, e - a) for a, e in zip(anchor, stop)))
        vals = pred[src]
        weight = np.broadcast_to(window[src[1:]], vals.shape)
        ok = ~np.isnan(vals)
        num[dst] += np.where(ok, weight * np.where(ok, vals, 0.0), 0.0)
        den[dst] += np.where(ok, weight, 0.0)
        ext[dst] = pick(ext[dst], vals)
    covered = den > 0
    if reduce == "mean":
        out = np.divide(num, den, out=np.full_like(num, np.nan), where=covered)
    elif reduce == "sum":
        out = np.where(covered, num, np.nan)
    else:
        out = ext
    finite = np.abs(preds[~np.isnan(preds)])
    scale = max(1.0, finite.max() if finite.size else 1.0) * max(1.0, den.max(initial=0.0))
    return out, scale


def accumulation_dtype(dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    return np.dtype("float32" if dtype in (np.float16, np.float32) else "float64")


def result_dtype(dtype, reduce, weights, expected) -> np.dtype:
    """Integers stay exact for max/min and an integral sum when every cell is covered."""
    dtype = np.dtype(dtype)
    covered = not np.isnan(expected).any()  # integer predictions hold no NaN
    if dtype.kind in "iu" and covered:
        if reduce in ("max", "min"):
            return dtype
        if reduce == "sum" and (np.asarray(weights) == np.round(weights)).all():
            return np.dtype("uint64" if dtype.kind == "u" else "int64")
    return accumulation_dtype(dtype)


def assert_matches(actual: np.ndarray, expected: np.ndarray, pred_dtype, scale: float) -> None:
    pred_dtype = np.dtype(pred_dtype)
    rtol = {np.float16: 1e-3, np.float32: 1e-5}.get(pred_dtype.type, 1e-10)
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected), "NaN cells differ")
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale)


def hann(n: int) -> np.ndarray:
    return np.sin(np.pi * (np.arange(n) + 0.5) / n) ** 2


def quiet_patch(obj, **options):
    """``obj.patch(**options)``, with the grid samplers' UncoveredCellsWarning silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", xpatch.UncoveredCellsWarning)
        p = obj.patch(**options)
        len(p)  # anchors (and min_valid) are resolved here
    return p


# -- layouts ---------------------------------------------------------------------------


def coordinates(extent) -> dict:
    """Index coordinates: y descending and x ascending, regularly spaced, as a raster."""
    return {
        "band": 100 + 3 * np.arange(extent["band"]),
        "y": 1000.0 - STEP * np.arange(extent["y"]),
        "x": 500.0 + STEP * np.arange(extent["x"]),
    }


def build_input(rng, dims, extent, dtype, nan_box) -> xr.DataArray:
    shape = tuple(extent[d] for d in dims)
    values = random_values(rng, shape, dtype)
    if nan_box:
        box = []
        for d in dims:
            lo = int(rng.integers(0, extent[d]))
            box.append(slice(lo, lo + int(rng.integers(1, extent[d] - lo + 1))))
        values[tuple(box)] = np.nan
    return xr.DataArray(
        values, dims=dims, coords=coordinates(extent), name="scene", attrs={"units": "K"}
    )


@st.composite
def layouts(draw, kinds=SAMPLERS):
    """A random array, patch layout and sampler; the expected anchors come with it."""
    kind = draw(st.sampled_from(kinds))
    boundary = draw(st.sampled_from(BOUNDARIES))
    geo = kind in ("points", "bounds")
    dims = tuple(draw(st.permutations(["band", "y", "x"])))
    patched_set = {"y", "x"} if geo else set(draw(st.sampled_from(["yx", "x", "byx"])))
    patched_set = {"band" if c == "b" else c for c in patched_set}
    pdims = tuple(d for d in dims if d in patched_set)
    dtype = draw(st.sampled_from(DTYPES))
    extent = {
        "band": draw(st.integers(1, 3)),
        "y": draw(st.integers(2 if geo else 1, 40)),
        "x": draw(st.integers(2 if geo else 1, 50)),
    }  # a transform, for AtPoints and InBounds, needs two labels along y and x
    size, stride = {}, {}
    for d in pdims:
        size[d] = draw(st.integers(1, extent[d] + (3 if boundary == "pad" else 0)))
        stride[d] = draw(st.integers(1, size[d] + (0 if boundary == "raise" else 2)))
    # Keep the number of patches small: widen the strides of the grid.
    while np.prod([len(starts_1d(extent[d], size[d], stride[d], "pad")) for d in pdims]) > (
        MAX_PATCHES
    ):
        d = max(pdims, key=lambda d: extent[d] / stride[d])
        stride[d] += 1
    if boundary == "raise":  # the grid must end flush with the edge
        for d in pdims:
            extent[d] = size[d] + ((extent[d] - size[d]) // stride[d]) * stride[d]
            while geo and extent[d] < 2:
                extent[d] += stride[d]
    shape = {d: extent[d] for d in pdims}
    upper = {d: shape[d] - 1 if boundary == "pad" else max(shape[d] - size[d], 0) for d in pdims}
    most = {d: max(shape[d] - size[d], 0) for d in pdims}
    seed = draw(st.integers(0, 2**16))
    coords = coordinates(extent)
    expected = None  # anchors in the sampler's order, where the sampler fixes them
    if kind == "grid":
        sampler = xpatch.RegularGrid()
        expected = cartesian([starts_1d(shape[d], size[d], stride[d], boundary) for d in pdims])
    elif kind == "jitter":
        sampler = xpatch.JitteredGrid(jitter=draw(st.integers(0, 3)), seed=seed)
    elif kind == "random":
        sampler = xpatch.RandomAnchors(count=draw(st.integers(1, 12)), seed=seed)
    elif kind in ("anchors", "labels"):
        n = draw(st.integers(1, 10))
        idx = {d: draw(st.lists(st.integers(0, upper[d]), min_size=n, max_size=n)) for d in pdims}
        expected = np.array([idx[d] for d in pdims], dtype=np.int64).T.reshape(n, len(pdims))
        if kind == "anchors":
            sampler = xpatch.Anchors(idx)
        else:
            sampler = xpatch.AtLabels({d: coords[d][idx[d]] for d in pdims})
    elif kind == "points":
        n = draw(st.integers(1, 8))
        rows = draw(st.lists(st.integers(0, extent["y"] - 1), min_size=n, max_size=n))
        cols = draw(st.lists(st.integers(0, extent["x"] - 1), min_size=n, max_size=n))
        offsets = draw(st.lists(st.floats(-0.45, 0.45), min_size=2 * n, max_size=2 * n))
        points = [
            (coords["x"][c] + STEP * u, coords["y"][r] - STEP * v)
            for r, c, u, v in zip(rows, cols, offsets[:n], offsets[n:])
        ]
        sampler = xpatch.AtPoints(points)
        cell = {"y": np.array(rows), "x": np.array(cols)}
        expected = np.stack(
            [np.clip(cell[d] - size[d] // 2, 0, most[d]) for d in pdims], axis=1
        ).astype(np.int64)
    else:  # bounds
        window = {}
        for d in pdims:
            need = 1 if boundary == "pad" else size[d]
            lo = draw(st.integers(0, shape[d] - need))
            if boundary == "raise":
                hi = (
                    lo
                    + size[d]
                    + stride[d] * draw(st.integers(0, (shape[d] - lo - size[d]) // stride[d]))
                )
            else:
                hi = draw(st.integers(lo + need, shape[d]))
            window[d] = (lo, hi)
        (top, bottom), (left, right) = window["y"], window["x"]
        sampler = xpatch.InBounds(
            (
                coords["x"][left] - 0.3 * STEP,
                coords["y"][bottom - 1] - 0.3 * STEP,
                coords["x"][right - 1] + 0.3 * STEP,
                coords["y"][top] + 0.3 * STEP,
            )
        )
        expected = cartesian(
            [
                [lo + s for s in starts_1d(hi - lo, size[d], stride[d], boundary)]
                for d, (lo, hi) in ((d, window[d]) for d in pdims)
            ]
        )
    floating = np.dtype(dtype).kind == "f"
    nan_box = floating and draw(st.booleans())
    min_valid = draw(st.sampled_from([None, 0.0, 0.25, 0.5, 0.75])) if floating else None
    if draw(st.booleans()):
        window = np.random.default_rng(seed).uniform(0.05, 1.0, [size[d] for d in pdims])
    else:
        window = draw(st.sampled_from(NAMED_WINDOWS))
    options = dict(size=size, stride=stride, boundary=boundary, window=window, sampler=sampler)
    return dict(
        kind=kind,
        dims=dims,
        pdims=pdims,
        extent=extent,
        dtype=dtype,
        nan_box=nan_box,
        min_valid=min_valid,
        options=options,
        expected=expected,
        most=most,
        seed=seed,
    )


def carried_first(p, da) -> np.ndarray:
    """The input's values as ``(*carried dims, *patched dims)``."""
    carried = [d for d in da.dims if d not in p.dims]
    return da.transpose(*carried, *p.dims).values


def check_weights(p, case) -> np.ndarray:
    w = p.weights()
    assert w.dims == p.dims
    assert w.dtype == np.float64
    assert w.shape == tuple(case["options"]["size"][d] for d in p.dims)
    assert (w.values > 0).all()
    window = case["options"]["window"]
    if isinstance(window, np.ndarray):
        np.testing.assert_array_equal(w.values, window)
    elif window == "boxcar":
        np.testing.assert_array_equal(w.values, np.ones(w.shape))
    elif window == "hann":
        expected = np.ones(())
        for n in w.shape:
            expected = np.multiply.outer(expected, hann(n))
        np.testing.assert_allclose(w.values, expected, rtol=1e-12)
    return w.values


def valid_fraction(values, anchor, size) -> float:
    patch = cut(values.astype(np.float64), anchor, size, np.nan)
    return np.count_nonzero(~np.isnan(patch)) / patch.size


def check_anchors(p, case, da, reference_anchors) -> None:
    """Anchors as the sampler defines them (filtered by min_valid), in the documented order.

    ``reference_anchors`` are those of the numpy patcher without min_valid, for the
    samplers whose anchors are random.
    """
    got = p.anchors()
    assert got.dims == ("patch", "dim")
    assert list(got["dim"].values) == list(p.dims)
    got = got.values
    assert got.dtype == np.int64
    assert len(p) == len(got)
    kind, pdims = case["kind"], p.dims
    size = [case["options"]["size"][d] for d in pdims]
    base = case["expected"]
    if kind == "jitter":
        grid = cartesian(
            [
                starts_1d(case["extent"][d], s, case["options"]["stride"][d], p.boundary)
                for d, s in zip(pdims, size)
            ]
        )
        jitter = case["options"]["sampler"].jitter
        most = np.array([case["most"][d] for d in pdims])
        assert reference_anchors.shape == grid.shape
        assert (reference_anchors >= np.clip(grid - jitter, 0, most)).all()
        assert (reference_anchors <= np.clip(grid + jitter, 0, most)).all()
        base = reference_anchors
    elif kind == "random":
        assert len(reference_anchors) == case["options"]["sampler"].count
        assert (reference_anchors >= 0).all()
        assert (reference_anchors <= [case["most"][d] for d in pdims]).all()
        base = reference_anchors
    if case["min_valid"] is not None:
        values = carried_first(p, da)
        fractions = np.array([valid_fraction(values, a, size) for a in base])
        base = base[(fractions > 0) & (fractions >= case["min_valid"])]
    keeps_order = not p.obj.chunks or kind in ("anchors", "labels")
    if keeps_order:
        np.testing.assert_array_equal(got, base.reshape(got.shape))
    else:
        np.testing.assert_array_equal(sort_rows(got), sort_rows(base))


def check_patches(p, da, rng) -> None:
    """``p.patches()`` and ``p[i]`` are the input's windows at the anchors."""
    anchors = p.anchors().values
    size = [p.size[d] for d in p.dims]
    carried = [d for d in da.dims if d not in p.dims]
    fill = np.nan if da.dtype.kind == "f" else 0
    values = carried_first(p, da)
    expected = np.stack([cut(values, a, size, fill) for a in anchors])
    patches = p.patches()
    assert patches.dtype == da.dtype
    got = patches.transpose("patch", *carried, *p.dims).values
    np.testing.assert_array_equal(got, expected)
    for j, d in enumerate(p.dims):
        np.testing.assert_array_equal(patches[f"{d}_anchor"].values, anchors[:, j])
    i = int(rng.integers(len(anchors)))
    one = p[i]
    assert "patch" not in one.dims
    np.testing.assert_array_equal(one.transpose(*carried, *p.dims).values, expected[i])


def make_prediction(p, rng, lead, dtype, lazy, shuffle, transpose):
    """Random per-patch predictions for ``p`` and their values in anchor order."""
    n = len(p)
    dims = ("patch", *lead, *p.dims)
    shape = (n, *lead.values(), *(p.size[d] for d in p.dims))
    values = random_values(rng, shape, dtype, nan_fraction=0.05)
    pred = xr.DataArray(values, dims=dims, name="pred")
    if "class" in lead:
        pred = pred.assign_coords({"class": [f"c{i}" for i in range(lead["class"])]})
    anchors = p.anchors().values
    if shuffle or rng.random() < 0.3:
        pred = pred.assign_coords(
            {f"{d}_anchor": ("patch", anchors[:, j]) for j, d in enumerate(p.dims)}
        )
    if shuffle:
        pred = pred.isel(patch=rng.permutation(n))
    if transpose:
        rest = list(dims[1:])
        rng.shuffle(rest)
        pred = pred.transpose("patch", *rest)
    if lazy:
        pred = pred.copy(
            data=dsa.from_array(pred.values, chunks=(partition(rng, n), *pred.shape[1:]))
        )
    return pred, values


def check_reconstruct(p, da, pred, values, reduce, weights, dtype) -> None:
    lead = [d for d in pred.dims if d != "patch" and d not in p.dims]
    out = p.reconstruct(pred, reduce=reduce)
    if pred.chunks is not None:
        assert out.chunks is not None  # lazy when the predictions are
    dims = tuple(da.dims) if {*lead, *p.dims} == set(da.dims) else (*lead, *p.dims)
    assert out.dims == dims
    for d in p.dims:
        np.testing.assert_array_equal(out[d].values, da[d].values)
    shape = [da.sizes[d] for d in p.dims]
    expected, scale = blend(p.anchors().values, weights, values, shape, reduce)
    assert out.dtype == result_dtype(dtype, reduce, weights, expected)
    got = out.transpose(*lead, *p.dims).values
    assert_matches(got, expected, dtype, scale)


@settings(max_examples=200, **SETTINGS)
@given(layouts(), st.sampled_from(REDUCES), st.data())
def test_reconstruct_matches_brute_force(case, reduce, data):
    rng = np.random.default_rng(case["seed"])
    da = build_input(rng, case["dims"], case["extent"], case["dtype"], case["nan_box"])
    options = dict(case["options"], min_valid=case["min_valid"])
    reference = quiet_patch(da, **case["options"]).anchors().values
    carried = [d for d in da.dims if d not in case["pdims"]]
    leads = [{}, {"class": 2}] + [{"band": da.sizes["band"]}] * ("band" in carried)
    lead = data.draw(st.sampled_from(leads), label="lead")
    for lazy_input in (False, True):
        obj = da
        if lazy_input:
            obj = da.chunk({d: partition(rng, da.sizes[d]) for d in da.dims})
        p = quiet_patch(obj, **options)
        assert p.dims == case["pdims"]
        check_anchors(p, case, da, reference)
        if len(p) == 0:  # min_valid left nothing
            continue
        weights = check_weights(p, case)
        check_patches(p, da, rng)
        lazy_pred = data.draw(st.booleans(), label="lazy prediction")
        shuffle = data.draw(st.booleans(), label="shuffled")
        transpose = data.draw(st.booleans(), label="transposed")
        pred, values = make_prediction(p, rng, lead, case["dtype"], lazy_pred, shuffle, transpose)
        check_reconstruct(p, da, pred, values, reduce, weights, case["dtype"])


# -- apply -----------------------------------------------------------------------------


def make_model(n_carried: int, n_patched: int, out_dtype, keep: bool):
    """A per-patch, non-pointwise model: it mixes each patch's mean, max and position."""

    def model(batch: np.ndarray) -> np.ndarray:
        assert batch.ndim == 1 + n_carried + n_patched
        x = np.nan_to_num(batch.astype(np.float64), nan=0.0)
        axes = tuple(range(1, x.ndim))
        expand = (slice(None),) + (None,) * (x.ndim - 1)
        mean, peak = x.mean(axis=axes)[expand], x.max(axis=axes)[expand]
        patch_shape = x.shape[1 + n_carried :]
        ramp = np.arange(np.prod(patch_shape)).reshape(patch_shape) / max(np.prod(patch_shape), 1)
        if keep:  # (b, *carried, *patch)
            out = x * (1.0 + ramp) - mean + 0.5 * peak
        else:  # (b, 2, *patch)
            first = x[(slice(None),) + (0,) * n_carried]
            mean, peak = mean.reshape(-1, *[1] * n_patched), peak.reshape(-1, *[1] * n_patched)
            out = np.stack([first + mean, peak * (1.0 + ramp) - first], axis=1)
        if np.dtype(out_dtype).kind in "iu":
            return np.rint(out / 4).astype(np.int64)
        return out

    return model


@settings(max_examples=150, **SETTINGS)
@given(layouts(), st.sampled_from(REDUCES), st.data())
def test_apply_matches_brute_force(case, reduce, data):
    rng = np.random.default_rng(case["seed"])
    da = build_input(rng, case["dims"], case["extent"], case["dtype"], nan_box=False)
    floating = np.dtype(case["dtype"]).kind == "f"
    out_dtype = data.draw(
        st.sampled_from(["float32", "float64", "int32"] + ["float16"] * floating), label="dtype"
    )
    keep = data.draw(st.booleans(), label="keep dims")
    batch_size = data.draw(st.integers(1, 7), label="batch_size")
    carried = [d for d in da.dims if d not in case["pdims"]]
    model = make_model(len(carried), len(case["pdims"]), out_dtype, keep)
    output_dims = {d: da.sizes[d] for d in carried} if keep else {"class": 2}
    fill = np.nan if floating else 0
    for lazy_input in (False, True):
        obj = da
        if lazy_input:
            obj = da.chunk({d: partition(rng, da.sizes[d]) for d in da.dims})
        p = quiet_patch(obj, **case["options"])
        out = p.apply(
            model, batch_size=batch_size, output_dims=output_dims, dtype=out_dtype, reduce=reduce
        )
        assert (out.chunks is not None) == lazy_input
        lead = list(output_dims)
        dims = tuple(da.dims) if {*lead, *p.dims} == set(da.dims) else (*lead, *p.dims)
        assert out.dims == dims
        values = carried_first(p, da)
        size = [p.size[d] for d in p.dims]
        anchors = p.anchors().values
        preds = np.stack(
            [model(cut(values, a, size, fill)[None])[0].astype(out_dtype) for a in anchors]
        )
        expected, scale = blend(
            anchors, p.weights().values, preds, list(values.shape[-len(size) :]), reduce
        )
        covered = not np.isnan(expected).any()
        if reduce == "mean" and np.dtype(out_dtype).kind in "iu" and covered:
            # apply stores the mean of integers in their dtype, rounded to nearest.
            assert out.dtype == np.dtype(out_dtype)
            got = out.transpose(*lead, *p.dims).values
            # Half-way means may round either way after float rounding of the sums.
            tie = np.isclose(np.abs(expected - np.trunc(expected)), 0.5, rtol=0, atol=1e-6)
            ok = (got == np.rint(expected)) | (tie & (np.abs(got - expected) <= 0.5 + 1e-6))
            assert ok.all(), (got[~ok], expected[~ok])
            continue
        assert out.dtype == result_dtype(out_dtype, reduce, p.weights().values, expected)
        got = out.transpose(*lead, *p.dims).values
        assert_matches(got, expected, out_dtype, scale)


# -- Datasets --------------------------------------------------------------------------


@settings(max_examples=80, **SETTINGS)
@given(
    st.sampled_from(["grid", "random", "anchors"]),
    st.sampled_from(["shift", "pad", "drop"]),
    st.sampled_from(REDUCES),
    st.booleans(),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_dataset_reconstruct_matches_brute_force(kind, boundary, reduce, lazy, shuffle, seed):
    rng = np.random.default_rng(seed)
    ny, nx = int(rng.integers(6, 30)), int(rng.integers(6, 30))
    ds = xr.Dataset(
        {
            "image": (("band", "y", "x"), rng.normal(size=(2, ny, nx)).astype("float32")),
            "label": (("x", "y"), rng.integers(0, 5, size=(nx, ny)).astype("uint16")),
            "info": ("band", np.array([1.0, 2.0])),
        },
        coords={"y": np.arange(ny) * 2.0, "x": np.arange(nx) * 3.0},
    )
    if lazy:
        ds = ds.chunk({"band": 1, "y": partition(rng, ny), "x": partition(rng, nx)})
    sy, sx = int(rng.integers(1, ny + 1)), int(rng.integers(1, nx + 1))
    sampler = {
        "grid": xpatch.RegularGrid(),
        "random": xpatch.RandomAnchors(count=9, seed=seed),
        "anchors": xpatch.Anchors(
            {"y": rng.integers(0, ny - sy + 1, 6), "x": rng.integers(0, nx - sx + 1, 6)}
        ),
    }[kind]
    window = rng.uniform(0.1, 1.0, (sy, sx))
    p = quiet_patch(
        ds,
        y=sy,
        x=sx,
        stride={"y": int(rng.integers(1, sy + 2)), "x": int(rng.integers(1, sx + 2))},
        boundary=boundary,
        window=window,
        sampler=sampler,
    )
    assert p.dims == ("y", "x")
    np.testing.assert_array_equal(p.weights().values, window)
    n = len(p)
    anchors = p.anchors().values
    image = random_values(rng, (n, 3, sy, sx), "float32", nan_fraction=0.05)
    label = random_values(rng, (n, sy, sx), "uint16")
    pred = xr.Dataset(
        {
            "image": (("patch", "class", "y", "x"), image),
            "label": (("patch", "y", "x"), label),
            "meta": ("class", np.arange(3.0)),
        },
        coords={"y_anchor": ("patch", anchors[:, 0]), "x_anchor": ("patch", anchors[:, 1])},
    )
    if shuffle:
        pred = pred.isel(patch=rng.permutation(n))
    # Dask data, numpy anchor coordinates (lazy ones are not read to reorder predictions).
    pred = pred.chunk({"patch": partition(rng, n)})
    pred = pred.assign_coords({c: ("patch", pred[c].values) for c in ("y_anchor", "x_anchor")})
    out = p.reconstruct(pred, reduce=reduce)
    assert set(out.data_vars) == {"image", "label", "meta"}
    np.testing.assert_array_equal(out["meta"].values, np.arange(3.0))
    assert out["image"].dims == ("class", "y", "x")
    assert out["label"].dims == ("x", "y")  # the input's order
    assert out["image"].dtype == np.float32
    for name, values, dtype in (("image", image, "float32"), ("label", label, "uint16")):
        expected, scale = blend(anchors, window, values, (ny, nx), reduce)
        got = out[name].transpose(..., "y", "x").values
        assert out[name].dtype == result_dtype(dtype, reduce, window, expected)
        assert_matches(got, expected, dtype, scale)


def test_dataset_with_variables_lacking_some_patched_dims_round_trips():
    """t2m(time, lat, lon) and mask(lat, lon), patched along time, lat and lon."""
    rng = np.random.default_rng(7)
    ds = xr.Dataset(
        {
            "t2m": (("time", "lat", "lon"), rng.integers(200, 320, (5, 11, 13)).astype("float64")),
            "mask": (("lat", "lon"), rng.integers(0, 2, (11, 13)).astype("float64")),
        },
        coords={"time": np.arange(5), "lat": 60.0 - np.arange(11), "lon": np.arange(13.0)},
    )
    p = ds.patch(time=2, lat=4, lon=5, stride={"time": 2, "lat": 3, "lon": 4})
    assert p.dims == ("time", "lat", "lon")
    anchors = p.anchors().values
    for i in (0, len(p) // 2, len(p) - 1):
        t, y, x = anchors[i]
        np.testing.assert_array_equal(
            p[i]["mask"].transpose("lat", "lon").values, ds["mask"].values[y : y + 4, x : x + 5]
        )
        np.testing.assert_array_equal(
            p[i]["t2m"].transpose("time", "lat", "lon").values,
            ds["t2m"].values[t : t + 2, y : y + 4, x : x + 5],
        )
    out = p.reconstruct(p.patches())
    for name in ("t2m", "mask"):
        assert out[name].dims == ds[name].dims
        np.testing.assert_array_equal(out[name].values, ds[name].values)


# -- explicit anchors with boundary="raise" --------------------------------------------


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
@pytest.mark.parametrize(
    "sampler",
    [
        xpatch.Anchors({"y": [0, 15, 7, 15], "x": [23, 0, 11, 23]}),
        xpatch.RandomAnchors(count=7, seed=3),
    ],
    ids=["Anchors", "RandomAnchors"],
)
def test_raise_accepts_explicit_anchors_inside_the_array(sampler, lazy):
    """The grid of stride 6 does not end flush on 23 x 31; the anchors need no grid."""
    rng = np.random.default_rng(11)
    da = xr.DataArray(rng.normal(size=(2, 23, 31)), dims=("band", "y", "x"))
    if lazy:
        da = da.chunk({"y": (5, 11, 7), "x": (1, 20, 10)})
    p = da.patch(y=8, x=8, stride=6, boundary="raise", window="hann", sampler=sampler)
    anchors = p.anchors().values
    assert (anchors >= 0).all() and (anchors <= [15, 23]).all()
    pred, values = make_prediction(p, rng, {"class": 2}, "float64", lazy, False, False)
    check_reconstruct(p, da, pred, values, "mean", p.weights().values, "float64")


@pytest.mark.parametrize(
    "anchors", [{"y": [0, 17], "x": [0, 0]}, {"y": [3], "x": [-1]}], ids=["past-end", "negative"]
)
def test_raise_refuses_anchors_whose_patch_leaves_the_array(anchors):
    da = xr.DataArray(np.zeros((24, 16)), dims=("y", "x"))  # the grid itself ends flush
    with pytest.raises(xpatch.GeometryError):
        len(da.patch(y=8, x=8, boundary="raise", sampler=xpatch.Anchors(anchors)))


# -- the multi-threaded eager path -----------------------------------------------------


@pytest.mark.parametrize("reduce", REDUCES)
def test_large_eager_reconstruct_matches_brute_force(reduce):
    """Predictions over 8 MiB: the eager overlap-add splits the grid across threads."""
    rng = np.random.default_rng(5)
    da = xr.DataArray(np.zeros((97, 131)), dims=("y", "x"))
    window = rng.uniform(0.05, 1.0, (24, 20))
    p = da.patch(y=24, x=20, stride={"y": 4, "x": 5}, window=window)
    pred, values = make_prediction(p, rng, {"class": 5}, "float64", False, False, False)
    assert pred.nbytes > 8 * 2**20
    check_reconstruct(p, da, pred, values, reduce, window, "float64")


def test_reconstruct_of_a_gaussian_tail_below_float32s_range_matches_brute_force():
    """A falsifying example: float32 predictions, ('gaussian', 1.5) over 43 cells.

    The window's ends (~2.7e-43) are denormal in float32; a NaN in the predictions
    (the masked sums) or lazy predictions (the partials) blended them unnormalised in
    float32, and the edge cells, which only those weights reach, came back off by 3e-4.
    """
    case = {
        "kind": "jitter", "dims": ("x", "y", "band"), "pdims": ("x", "y", "band"),
        "extent": {"band": 1, "y": 1, "x": 43}, "dtype": "float32", "nan_box": False,
        "min_valid": None, "expected": None, "most": {"x": 0, "y": 0, "band": 0}, "seed": 0,
        "options": {
            "size": {"x": 43, "y": 1, "band": 1}, "stride": {"x": 1, "y": 1, "band": 1},
            "boundary": "shift", "window": ("gaussian", 1.5),
            "sampler": xpatch.JitteredGrid(jitter=0, seed=0),
        },
    }  # fmt: skip
    rng = np.random.default_rng(case["seed"])
    da = build_input(rng, case["dims"], case["extent"], case["dtype"], case["nan_box"])
    for lazy_input in (False, True):
        obj = da.chunk({d: partition(rng, da.sizes[d]) for d in da.dims}) if lazy_input else da
        p = quiet_patch(obj, **case["options"], min_valid=case["min_valid"])
        weights = check_weights(p, case)
        check_patches(p, da, rng)
        pred, values = make_prediction(p, rng, {}, case["dtype"], False, False, False)
        assert np.isnan(values).any()  # the masked sums
        check_reconstruct(p, da, pred, values, "mean", weights, case["dtype"])


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
@pytest.mark.parametrize("nan", [False, True], ids=["full", "nan"])
@pytest.mark.parametrize("weighted", [False, True], ids=["window", "weights"])
def test_a_sum_reaches_the_cells_only_a_gaussian_tail_below_float32s_range_reaches(
    lazy, nan, weighted
):
    """A falsifying example: float16 predictions with a NaN, a sum, ('gaussian', 1.5)
    over 45 cells, five patches at one anchor.

    The window's ends (~2e-47) are 0 in float32. The masked sums (a NaN among the
    predictions) and the sums with per-patch weights counted Σw in float32, found
    none at the end cells, and called them uncovered (NaN), where the plain sums
    give 0.
    """
    sampler = xpatch.Anchors(indices={"x": [0] * 5, "y": [0] * 5})
    da = xr.DataArray(np.zeros((1, 45, 1), np.float16), dims=("band", "x", "y"))
    p = quiet_patch(da, size={"x": 45, "y": 1}, stride=1, window=("gaussian", 1.5),
                    sampler=sampler)  # fmt: skip
    values = np.random.default_rng(0).normal(0.0, 10.0, (5, 1, 45, 1)).astype(np.float16)
    if nan:
        values[2, 0, 20, 0] = np.nan
    pred = xr.DataArray(values, dims=("patch", "band", "x", "y"))
    weights = np.ones(5) if weighted else None
    out = p.reconstruct(pred.chunk({"patch": 2}) if lazy else pred, "sum", weights=weights)
    expected, scale = blend(p.anchors().values, p.weights().values, values, [45, 1], "sum")
    assert not np.isnan(expected).any()
    assert_matches(out.values, expected, np.float16, scale)


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_apply_sums_with_unit_weights_as_without_under_a_narrow_gaussian(lazy):
    da = xr.DataArray(np.random.default_rng(2).normal(0, 10, (45, 3)).astype("f4"), dims=("x", "y"))
    p = quiet_patch(da.chunk({"x": 20}) if lazy else da, size={"x": 45, "y": 1}, stride=1,
                    window=("gaussian", 1.5))  # fmt: skip
    plain = p.apply(lambda b: b * 2, reduce="sum")
    weighted = p.apply(lambda b: b * 2, reduce="sum", weights=np.ones(len(p)))
    assert not np.isnan(plain.values).any()  # the ends reached, by weights 0 in float32
    np.testing.assert_array_equal(weighted.values, plain.values)


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
@pytest.mark.parametrize("nan", [False, True], ids=["full", "nan"])
@pytest.mark.parametrize("sigma", [1.5, 1.0])  # ends ~3e-43 (denormal in float32), ~1e-96 (0)
def test_mean_of_float32_predictions_gives_back_a_lone_patch_under_a_narrow_gaussian(
    lazy, nan, sigma
):
    n = 43
    da = xr.DataArray(np.zeros(n, np.float32), dims="x")
    p = quiet_patch(da, size={"x": n}, stride={"x": 1}, window=("gaussian", sigma))
    values = np.random.default_rng(1).normal(0.0, 10.0, (len(p), n)).astype(np.float32)
    if nan:
        values[0, n // 2] = np.nan
    pred = xr.DataArray(values, dims=("patch", "x"))
    out = p.reconstruct(pred.chunk({"patch": 1}) if lazy else pred, reduce="mean")
    assert out.dtype == np.float32
    expected, scale = blend(p.anchors().values, p.weights().values, values, [n], "mean")
    assert_matches(out.values, expected, np.float32, scale)
    # Cells 0 and n - 1 are reached by the ends of one patch only: its values come back.
    np.testing.assert_allclose(out.values[[0, -1]], values[0, [0, -1]], rtol=2e-7)
