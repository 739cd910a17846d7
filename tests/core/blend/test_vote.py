"""reduce="vote": per cell, the label with the largest summed window weight; ties to the smallest.

Known answers on tiny layouts, a brute-force per-cell vote on random layouts (numpy and
dask, predictions chunked any way along "patch"), the lazy graph's size and laziness,
through reconstruct and through apply, and the refusal of float predictions.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xpatch
from tests.conftest import forbid_compute

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def constant_patches(p, labels, dtype="int16") -> xr.DataArray:
    """Predictions where patch i says ``labels[i]`` everywhere."""
    pred = p.patches().astype(dtype)
    shape = (-1,) + (1,) * (pred.ndim - 1)
    return pred.copy(data=np.broadcast_to(np.asarray(labels, dtype).reshape(shape), pred.shape))


def brute_vote(pred: np.ndarray, anchors: np.ndarray, window: np.ndarray, grid) -> np.ndarray:
    """Per cell, a dict label -> summed weight, then the heaviest (ties to the smallest)."""
    k = window.ndim
    lead = pred.shape[1 : pred.ndim - k]
    out = np.full((*lead, *grid), np.nan)
    for lead_index in np.ndindex(*lead):
        for cell in np.ndindex(*grid):
            votes: dict[int, float] = {}
            for i, a in enumerate(anchors):
                offset = tuple(c - s for c, s in zip(cell, a))
                if all(0 <= o < n for o, n in zip(offset, window.shape)):
                    label = int(pred[(i, *lead_index, *offset)])
                    votes[label] = votes.get(label, 0.0) + float(window[offset])
            if votes:
                top = max(votes.values())
                out[(*lead_index, *cell)] = min(
                    label for label, w in votes.items() if w >= top * (1 - 1e-9)
                )
    return out


def test_the_heavier_window_wins():
    # Window [1, 4, 4, 1]: where two patches meet, the one whose middle lies there wins.
    x = xr.DataArray(np.zeros(8), dims="x")
    p = x.patch(x=4, stride=2, window=np.array([1.0, 4.0, 4.0, 1.0]))
    out = p.reconstruct(constant_patches(p, [5, 7, 9]), reduce="vote")
    assert out.dtype == np.int16
    assert out.values.tolist() == [5, 5, 5, 7, 7, 9, 9, 9]


def test_ties_go_to_the_smallest_label():
    x = xr.DataArray(np.zeros(6), dims="x")
    p = x.patch(x=4, stride=2)  # boxcar: the overlap [2, 4) is a tie
    assert p.reconstruct(constant_patches(p, [3, 1]), reduce="vote").values.tolist() == [
        3,
        3,
        1,
        1,
        1,
        1,
    ]
    assert p.reconstruct(constant_patches(p, [1, 3]), reduce="vote").values.tolist() == [
        1,
        1,
        1,
        1,
        3,
        3,
    ]
    # Negative labels order as numbers.
    out = p.reconstruct(constant_patches(p, [2, -4], "int8"), reduce="vote")
    assert out.dtype == np.int8 and out.values.tolist() == [2, 2, -4, -4, -4, -4]


def test_the_majority_of_three_wins():
    x = xr.DataArray(np.zeros(5), dims="x")
    p = x.patch(x=3, stride=1)  # cell 2 is covered by all three patches, 2 to 1 for label 2
    out = p.reconstruct(constant_patches(p, [2, 0, 2], "uint8"), reduce="vote")
    # Cells 1 and 3 are covered by two patches, one each: a tie, to label 0.
    assert out.dtype == np.uint8 and out.values.tolist() == [2, 0, 2, 0, 2]


def test_patches_of_a_label_map_give_it_back_numpy_and_dask():
    rng = np.random.default_rng(3)
    labels = xr.DataArray(rng.integers(0, 5, (2, 23, 19)).astype("uint8"), dims=("band", "y", "x"))
    for data in (labels, labels.chunk({"y": 7, "x": 6})):
        p = data.patch(y=6, x=5, stride=3, window="hann")
        out = p.reconstruct(p.patches(), reduce="vote")
        assert out.dtype == np.uint8 and out.dims == ("band", "y", "x")
        np.testing.assert_array_equal(out.values, labels.values)


def test_bool_predictions_vote_to_bool():
    mask = xr.DataArray(np.arange(12) % 3 == 0, dims="x")
    p = mask.patch(x=4, stride=2, window="hann")
    out = p.reconstruct(p.patches(), reduce="vote")
    assert out.dtype == bool and out.values.tolist() == mask.values.tolist()


def test_uncovered_cells_are_nan_in_float64():
    x = xr.DataArray(np.arange(10, dtype="int32"), dims="x")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", xpatch.UncoveredCellsWarning)
        p = x.patch(x=3, stride=4, boundary="drop")  # cells 3, 7, 8, 9 are uncovered
    out = p.reconstruct(p.patches(), reduce="vote")
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out.values, [0, 1, 2, np.nan, 4, 5, 6, np.nan, np.nan, np.nan])
    lazy = x.chunk(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", xpatch.UncoveredCellsWarning)
        q = lazy.patch(x=3, stride=4, boundary="drop")
    np.testing.assert_array_equal(q.reconstruct(q.patches(), reduce="vote").values, out.values)


def test_large_labels_in_a_float64_result_are_refused():
    x = xr.DataArray(np.array([2**60 + 1, 3, 5, 7, 9], dtype="int64"), dims="x")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", xpatch.UncoveredCellsWarning)
        p = x.patch(x=2, stride=3, boundary="drop")
    with pytest.raises(xpatch.PredictionError, match="2\\*\\*53"):
        p.reconstruct(p.patches(), reduce="vote")
    full = x.patch(x=2, stride=1)  # covered: stays int64, exact
    assert full.reconstruct(full.patches(), reduce="vote").values.tolist() == x.values.tolist()


@settings(max_examples=60, **SETTINGS)
@given(st.data())
def test_against_a_brute_force_vote(data):
    ndim = data.draw(st.integers(1, 2), label="ndim")
    dims = ("y", "x")[-ndim:]
    shape = [data.draw(st.integers(1, 14), label=f"n_{d}") for d in dims]
    size = {d: data.draw(st.integers(1, n), label=f"size_{d}") for d, n in zip(dims, shape)}
    stride = {d: data.draw(st.integers(1, size[d]), label=f"stride_{d}") for d in dims}
    window = data.draw(st.sampled_from(["boxcar", "hann", "random"]), label="window")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    dtype = data.draw(st.sampled_from(["int8", "uint16", "int64"]), label="dtype")
    n_labels = data.draw(st.integers(1, 5), label="n_labels")
    rng = np.random.default_rng(seed)
    if window == "random":
        window = rng.uniform(0.1, 2.0, [size[d] for d in dims])
    band = data.draw(st.booleans(), label="band")
    arr = xr.DataArray(np.zeros(shape), dims=dims)
    if band:
        arr = arr.expand_dims(band=2)
    chunks = {d: data.draw(st.integers(1, n), label=f"chunk_{d}") for d, n in zip(dims, shape)}
    p = arr.chunk(chunks).patch(size, stride=stride, window=window)
    template = p.patches()
    labels = rng.integers(-2 if dtype != "uint16" else 0, n_labels, template.shape).astype(dtype)
    pred = template.copy(data=labels).compute()
    expected = brute_vote(labels, p.anchors().values, p.weights().values, shape)
    eager = p.reconstruct(pred, reduce="vote")
    assert eager.dtype == np.dtype(dtype)  # shift covers every cell
    np.testing.assert_array_equal(eager.values, expected)
    patch_chunks = data.draw(st.integers(1, pred.sizes["patch"]), label="patch_chunks")
    with forbid_compute():
        lazy = p.reconstruct(pred.chunk(patch=patch_chunks), reduce="vote")
    assert lazy.dtype == eager.dtype
    np.testing.assert_array_equal(lazy.values, eager.values)


def test_lazy_vote_is_bounded_like_the_mean():
    rng = np.random.default_rng(0)
    x = xr.DataArray(rng.integers(0, 3, (64, 64)).astype("uint8"), dims=("y", "x")).chunk(16)
    p = x.patch(y=8, x=8, stride=4, window="hann")
    pred = p.patches()
    with forbid_compute():
        vote = p.reconstruct(pred, reduce="vote")
        mean = p.reconstruct(pred, reduce="mean")
    assert len(vote.data.dask) == len(mean.data.dask)
    assert len(vote.data.dask) < 20 * vote.data.npartitions  # a few tasks per chunk
    np.testing.assert_array_equal(vote.values, x.values)


def test_vote_through_apply_numpy_and_dask():
    rng = np.random.default_rng(1)
    x = xr.DataArray(rng.integers(0, 50, (30, 28)).astype("uint16"), dims=("y", "x"))

    def classify(batch):
        return (batch // 10).astype("uint8")

    expected = (x.values // 10).astype("uint8")
    out = x.patch(y=8, x=8, stride=4, window="hann").apply(classify, dtype="uint8", reduce="vote")
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out.values, expected)
    p = x.chunk(10).patch(y=8, x=8, stride=4, window="hann")
    with forbid_compute():
        lazy = p.apply(classify, dtype="uint8", reduce="vote")
    assert lazy.dtype == np.uint8
    np.testing.assert_array_equal(lazy.values, expected)


def test_vote_through_apply_with_disagreeing_patches():
    # Each patch says its own anchor's parity everywhere: the vote matches reconstruct's.
    x = xr.DataArray(np.arange(40.0).reshape(5, 8), dims=("y", "x"))
    p = x.chunk(4).patch(y=3, x=3, stride=1, window="hann")

    def parity(batch):
        return np.broadcast_to((batch[:, :1, :1] % 3).astype("int8"), batch.shape).copy()

    out = p.apply(parity, dtype="int8", reduce="vote")
    pred = p.patches().compute()
    pred = pred.copy(data=parity(pred.values))
    np.testing.assert_array_equal(out.values, p.reconstruct(pred, reduce="vote").values)


def test_float_predictions_are_refused():
    x = xr.DataArray(np.arange(8.0), dims="x")
    p = x.patch(x=4, stride=2)
    with pytest.raises(xpatch.PredictionError, match=r"float64.*astype"):
        p.reconstruct(p.patches(), reduce="vote")
    q = x.chunk(4).patch(x=4, stride=2)
    with forbid_compute(), pytest.raises(xpatch.PredictionError, match="float64"):
        q.reconstruct(q.patches(), reduce="vote")
    with pytest.raises(xpatch.PredictionError, match="float32"):
        p.apply(lambda b: b.astype("float32"), dtype="float32", reduce="vote")


def test_unknown_reduction_lists_vote():
    x = xr.DataArray(np.arange(8), dims="x")
    p = x.patch(x=4, stride=2)
    with pytest.raises(xpatch.OptionError, match="vote"):
        p.reconstruct(p.patches(), reduce="mode")
