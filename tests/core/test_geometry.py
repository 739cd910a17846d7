from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from hypothesis import given
from hypothesis import strategies as st

import xpatch
from xpatch.core.geometry import Geometry, axis_starts, covered_cells


@pytest.fixture
def seed_array() -> xr.DataArray:
    """The seed recipe's array: 256 x 256 float32."""
    return xr.DataArray(np.arange(256 * 256, dtype=np.float32).reshape(256, 256), dims=("y", "x"))


def test_seed_recipe_drop_gives_100_patches_and_says_what_is_uncovered(seed_array):
    with pytest.warns(xpatch.UncoveredCellsWarning, match=r"4032 of 65536 cells"):
        p = seed_array.patch(y=32, x=32, stride=24, boundary="drop")
    assert len(p) == 100
    assert p.patches().sizes == {"patch": 100, "y": 32, "x": 32}


def test_seed_recipe_default_boundary_gives_121_patches_covering_every_cell(seed_array):
    p = seed_array.patch(y=32, x=32, stride=24, window="hann")
    assert len(p) == 121
    anchors = np.asarray(p.anchors())
    covered = np.zeros((256, 256), dtype=bool)
    for y0, x0 in anchors:
        covered[y0 : y0 + 32, x0 : x0 + 32] = True
    assert covered.all()
    assert anchors[:, 0].max() == 256 - 32  # the last patch ends flush with the edge
    np.testing.assert_allclose(p.reconstruct(p.patches()), seed_array, rtol=1e-6)


@pytest.mark.parametrize(
    ("boundary", "expected"),
    [
        ("shift", [0, 4, 8, 12, 14]),
        ("pad", [0, 4, 8, 12, 16]),
        ("drop", [0, 4, 8, 12]),
    ],
)
def test_axis_starts_per_boundary(boundary, expected):
    assert axis_starts(20, 6, 4, boundary, "x").tolist() == expected


def test_boundary_raise_names_the_remainder_and_the_fixes():
    with pytest.raises(xpatch.GeometryError, match=r"last 2 cell\(s\).*boundary='shift'"):
        axis_starts(20, 6, 4, "raise", "x")
    assert axis_starts(18, 6, 4, "raise", "x").tolist() == [0, 4, 8, 12]


@given(
    extent=st.integers(1, 300),
    size=st.integers(1, 64),
    stride=st.integers(1, 80),
    boundary=st.sampled_from(["shift", "pad", "drop"]),
)
def test_axis_starts_properties(extent, size, stride, boundary):
    if size > extent and boundary != "pad":
        return
    starts = axis_starts(extent, size, stride, boundary, "x")
    assert starts[0] == 0
    assert (np.diff(starts) > 0).all()
    assert (np.diff(starts) <= stride).all()
    if boundary == "pad":
        assert starts[-1] < extent
        assert extent <= starts[-1] + size or stride > size
    else:
        assert starts[-1] + size <= extent
    if boundary != "drop" and stride <= size:
        assert covered_cells(extent, size, starts) == extent  # nothing left out
    if boundary == "drop":
        assert starts[-1] + size + stride > extent  # no complete patch was left out


def test_million_patch_grid_is_vectorised():
    geometry = Geometry.build({"y": 8000, "x": 8000}, {"y": 8, "x": 8}, 8, "shift")
    anchors = geometry.grid_anchors()
    assert anchors.shape == (1_000_000, 2)
    assert anchors.dtype == np.int64
    assert anchors[-1].tolist() == [7992, 7992]


def test_patching_a_subset_of_dims_carries_the_rest():
    cube = xr.DataArray(np.random.default_rng(0).random((5, 4, 30)), dims=("time", "level", "x"))
    p = cube.patch(time=3, stride=1)
    assert p.dims == ("time",)
    assert len(p) == 3
    assert p.patches().sizes == {"patch": 3, "time": 3, "level": 4, "x": 30}
    volume = xr.DataArray(np.random.default_rng(1).random((10, 12, 14)), dims=("z", "y", "x"))
    pv = volume.patch(z=4, y=5, x=6, stride=3)
    assert pv.anchors().shape[1] == 3
    np.testing.assert_allclose(pv.reconstruct(pv.patches()), volume)


def test_dims_follow_the_array_order_whatever_the_keyword_order():
    da = xr.DataArray(np.zeros((6, 8)), dims=("y", "x"))
    p = da.patch(size={"x": 4, "y": 3})
    assert p.dims == ("y", "x")
    assert p.size == {"y": 3, "x": 4}
    assert p.anchors()["dim"].values.tolist() == ["y", "x"]


def test_stride_mapping_defaults_to_size_for_dims_left_out():
    da = xr.DataArray(np.zeros((6, 8)), dims=("y", "x"))
    assert da.patch(y=3, x=4, stride={"x": 2}).stride == {"y": 3, "x": 2}


def test_pad_boundary_allows_patches_larger_than_the_array():
    da = xr.DataArray(np.arange(5.0), dims="x")
    p = da.patch(x=8, boundary="pad")
    assert len(p) == 1
    first = p[0]
    assert np.isnan(first.values[5:]).all()
    np.testing.assert_array_equal(first.values[:5], da.values)
    np.testing.assert_array_equal(p.reconstruct(p.patches()), da)
