"""dt.patch(...): the same patches cut from every node of a DataTree of resolutions."""

from __future__ import annotations

import pickle
from fractions import Fraction

import dask
import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xpatch
import xpatch.tree  # registers dt.patch
from tests.conftest import ComputeCounter, forbid_compute
from xpatch.tree import TreePatcher

X0, Y0 = 600_000.0, 5_000_000.0
#: Sentinel-2-like nodes: cell size (m) -> bands.
BANDS = {10: ("b02", "b03"), 20: ("b05", "b06"), 60: ("b01",)}


def grid(
    extent_m: int, cell: int, bands, seed: int, *, x0: float = X0, dtype=np.float32
) -> xr.Dataset:
    n = extent_m // cell
    rng = np.random.default_rng(seed)
    centres = cell / 2 + cell * np.arange(n)
    return xr.Dataset(
        {b: (("y", "x"), rng.random((n, n), dtype=dtype)) for b in bands},
        coords={"y": Y0 - centres, "x": x0 + centres},
        attrs={"resolution": cell},
    )


def s2_tree(extent_m: int = 2400, chunks: int | None = None, dtype=np.float32) -> xr.DataTree:
    nodes = {
        f"/{cell}m": grid(extent_m, cell, bands, seed=cell, dtype=dtype)
        for cell, bands in BANDS.items()
    }
    if chunks is not None:  # one chunk layout in metres: chunks cells at 10 m
        nodes = {
            path: ds.chunk({"y": chunks * 10 // cell, "x": chunks * 10 // cell})
            for (path, ds), cell in zip(nodes.items(), BANDS)
        }
    return xr.DataTree.from_dict(
        {
            "/": xr.Dataset(attrs={"product": "S2-like"}),
            **nodes,
            "/meta": xr.Dataset({"sun_zenith": 31.5}),
        }
    )


@pytest.fixture
def tree() -> xr.DataTree:
    return s2_tree()  # 240 x 240, 120 x 120 and 40 x 40 cells


def direct(ds: xr.Dataset, anchor, size) -> xr.Dataset:
    return ds.isel({d: slice(a, a + s) for (d, s), a in zip(size.items(), anchor)})


def node(tree: xr.DataTree, path: str) -> xr.Dataset:
    return tree[path].to_dataset()


def test_patch_sizes_strides_and_factors_per_node(tree):
    tp = tree.patch(y=60, x=60, stride=30, reference="/10m")
    assert isinstance(tp, TreePatcher)
    assert tp.reference == "/10m" and tp.nodes == ("/10m", "/20m", "/60m")
    assert len(tp) == 7 * 7
    sizes = {path: (p.size["y"], p.size["x"]) for path, p in tp.patchers.items()}
    strides = {path: p.stride["y"] for path, p in tp.patchers.items()}
    assert sizes == {"/10m": (60, 60), "/20m": (30, 30), "/60m": (10, 10)}
    assert strides == {"/10m": 30, "/20m": 15, "/60m": 5}
    assert tp.factors == {
        "/10m": {"y": 1, "x": 1},
        "/20m": {"y": Fraction(1, 2), "x": Fraction(1, 2)},
        "/60m": {"y": Fraction(1, 6), "x": Fraction(1, 6)},
    }
    ref = tp.anchors().values
    for path, p in tp.patchers.items():
        f = tp.factors[path]["y"]
        np.testing.assert_array_equal(p.anchors().values, ref * f.numerator // f.denominator)
    assert "TreePatcher (49 patches)" in repr(tp) and "'/10m'" in repr(tp)


def test_default_reference_is_the_finest_node_and_another_reference_agrees(tree):
    tp = tree.patch(y=60, x=60, stride=30)
    assert tp.reference == "/10m"
    at20 = tree.patch(y=30, x=30, stride=15, reference="20m")
    assert at20.reference == "/20m"
    assert at20.factors["/10m"]["y"] == 2
    for path in tp.nodes:
        np.testing.assert_array_equal(
            at20.patchers[path].anchors().values, tp.patchers[path].anchors().values
        )
        assert at20.patchers[path].size == tp.patchers[path].size


def test_bounds_agree_across_nodes_for_every_patch(tree):
    tp = tree.patch(y=60, x=60, stride=30)
    bounds = tp.bounds()
    ref = bounds["/10m"]["bounds"].values
    assert ref.shape == (len(tp), 4)
    assert ref[0].tolist() == [X0, Y0 - 600, X0 + 600, Y0]
    for path in tp.nodes:
        np.testing.assert_allclose(bounds[path]["bounds"].values, ref, rtol=0, atol=1e-6)
    assert "/meta" not in bounds


@pytest.mark.parametrize("chunks", [None, 80])
def test_each_patch_equals_direct_slicing_of_every_node(chunks):
    tree = s2_tree(chunks=chunks)
    tp = tree.patch(y=60, x=60, stride=30)
    for i in (0, 5, 17, len(tp) - 1, -1):
        patch = tp[i]
        assert isinstance(patch, xr.DataTree)
        assert set(patch.children) == {"10m", "20m", "60m"}  # /meta is left out
        assert patch.attrs == {"product": "S2-like"}
        anchor = tp.anchors().values[i]
        for path, p in tp.patchers.items():
            f = tp.factors[path]["y"]
            expected = direct(node(tree, path), anchor * f.numerator // f.denominator, p.size)
            got = patch[path].to_dataset()
            xr.testing.assert_equal(got[list(expected.data_vars)].compute(), expected.compute())
    with pytest.raises(IndexError, match="out of range for 49"):
        tp[49]
    with pytest.raises(TypeError, match="must be an int"):
        tp[1.5]


@pytest.mark.parametrize("chunks", [None, 80])
def test_identity_apply_and_reconstruct_of_patches_give_every_node_back(chunks):
    tree = s2_tree(chunks=chunks)
    tp = tree.patch(y=60, x=60, stride=30, window="hann")
    applied = tp.apply(lambda b: b, batch_size=16)
    rebuilt = tp.reconstruct(tp.patches())
    for path in tp.nodes:
        want = node(tree, path).compute()
        for name in want.data_vars:
            np.testing.assert_allclose(applied[path][name].values, want[name].values, rtol=1e-6)
            np.testing.assert_allclose(rebuilt[path][name].values, want[name].values, rtol=1e-6)
    assert set(applied.children) == set(rebuilt.children) == {"10m", "20m", "60m"}
    assert applied.attrs == {"product": "S2-like"}


def test_apply_hands_each_node_its_own_patch_size():
    tree = s2_tree()
    seen = {}

    def spy(name):
        def fn(batch):
            seen.setdefault(name, set()).add(batch.shape[1:])
            return batch

        return fn

    tp = tree.patch(y=60, x=60, stride=30)
    tp.apply({path: spy(path) for path in tp.nodes})
    assert seen == {"/10m": {(2, 60, 60)}, "/20m": {(2, 30, 30)}, "/60m": {(1, 10, 10)}}


def test_apply_with_a_mapping_and_declared_outputs():
    tree = s2_tree()
    tp = tree.patch(y=60, x=60, stride=30)
    out = tp.apply({"/20m": lambda b: b.mean(axis=1)}, output_dims={}, dtype="float32")
    assert list(out.children) == ["20m"]
    want = node(tree, "/20m").to_dataarray("variable").mean("variable")
    np.testing.assert_allclose(out["/20m"]["data"].values, want.values, rtol=1e-6)
    with pytest.raises(xpatch.OptionError, match="'/30m', which is not patched"):
        tp.apply({"/30m": lambda b: b})
    with pytest.raises(xpatch.OptionError, match="not callable"):
        tp.apply({"/20m": 3})


def test_reconstruct_takes_a_mapping_of_some_nodes():
    tree = s2_tree()
    tp = tree.patch(y=60, x=60, stride=30)
    pred = tp.patches()["/60m"]["b01"] * 2
    out = tp.reconstruct({"60m": pred}, reduce="mean")
    assert list(out.children) == ["60m"]
    np.testing.assert_allclose(out["/60m"]["b01"].values, node(tree, "/60m")["b01"].values * 2)
    with pytest.raises(xpatch.OptionError, match="'/meta'"):
        tp.reconstruct({"/meta": pred})
    with pytest.raises(xpatch.OptionError, match="a list"):
        tp.reconstruct([pred])


def test_units_crs_gives_the_layout_of_cells(tree):
    cells = tree.patch(y=60, x=60, stride=30)
    metres = tree.patch(y=600, x=600, stride=300, units="crs")
    assert metres.units == "crs"
    assert metres.anchors().equals(cells.anchors())
    for path in cells.nodes:
        assert metres.patchers[path].size == cells.patchers[path].size
        assert metres.patchers[path].stride == cells.patchers[path].stride
    per_dim = tree.patch(y=600.0, x=1200, stride={"y": 300, "x": 600}, units="crs")
    assert per_dim.patchers["/60m"].size == {"y": 10, "x": 20}
    assert per_dim.patchers["/60m"].stride == {"y": 5, "x": 10}


def test_building_and_applying_compute_nothing_on_dask():
    tree = s2_tree(chunks=80)
    with forbid_compute():
        tp = tree.patch(y=60, x=60, stride=30, window="hann")
        patches = tp.patches()
        applied = tp.apply(lambda b: b * 2, batch_size=8)
        rebuilt = tp.reconstruct(patches)
        src = tp.to_grain()
        repr(tp)
    for path in tp.nodes:
        for name in node(tree, path).data_vars:
            assert isinstance(applied[path][name].data, dask.array.Array)
            assert isinstance(rebuilt[path][name].data, dask.array.Array)
            assert isinstance(patches[path][name].data, dask.array.Array)
    counter = ComputeCounter()
    with counter:
        np.testing.assert_allclose(
            applied["/60m"]["b01"].values, node(tree, "/60m")["b01"].values * 2, rtol=1e-6
        )
    assert counter.computes >= 1
    assert src[0]["/60m"]["b01"].shape == (10, 10)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size=st.tuples(st.integers(1, 10), st.integers(1, 10)),
    stride=st.tuples(st.integers(1, 10), st.integers(1, 10)),
    boundary=st.sampled_from(["shift", "pad"]),
)
def test_round_trip_is_exact_at_every_node_for_multiples_of_6(size, stride, boundary):
    tree = s2_tree(extent_m=600, dtype=np.float64)  # 60 x 60, 30 x 30, 10 x 10 cells
    y, x = (6 * s for s in size)
    stride = {"y": 6 * min(stride[0], size[0]), "x": 6 * min(stride[1], size[1])}
    tp = tree.patch(y=y, x=x, stride=stride, boundary=boundary)
    assert tp.patchers["/60m"].size == {"y": y // 6, "x": x // 6}
    rebuilt = tp.reconstruct(tp.patches())
    for path in tp.nodes:
        want = node(tree, path)
        for name in want.data_vars:
            # Exact up to the rounding of the weighted mean (1 ulp or so).
            np.testing.assert_allclose(rebuilt[path][name].values, want[name].values, rtol=1e-12)
    bounds = tp.bounds()
    for path in tp.nodes:
        np.testing.assert_allclose(
            bounds[path]["bounds"].values, bounds["/10m"]["bounds"].values, atol=1e-6
        )


def test_to_grain_items_hold_every_node_and_pickle():
    tree = s2_tree(chunks=80)
    tp = tree.patch(y=60, x=60, stride=30)
    src = tp.to_grain(variables={"/10m": ["b03"]})
    assert len(src) == len(tp)
    item = src[7]
    assert sorted(item) == ["/10m", "/20m", "/60m", "anchor", "index"]
    assert item["index"] == 7
    np.testing.assert_array_equal(item["anchor"], tp.anchors().values[7])
    assert sorted(item["/10m"]) == ["b03"] and sorted(item["/20m"]) == ["b05", "b06"]
    patch = tp[7]
    for path, entry in item.items():
        if path.startswith("/"):
            for name, array in entry.items():
                np.testing.assert_array_equal(array, patch[path][name].values)
    assert src.fingerprint in repr(src) and "reference='/10m'" in repr(src)
    assert src.fingerprint == tp.to_grain(variables={"/10m": ["b03"]}).fingerprint
    assert src.fingerprint != tp.to_grain().fingerprint
    copy = pickle.loads(pickle.dumps(src))
    np.testing.assert_array_equal(copy[7]["/60m"]["b01"], item["/60m"]["b01"])
    assert copy.fingerprint == src.fingerprint
    with_weights = tp.to_grain(weights=True)[0]
    assert with_weights["/60m"]["weights"].shape == (10, 10)
    with pytest.raises(IndexError):
        src[len(src)]
    with pytest.raises(xpatch.OptionError, match="'/meta'"):
        tp.to_grain(variables={"/meta": ["sun_zenith"]})


def test_nodes_without_coordinates_scale_by_their_extents():
    tree = xr.DataTree.from_dict(
        {
            "/fine": xr.Dataset({"v": (("y", "x"), np.arange(144.0).reshape(12, 12))}),
            "/coarse": xr.Dataset({"v": (("y", "x"), np.arange(16.0).reshape(4, 4))}),
        }
    )
    tp = tree.patch(y=6, x=6, stride=3)
    assert tp.factors["/coarse"] == {"y": Fraction(1, 3), "x": Fraction(1, 3)}
    assert tp.patchers["/coarse"].size == {"y": 2, "x": 2}
    assert tp.reconstruct(tp.patches())["/coarse"]["v"].equals(tree["/coarse"]["v"])


def test_a_geotransform_gives_the_cell_size_of_a_node_without_coordinates(tree):
    ds = node(tree, "/60m").drop_vars(["y", "x"])
    gdal = f"{X0} 60.0 0.0 {Y0} 0.0 -60.0"
    ds = ds.assign_coords(spatial_ref=((), 0, {"crs_wkt": "LOCAL_CS", "GeoTransform": gdal}))
    tree = xr.DataTree.from_dict({"/10m": node(tree, "/10m"), "/60m": ds})
    tp = tree.patch(y=60, x=60, stride=30)
    assert tp.factors["/60m"]["y"] == Fraction(1, 6)
    bounds = tp.bounds()
    np.testing.assert_allclose(bounds["/60m"]["bounds"], bounds["/10m"]["bounds"], atol=1e-6)


# -- errors --------------------------------------------------------------------------------


def test_a_size_that_is_no_whole_number_of_cells_at_a_node_is_refused_with_the_numbers(tree):
    with forbid_compute():
        with pytest.raises(xpatch.GeometryError) as caught:
            s2_tree(chunks=80).patch(y=64, x=60, stride=30)
    message = str(caught.value)
    for part in ("size 64 along 'y'", "'/60m'", "64 * 1/6 = 32/3", "10.67", "multiple of 6"):
        assert part in message
    assert "60 or 66" in message
    with pytest.raises(xpatch.GeometryError, match=r"stride 21 along 'x' .* 21 \* 1/2 = 21/2"):
        tree.patch(y=60, x=60, stride={"x": 21, "y": 30})
    with pytest.raises(
        xpatch.GeometryError,
        match=r"640 map units.*multiple of 60 map units \(6 reference cells\) \(e\.g\. 600 or 660",
    ):
        tree.patch(y=640, x=600, units="crs")
    with pytest.raises(xpatch.GeometryError, match=r"605 \(units='crs'\) is 60.5 cells of 10"):
        tree.patch(y=605, x=600, units="crs")


def test_anchors_that_are_no_whole_number_of_cells_are_refused(tree):
    sampler = xpatch.Anchors({"y": [0, 7], "x": [0, 0]})
    with pytest.raises(xpatch.GeometryError, match=r"patch 1 starts at cell 7 along 'y'.*7 \* 1/2"):
        tree.patch(y=60, x=60, sampler=sampler)
    ok = tree.patch(y=60, x=60, sampler=xpatch.Anchors({"y": [0, 12], "x": [6, 0]}))
    assert ok.patchers["/60m"].anchors().values.tolist() == [[0, 1], [2, 0]]


def test_mismatched_footprints_are_refused_naming_both_nodes_and_extents():
    tree = s2_tree()
    shifted = grid(2400, 60, ("b01",), seed=1, x0=X0 + 60)
    bad = xr.DataTree.from_dict({"/10m": node(tree, "/10m"), "/60m": shifted})
    with pytest.raises(xpatch.GeometryError) as caught:
        bad.patch(y=60, x=60)
    message = str(caught.value)
    assert "'/10m'" in message and "'/60m'" in message and "along 'x'" in message
    assert "[600000, 602400]" in message and "[600060, 602460]" in message
    cropped = xr.DataTree.from_dict(
        {"/10m": node(tree, "/10m"), "/60m": node(tree, "/60m").isel(x=slice(0, 39))}
    )
    with pytest.raises(xpatch.GeometryError, match="footprints of '/10m' and '/60m' differ"):
        cropped.patch(y=60, x=60)


def test_cell_sizes_without_a_rational_ratio_or_opposite_directions_are_refused(tree):
    odd = node(tree, "/60m")
    odd = odd.assign_coords(x=X0 + (np.arange(40) + 0.5) * (2400 / 40.0001))
    with pytest.raises(xpatch.GeometryError, match="not in a ratio of small whole numbers"):
        xr.DataTree.from_dict({"/10m": node(tree, "/10m"), "/60m": odd}).patch(y=60, x=60)
    flipped = node(tree, "/60m").isel(y=slice(None, None, -1))
    with pytest.raises(xpatch.GeometryError, match="flip one of them"):
        xr.DataTree.from_dict({"/10m": node(tree, "/10m"), "/60m": flipped}).patch(y=60, x=60)
    partial = node(tree, "/60m").drop_vars("x")
    with pytest.raises(xpatch.GeometryError, match=r"\['/60m'\] do not"):
        xr.DataTree.from_dict({"/10m": node(tree, "/10m"), "/60m": partial}).patch(y=60, x=60)


def test_bad_references_units_dims_and_windows_are_refused(tree):
    with pytest.raises(xpatch.OptionError, match=r"reference='/5m' is not a node.*'/10m'"):
        tree.patch(y=60, x=60, reference="/5m")
    with pytest.raises(xpatch.DimensionError, match="reference='/meta' has no data variable"):
        tree.patch(y=60, x=60, reference="/meta")
    with pytest.raises(
        xpatch.OptionError, match=r"units='metres' is not one of \('cells', 'crs'\)"
    ):
        tree.patch(y=60, x=60, units="metres")
    with pytest.raises(xpatch.DimensionError, match=r"\['band'\] that no node"):
        tree.patch(band=2)
    with pytest.raises(xpatch.DimensionError, match="no node of the tree has a data variable"):
        xr.DataTree.from_dict({"/meta": xr.Dataset({"s": 1}, coords={"t": [1, 2]})}).patch(t=1)
    bare = xr.DataTree.from_dict(
        {"/a": xr.Dataset({"v": (("y", "x"), np.zeros((4, 4)))}), "/b": xr.Dataset()}
    )
    with pytest.raises(xpatch.OptionError, match="units='crs' needs numeric coordinates"):
        bare.patch(y=2, x=2, units="crs")
    with pytest.raises(xpatch.OptionError, match="window= is an array"):
        tree.patch(y=60, x=60, window=np.ones((60, 60)))
    with pytest.raises(xpatch.OptionError, match=r"patches an xarray\.DataTree"):
        TreePatcher(node(tree, "/10m"), y=60, x=60)
    one_dim = xr.DataTree.from_dict(
        {"/a": node(tree, "/10m"), "/b": xr.Dataset({"p": ("y", np.zeros(3))})}
    )
    with pytest.raises(xpatch.DimensionError, match=r"node '/b' .* not along \['x'\]"):
        one_dim.patch(y=60, x=60)


def test_apply_keeps_a_shared_nodata_and_each_node_keeps_its_grid_mapping(tree):
    nodes = {}
    for path in ("/10m", "/60m"):
        ds = node(tree, path)
        cell = 10 if path == "/10m" else 60
        gdal = f"{X0} {cell}.0 0.0 {Y0} 0.0 -{cell}.0"
        ds = ds.assign_coords(spatial_ref=((), 0, {"crs_wkt": "LOCAL_CS", "GeoTransform": gdal}))
        for name in ds.data_vars:
            ds[name] = ds[name].where(ds.x > X0 + 120, -9999.0)
            ds[name].attrs["nodata"] = -9999.0
        nodes[path] = ds
    tp = xr.DataTree.from_dict(nodes).patch(y=60, x=60, stride=30)
    out = tp.apply(lambda b: b + 1)
    for path, ds in nodes.items():
        for name in ds.data_vars:
            result = out[path][name]
            assert result.attrs["_FillValue"] == -9999.0
            masked = (ds.x <= X0 + 120).broadcast_like(ds[name])
            assert (result.values[masked.values] == -9999.0).all()
            np.testing.assert_allclose(
                result.values[~masked.values], ds[name].values[~masked.values] + 1, rtol=1e-6
            )
        assert out[path]["spatial_ref"].attrs["GeoTransform"].startswith(f"{X0}")
        assert (
            tp[3][path]["spatial_ref"].attrs["GeoTransform"] != ds.spatial_ref.attrs["GeoTransform"]
        )


def test_a_tree_patcher_pickles(tree):
    tp = tree.patch(y=60, x=60, stride=30)
    copy = pickle.loads(pickle.dumps(tp))
    assert copy.nodes == tp.nodes and copy.factors == tp.factors
    assert copy.anchors().equals(tp.anchors())
    with pytest.raises(AttributeError):
        tp.reference = "/20m"


def test_the_tree_source_shuffles_chunk_by_chunk_like_every_source():
    pytest.importorskip("grain")
    from xpatch.grain import Source

    cells = {"y": 95.0 - 10 * np.arange(16), "x": 5.0 + 10 * np.arange(16)}
    coarse = {"y": 90.0 - 20 * np.arange(8), "x": 10.0 + 20 * np.arange(8)}
    tree = xr.DataTree.from_dict(
        {
            "/10m": xr.Dataset({"a": (("y", "x"), np.arange(256.0).reshape(16, 16))}, cells).chunk(
                8
            ),
            "/20m": xr.Dataset({"b": (("y", "x"), np.ones((8, 8)))}, coarse),
        }
    )
    src = tree.patch(y=4, x=4).to_grain()
    assert isinstance(src, Source)
    order = [int(item["index"]) for item in src.chunk_shuffle(seed=3)]
    assert sorted(order) == list(range(len(src)))  # every patch once
    assert order == src.chunk_shuffled_order(seed=3).tolist()
    # The reference node's 4 chunks, each read once (the sweep mixes their patches).
    assert src.sources["/10m"].cache_stats().loads == 4
    chunks = src.chunk_of_patch()[src.chunk_shuffled_order(seed=3, order="chunk")]
    assert int((np.diff(chunks) != 0).sum()) == 3  # the chunk order: each visited once


def test_nodes_in_different_crss_are_not_one_footprint():
    # The same numbers in two CRSs are different ground: patching them as one is wrong.
    def node(n: int, cell: float, crs: str) -> xr.Dataset:
        centres = cell / 2 + cell * np.arange(n)
        ds = xr.Dataset(
            {"v": (("y", "x"), np.zeros((n, n)))}, coords={"y": 120 - centres, "x": centres}
        )
        return ds.assign_coords(spatial_ref=((), 0, {"crs_wkt": crs}))

    same = xr.DataTree.from_dict(
        {"/a": node(12, 10, "EPSG:32633"), "/b": node(6, 20, "EPSG:32633")}
    )
    assert len(same.patch(y=6, x=6)) == 4
    mixed = xr.DataTree.from_dict(
        {"/a": node(12, 10, "EPSG:32633"), "/b": node(6, 20, "EPSG:32634")}
    )
    with pytest.raises(xpatch.GeometryError, match=r"'/a' and '/b' are in different CRSs"):
        mixed.patch(y=6, x=6)


@pytest.mark.parametrize(
    "sampler",
    [
        xpatch.JitteredGrid(jitter=5, seed=0),
        xpatch.RandomAnchors(9, seed=1),
        "weighted",
    ],
    ids=["jittered", "random", "weighted"],
)
def test_drawn_anchors_snap_to_the_coarsest_nodes_grid(tree, sampler):
    # 10 m, 20 m and 60 m nodes: an anchor must be a multiple of 6 reference cells.
    if sampler == "weighted":
        weights = xr.DataArray(np.random.default_rng(2).random((240, 240)), dims=("y", "x"))
        sampler = xpatch.WeightedAnchors(weights, count=9, seed=3)
    tp = tree.patch(y=60, x=60, stride=30, sampler=sampler)
    anchors = tp.anchors().values
    assert len(anchors) and (anchors % 6 == 0).all()
    for i in range(len(tp)):
        patch = tp[i]
        for path, p in tp.patchers.items():
            f = tp.factors[path]["y"]
            expected = direct(node(tree, path), anchors[i] * f.numerator // f.denominator, p.size)
            got = patch[path].to_dataset()
            xr.testing.assert_equal(got[list(expected.data_vars)], expected)


def test_a_halo_is_ground_scaled_to_every_node_like_a_size(tree):
    # 6 reference cells of halo are 6, 3 and 1 cells at 10, 20 and 60 m: the same 60 m.
    tp = tree.patch(y=60, x=60, stride=30, halo=6)
    for path, p in tp.patchers.items():
        f = tp.factors[path]["y"]
        assert p.layout.halo == (6 * f, 6 * f)
        assert tp[0][path].to_dataset().sizes["y"] == (60 + 12) * f
    with pytest.raises(xpatch.GeometryError, match=r"halo 4 along 'y'.*not a\s+whole number"):
        tree.patch(y=60, x=60, halo=4)
