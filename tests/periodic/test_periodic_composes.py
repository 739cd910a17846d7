"""A periodic dim with every sampler, halo, reduction and apply option, against numpy.

The reference is a plain loop over the anchors ``p.anchors()`` gives, with the
periodic dim's cells taken modulo its extent: nothing of xpatch's blending.
"""

from __future__ import annotations

import itertools

import hypothesis.strategies as st
import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings

import xpatch

NY, NX = 10, 16
SIZE = {"y": 4, "x": 6}
STRIDE = {"y": 3, "x": 5}
IMAGE = np.random.default_rng(0).normal(size=(NY, NX))


def image(lazy: bool) -> xr.DataArray:
    da = xr.DataArray(
        IMAGE, dims=("y", "x"), coords={"y": np.arange(NY) * 10.0, "x": np.arange(NX) * 22.5}
    )
    return da.chunk({"y": (3, 7), "x": (5, 4, 7)}) if lazy else da


SAMPLERS = {
    "grid": lambda: None,
    "jittered": lambda: xpatch.JitteredGrid(jitter=2, seed=1),
    "random": lambda: xpatch.RandomAnchors(7, seed=3),
    "anchors": lambda: xpatch.Anchors({"y": [0, 6, 3], "x": [13, 15, 0]}),
    "labels": lambda: xpatch.AtLabels({"y": [0.0, 60.0], "x": [292.5, 337.5]}),
    "weighted": lambda: xpatch.WeightedAnchors(
        xr.DataArray(np.eye(NY, NX) + 0.1, dims=("y", "x")), count=6, seed=2
    ),
}


def layout(lazy: bool, sampler: str, **options) -> xpatch.Patcher:
    return image(lazy).patch(
        SIZE, STRIDE, boundary={"x": "periodic"}, sampler=SAMPLERS[sampler](), **options
    )


def cells(anchor) -> tuple[np.ndarray, np.ndarray]:
    ay, ax = (int(a) for a in anchor)
    return ay + np.arange(SIZE["y"]), (ax + np.arange(SIZE["x"])) % NX


def reference(anchors, values, reduce: str, window=None) -> np.ndarray:
    """Blend per-patch ``values`` (n, 4, 6) cell by cell, the periodic dim wrapped."""
    window = np.ones((SIZE["y"], SIZE["x"])) if window is None else window
    total, weight = np.zeros((NY, NX)), np.zeros((NY, NX))
    extreme = np.full((NY, NX), np.nan)
    pick = np.fmax if reduce == "max" else np.fmin
    for anchor, value in zip(anchors, values):
        ys, xs = cells(anchor)
        box = np.ix_(ys, xs)
        np.add.at(total, box, window * value)
        np.add.at(weight, box, window)
        extreme[box] = pick(extreme[box], value)
    covered = weight > 0
    if reduce in ("max", "min"):
        return extreme
    if reduce == "sum":
        return np.where(covered, total, np.nan)
    return np.where(covered, total / np.where(covered, weight, 1), np.nan)


def per_patch_model(patches: xr.DataArray) -> xr.DataArray:
    # Each patch adds its own number, so that overlaps differ and every reduction shows.
    return patches * 2 + xr.DataArray(np.arange(patches.sizes["patch"]), dims="patch")


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_every_sampler_lays_anchors_inside_one_turn_and_patches_wrap(lazy, sampler):
    p = layout(lazy, sampler)
    anchors = p.anchors().values
    assert ((anchors >= 0) & (anchors < [NY, NX])).all()
    assert (anchors[:, 0] <= NY - SIZE["y"]).all()  # y ends: it does not wrap
    for i in range(len(p)):
        ys, xs = cells(anchors[i])
        np.testing.assert_array_equal(p[i].values, IMAGE[np.ix_(ys, xs)])


@pytest.mark.parametrize(
    ("lazy", "sampler", "reduce", "window"),
    [
        (lazy, sampler, reduce, window)
        for lazy, sampler, reduce, window in itertools.product(
            [False, True], SAMPLERS, ["mean", "sum", "max", "min"], ["boxcar", "hann"]
        )
        # max/min ignore the window: one window is enough for them
        if not (reduce in ("max", "min") and window == "hann")
    ],
)
def test_every_reduction_folds_across_the_seam(lazy, sampler, reduce, window):
    p = layout(lazy, sampler, window=window)
    pred = per_patch_model(p.patches())
    expected = reference(p.anchors().values, pred.values, reduce, p.weights().values)
    out = p.reconstruct(pred, reduce)
    np.testing.assert_allclose(out.values, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(out.x.values, image(False).x.values)


@pytest.mark.parametrize("lazy", [False, True])
def test_apply_equals_reconstruct_of_the_model_with_every_option(lazy):
    p = layout(lazy, "random", window="hann")
    weights = np.arange(1.0, len(p) + 1)
    doubled = p.apply(lambda b: b * 2, weights=weights)
    pred = p.patches() * 2
    # weighted per patch: w_k times the window
    window = p.weights().values
    total, weight = np.zeros((NY, NX)), np.zeros((NY, NX))
    for anchor, value, w in zip(p.anchors().values, pred.values, weights):
        box = np.ix_(*cells(anchor))
        np.add.at(total, box, w * window * value)
        np.add.at(weight, box, w * window)
    expected = np.where(weight > 0, total / np.where(weight > 0, weight, 1), np.nan)
    np.testing.assert_allclose(doubled.values, expected, rtol=1e-12)
    np.testing.assert_allclose(p.reconstruct(pred, weights=weights).values, expected, rtol=1e-12)
    cast = p.apply(lambda b: b * 2, out_dtype="float32")
    assert cast.dtype == np.float32
    np.testing.assert_allclose(
        cast.values, reference(p.anchors().values, pred.values, "mean", window), rtol=1e-6
    )


@pytest.mark.parametrize("lazy", [False, True])
def test_predictions_at_twice_the_resolution_land_on_twice_the_cells(lazy):
    # The case: a periodic reconstruct at 2x gave shape (4, 8) of wrong values.
    da = xr.DataArray(np.arange(8.0)[None].repeat(2, 0), dims=("y", "x"))
    da = da.chunk({"x": 3}) if lazy else da
    p = da.patch(y=2, x=4, stride={"y": 2, "x": 3}, boundary={"x": "periodic"})
    up = p.patches().values.repeat(2, axis=1).repeat(2, axis=2)
    out = p.reconstruct(xr.DataArray(up, dims=("patch", "y", "x")))
    assert out.shape == (4, 16)
    np.testing.assert_array_equal(out.values[0], np.arange(8.0).repeat(2))
    applied = p.apply(lambda b: b.repeat(2, axis=1).repeat(2, axis=2), scale=2)
    np.testing.assert_array_equal(applied.values, np.arange(8.0).repeat(2)[None].repeat(4, 0))


@pytest.mark.parametrize("lazy", [False, True])
def test_votes_and_argmax_fold_across_the_seam(lazy):
    p = layout(lazy, "jittered")
    labels = (p.patches() > 0).astype("uint8") + xr.DataArray(
        np.arange(len(p)) % 2, dims="patch"
    ).astype("uint8")
    anchors = p.anchors().values
    counts = np.zeros((3, NY, NX))
    for anchor, value in zip(anchors, labels.values):
        ys, xs = cells(anchor)
        for c in range(3):
            np.add.at(counts[c], np.ix_(ys, xs), (value == c).astype(float))
    expected = counts.argmax(axis=0)
    covered = counts.sum(axis=0) > 0
    assert not covered.all()  # the jittered grid leaves gaps: they must stay empty
    vote = p.reconstruct(labels, "vote").values
    np.testing.assert_array_equal(vote[covered], expected[covered])
    assert np.isnan(vote[~covered]).all()
    scores = xr.concat([(labels == c).astype(float) for c in range(3)], dim="cls")
    scores = scores.transpose("patch", "cls", "y", "x")
    best = p.reconstruct(scores, "argmax").values
    np.testing.assert_array_equal(best[covered], expected[covered])
    assert (best[~covered] > 2).all()  # no class: a value no class takes


def test_a_halo_is_read_across_the_seam_and_the_anchors_stay_the_windows():
    p = image(True).patch(SIZE, STRIDE, boundary={"x": "periodic"}, halo=2)
    grid = image(True).patch(SIZE, STRIDE, boundary={"x": "periodic"})
    np.testing.assert_array_equal(p.anchors().values, grid.anchors().values)
    padded = np.pad(IMAGE, [(2, 2), (0, 0)], constant_values=np.nan)
    for i, (ay, ax) in enumerate(p.anchors().values):
        xs = (ax - 2 + np.arange(SIZE["x"] + 4)) % NX
        expected = padded[ay : ay + SIZE["y"] + 4][:, xs]
        np.testing.assert_array_equal(p[i].values, expected)
    # A model that crops the halo away: the blend is the whole field's.
    out = p.apply(lambda b: b[:, 2:-2, 2:-2] * 3)
    np.testing.assert_allclose(out.values, IMAGE * 3, rtol=1e-12)


def test_the_grain_items_anchor_is_the_windows_not_the_halos():
    pytest.importorskip("grain")
    p = image(True).patch(SIZE, STRIDE, boundary={"x": "periodic"}, halo=1)
    src = p.to_grain()
    served = np.array([src[i]["anchor"] for i in range(len(src))])
    np.testing.assert_array_equal(np.sort(served, axis=0), np.sort(p.anchors().values, axis=0))


def test_min_valid_counts_the_cells_across_the_seam():
    values = IMAGE.copy()
    values[:, :3] = np.nan  # the first three columns hold no data
    da = xr.DataArray(values, dims=("y", "x"))
    p = da.patch(y=4, x=6, stride={"y": 3, "x": 5}, boundary={"x": "periodic"}, min_valid=0.9)
    for ay, ax in p.anchors().values:
        xs = (ax + np.arange(6)) % NX
        assert np.isfinite(values[ay : ay + 4][:, xs]).mean() >= 0.9
    # the patch at x=15 wraps onto the empty columns 0-4: it is left out
    assert 15 not in p.anchors().values[:, 1]


def test_a_regional_grid_marked_periodic_is_refused_naming_the_span():
    lon = np.arange(0, 91, 10.0)  # 0 ... 90 E: a region, not a turn
    da = xr.DataArray(np.zeros(10), dims="lon", coords={"lon": lon})
    with pytest.raises(xpatch.GeometryError, match="100 degrees, not one whole turn"):
        da.patch(lon=4, boundary={"lon": "periodic"})
    global_lon = np.arange(0, 360, 36.0)
    da = xr.DataArray(np.zeros(10), dims="lon", coords={"lon": global_lon})
    assert len(da.patch(lon=4, boundary={"lon": "periodic"})) == 3  # starts 0, 4, 8


def test_the_weights_of_a_periodic_layout_are_its_window():
    p = layout(False, "grid", window="hann")
    flat = image(False).patch(SIZE, STRIDE, window="hann")
    np.testing.assert_array_equal(p.weights().values, flat.weights().values)


def test_a_halo_longer_than_a_turn_is_refused():
    with pytest.raises(xpatch.GeometryError, match="past a whole turn"):
        image(False).patch(SIZE, STRIDE, boundary={"x": "periodic"}, halo={"x": NX + 1})


def test_a_regional_grid_wraps_by_position_once_its_labels_are_dropped():
    lon = np.arange(0, 91, 10.0)
    da = xr.DataArray(np.arange(10.0), dims="lon", coords={"lon": lon})
    p = da.drop_vars("lon").patch(lon=4, stride=3, boundary="periodic")
    np.testing.assert_array_equal(p[3].values, [9.0, 0.0, 1.0, 2.0])


def test_predictions_at_half_the_resolution_land_on_half_the_cells():
    da = xr.DataArray(np.arange(16.0)[None].repeat(4, 0), dims=("y", "x"))
    p = da.patch(y=4, x=4, stride=2, boundary={"x": "periodic"})
    half = p.apply(lambda b: b.reshape(b.shape[0], 2, 2, 2, 2).mean(axis=(2, 4)), scale=0.5)
    np.testing.assert_array_equal(half.values, np.arange(0.5, 16, 2.0)[None].repeat(2, 0))


def test_shuffled_predictions_and_their_weights_move_together():
    p = layout(False, "random", window="hann")
    pred = per_patch_model(p.patches())
    weights = np.arange(1.0, len(p) + 1)
    expected = p.reconstruct(pred, weights=weights)
    order = np.random.default_rng(5).permutation(len(p))
    shuffled = p.reconstruct(pred.isel(patch=order), weights=weights[order])
    np.testing.assert_allclose(shuffled.values, expected.values, rtol=1e-12)


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("sampler", ["grid", "jittered", "anchors", "weighted"])
@pytest.mark.parametrize("seed", range(4))  # the sweep runs either way along each axis
def test_an_epoch_reads_each_chunk_once_though_windows_wrap_to_the_first(batched, sampler, seed):
    # The windows past the far end read the first chunk's low cells: its frame keeps
    # them (it kept only the side facing its next neighbour, and 10 loads for 9 chunks).
    pytest.importorskip("grain")
    p = layout(True, sampler)
    src = p.to_grain(cache_bytes=IMAGE.nbytes * 4)
    expected = [cells(a) for a in p.anchors().values]
    if batched:
        batches = xpatch.grain.BatchSource(src, 3, seed=seed)
        served = [batches[k] for k in range(len(batches))]
        items = [
            {"index": i, "data": data}
            for batch in served
            for i, data in zip(batch["index"], batch["data"])
        ]
    else:
        items = [src[int(i)] for i in src.chunk_shuffled_order(seed=seed, epoch=0)]
    assert sorted(int(item["index"]) for item in items) == list(range(len(src)))
    for item in items:
        np.testing.assert_array_equal(item["data"], IMAGE[np.ix_(*expected[int(item["index"])])])
    touched = src.touched_chunks()
    assert src.cache_stats().loads == len(np.unique(touched[touched >= 0]))


@settings(max_examples=30, deadline=None)
@given(
    extent=st.tuples(st.integers(4, 14), st.integers(4, 14)),
    chunk=st.tuples(st.integers(1, 6), st.integers(1, 6)),
    size=st.integers(1, 5),
    stride=st.integers(1, 5),
    seed=st.integers(0, 3),
    batched=st.booleans(),
)
def test_any_periodic_grid_reads_each_chunk_once_per_epoch(
    extent, chunk, size, stride, seed, batched
):
    pytest.importorskip("grain")
    ny, nx = extent
    size = min(size, ny, nx)
    values = np.arange(ny * nx, dtype="float32").reshape(ny, nx)
    lazy = xr.DataArray(values, dims=("y", "x")).chunk({"y": chunk[0], "x": chunk[1]})
    p = lazy.patch(y=size, x=size, stride=min(stride, size), boundary={"x": "periodic"})
    src = p.to_grain(cache_bytes=values.nbytes * 4)
    if batched:
        batches = xpatch.grain.BatchSource(src, 3, seed=seed)
        served = [batches[k] for k in range(len(batches))]
        index = np.concatenate([batch["index"] for batch in served])
        data = np.concatenate([batch["data"] for batch in served])
    else:
        order = src.chunk_shuffled_order(seed=seed, epoch=0)
        index, data = order, np.stack([src[int(i)]["data"] for i in order])
    assert sorted(index.tolist()) == list(range(len(src)))
    for i, patch in zip(index.tolist(), data):
        ay, ax = (int(a) for a in p.anchors().values[i])
        rows, cols = ay + np.arange(size), (ax + np.arange(size)) % nx
        np.testing.assert_array_equal(patch, values[np.ix_(rows, cols)])
    touched = src.touched_chunks()
    assert src.cache_stats().loads == len(np.unique(touched[touched >= 0]))
