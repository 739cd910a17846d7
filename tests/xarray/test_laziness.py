"""Dask input stays lazy: building pipelines computes nothing; graphs follow chunks."""

from __future__ import annotations

import dask.array as dsa
import numpy as np
import pytest
import xarray as xr

import xpatch
from tests.conftest import ComputeCounter, forbid_compute, sorted_by_anchor


@pytest.fixture
def lazy_scene() -> xr.DataArray:
    data = dsa.random.default_rng(0).random((4, 512, 512), chunks=(4, 128, 128))
    return xr.DataArray(data, dims=("band", "y", "x"))


@pytest.mark.parametrize(
    "boundary",
    [
        "shift",
        "pad",
        {"x": "periodic"},
        {"x": "periodic", "y": "pad", "halo": 3},
        {"y": "shift", "halo": {"x": 5}, "pad_mode": "reflect"},
    ],
    ids=["shift", "pad", "periodic", "periodic-halo", "halo-reflect"],
)
@pytest.mark.parametrize("reduce", ["mean", "sum", "max"])
def test_building_the_whole_pipeline_computes_nothing(lazy_scene, boundary, reduce):
    options = {"boundary": boundary}
    if isinstance(boundary, dict):
        options = {k: v for k, v in boundary.items() if k in ("halo", "pad_mode")}
        options["boundary"] = {k: v for k, v in boundary.items() if k in ("x", "y")}
        if "pad_mode" in options:
            options["boundary"] = "pad"
    with forbid_compute():
        p = lazy_scene.patch(y=64, x=64, stride=48, window="hann", **options)
        len(p)
        p.anchors()
        p.weights()
        first = p[0]
        at = p.patch_at((10, 440))
        patches = p.patches()
        pred = np.tanh(patches) * 2
        out = p.reconstruct(pred, reduce=reduce)
    for result in (first, at, patches, out):
        assert isinstance(result.data, dsa.Array)
    with ComputeCounter() as counter:
        computed = out.compute()
    assert counter.computes == 1
    assert isinstance(computed.data, np.ndarray)
    if reduce == "mean":  # the lazy result is the eager one
        eager = lazy_scene.compute().patch(y=64, x=64, stride=48, window="hann", **options)
        expected = eager.reconstruct(np.tanh(eager.patches()) * 2)
        np.testing.assert_allclose(computed.values, expected.values, rtol=1e-12)


def test_patch_groups_follow_chunks_not_patches(lazy_scene):
    # One group (one task, one chunk along "patch") per input chunk that holds
    # anchors, whatever the number of patches per chunk.
    dense = lazy_scene.patch(y=64, x=64, stride=8)  # 57 x 57 patches
    sparse = lazy_scene.patch(y=64, x=64, stride=48)  # 11 x 11 patches
    for p in (dense, sparse):
        patches = p.patches().data
        assert patches.numblocks[0] == 16
        own_layer = patches.__dask_graph__().layers[patches.name]
        assert len(own_layer) == 16


def test_dask_patches_are_ordered_chunk_by_chunk(lazy_scene):
    p = lazy_scene.patch(y=64, x=64, stride=48)
    anchors = np.asarray(p.anchors())
    chunk_of = anchors // 128
    flat = chunk_of[:, 0] * 4 + chunk_of[:, 1]
    assert (np.diff(flat) >= 0).all()
    # Within a chunk, the grid's C order.
    for c in np.unique(flat):
        inside = anchors[flat == c]
        assert (np.lexsort(inside.T[::-1]) == np.arange(len(inside))).all()
    numpy_p = lazy_scene.compute().patch(y=64, x=64, stride=48)
    assert sorted(map(tuple, anchors)) == sorted(map(tuple, np.asarray(numpy_p.anchors())))
    assert np.asarray(numpy_p.anchors()).tolist() == sorted(map(list, anchors))


def test_reconstruct_graph_has_one_task_per_output_block(lazy_scene):
    p = lazy_scene.patch(y=64, x=64, stride=48, window="hann")
    patches = p.patches()
    out = p.reconstruct(patches)
    layer = out.data.__dask_graph__().layers[out.data.name]
    name = out.data.name
    assert sum(key[0] == name for key in layer) == 16  # 4 x 4 output blocks
    assert sum(key[0] == f"{name}-partial" for key in layer) == 16  # one per patch group
    # Groups overhang into the next block along y, x or both: 3 x 3 + 3 + 3 interior.
    assert sum(key[0] == f"{name}-overhang" for key in layer) == 15
    assert out.chunks == ((4,), (128,) * 4, (128,) * 4)
    windows = [k for k in layer if "window" in str(k[0])]
    assert len(windows) == 1


def test_numpy_and_dask_give_the_same_patches_and_reconstruction(lazy_scene):
    eager_scene = lazy_scene.compute()
    for boundary in ("shift", "pad"):
        kwargs = dict(y=70, x=50, stride={"y": 40, "x": 33}, window="tukey", boundary=boundary)
        lp = lazy_scene.patch(**kwargs)
        ep = eager_scene.patch(**kwargs)
        np.testing.assert_array_equal(
            sorted_by_anchor(lp.patches()).values, sorted_by_anchor(ep.patches()).values
        )
        anchor = np.asarray(lp.anchors())[5]
        same = int(np.flatnonzero((np.asarray(ep.anchors()) == anchor).all(axis=1))[0])
        np.testing.assert_array_equal(lp[5].values, ep[same].values)
        np.testing.assert_allclose(
            lp.reconstruct(lp.patches() ** 2).values, ep.reconstruct(ep.patches() ** 2).values
        )


def test_numpy_predictions_on_a_dask_patcher_and_vice_versa(lazy_scene):
    p = lazy_scene.patch(y=64, x=64, stride=48)
    eager_pred = p.patches().compute()
    from_numpy = p.reconstruct(eager_pred)
    assert isinstance(from_numpy.data, np.ndarray)
    from_dask = p.reconstruct(eager_pred.chunk({"patch": 7}))
    assert isinstance(from_dask.data, dsa.Array)
    np.testing.assert_allclose(from_numpy.values, from_dask.values)


def test_the_input_is_never_mutated():
    values = np.random.default_rng(0).random((2, 20, 20))
    keep = values.copy()
    da = xr.DataArray(values, dims=("b", "y", "x"), coords={"y": np.arange(20.0)})
    coords_before = da.y.values.copy()
    p = da.patch(y=8, x=8, stride=5, window="hann", boundary="pad")
    patch = p[0]
    patch.values[:] = -1  # writing into a patch must not reach the input
    patches = p.patches()
    patches.values[:] = -2
    p.reconstruct(patches)
    p.reconstruct(patches, reduce="max")
    np.testing.assert_array_equal(values, keep)
    np.testing.assert_array_equal(da.y.values, coords_before)


def test_patcher_is_immutable_and_pickles(lazy_scene):
    import pickle

    p = lazy_scene.patch(y=64, x=64, stride=48, window="hann")
    with pytest.raises(AttributeError, match="immutable"):
        p.boundary = "pad"
    clone = pickle.loads(pickle.dumps(p))
    np.testing.assert_array_equal(clone.anchors(), p.anchors())
    np.testing.assert_array_equal(clone[3].values, p[3].values)
    assert isinstance(clone, xpatch.Patcher)


def test_the_compute_counter_can_fail():
    # A computation whose error the code under test swallows is still counted.
    with pytest.raises(AssertionError, match="1 computation"):
        with forbid_compute() as refused:
            try:
                dsa.ones(3).sum().compute()
            except AssertionError:
                pass
            assert refused.computes == 1
