"""Periodic dims: patches across a global grid's seam, blended back exactly."""

from __future__ import annotations

import warnings

import dask
import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

import xpatch
from xpatch import DimensionError, GeometryError, OptionError

LON = np.arange(64) * 5.625  # 0 ... 354.375
LAT = np.linspace(87.2, -87.2, 24)


def global_field(seed: int = 0) -> xr.DataArray:
    values = np.random.default_rng(seed).normal(size=(2, 24, 64)).astype("float64")
    return xr.DataArray(
        values, dims=("level", "lat", "lon"), coords={"lat": LAT, "lon": LON}, name="t"
    )


def circular_reference(values: np.ndarray) -> np.ndarray:
    """A 3x3 box sum: lat edges reflected (numpy's 'reflect'), lon wrapped."""
    padded = np.pad(values, [(0, 0), (1, 1), (0, 0)], mode="reflect")
    padded = np.pad(padded, [(0, 0), (0, 0), (1, 1)], mode="wrap")
    return box3(padded)


def box3(grown: np.ndarray) -> np.ndarray:
    """Sum of each cell's 3x3 neighbourhood over the last two axes, valid cells only."""
    rows, cols = grown.shape[-2] - 2, grown.shape[-1] - 2
    return sum(grown[..., i : i + rows, j : j + cols] for i in range(3) for j in range(3))


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("window", ["boxcar", "hann"])
def test_a_global_field_round_trips_exactly_with_patches_across_the_seam(lazy, window):
    field = global_field()
    obj = field.chunk({"lon": 16, "lat": 12}) if lazy else field
    p = obj.patch(
        lat=12, lon=16, stride={"lat": 12, "lon": 12}, window=window, boundary={"lon": "periodic"}
    )
    lon_starts = sorted(set(p.anchors().sel(dim="lon").values.tolist()))
    assert lon_starts == list(range(0, 64, 12))  # 60: the last patch runs across the seam
    out = p.reconstruct(p.patches())
    xr.testing.assert_allclose(out.compute(), field, rtol=1e-12)
    assert list(out.lon.values) == list(LON)


def test_a_patch_across_the_seam_has_continuous_labels_and_the_wrapped_values():
    field = global_field()
    p = field.patch(lat=24, lon=16, stride=12, boundary={"lon": "periodic"})
    last = p[len(p) - 1]
    np.testing.assert_allclose(last.lon.values, 60 * 5.625 + np.arange(16) * 5.625)
    assert last.lon.values[4] == 360.0
    np.testing.assert_array_equal(last.values, np.roll(field.values, -60, axis=-1)[..., :16])


def test_a_circular_convolution_through_apply_equals_the_whole_field_one():
    field = global_field(1)
    expected = circular_reference(field.values)
    results = []
    for obj in (field, field.chunk({"lat": 12, "lon": 32})):
        p = obj.patch(
            lat=8,
            lon=16,
            stride=6,
            halo=1,
            window="hann",
            boundary={"lon": "periodic", "lat": "shift"},
            pad_mode="reflect",
        )
        out = p.apply(box3)  # a model that crops: grown patch in, window out
        np.testing.assert_allclose(out.values, expected, rtol=1e-10, atol=1e-12)
        results.append(out.values)
    np.testing.assert_allclose(results[0], results[1], rtol=1e-12)
    seam = np.abs(results[0][..., [0, -1]] - expected[..., [0, -1]]).max()
    assert seam < 1e-10


def test_building_on_lazy_input_computes_nothing():
    computed = []

    class Count(dask.callbacks.Callback):
        def _start(self, dsk):
            computed.append(len(dsk))

    lazy = global_field().chunk({"lon": 16})
    with Count():
        p = lazy.patch(lat=12, lon=16, stride=12, boundary={"lon": "periodic"})
        out = p.apply(lambda batch: batch + 1)
        again = p.reconstruct(p.patches())
    assert computed == []
    xr.testing.assert_allclose(out.compute(), global_field() + 1)
    xr.testing.assert_allclose(again.compute(), global_field())


def test_extremes_and_sums_fold_and_nan_results_are_left_out():
    field = global_field()
    p = field.patch(lat=24, lon=16, stride=12, boundary={"lon": "periodic"})
    xr.testing.assert_allclose(p.reconstruct(p.patches(), "max"), field)
    xr.testing.assert_allclose(p.reconstruct(p.patches(), "min"), field)
    ones = xr.ones_like(p.patches())
    counts = p.reconstruct(ones, "sum")
    starts = np.arange(0, 64, 12)
    cover = np.zeros(64)
    for start in starts:
        cover[(start + np.arange(16)) % 64] += 1
    np.testing.assert_array_equal(counts.isel(level=0, lat=0).values, cover)
    pred = p.patches().copy()
    pred[-1] = np.nan  # the patch across the seam gives nothing
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = p.reconstruct(pred)
    xr.testing.assert_allclose(out, field)  # other patches cover its cells


@settings(max_examples=25, deadline=None)
@given(
    extent=st.integers(5, 40),
    size=st.integers(1, 12),
    stride=st.integers(1, 12),
    lazy=st.booleans(),
)
def test_any_periodic_line_round_trips(extent, size, stride, lazy):
    size = min(size, extent)
    stride = min(stride, size)  # every cell covered
    line = xr.DataArray(np.random.default_rng(extent).random(extent), dims="x")
    obj = line.chunk(7) if lazy else line
    p = obj.patch(x=size, stride=stride, boundary="periodic", window="hann")
    xr.testing.assert_allclose(p.reconstruct(p.patches()).compute(), line, rtol=1e-12)
    doubled = p.apply(lambda batch: 2 * batch).compute()
    xr.testing.assert_allclose(doubled, 2 * line, rtol=1e-12)


def test_a_grain_source_serves_the_patches_across_the_seam():
    pytest.importorskip("grain")
    field = global_field()
    p = field.patch(lat=24, lon=16, stride=12, boundary={"lon": "periodic"})
    src = p.to_grain(weights=False)
    assert len(src) == len(p)
    np.testing.assert_array_equal(src[len(p) - 1]["data"], p[len(p) - 1].values)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"lon": 80, "boundary": {"lon": "periodic"}}, GeometryError, "larger than the periodic"),
        ({"lon": 8, "boundary": {"x": "periodic"}}, DimensionError, "not patched"),
        (
            {"lat": 8, "lon": 8, "boundary": {"lon": "periodic", "lat": "nope"}},
            OptionError,
            "not a boundary mode",
        ),
    ],
)
def test_bad_periodic_layouts_are_refused_naming_the_argument(options, error, match):
    with pytest.raises(error, match=match):
        global_field().patch(**options)


def test_votes_and_casts_take_the_seam_as_any_other_cell():
    field = global_field()
    p = field.patch(lon=16, stride=12, boundary={"lon": "periodic"})
    labels = (field > 0).astype("uint8")
    q = labels.patch(lon=16, stride=12, boundary={"lon": "periodic"})
    np.testing.assert_array_equal(q.reconstruct(q.patches(), "vote").values, labels.values)
    cast = p.apply(lambda b: b, out_dtype="float32")
    assert cast.dtype == np.float32
    np.testing.assert_allclose(cast.values, field.values.astype("float32"))


@pytest.mark.parametrize("lazy", [False, True])
def test_results_that_differ_per_patch_blend_with_the_weights_of_every_patch_across_the_seam(
    lazy,
):
    # Each patch predicts its own number: a cell's mean is Σ w_k k / Σ w_k over the
    # patches that cover it, wherever they start, computed here cell by cell.
    line = xr.DataArray(np.zeros(30), dims="x")
    obj = line.chunk(8) if lazy else line
    p = obj.patch(x=9, stride=4, boundary="periodic", window="hann")
    starts = p.anchors().values[:, 0]
    pred = p.patches().copy(data=np.repeat(np.arange(len(p), dtype=float)[:, None], 9, axis=1))
    window = line.patch(x=9, window="hann").weights().values  # the window of one patch
    total, weight = np.zeros(30), np.zeros(30)
    for k, start in enumerate(starts):
        cells = (start + np.arange(9)) % 30
        np.add.at(total, cells, window * k)
        np.add.at(weight, cells, window)
    expected = total / weight
    np.testing.assert_allclose(p.reconstruct(pred).values, expected, rtol=1e-12)
    np.testing.assert_allclose(p.reconstruct(pred, "sum").values, total, rtol=1e-12)
    maxima = np.full(30, -np.inf)
    for k, start in enumerate(starts):
        cells = (start + np.arange(9)) % 30
        maxima[cells] = np.maximum(maxima[cells], k)
    np.testing.assert_array_equal(p.reconstruct(pred, "max").values, maxima)


def test_the_functional_spelling_lays_the_same_periodic_patches_as_the_accessor():
    field = global_field()
    given = xpatch.patch(field, lon=8, stride=6, boundary={"lon": "periodic"})
    accessor = field.patch(lon=8, stride=6, boundary={"lon": "periodic"})
    np.testing.assert_array_equal(given.anchors().values, accessor.anchors().values)
    xr.testing.assert_allclose(given.reconstruct(given.patches()), field)


def test_a_dataset_round_trips_across_the_seam():
    field = global_field()
    data = xr.Dataset({"t": field, "mask": field.isel(level=0) > 0})
    p = data.patch(lat=12, lon=16, stride=12, boundary={"lon": "periodic"})
    out = p.reconstruct(p.patches())
    xr.testing.assert_allclose(out["t"], field)
    np.testing.assert_array_equal(out["mask"].values, (field.isel(level=0) > 0).values)


def test_the_bounds_of_a_patch_across_the_seam_go_on_past_the_last_label():
    field = global_field().rename(lat="y", lon="x")
    p = field.patch(y=24, x=16, stride=12, boundary={"x": "periodic"})
    left, _, right, _ = p.bounds().values[len(p) - 1]
    step = 5.625
    assert left == pytest.approx(60 * step - step / 2)
    assert right == pytest.approx((60 + 16) * step - step / 2)  # past 360
    assert right > 360


def test_a_boundary_per_dim_gives_each_dim_its_own_mode():
    field = global_field()
    mapped = field.patch(lat=12, lon=24, stride=12, boundary={"lat": "pad", "lon": "pad"})
    assert mapped.boundary == "pad"
    assert len(mapped) == len(field.patch(lat=12, lon=24, stride=12, boundary="pad"))
    mixed = field.patch(lat=12, lon=24, stride=12, boundary={"lat": "pad"})  # lon: shift
    lat_starts = [0, 12]  # pad: 24 cells
    lon_starts = [0, 12, 24, 36, 40]  # shift: the last one flush with the end
    expected = [[a, b] for a in lat_starts for b in lon_starts]
    assert mixed.anchors().values.tolist() == expected
    out = mixed.reconstruct(mixed.patches())
    xr.testing.assert_allclose(out, field)


def test_a_stride_past_the_size_warns_of_the_cells_no_patch_covers():
    line = xr.DataArray(np.arange(12.0), dims="x")
    with pytest.warns(xpatch.UncoveredCellsWarning, match="4 of 12 cells"):
        p = line.patch(x=2, stride=3, boundary="periodic")
    assert int(p.reconstruct(p.patches()).isnull().sum()) == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        line.patch(x=3, stride=3, boundary="periodic")


def test_a_dim_left_out_of_the_boundary_takes_shift_not_another_dims_mode():
    field = global_field()
    p = field.patch(level=1, lat=8, lon=8, boundary={"lon": "periodic", "lat": "pad"})
    assert p.boundary == {"level": "shift", "lat": "pad", "lon": "periodic"}
    p = field.patch(level=1, lat=8, lon=8, boundary={"lon": "periodic", "lat": "shift"})
    assert p.boundary == {"level": "shift", "lat": "shift", "lon": "periodic"}
