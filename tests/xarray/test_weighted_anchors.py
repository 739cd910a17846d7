"""WeightedAnchors: patch centres drawn in proportion to a weight map, read chunk by chunk once."""

from __future__ import annotations

import collections
import itertools

import dask.array as dsa
import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

import xpatch
from tests.conftest import ComputeCounter
from xpatch.core.weighted_draw import weighted_cells


def counted_map(values: np.ndarray, chunks: int, calls: collections.Counter) -> xr.DataArray:
    """A lazy weight map whose blocks count how often they are computed."""

    def block(x: np.ndarray, block_id=None) -> np.ndarray:
        if x.size:  # dask probes the function with an empty array while building
            calls[block_id] += 1
        return x

    data = dsa.from_array(values, chunks=chunks).map_blocks(block, dtype=values.dtype)
    return xr.DataArray(data, dims=("y", "x"))


def test_one_percent_positive_cells_with_half_the_mass_centre_half_the_patches():
    n, size = 200, 16
    labels = np.zeros((n, n), dtype=bool)
    rng = np.random.default_rng(5)
    # 1 % of the cells, away from the edges so that no patch moves off its centre.
    inner = rng.choice((n - 2 * size) ** 2, size=n * n // 100, replace=False)
    labels[size + inner // (n - 2 * size), size + inner % (n - 2 * size)] = True
    positives = labels.sum()
    weights = np.where(labels, 0.5 / positives, 0.5 / (labels.size - positives))
    calls: collections.Counter = collections.Counter()
    weight_map = counted_map(weights, 50, calls)
    image = xr.DataArray(np.zeros((n, n), "float32"), dims=("y", "x")).chunk(50)
    sampler = xpatch.WeightedAnchors(weight_map, count=10_000, seed=1)
    with ComputeCounter() as counter:
        p = image.patch(y=size, x=size, sampler=sampler)
    assert len(p) == 10_000
    # Read once, chunk by chunk: one computation per block, each block once.
    assert counter.computes == 16 and sorted(calls.values()) == [1] * 16
    centres = p.plan.anchors + size // 2
    fraction = labels[centres[:, 0], centres[:, 1]].mean()
    assert 0.45 <= fraction <= 0.55


@settings(max_examples=25, deadline=None)
@given(
    cuts=st.lists(st.integers(1, 35), min_size=0, max_size=4, unique=True),
    seed=st.integers(0, 2**32 - 1),
)
def test_property_draws_follow_the_weights_whatever_the_chunks(cuts, seed):
    weights = np.arange(36, dtype=np.float64).reshape(6, 6) % 7  # zeros included
    flat = weights.ravel()
    bounds = [0, *sorted(cuts), 36]
    # Chunks as runs of rows of the flattened map, in order (any partition works).
    chunks = [((a,), flat[a:b]) for a, b in itertools.pairwise(bounds)]
    draws = 20_000
    cells = weighted_cells(chunks, draws, seed)[:, 0]
    counts = np.bincount(cells, minlength=36)
    expected = draws * flat / flat.sum()
    assert (counts[flat == 0] == 0).all()
    sigma = np.sqrt(expected * (1 - flat / flat.sum()))
    assert (np.abs(counts - expected) <= 5 * sigma + 1).all()


def test_the_draw_is_seeded_and_the_same_for_numpy_and_one_chunk_of_dask():
    weights = xr.DataArray(np.random.default_rng(0).random((40, 30)), dims=("y", "x"))
    image = xr.DataArray(np.zeros((40, 30)), dims=("y", "x"))

    def anchors(w, seed):
        sampler = xpatch.WeightedAnchors(w, count=50, seed=seed)
        return image.patch(y=8, x=8, sampler=sampler).anchors().values

    first = anchors(weights, 3)
    np.testing.assert_array_equal(first, anchors(weights, 3))
    np.testing.assert_array_equal(first, anchors(weights.chunk(-1), 3))
    assert not np.array_equal(first, anchors(weights, 4))


def test_centres_near_the_edge_move_the_patch_inward():
    image = xr.DataArray(np.zeros((20, 20)), dims=("y", "x"))
    weights = xr.zeros_like(image)
    weights[0, 19] = 1.0
    p = image.patch(y=8, x=8, sampler=xpatch.WeightedAnchors(weights, count=2, seed=0))
    assert p.anchors().values.tolist() == [[0, 12], [0, 12]]


def test_weights_can_come_in_any_dim_order_and_a_dataset_is_patched_too():
    values = np.zeros((12, 10))
    values[6, 2] = 1.0
    ds = xr.Dataset({"a": (("y", "x"), np.zeros((12, 10)))})
    weights = xr.DataArray(values, dims=("y", "x")).transpose("x", "y")
    p = ds.patch(y=4, x=4, sampler=xpatch.WeightedAnchors(weights, count=1))
    assert p.anchors().values.tolist() == [[4, 0]]


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        (np.ones((10, 10)), "must be an xarray.DataArray"),
        (xr.DataArray(np.ones((10, 10, 2)), dims=("y", "x", "band")), "exactly the patched dims"),
        (xr.DataArray(np.ones((10, 9)), dims=("y", "x")), "9 cells along 'x' and the array 10"),
        (
            xr.DataArray(np.ones((10, 10)), dims=("y", "x"), coords={"y": np.arange(10) + 1}),
            "'y' coordinate differs",
        ),
        (xr.DataArray(np.zeros((10, 10)), dims=("y", "x")), "every weight is 0"),
        (xr.DataArray(-np.ones((10, 10)), dims=("y", "x")), "negative or not finite"),
        (xr.DataArray(np.full((10, 10), np.nan), dims=("y", "x")), "negative or not finite"),
        (xr.DataArray(np.full((10, 10), 1e308), dims=("y", "x")), "sum to more than float64"),
        (xr.DataArray(np.ones((10, 10)) * (1 - 1j), dims=("y", "x")), "must be real"),
    ],
)
def test_bad_weight_maps_are_refused_with_the_fix(weights, message):
    image = xr.DataArray(np.zeros((10, 10)), dims=("y", "x"), coords={"y": np.arange(10)})
    with pytest.raises(xpatch.XPatchError, match=message):
        image.patch(y=4, x=4, sampler=xpatch.WeightedAnchors(weights, count=3))


def test_count_and_seed_are_checked_and_the_sampler_needs_the_array():
    image = xr.DataArray(np.zeros((10, 10)), dims=("y", "x"))
    weights = xr.ones_like(image)
    with pytest.raises(xpatch.XPatchError, match=r"count=...\)=0 must be a positive integer"):
        image.patch(y=4, x=4, sampler=xpatch.WeightedAnchors(weights, count=0))
    with pytest.raises(xpatch.OptionError, match="seed=-1"):
        image.patch(y=4, x=4, sampler=xpatch.WeightedAnchors(weights, count=2, seed=-1))
    with pytest.raises(xpatch.OptionError, match="pass it as sampler="):
        xpatch.WeightedAnchors(weights, count=2).anchors(None)


def test_balanced_weights_give_each_class_equal_mass_and_stay_lazy():
    values = np.zeros((60, 60), dtype=np.int16)
    values[10:13, 20:24] = 1  # 12 cells
    values[40:50, 40:50] = 7  # 100 cells
    labels = xr.DataArray(values, dims=("y", "x")).chunk(20)
    with ComputeCounter() as counter:
        weights = xpatch.balanced_weights(labels)
    assert counter.computes == 1  # the class counts, nothing else
    assert weights.chunks == labels.chunks
    w = weights.values
    for c in (0, 1, 7):
        assert w[values == c].sum() == pytest.approx(1 / 3)
    only = xpatch.balanced_weights(labels, classes=[1, 7]).values
    assert (only[values == 0] == 0).all() and only[values == 1].sum() == pytest.approx(0.5)
    image = xr.DataArray(np.zeros((60, 60)), dims=("y", "x"))
    p = image.patch(y=4, x=4, sampler=xpatch.WeightedAnchors(weights, count=3000, seed=2))
    centres = p.anchors().values + 2
    drawn = values[centres[:, 0], centres[:, 1]]
    assert all(abs((drawn == c).mean() - 1 / 3) < 0.04 for c in (0, 1, 7))


def test_balanced_weights_refuse_float_labels_and_absent_classes():
    with pytest.raises(xpatch.OptionError, match="integer or boolean class labels"):
        xpatch.balanced_weights(xr.DataArray(np.zeros(4), dims="x"))
    labels = xr.DataArray(np.array([0, 1, 1]), dims="x")
    with pytest.raises(xpatch.OptionError, match=r"classes \[2\] have no cells"):
        xpatch.balanced_weights(labels, classes=[1, 2])
