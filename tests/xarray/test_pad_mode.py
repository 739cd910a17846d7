"""pad_mode=: numpy.pad's modes past the array's end, in every view, apply and Grain."""

from __future__ import annotations

import pickle

import dask.array as dsa
import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xpatch
from tests.conftest import forbid_compute

MODES = ("constant", "reflect", "symmetric", "edge", "wrap")


def reference(values: np.ndarray, axes, anchors: np.ndarray, size, mode: str) -> np.ndarray:
    """np.pad of the whole array by the patches' overhang, then one slice per patch."""
    widths = [(0, 0)] * values.ndim
    for j, ax in enumerate(axes):
        widths[ax] = (0, max(0, int(anchors[:, j].max()) + size[j] - values.shape[ax]))
    if mode == "constant":
        padded = np.pad(values, widths, constant_values=np.nan)
    else:
        padded = np.pad(values, widths, mode=mode)
    out = []
    for row in anchors:
        index = [slice(None)] * values.ndim
        for j, ax in enumerate(axes):
            index[ax] = slice(int(row[j]), int(row[j]) + size[j])
        out.append(padded[tuple(index)])
    return np.stack(out)


@st.composite
def layouts(draw):
    ndim = draw(st.sampled_from([1, 2, 3]))
    n_patched = 1 if ndim == 1 else 2
    shape = [draw(st.integers(1, 11)) for _ in range(n_patched)]
    size = [draw(st.integers(1, 9)) for _ in range(n_patched)]
    stride = [draw(st.integers(1, s)) for s in size]  # every cell covered: no warning
    chunks = [draw(st.integers(1, n)) for n in shape]
    mode = draw(st.sampled_from(MODES))
    return ndim, shape, size, stride, chunks, mode


def build(ndim, shape, chunks=None):
    dims = ("x",) if ndim == 1 else ("y", "x")
    full = shape if ndim < 3 else [2, *shape]
    names = dims if ndim < 3 else ("band", *dims)
    values = np.arange(np.prod(full), dtype="float64").reshape(full) * 1.5 + 1
    da = xr.DataArray(values, dims=names)
    if chunks is not None:
        da = da.chunk(dict(zip(dims, chunks)))
    return da, dims


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=layouts(), lazy=st.booleans(), data=st.data())
def test_every_mode_equals_numpy_pad_of_the_whole_array(layout, lazy, data):
    ndim, shape, size, stride, chunks, mode = layout
    da, dims = build(ndim, shape, chunks if lazy else None)
    p = da.patch(dict(zip(dims, size)), dict(zip(dims, stride)), boundary="pad", pad_mode=mode)
    assert p.pad_mode == mode
    values = da.values
    axes = [da.dims.index(d) for d in dims]
    anchors = p.anchors().values
    expected = reference(values, axes, anchors, size, mode)
    np.testing.assert_array_equal(p.patches().values, expected)
    i = data.draw(st.integers(0, len(p) - 1))
    np.testing.assert_array_equal(p[i].values, expected[i])
    # Any start inside the array, not only the grid's.
    anchor = [data.draw(st.integers(0, n - 1)) for n in shape]
    one = reference(values, axes, np.array([anchor]), size, mode)[0]
    np.testing.assert_array_equal(p.patch_at(anchor).values, one)
    # The Grain source cuts the same patches from its cached chunks.
    src = p.to_grain()
    for k in {0, i, len(p) - 1}:
        np.testing.assert_array_equal(src[k]["data"], expected[k])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("lazy", [False, True])
def test_grain_items_equal_patches_and_weights_stay_zero_past_the_edge(mode, lazy):
    da, _ = build(3, [13, 10], [4, 3] if lazy else None)
    p = da.patch(y=6, x=4, stride=3, boundary="pad", pad_mode=mode)
    src = p.to_grain()
    stacked = p.patches().values
    for i in range(len(p)):
        item = src[i]
        np.testing.assert_array_equal(item["data"], stacked[i])
        y, x = item["anchor"]
        # Padded cells carry no weight, whatever fills them.
        assert (item["weights"][max(0, 13 - y) :, :] == 0).all()
        assert (item["weights"][:, max(0, 10 - x) :] == 0).all()
    np.testing.assert_array_equal(p.weights().values, np.ones((6, 4)))


def test_dataset_variables_with_some_of_the_patched_dims():
    base = np.arange(8 * 7, dtype="float32").reshape(8, 7)
    ds = xr.Dataset({"image": (("y", "x"), base), "profile": ("x", base[0] * 2)})
    for obj in (ds, ds.chunk(y=3, x=4)):
        p = obj.patch(y=5, x=5, stride=3, boundary="pad", pad_mode="symmetric")
        patches = p.patches()
        anchors = p.anchors().values
        np.testing.assert_array_equal(
            patches["image"].values, reference(base, [0, 1], anchors, [5, 5], "symmetric")
        )
        np.testing.assert_array_equal(
            patches["profile"].values,
            reference(base[0] * 2, [0], anchors[:, 1:], [5], "symmetric"),
        )
        src = p.to_grain()
        for i in range(len(p)):
            np.testing.assert_array_equal(src[i]["profile"], patches["profile"].values[i])


def mean3x3(batch: np.ndarray) -> np.ndarray:
    """A 3x3 mean filter over the last two axes, 'same' size, zero outside the patch."""
    padded = np.pad(batch, [(0, 0)] * (batch.ndim - 2) + [(1, 1), (1, 1)])
    out = np.zeros_like(batch)
    for dy in range(3):
        for dx in range(3):
            out += padded[..., dy : dy + batch.shape[-2], dx : dx + batch.shape[-1]]
    return out / 9


@pytest.fixture
def image() -> xr.DataArray:
    rng = np.random.default_rng(0)
    return xr.DataArray(rng.normal(size=(100, 90)), dims=("y", "x"))


@pytest.mark.parametrize("lazy", [False, True])
def test_apply_conv_with_reflect_has_no_nan_and_equals_brute_force(image, lazy):
    obj = image.chunk(y=40, x=35) if lazy else image
    p = obj.patch(y=32, x=32, stride=24, boundary="pad", pad_mode="reflect", window="hann")
    out = p.apply(mean3x3, batch_size=8)
    assert not out.isnull().any()
    # Brute force: the model on reflect-padded patches of the whole image, blended.
    anchors = p.anchors().values
    patches = reference(image.values, [0, 1], anchors, [32, 32], "reflect")
    pred = xr.DataArray(mean3x3(patches), dims=("patch", "y", "x"))
    np.testing.assert_allclose(out.values, p.reconstruct(pred).values, rtol=1e-12)


def test_the_default_stays_constant_and_nan_spreads(image):
    # The documented trap of the default: NaN fill reaches valid cells through the filter.
    p = image.patch(y=32, x=32, stride=24, boundary="pad")
    assert p.pad_mode == "constant"
    out = p.apply(mean3x3)
    assert int(out.isnull().sum()) > 0
    p0 = image.patch(y=32, x=32, stride=24, boundary="pad", pad_value=0.0)
    assert not p0.apply(mean3x3).isnull().any()


@pytest.mark.parametrize("mode", ["reflect", "wrap"])
def test_graphs_compute_nothing_and_stay_one_task_per_group(image, mode):
    obj = image.chunk(y=25, x=30)
    with forbid_compute():
        p = obj.patch(y=16, x=16, stride=12, boundary="pad", pad_mode=mode)
        stacked = p.patches().data
        applied = p.apply(mean3x3, batch_size=4)
        source = p.to_grain()
    assert len(source) == len(p)
    graph = dict(stacked.__dask_graph__())
    tasks = [k for k in graph if isinstance(k, tuple) and k[0].startswith("xpatch-patches-")]
    assert len(tasks) == len(p.plan.groups)
    partials = [k for k in applied.data.__dask_graph__() if "partial" in str(k[0])]
    assert len(partials) == len(p.plan.groups)
    # The group of the last chunk along x reads only what it needs: with "wrap"
    # the array's first columns, never every chunk.
    input_name = obj.data.name
    for key in tasks:
        reads = {d for d in _keys_in(graph[key]) if d[0] == input_name}
        assert len(reads) <= 6, (key, sorted(reads))


def _keys_in(task) -> list:
    found = []
    stack = [task]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple) and item and isinstance(item[0], str):
            found.append(item)
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif hasattr(item, "dependencies"):  # dask's Task objects
            found.extend(item.dependencies)
    return found


def test_modes_name_different_graphs_and_constant_keeps_its_names(image):
    obj = image.chunk(y=40, x=40)
    names = {
        mode: obj.patch(y=32, x=32, stride=24, boundary="pad", pad_mode=mode).patches().data.name
        for mode in MODES
    }
    assert len(set(names.values())) == len(MODES)
    plain = obj.patch(y=32, x=32, stride=24, boundary="pad").patches().data.name
    assert names["constant"] == plain
    applied = {
        mode: obj.patch(y=32, x=32, stride=24, boundary="pad", pad_mode=mode)
        .apply(mean3x3)
        .data.name
        for mode in ("constant", "reflect")
    }
    assert applied["constant"] != applied["reflect"]


def test_property_pickle_and_functional_form(image):
    p = xpatch.patch(image, y=32, x=32, boundary="pad", pad_mode="edge")
    assert p.pad_mode == "edge"
    assert pickle.loads(pickle.dumps(p)).pad_mode == "edge"
    assert image.patch(y=32, x=32).pad_mode == "constant"
    assert pickle.loads(pickle.dumps(p.to_grain())).fingerprint == p.to_grain().fingerprint
    assert (
        p.to_grain().fingerprint != image.patch(y=32, x=32, boundary="pad").to_grain().fingerprint
    )


def test_errors(image):
    with pytest.raises(xpatch.OptionError, match=r"pad_mode='mirror'.*'reflect'"):
        image.patch(y=32, x=32, boundary="pad", pad_mode="mirror")
    with pytest.raises(xpatch.OptionError, match=r"pad_mode='reflect' needs boundary='pad'"):
        image.patch(y=32, x=32, pad_mode="reflect")
    with pytest.raises(xpatch.OptionError, match=r"pad_value=0.*pad_mode='constant'"):
        image.patch(y=32, x=32, boundary="pad", pad_mode="wrap", pad_value=0)
    # constant with other boundaries stays allowed (the default)
    assert image.patch(y=32, x=32, pad_mode="constant").pad_mode == "constant"


def test_lazy_input_reads_chunks_from_the_far_side_for_wrap():
    values = dsa.arange(20.0, chunks=5)
    da = xr.DataArray(values, dims="x")
    p = da.patch(x=8, stride=8, boundary="pad", pad_mode="wrap")
    np.testing.assert_array_equal(p.patches().values[-1], [16, 17, 18, 19, 0, 1, 2, 3])


# -- one mode per dim ------------------------------------------------------------------


def padded_per_dim(values: np.ndarray, widths: dict[int, tuple[int, int]], modes: dict[int, str]):
    """np.pad axis after axis, in axis order, each with its own mode (0 for constant)."""
    for axis, width in sorted(widths.items()):
        pad = [(0, 0)] * values.ndim
        pad[axis] = width
        mode = modes[axis]
        kwargs = {"constant_values": 0.0} if mode == "constant" else {}
        values = np.pad(values, pad, mode=mode, **kwargs)
    return values


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lat_mode=st.sampled_from(MODES),
    lon_mode=st.sampled_from(MODES),
    halo=st.integers(0, 3),
    chunk=st.integers(4, 12),
)
def test_a_mode_per_dim_pads_each_dim_as_numpy_does_one_after_the_other(
    lat_mode, lon_mode, halo, chunk
):
    values = np.random.default_rng(2).normal(size=(13, 17))
    da = xr.DataArray(values, dims=("lat", "lon"))
    modes = {"lat": lat_mode, "lon": lon_mode}
    options = dict(lat=8, lon=8, stride=6, boundary="pad", pad_mode=modes, halo=halo)
    if "constant" in modes.values():
        options["pad_value"] = 0.0
    eager = da.patch(**options)
    with forbid_compute():
        lazy = da.chunk(lat=chunk, lon=chunk).patch(**options)
        stack = lazy.patches()
    anchors = eager.anchors().values
    ends = anchors.max(axis=0) + 8
    widths = {0: (halo, halo + ends[0] - 13), 1: (halo, halo + ends[1] - 17)}
    expected = padded_per_dim(values, widths, {0: lat_mode, 1: lon_mode})
    grown = 8 + 2 * halo
    for i, (y, x) in enumerate(anchors):
        np.testing.assert_array_equal(eager[i].values, expected[y : y + grown, x : x + grown])
    for i, (y, x) in enumerate(lazy.anchors().values):  # chunk order for dask input
        np.testing.assert_array_equal(stack[i].values, expected[y : y + grown, x : x + grown])
    # Whatever the padding, the kept windows round-trip, numpy and dask alike.
    np.testing.assert_allclose(lazy.reconstruct(stack).values, values, rtol=1e-12)
    np.testing.assert_allclose(eager.apply(lambda b: b * 2).values, 2 * values, rtol=1e-12)


def test_a_global_grid_reads_longitude_wrapped_and_latitude_reflected():
    """A 3x3 filter over lon wrapped, lat reflected: the whole field padded the same way."""
    rng = np.random.default_rng(4)
    field = xr.DataArray(
        rng.normal(size=(2, 36, 72)),
        dims=("time", "lat", "lon"),
        coords={"lat": np.linspace(87.5, -87.5, 36), "lon": np.arange(0, 360, 5.0)},
    )

    def box3(batch):  # an unpadded 3x3 mean: one cell less on each side
        h, w = batch.shape[-2] - 2, batch.shape[-1] - 2
        return sum(batch[..., i : i + h, j : j + w] for i in range(3) for j in range(3)) / 9

    options = dict(lat=12, lon=24, stride=9, halo=1, pad_mode={"lat": "reflect", "lon": "wrap"})
    out = field.chunk(lon=36).patch(**options).apply(box3, output_dims={"time": 2}, dtype="float64")
    padded = padded_per_dim(field.values, {1: (1, 1), 2: (1, 1)}, {1: "reflect", 2: "wrap"})
    np.testing.assert_allclose(out.values, box3(padded), rtol=1e-12)
    first = field.patch(**options)[0]
    assert first.lon.values[0] == -5.0 and first.lat.values[0] == 92.5


def test_a_mode_per_dim_is_checked_like_one_mode():
    da = xr.DataArray(np.zeros((8, 8)), dims=("y", "x"))
    with pytest.raises(xpatch.OptionError, match=r"names \['t'\]"):
        da.patch(y=4, x=4, boundary="pad", pad_mode={"t": "wrap"})
    with pytest.raises(xpatch.OptionError, match="not a padding mode"):
        da.patch(y=4, x=4, boundary="pad", pad_mode={"x": "mirror"})
    with pytest.raises(xpatch.OptionError, match="needs boundary='pad'"):
        da.patch(y=4, x=4, pad_mode={"x": "wrap"})
    with pytest.raises(xpatch.OptionError, match="pad_value"):
        da.patch(y=4, x=4, boundary="pad", pad_mode={"x": "wrap", "y": "edge"}, pad_value=1.0)
    same = da.patch(y=4, x=4, boundary="pad", pad_mode={"x": "wrap", "y": "wrap"})
    assert same.layout.pad_mode == "wrap" and same.layout.grown is None
