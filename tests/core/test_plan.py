"""The plan: bounded graphs and task memory for every sampler and prediction chunking."""

from __future__ import annotations

import pickle
from unittest import mock

import dask.array as dsa
import numpy as np
import pytest
import xarray as xr
from dask.base import tokenize
from hypothesis import given, settings
from hypothesis import strategies as st

import xpatch
from tests.conftest import forbid_compute
from xpatch.core.plan import ChunkGrid, Plan, column_bounds, reaching

SHAPE = (2, 256, 256)
CHUNK = 64  # 16 input chunks
SIZE, STRIDE = 32, 24


def lazy_scene() -> xr.DataArray:
    data = dsa.random.default_rng(0).random(SHAPE, chunks=(2, CHUNK, CHUNK))
    return xr.DataArray(data, dims=("band", "y", "x"), coords={"y": np.arange(256.0)})


def samplers() -> dict:
    rng = np.random.default_rng(1)
    scattered = rng.integers(0, 256 - SIZE + 1, size=(500, 2))
    return {
        "grid": None,
        "jittered": xpatch.JitteredGrid(jitter=5, seed=0),
        "random": xpatch.RandomAnchors(400, seed=0),
        "anchors": xpatch.Anchors({"y": scattered[:, 0], "x": scattered[:, 1]}),
        "labels": xpatch.AtLabels({"y": scattered[:50, 0].astype(float), "x": scattered[:50, 1]}),
    }


def own_tasks(result, *inputs) -> int:
    """Keys of ``result``'s graph that none of ``inputs`` has."""
    keys = set(dict(result.__dask_graph__()))
    for source in inputs:
        keys -= set(dict(source.__dask_graph__()))
    return len(keys)


@pytest.mark.parametrize("name", list(samplers()))
def test_every_sampler_has_at_most_four_tasks_per_input_chunk(name):
    scene = lazy_scene()
    chunks = 16
    with forbid_compute():
        # AtLabels resolves labels on the "y" coordinate only; it has none on "x".
        sampler = samplers()[name]
        if name == "labels":
            scene = scene.assign_coords(x=np.arange(256))
        p = scene.patch(y=SIZE, x=SIZE, stride=STRIDE, sampler=sampler)
        patches = p.patches()
        one_per_chunk = patches.chunk(patch=1)
        out = p.reconstruct(one_per_chunk)
        applied = p.apply(lambda b: b, batch_size=16)
    assert len({tuple(g) for g in p.plan.groups}) <= chunks * 2  # split only by bytes
    assert own_tasks(patches.data, scene.data) <= 4 * chunks
    coords = [one_per_chunk[c].data for c in ("y_anchor", "x_anchor")]  # lazy: pred's own
    assert own_tasks(out.data, one_per_chunk.data, *coords) <= 4 * chunks
    assert own_tasks(p.reconstruct(patches).data, patches.data) <= 4 * chunks
    assert own_tasks(applied.data, scene.data) <= 4 * chunks
    # Regrouped predictions give what the numpy path gives.
    eager = scene.compute()
    expected = eager.patch(y=SIZE, x=SIZE, stride=STRIDE, sampler=p.sampler)
    np.testing.assert_allclose(
        out.values, expected.reconstruct(expected.patches()).values, rtol=1e-12, equal_nan=True
    )


def test_group_boxes_are_a_chunk_plus_the_overhang_for_numpy_input_too():
    # Numpy input is planned on dask's auto grid; its dask predictions, chunked
    # at random along "patch", are regrouped to that grid, never spanning the scene.
    values = np.random.default_rng(0).random((300, 300))
    scene = xr.DataArray(values, dims=("y", "x"))
    p = scene.patch(y=16, x=16, sampler=xpatch.RandomAnchors(500, seed=3))
    grid = p.plan.grid
    for (_, shape), (home, _) in zip(p.plan.boxes, p.plan.reach):
        extent = grid.extent(home)
        assert all(n <= e + 16 - 1 for n, e in zip(shape, extent))
    pred = p.patches().chunk(patch=50) * 2
    out = p.reconstruct(pred)
    assert out.chunks is not None
    np.testing.assert_allclose(out.values, p.reconstruct(p.patches() * 2).values, equal_nan=True)


def test_scattered_anchors_keep_their_order_and_come_back_in_place():
    scene = lazy_scene()
    anchors = samplers()["anchors"]
    p = scene.patch(y=SIZE, x=SIZE, sampler=anchors)
    np.testing.assert_array_equal(p.anchors().values[:, 0], anchors.indices["y"])
    assert not p.plan.in_chunk_order
    patches = p.patches()
    i = 17
    np.testing.assert_array_equal(patches.isel(patch=i).values, p[i].values)
    # Shuffled predictions carrying their anchors are matched back.
    order = np.random.default_rng(0).permutation(len(p))
    shuffled = (patches * 3).isel(patch=order)
    np.testing.assert_allclose(
        p.reconstruct(shuffled).values, p.reconstruct(patches * 3).values, equal_nan=True
    )


def test_lazy_anchor_coordinates_are_checked_not_computed():
    p = lazy_scene().patch(y=SIZE, x=SIZE, stride=STRIDE)
    pred = p.patches().chunk(patch=7)  # chunks the anchor coordinates too
    with forbid_compute():
        out = p.reconstruct(pred)
    np.testing.assert_allclose(out.values, p.reconstruct(p.patches()).values)
    reversed_ = pred.isel(patch=slice(None, None, -1))  # lazy anchors, out of order
    with forbid_compute():
        wrong = p.reconstruct(reversed_)
    with pytest.raises(xpatch.PredictionError, match=r"lazy .*_anchor coordinates are checked"):
        wrong.compute()


@pytest.mark.parametrize("chunked", [True, False])
def test_group_anchors_are_the_anchors_in_chunk_order(chunked):
    scene = lazy_scene() if chunked else lazy_scene().compute()
    starts = np.random.default_rng(4).integers(0, 256 - SIZE, (2, 40))
    scrambled = xpatch.Anchors({"y": starts[0], "x": starts[1]})  # not in chunk order
    orders = []
    for sampler in (xpatch.RegularGrid(), xpatch.RandomAnchors(60, seed=3), scrambled):
        plan = scene.patch(y=SIZE, x=SIZE, stride=STRIDE, sampler=sampler).plan
        orders.append(plan.in_chunk_order)
        groups = [plan.group_anchors(g) for g in range(len(plan.groups))]
        np.testing.assert_array_equal(np.concatenate(groups), plan.anchors[plan.order])
        assert len(groups) > 1 or not chunked
        if plan.in_chunk_order:  # views of the plan's own (read-only) anchors
            assert all(np.shares_memory(g, plan.anchors) for g in groups if len(g))
            assert not any(g.flags.writeable for g in groups)
    assert orders == [True, True, not chunked]  # both branches taken when chunked


@pytest.mark.parametrize("keep_order", [True, False])
@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_compiling_a_plan_leaves_the_callers_anchors_alone(keep_order, dtype):
    grid = ChunkGrid.from_chunks([(4, 4), (5, 5)])
    given = np.array([[5, 6], [0, 0], [6, 1], [1, 7]], dtype=dtype)
    before = given.copy()
    plan = Plan.compile(given, grid, [2, 2], keep_order=keep_order)
    assert given.flags.writeable and np.array_equal(given, before)
    assert not plan.anchors.flags.writeable and not plan.order.flags.writeable
    assert not np.may_share_memory(plan.anchors, given)
    assert plan.anchors.dtype == plan.order.dtype == np.int64
    in_chunk_order = [[0, 0], [1, 7], [6, 1], [5, 6]]  # blocks 0, 1, 2 and 3
    np.testing.assert_array_equal(plan.anchors[plan.order], in_chunk_order)
    np.testing.assert_array_equal(plan.anchors, before if keep_order else in_chunk_order)


def test_anchors_in_any_memory_layout_name_the_same_plan_and_graphs():
    """Graph names (and with them a resumed write's fingerprint) hash the plan's memory."""
    import pandas as pd

    lazy = lazy_scene()
    given = np.array([[0, 0], [40, 72], [100, 30], [200, 200]])
    padded = np.zeros((8, 4), dtype=np.int64)
    padded[::2, ::2] = given
    from_pandas = pd.DataFrame(given, columns=["y", "x"]).to_numpy()
    assert from_pandas.flags.f_contiguous and not from_pandas.flags.c_contiguous
    layouts = [given, np.asfortranarray(given), padded[::2, ::2], given.astype(np.int32),
               from_pandas, given.tolist()]  # fmt: skip
    names = set()
    for anchors in layouts:
        p = lazy.patch(y=SIZE, x=SIZE, sampler=xpatch.Anchors(anchors))
        assert p.plan.anchors.flags.c_contiguous
        names.add((p.plan.token, p.apply(np.negative).data.name, p.to_grain().fingerprint))
    assert len(names) == 1, names


def test_the_plan_pickles_and_tokenizes_deterministically():
    p = lazy_scene().patch(y=SIZE, x=SIZE, stride=STRIDE, sampler=xpatch.RandomAnchors(50))
    clone = pickle.loads(pickle.dumps(p.plan))
    assert tokenize(clone) == tokenize(p.plan)
    for g in range(len(p.plan.groups)):
        np.testing.assert_array_equal(clone.group_anchors(g), p.plan.group_anchors(g))
    other = lazy_scene().patch(y=SIZE, x=SIZE, stride=STRIDE, sampler=xpatch.RandomAnchors(51))
    assert tokenize(other.plan) != tokenize(p.plan)
    assert not p.plan.anchors.flags.writeable
    assert not clone.anchors.flags.writeable and not clone.order.flags.writeable  # unpickled too


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(-20, 40), st.integers(-20, 40), st.integers(0, 9)),
        min_size=1,
        max_size=30,
    ),
    st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(1, 6)),
    st.tuples(st.integers(-10, 30), st.integers(-10, 30), st.integers(-5, 9)),
    st.tuples(st.integers(0, 30), st.integers(0, 30), st.integers(0, 9)),
    st.integers(1, 3),
)
def test_column_bounds_and_reaching_match_the_axis_reductions(rows, size, lo, extent, k):
    """Column by column, the same answers as numpy's reductions along the anchors' axis."""
    anchors = np.array(rows, dtype=np.int64)[:, :k]
    size, lo = np.array(size[:k]), np.array(lo[:k])
    hi = lo + np.array(extent[:k])
    low, high = column_bounds(anchors)
    np.testing.assert_array_equal(low, anchors.min(axis=0))
    np.testing.assert_array_equal(high, anchors.max(axis=0))
    expected = ((anchors < hi) & (anchors + size > lo)).all(axis=1)
    np.testing.assert_array_equal(reaching(anchors, size, lo, hi), expected)


def test_the_plan_token_is_hashed_once_and_names_the_plan():
    p = lazy_scene().patch(y=SIZE, x=SIZE, stride=STRIDE)
    fields = (p.plan.grid.starts, p.plan.size, p.plan.anchors, p.plan.order, p.plan.groups)
    assert p.plan.__dask_tokenize__() == tokenize(*fields)  # the names graphs had before
    first = tokenize(p.plan)
    with mock.patch("xpatch.core.plan.tokenize", side_effect=AssertionError("hashed again")):
        assert tokenize(p.plan) == first
