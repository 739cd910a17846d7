from __future__ import annotations

import pickle
import subprocess
import sys

import dask.array as dsa
import numpy as np
import pandas as pd
import pytest
import xarray as xr

import xpatch
from tests.conftest import ComputeCounter, forbid_compute


@pytest.fixture
def grid() -> xr.DataArray:
    return xr.DataArray(
        np.random.default_rng(0).random((60, 80)),
        dims=("y", "x"),
        coords={"y": np.arange(60) * 2.0, "x": pd.date_range("2020-01-01", periods=80, freq="D")},
    )


SEEDED = [
    xpatch.JitteredGrid(jitter=5, seed=3),
    xpatch.JitteredGrid(jitter={"x": 7}, seed=3),
    xpatch.RandomAnchors(count=50, seed=3),
    xpatch.RandomAnchors(count=50, seed=3, replace=False),
]


@pytest.mark.parametrize("sampler", SEEDED, ids=repr)
def test_seeded_samplers_repeat_and_stay_inside(grid, sampler):
    first = np.asarray(grid.patch(y=10, x=12, sampler=sampler).anchors())
    again = np.asarray(grid.patch(y=10, x=12, sampler=sampler).anchors())
    np.testing.assert_array_equal(first, again)
    assert (first >= 0).all()
    assert (first <= [50, 68]).all()
    other_seed = type(sampler)(**{**sampler.__dict__, "seed": 4})
    assert not np.array_equal(
        np.asarray(grid.patch(y=10, x=12, sampler=other_seed).anchors()), first
    )


def test_same_seed_same_anchors_in_another_process(grid):
    sampler = xpatch.RandomAnchors(count=20, seed=11, replace=False)
    here = np.asarray(grid.patch(y=10, x=12, sampler=sampler).anchors()).tolist()
    code = (
        "import numpy as np, xarray as xr, xpatch\n"
        "da = xr.DataArray(np.zeros((60, 80)), dims=('y', 'x'))\n"
        "s = xpatch.RandomAnchors(count=20, seed=11, replace=False)\n"
        "print(np.asarray(da.patch(y=10, x=12, sampler=s).anchors()).tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(here)


def test_jitter_moves_each_anchor_by_at_most_the_jitter(grid):
    regular = np.asarray(grid.patch(y=10, x=12, stride=10).anchors())
    jittered = np.asarray(
        grid.patch(y=10, x=12, stride=10, sampler=xpatch.JitteredGrid(jitter=3, seed=0)).anchors()
    )
    assert jittered.shape == regular.shape
    assert (np.abs(jittered - regular) <= 3).all()
    assert (jittered != regular).any()


def test_random_without_replacement_has_no_duplicates_and_refuses_too_many(grid):
    anchors = np.asarray(
        grid.patch(y=58, x=78, sampler=xpatch.RandomAnchors(count=9, replace=False)).anchors()
    )
    assert len({tuple(a) for a in anchors}) == 9  # all 3 x 3 positions, each once
    with pytest.raises(xpatch.OptionError, match=r"more patches than the 9 distinct positions"):
        grid.patch(y=58, x=78, sampler=xpatch.RandomAnchors(count=10, replace=False)).anchors()


def test_explicit_index_anchors(grid):
    p = grid.patch(y=10, x=12, sampler=xpatch.Anchors([[0, 0], [50, 68], [7, 3]]))
    assert np.asarray(p.anchors()).tolist() == [[0, 0], [50, 68], [7, 3]]
    np.testing.assert_array_equal(p[2].values, grid.values[7:17, 3:15])
    with pytest.raises(xpatch.GeometryError, match=r"outside the array along 'x'.*\[0, 68\]"):
        grid.patch(y=10, x=12, sampler=xpatch.Anchors([[0, 69]])).anchors()


def test_anchors_from_coordinate_labels_and_timestamps(grid):
    sampler = xpatch.AtLabels({"y": [4.0, 20.0], "x": ["2020-01-05", "2020-02-01"]})
    p = grid.patch(y=10, x=12, sampler=sampler)
    assert np.asarray(p.anchors()).tolist() == [[2, 4], [10, 31]]
    assert p[1].x.values[0] == np.datetime64("2020-02-01")
    near = xpatch.AtLabels({"y": [4.9], "x": [pd.Timestamp("2020-01-05 13:00")]}, method="nearest")
    assert np.asarray(grid.patch(y=10, x=12, sampler=near).anchors()).tolist() == [[2, 5]]
    with pytest.raises(xpatch.GeometryError, match=r"label\(s\) \[5.0\] not found along 'y'"):
        grid.patch(y=10, x=12, sampler=xpatch.AtLabels({"y": [5.0], "x": ["2020-01-05"]}))


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_validity_filter_drops_all_nan_and_mostly_nan_patches(lazy):
    data = np.ones((2, 20, 20))
    data[:, :10, :10] = np.nan  # patch (0, 0) entirely NaN
    data[:, 10:, :7] = np.nan  # patch (10, 0): 70 % NaN
    data[0, :10, 10:] = np.nan  # patch (0, 10): one band NaN -> 50 % valid
    da = xr.DataArray(
        dsa.from_array(data, chunks=(1, 7, 7)) if lazy else data, dims=("b", "y", "x")
    )
    p_any = da.patch(y=10, x=10, min_valid=0)
    p_half = da.patch(y=10, x=10, min_valid=0.5)
    assert np.asarray(p_any.anchors()).tolist() == [[0, 10], [10, 0], [10, 10]]
    assert np.asarray(p_half.anchors()).tolist() == [[0, 10], [10, 10]]


def test_validity_filter_counts_padding_as_invalid():
    da = xr.DataArray(np.ones(10), dims="x")
    p = da.patch(x=8, stride=8, boundary="pad", min_valid=0.5)
    assert np.asarray(p.anchors()).ravel().tolist() == [0]  # [8, 16) holds 2 of 8 valid cells


def test_validity_filter_on_dask_computes_once_when_built_and_never_again():
    data = dsa.from_array(np.ones((40, 40)), chunks=10)
    da = xr.DataArray(data, dims=("y", "x"))
    with ComputeCounter() as counter:
        p = da.patch(y=8, x=8, min_valid=0.9)
    assert counter.computes == 1
    with forbid_compute():  # every other path, and a pickled copy, computes nothing
        assert len(p) == 25
        p.patches()
        p.reconstruct(p.patches())
        p.apply(lambda b: b)
        p.to_grain()
        clone = pickle.loads(pickle.dumps(p))
        assert len(clone) == 25
        clone.to_grain()
