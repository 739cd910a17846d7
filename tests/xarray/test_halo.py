"""``halo=``: patches read grown by a halo, only their inner window kept."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

import xpatch
from tests.conftest import forbid_compute

KERNEL = np.array([[0.1, -0.3, 0.2], [0.5, 1.0, -0.4], [0.05, 0.25, -0.15]])


def valid_conv(batch: np.ndarray) -> np.ndarray:
    """An unpadded 3x3 correlation over the last two axes: one cell less on each side."""
    h, w = batch.shape[-2] - 2, batch.shape[-1] - 2
    out = np.zeros((*batch.shape[:-2], h, w))
    for dy in range(3):
        for dx in range(3):
            out += KERNEL[dy, dx] * batch[..., dy : dy + h, dx : dx + w]
    return out


def conv_stack(batch: np.ndarray, layers: int) -> np.ndarray:
    """``layers`` unpadded convolutions: a model that crops ``layers`` cells per side."""
    for _ in range(layers):
        batch = np.tanh(valid_conv(batch))
    return batch


def image(ny: int = 40, nx: int = 52, seed: int = 0) -> xr.DataArray:
    values = np.random.default_rng(seed).normal(size=(2, ny, nx))
    return xr.DataArray(
        values,
        dims=("band", "y", "x"),
        coords={"y": 100.0 - 2.0 * np.arange(ny), "x": 10.0 * np.arange(nx)},
    )


def padded(values: np.ndarray, halo: tuple[int, int], pad_mode: str) -> np.ndarray:
    width = [(0, 0), (halo[0], halo[0]), (halo[1], halo[1])]
    return np.pad(values, width, mode=pad_mode)


@settings(max_examples=30, deadline=None)
@given(
    ny=st.integers(14, 40),
    nx=st.integers(14, 40),
    chunk=st.integers(5, 20),
    size=st.integers(6, 14),
    step=st.integers(1, 14),
    layers=st.integers(1, 3),
    pad_mode=st.sampled_from(["reflect", "symmetric", "edge", "wrap", "constant"]),
    boundary=st.sampled_from(["shift", "pad"]),
    window=st.sampled_from(["boxcar", "hann"]),
)
def test_a_stack_of_unpadded_convolutions_equals_the_stack_on_the_whole_image(
    ny, nx, chunk, size, step, layers, pad_mode, boundary, window
):
    """The issue's case: numpy and dask, interior and edges, any chunks and stride."""
    da = image(ny, nx)
    stride = min(step, size)
    options = dict(y=size, x=size, stride=stride, halo=layers, boundary=boundary, window=window)
    if pad_mode != "constant":
        options["pad_mode"] = pad_mode
    else:  # numpy.pad's constant is 0; xpatch's default fill of floats is NaN
        options["pad_value"] = 0.0
    expected = conv_stack(padded(da.values, (layers, layers), pad_mode), layers)

    def model(batch):
        return conv_stack(batch, layers)

    eager = da.patch(**options).apply(model, dtype="float64", output_dims={"band": 2})
    lazy = da.chunk(y=chunk, x=chunk).patch(**options)
    with forbid_compute():
        result = lazy.apply(model, dtype="float64", output_dims={"band": 2})
    with dask.config.set(scheduler="synchronous"):
        computed = result.values
    # boundary="pad" covers every cell; "shift" too (the last patch moves back).
    np.testing.assert_allclose(eager.values, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(computed, expected, rtol=1e-12, atol=1e-12)


def test_a_model_that_keeps_the_grown_shape_is_cropped_by_xpatch():
    da = image()
    p = da.patch(y=16, x=16, stride=12, halo={"y": 2, "x": 3}, pad_mode="reflect")
    seen = []

    def same(batch):  # keeps the grown shape: xpatch crops the halo
        seen.append(batch.shape[-2:])
        return batch * 3

    out = p.apply(same, dtype="float64", output_dims={"band": 2})
    assert set(seen) == {(20, 22)}
    np.testing.assert_allclose(out.values, da.values * 3, rtol=1e-12)
    assert out.dims == da.dims and np.array_equal(out.x, da.x)


def test_patches_and_items_are_grown_with_labels_past_the_edges():
    da = image()
    p = da.patch(y=16, x=16, stride=12, halo={"y": 2, "x": 3}, pad_mode="edge")
    grown = padded(da.values, (2, 3), "edge")
    first = p[0]
    assert first.sizes == {"band": 2, "y": 20, "x": 22}
    np.testing.assert_array_equal(first.values, grown[:, :20, :22])
    np.testing.assert_array_equal(first.x.values, 10.0 * np.arange(-3, 19))
    np.testing.assert_array_equal(first.y.values, 100.0 - 2.0 * np.arange(-2, 18))
    stack = p.patches()
    anchors = p.anchors().values
    assert stack.sizes["patch"] == len(p) == len(anchors)
    for i in (0, len(p) - 1):
        y, x = anchors[i]
        np.testing.assert_array_equal(stack[i].values, grown[:, y : y + 20, x : x + 22])
    lazy = da.chunk(y=9, x=11).patch(y=16, x=16, stride=12, halo={"y": 2, "x": 3}, pad_mode="edge")
    with forbid_compute():
        lazy_stack = lazy.patches()
    np.testing.assert_array_equal(lazy_stack.values, stack.values)
    src = lazy.to_grain()
    item = src[len(src) - 1]
    y, x = item["anchor"].tolist()
    np.testing.assert_array_equal(item["data"], grown[:, y : y + 20, x : x + 22])
    # The halo is read, not kept: its cells weigh nothing.
    assert item["weights"][:2].sum() == 0 and item["weights"][:, :3].sum() == 0
    assert item["weights"][2:18, 3:19].min() > 0


@pytest.mark.parametrize("chunked", [False, True])
def test_reconstruct_takes_grown_or_inner_predictions(chunked):
    da = image()
    da = da.chunk(y=13, x=17) if chunked else da
    p = da.patch(y=16, x=16, stride=12, halo=2, pad_mode="reflect", window="hann")
    stack = p.patches()
    np.testing.assert_allclose(p.reconstruct(stack).values, image().values, rtol=1e-12)
    inner = stack.isel(y=slice(2, 18), x=slice(2, 18))
    np.testing.assert_allclose(p.reconstruct(inner * 2).values, 2 * image().values, rtol=1e-12)


def test_a_halo_with_a_scale_crops_the_scaled_halo():
    da = image(24, 24)
    p = da.patch(y=8, x=8, stride=8, halo=1, pad_mode="edge")

    def up(batch):  # twice the resolution, the grown patch kept: 2 halo cells per side
        return np.repeat(np.repeat(batch, 2, axis=-1), 2, axis=-2)

    out = p.apply(up, scale=2, dtype="float64", output_dims={"band": 2})
    expected = np.repeat(np.repeat(da.values, 2, axis=-1), 2, axis=-2)
    np.testing.assert_allclose(out.values, expected, rtol=1e-12)


@pytest.mark.parametrize("halo", [-1, "2", 1.5, {"t": 1}, {"x": True}])
def test_a_bad_halo_is_refused_naming_it(halo):
    with pytest.raises(xpatch.OptionError, match="halo="):
        image().patch(y=8, x=8, halo=halo)


def test_pad_mode_goes_with_a_halo_whatever_the_boundary_and_is_shown():
    p = image().patch(y=8, x=8, halo={"x": 2}, pad_mode="reflect")
    assert "halo={'y': 0, 'x': 2}" in repr(p.layout)
    assert p.layout.options().halo == {"y": 0, "x": 2}
    with pytest.raises(xpatch.OptionError, match="boundary='pad'"):
        image().patch(y=8, x=8, pad_mode="reflect")  # no halo: nothing to fill


def test_datasets_scenes_and_trees_read_the_halo_too():
    da = image(24, 28)
    ds = xr.Dataset({"v": da, "w": da.isel(band=0) + 1, "static": ("band", [1.0, 2.0])})
    p = ds.patch(y=8, x=8, halo={"x": 1}, pad_mode="reflect")
    first = p[0]
    assert first.sizes == {"band": 2, "y": 8, "x": 10}
    np.testing.assert_array_equal(
        first["w"].values, padded(da.values + 1, (0, 1), "reflect")[0, :8, :10]
    )
    np.testing.assert_array_equal(first["static"].values, [1.0, 2.0])
    scenes = xpatch.patch_scenes([da, da * 2], y=8, x=8, stride=6, halo=2, pad_mode="edge")
    out = scenes.apply(lambda b: conv_stack(b, 2), dtype="float64", output_dims={"band": 2})
    for name, factor in (("0", 1), ("1", 2)):
        expected = conv_stack(padded(da.values * factor, (2, 2), "edge"), 2)
        np.testing.assert_allclose(out[name].values, expected, rtol=1e-12)
    tree = xr.DataTree.from_dict({"/a": da.to_dataset(name="v")})
    grown = tree.patch(y=8, x=8, stride=6, halo=2, pad_mode="edge").to_grain()[0]["/a"]["v"]
    np.testing.assert_array_equal(grown, padded(da.values, (2, 2), "edge")[:, :12, :12])


@pytest.mark.parametrize("pad_mode", ["reflect", "symmetric", "wrap", "edge"])
def test_a_halo_wider_than_the_array_pads_dask_input_as_numpy_does(pad_mode):
    """dask.array.pad gets such widths wrong; the halo gathers numpy.pad's cells instead."""
    da = image(10, 12)
    options = dict(y=8, x=8, stride=6, halo=4, boundary="pad", pad_mode=pad_mode)
    eager = da.patch(**options).patches().values
    lazy = da.chunk(y=5, x=5).patch(**options).patches().values
    np.testing.assert_array_equal(lazy, eager)
    expected = padded(da.values, (4, 4), pad_mode)
    if pad_mode != "wrap":  # numpy pads the end of boundary="pad" past the halo alike
        np.testing.assert_array_equal(eager[0], expected[:, :16, :16])


def test_a_file_opened_without_dask_is_not_loaded_by_a_halo(tmp_path):
    da = image(32, 32)
    da.to_dataset(name="v").to_zarr(tmp_path / "s.zarr", consolidated=False)
    lazy = xr.open_zarr(tmp_path / "s.zarr", consolidated=False, chunks=None)["v"]
    p = lazy.patch(y=8, x=8, halo=2, pad_mode="reflect")
    assert not lazy.variable._in_memory  # the caller's object was not read
    np.testing.assert_array_equal(p[0].values, padded(da.values, (2, 2), "reflect")[:, :12, :12])


def test_grain_weights_are_zero_past_the_arrays_edge_with_a_halo():
    da = image(20, 20)
    src = da.patch(y=16, x=16, stride=12, boundary="pad", halo=1, pad_mode="edge").to_grain()
    for i in range(len(src)):
        item = src[i]
        y, x = item["anchor"].tolist()
        rows = np.arange(y - 1, y + 17)[:, None]
        cols = np.arange(x - 1, x + 17)[None, :]
        outside = (rows < 0) | (rows >= 20) | (cols < 0) | (cols >= 20)
        assert (item["weights"][outside] == 0).all()
        # The kept window's cells inside the array weigh (boxcar: 1), the halo's do not.
        kept = (rows >= y) & (rows < y + 16) & (cols >= x) & (cols < x + 16)
        assert (item["weights"][kept & ~outside] > 0).all()
        assert (item["weights"][~kept] == 0).all()


def test_a_raster_placed_by_its_geotransform_alone_moves_with_the_halo():
    da = xr.DataArray(np.zeros((16, 16)), dims=("y", "x"))
    da = da.assign_coords(spatial_ref=xr.Variable((), 0, {"GeoTransform": "100 10 0 500 0 -10"}))
    da.attrs["grid_mapping"] = "spatial_ref"
    first = da.patch(y=8, x=8, halo=2, pad_mode="edge")[0]
    assert first.spatial_ref.attrs["GeoTransform"].split()[:4] == ["80.0", "10.0", "0.0", "520.0"]


def test_reconstruct_crops_grown_predictions_at_a_scale():
    da = image(24, 24)
    p = da.patch(y=8, x=8, stride=8, halo=1, pad_mode="edge")
    grown = p.patches()
    up = xr.DataArray(np.repeat(np.repeat(grown.values, 2, axis=-1), 2, axis=-2), dims=grown.dims)
    assert up.sizes["y"] == 20  # (8 + 2 x 1) x 2
    out = p.reconstruct(up, scale=2)
    np.testing.assert_allclose(out.values, np.repeat(np.repeat(da.values, 2, -1), 2, -2))


def test_the_memory_budget_splits_the_chunks_of_a_halo_apply_and_keeps_its_values(tmp_path):
    da = image(96, 96).chunk(y=48, x=48)
    options = dict(y=16, x=16, stride=12, halo=1, pad_mode="reflect")
    p = da.patch(**options)

    def model(batch):
        return conv_stack(batch, 1)

    whole = p.apply(model, dtype="float64", output_dims={"band": 2}, task_memory="1GiB")
    with forbid_compute():
        small = p.apply(model, dtype="float64", output_dims={"band": 2}, task_memory="64KiB")
    assert whole.chunks[1:] == ((48, 48), (48, 48))
    assert max(small.chunks[1]) < 48 and max(small.chunks[2]) < 48
    expected = conv_stack(padded(image(96, 96).values, (1, 1), "reflect"), 1)
    assert xpatch.write(small, tmp_path / "small.zarr", progress=False) > 4
    stored = xr.open_zarr(tmp_path / "small.zarr")
    np.testing.assert_allclose(stored[next(iter(stored.data_vars))].values, expected, rtol=1e-12)
    np.testing.assert_allclose(whole.values, expected, rtol=1e-12)


def test_a_raster_with_irregular_labels_takes_a_halo_without_a_transform():
    y = np.r_[0:8, 10:18].astype(float)
    da = xr.DataArray(np.arange(256.0).reshape(16, 16), dims=("y", "x"), coords={"y": y})
    da = da.assign_coords(spatial_ref=xr.Variable((), 0, {"GeoTransform": "0 1 0 0 0 1"}))
    da.attrs["grid_mapping"] = "spatial_ref"
    first = da.patch(y=8, x=8, halo=1, pad_mode="edge")[0]
    assert first.shape == (10, 10) and first.y.values[:2].tolist() == [-1.0, 0.0]


def test_a_halo_longer_than_its_dim_is_refused_before_any_work():
    # Unguarded, a halo of 10**6 on 100 cells asked numpy for 43.7 TiB.
    da = xr.DataArray(np.zeros((3, 100, 100), dtype="float32"), dims=("b", "y", "x"))
    with pytest.raises(xpatch.GeometryError, match=r"halo\['y'\]=1000000 reaches past"):
        da.patch(y=10, x=10, halo=10**6)
    assert len(da.patch(y=10, x=10, halo=100)) == 100  # a halo of the whole dim is taken


@pytest.mark.parametrize("lazy", [False, True])
def test_grown_predictions_at_twice_the_resolution_are_read_as_such(lazy):
    # 2 x a grown patch of 12 is 24 cells, which is also 3 x the window of 8: a 2x model
    # of the grown patch came back at 3x, silently (shape (66, 78) for a 22 x 26 image).
    da = xr.DataArray(np.random.default_rng(3).random((22, 26)), dims=("y", "x"))
    da = da.chunk({"y": 7, "x": 9}) if lazy else da
    p = da.patch(y=8, x=8, stride=6, halo={"y": 2, "x": 2}, window="hann")
    up = p.patches().values.repeat(2, axis=1).repeat(2, axis=2)  # (n, 24, 24)
    out = p.reconstruct(xr.DataArray(up, dims=("patch", "y", "x")))
    assert out.shape == (44, 52)
    np.testing.assert_allclose(out.values, da.values.repeat(2, 0).repeat(2, 1), rtol=1e-12)


def test_a_shape_read_at_two_scales_is_the_grown_patchs_unless_scale_says_otherwise():
    # 24 cells: 3 x a grown 8 (halo 1 around 6) or 4 x the window of 6.
    da = xr.DataArray(np.arange(24.0)[:, None].repeat(6, 1), dims=("y", "x"))
    p = da.patch(y=6, x=6, halo={"y": 1})
    grown = p.patches().values.repeat(3, axis=1)  # a 3x model of the grown patch
    out = p.reconstruct(xr.DataArray(grown, dims=("patch", "y", "x")), scale={"y": 3, "x": 1})
    inferred = p.reconstruct(xr.DataArray(grown, dims=("patch", "y", "x")))
    np.testing.assert_array_equal(inferred.values, out.values)
    assert out.shape == (72, 6)
    cropped = grown[:, 3:-3]  # a 4x model of the window (18 cells): scale= says so
    window = np.concatenate([cropped, cropped[:, :6]], axis=1)  # 24 cells
    at_four = p.reconstruct(xr.DataArray(window, dims=("patch", "y", "x")), scale={"y": 4, "x": 1})
    assert at_four.shape == (96, 6)


def test_per_cell_weights_of_the_grown_patch_lose_the_halo_with_the_predictions():
    da = xr.DataArray(np.random.default_rng(4).random((22, 26)), dims=("y", "x"))
    p = da.patch(y=8, x=8, stride=6, halo=2)
    patches = p.patches()  # grown: (n, 12, 12)
    weights = xr.ones_like(patches)  # per cell, of the grown shape
    out = p.reconstruct(patches, weights=weights)
    np.testing.assert_allclose(out.values, da.values, rtol=1e-12)
