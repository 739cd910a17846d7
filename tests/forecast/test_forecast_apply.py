"""A forecast's apply and Grain source with the layout's options, against numpy references.

Each reference is written here with numpy alone: the valid times by position, the
patches as index windows, a whole-field model run on ``np.pad`` of the field.
"""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import xpatch
from xpatch import Forecast, OptionError, PredictionError

TIMES = pd.date_range("2021-01-01", periods=6, freq="6h")
N = 16  # the field is N x N; dask input is chunked by 5, unequal chunks


def field(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((len(TIMES), N, N))


def as_input(values: np.ndarray, lazy: bool) -> xr.DataArray:
    da = xr.DataArray(values, dims=("time", "y", "x"), coords={"time": TIMES})
    return da.chunk({"time": 5, "y": 5, "x": 5}) if lazy else da


def model(inputs: np.ndarray) -> np.ndarray:
    """A pointwise model of the last input: the blend of its patches is the model itself."""
    return 2 * inputs[:, -1:] + 1


def covered(starts: list[tuple[int, int]], size: int) -> np.ndarray:
    """The cells of an N x N field that the patches at ``starts`` cover."""
    mask = np.zeros((N, N), bool)
    for y, x in starts:
        mask[y : y + size, x : x + size] = True
    return mask


# -- 1. the layout's sampler and min_valid --------------------------------------------


@pytest.mark.parametrize("lazy", [False, True])
def test_apply_blends_only_the_patches_the_sampler_chose(lazy):
    values = field()
    fc = as_input(values, lazy).patch(
        time=Forecast(inputs=["0h"], targets=["6h"]),
        y=8,
        x=8,
        sampler=xpatch.Anchors({"y": [0, 4], "x": [0, 6]}),
    )
    assert len(fc) == 5 * 2  # origins 0..4, two patches each
    out = fc.apply(model, batch_size=3).compute()
    mask = covered([(0, 0), (4, 6)], 8)
    expected = np.where(mask, 2 * values[:5] + 1, np.nan)  # origin o's forecast at o + 1
    np.testing.assert_allclose(out.values, expected, rtol=1e-12)
    assert list(out.time.values) == list(TIMES[1:].to_numpy())


@pytest.mark.parametrize("lazy", [False, True])
def test_apply_leaves_out_the_patches_min_valid_dropped(lazy):
    values = field()
    values[:, 8:, 8:14] = np.nan  # patch (8, 8) keeps 16 of its 64 cells: 1/4 valid
    fc = as_input(values, lazy).patch(
        time=Forecast(inputs=["0h"], targets=["6h"]), y=8, x=8, min_valid=0.5
    )
    starts = [(y, x) for y in (0, 8) for x in (0, 8)]
    kept = [(y, x) for y, x in starts if np.isfinite(values[:, y : y + 8, x : x + 8]).mean() >= 0.5]
    assert len(kept) == 3 and len(fc) == 5 * 3
    out = fc.apply(lambda inputs: np.nan_to_num(inputs) + 1).compute()
    expected = np.where(covered(kept, 8), np.nan_to_num(values[:5]) + 1, np.nan)
    expected[np.isnan(values[:5])] = np.nan  # an input cell without data has none out
    np.testing.assert_allclose(out.values, expected, rtol=1e-12)
    assert np.isfinite(out.values[:, 8:, 14:]).sum() == 0  # valid inputs, but no patch


# -- 2. a Dataset with a static field, a model of fewer variables than it reads -------


def archive(lazy: bool) -> tuple[xr.Dataset, dict[str, np.ndarray]]:
    raw = {"t2m": field(1), "z500": field(2), "oro": np.random.default_rng(3).random((N, N))}
    ds = xr.Dataset(
        {
            "t2m": (("time", "y", "x"), raw["t2m"]),
            "z500": (("time", "y", "x"), raw["z500"].astype("float32")),
            "oro": (("y", "x"), raw["oro"]),
        },
        coords={"time": TIMES, "y": np.arange(N) * 0.5, "x": np.arange(N) * 2.0},
    )
    return (ds.chunk({"time": 5, "y": 5, "x": 5}) if lazy else ds), raw


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("declared", [True, False])
def test_a_dataset_model_reads_every_input_and_returns_one_variable(lazy, declared):
    ds, raw = archive(lazy)
    seen = {}

    def t2m_model(inputs: dict) -> dict:
        seen.update({k: (v.shape, v.dtype) for k, v in inputs.items()})
        return {"t2m": inputs["t2m"][:, -1:] + 0.1 * inputs["z500"][:, :1] + inputs["oro"][:, None]}

    if declared:  # the Forecast's default targets (t2m, z500); output_dims picks t2m
        fc = ds.patch(time=Forecast(inputs=["-6h", "0h"], targets=["6h"]), y=8, x=8, stride=4)
        out = fc.apply(t2m_model, batch_size=4, output_dims={"t2m": None})
    else:  # the targets of the Forecast the model was trained on
        forecast = Forecast(inputs=["-6h", "0h"], targets=["6h"], target_variables=["t2m"])
        out = ds.patch(time=forecast, y=8, x=8, stride=4).apply(t2m_model, batch_size=4)
    assert isinstance(out, xr.Dataset) and list(out.data_vars) == ["t2m"]
    out = out.compute()
    assert seen["oro"][0][1:] == (8, 8) and seen["t2m"][0][1:] == (2, 8, 8)
    assert seen["z500"][1] == np.float32  # each variable in its own dtype
    origins = np.arange(1, 5)  # -6h and 6h must exist
    z500 = raw["z500"].astype("float32")  # times 0.1 in float32, as the model sees it
    expected = raw["t2m"][origins] + 0.1 * z500[origins - 1] + raw["oro"]
    np.testing.assert_allclose(out["t2m"].values, expected, rtol=1e-12)
    assert out["t2m"].dims == ("time", "y", "x")
    assert list(out.time.values) == list(TIMES[origins + 1].to_numpy())
    np.testing.assert_array_equal(out.x.values, np.arange(N) * 2.0)


def test_a_dataset_rollout_and_its_refusals():
    ds, raw = archive(False)
    fc = ds.patch(time=Forecast(inputs=["0h"], targets=["6h", "12h"]), y=8, x=8)
    out = fc.apply(
        lambda x: {"t2m": x["t2m"] + np.arange(2)[None, :, None, None]},
        output_dims={"t2m": None},
    )
    assert out["t2m"].dims == ("time", "lead", "y", "x") and "valid_time" in out.coords
    np.testing.assert_allclose(out["t2m"].isel(lead=1).values, raw["t2m"][:4] + 1)
    with pytest.raises(PredictionError, match="return a dict"):
        fc.apply(lambda x: x["t2m"], output_dims={"t2m": None})
    with pytest.raises(OptionError, match="oro"):
        fc.apply(lambda x: {"oro": x["oro"]}, output_dims={"oro": None})
    with pytest.raises(OptionError, match="key output_dims by its outputs"):
        fc.apply(lambda x: x, output_dims={})


# -- 3. a halo, and a model that crops it -------------------------------------------------


def valid_box(batch: np.ndarray) -> np.ndarray:
    """A 3 x 3 box sum without padding: one cell less on each side."""
    h, w = batch.shape[-2] - 2, batch.shape[-1] - 2
    return sum(batch[..., i : i + h, j : j + w] for i in range(3) for j in range(3))


@pytest.mark.parametrize("lazy", [False, True])
def test_a_model_that_crops_the_halo_equals_the_whole_field_padded(lazy):
    values = field()
    fc = as_input(values, lazy).patch(
        time=Forecast(inputs=["0h"], targets=["6h"]),
        y=8,
        x=8,
        halo=2,
        pad_mode="reflect",
    )
    shapes = []

    def cropping(inputs):
        shapes.append(inputs.shape[1:])
        return valid_box(np.tanh(valid_box(inputs)))  # crops 2 cells on each side

    out = fc.apply(cropping).compute()
    assert (1, 12, 12) in shapes
    padded = np.pad(values[:5], [(0, 0), (2, 2), (2, 2)], mode="reflect")
    np.testing.assert_allclose(out.values, valid_box(np.tanh(valid_box(padded))), rtol=1e-12)
    with pytest.raises(PredictionError, match=r"or the inner \(\d+, 1, 8, 8\)"):
        fc.apply(lambda inputs: inputs[..., 1:-1, 1:-1])


# -- 4. a whole-field forecast of a Dataset with a static field, through Grain ---------


@pytest.mark.parametrize("lazy", [False, True])
def test_the_grain_source_serves_a_static_field_once_per_sample(lazy):
    ds, raw = archive(lazy)
    fc = ds.patch(time=Forecast(inputs=["-6h", "0h"], targets=["6h"]))
    src = pickle.loads(pickle.dumps(fc.to_grain()))
    assert len(src) == 4
    for i in range(len(src)):
        item = src[i]
        o = i + 1  # the origins 1..4
        assert set(item["inputs"]) == {"t2m", "z500", "oro"}
        np.testing.assert_array_equal(item["inputs"]["oro"], raw["oro"])
        np.testing.assert_array_equal(item["inputs"]["t2m"], raw["t2m"][[o - 1, o]])
        np.testing.assert_array_equal(item["targets"]["t2m"], raw["t2m"][[o + 1]])
        assert set(item["targets"]) == {"t2m", "z500"}
    item["inputs"]["oro"][:] = 0  # each sample has its own copy
    np.testing.assert_array_equal(src[0]["inputs"]["oro"], raw["oro"])


# -- whole-field references, numpy and dask with unequal chunks -------------------------


@pytest.mark.parametrize("lazy", [False, True])
def test_a_whole_field_dataset_forecast_with_a_static_field_equals_the_numpy_model(lazy):
    ds, raw = archive(lazy)
    forecast = Forecast(
        inputs=["-6h", "0h"],
        targets=["6h"],
        input_variables=["t2m", "oro"],
        target_variables=["t2m"],
    )
    out = ds.patch(time=forecast).apply(lambda x: {"t2m": x["t2m"][:, -1:] * x["oro"][:, None]})
    np.testing.assert_array_equal(out["t2m"].values, raw["t2m"][1:5] * raw["oro"])


@pytest.mark.parametrize("lazy", [False, True])
def test_a_rollout_through_overlapping_windowed_patches_equals_the_whole_field(lazy):
    values = field()
    leads = pd.timedelta_range("6h", "12h", freq="6h")
    forecast = Forecast(inputs=["-6h", "0h"], targets=leads)

    def rollout(inputs):  # lead k: the mean of the inputs times k + 1
        return inputs.mean(axis=1, keepdims=True) * np.array([1.0, 2.0])[None, :, None, None]

    fc = as_input(values, lazy).patch(time=forecast, y=8, x=8, stride=6, window="hann")
    out = fc.apply(rollout, batch_size=7).compute()
    origins = np.arange(1, 4)  # -6h and +12h must exist
    mean = (values[origins - 1] + values[origins]) / 2
    expected = np.stack([mean, 2 * mean], axis=1)
    assert out.dims == ("time", "lead", "y", "x")
    np.testing.assert_allclose(out.values, expected, rtol=1e-12)
    whole = as_input(values, lazy).patch(time=forecast).apply(rollout)
    np.testing.assert_allclose(whole.values, expected, rtol=1e-12)


@pytest.mark.parametrize("lazy", [False, True])
def test_each_variable_keeps_its_own_dim_order_and_the_dims_it_has_as_in_training(lazy):
    rng = np.random.default_rng(4)
    a, co2, mask = rng.random((4, 6, 5)), np.arange(4.0), np.arange(30, dtype="int16")
    ds = xr.Dataset(
        {
            "a": (("time", "x", "y"), a),  # x before y, unlike the sizes below
            "co2": (("time",), co2),  # none of the patched dims
            "mask": (("x", "y"), mask.reshape(6, 5)),  # static, integer
        },
        coords={"time": TIMES[:4]},
    )
    ds = ds.chunk({"x": 4, "y": 2}) if lazy else ds
    fc = ds.patch(time=Forecast(inputs=["0h"], targets=["6h"]), y=3, x=2, halo=1, pad_mode="edge")
    item = fc.to_grain()[0]["inputs"]
    seen = {}

    def model(x):
        seen.update({k: (v.shape[1:], v.dtype) for k, v in x.items()})
        inner = x["a"][..., 1:-1, 1:-1] + x["mask"][:, None, 1:-1, 1:-1]  # crops the halo
        return {"a": inner + x["co2"][:, :, None, None]}

    out = fc.apply(model, output_dims={"a": None}).compute()
    assert seen["a"][0] == item["a"].shape and seen["mask"][0] == item["mask"].shape == (4, 5)
    assert seen["co2"] == ((1,), np.float64) and seen["mask"][1] == np.int16
    assert out["a"].dims == ("time", "x", "y")
    expected = a[:3] + mask.reshape(6, 5) + co2[:3, None, None]
    np.testing.assert_array_equal(out["a"].values, expected)


@pytest.mark.parametrize("chunks", [(10, 7, 20), 8])
def test_a_forecast_result_keeps_the_inputs_name_whatever_its_chunks(chunks):
    times = pd.date_range("2021-01-01", periods=37, freq="6h")
    values = np.random.default_rng(0).random((37, 8, 8))
    da = xr.DataArray(values, dims=("time", "y", "x"), coords={"time": times}, name="t2m")
    fc = da.chunk({"time": chunks}).patch(
        time=xpatch.Forecast(inputs=["-6h", "0h"], targets=["6h"]), y=4, x=4
    )
    out = fc.apply(lambda b: b[:, -1:])
    assert out.name == "t2m"
    np.testing.assert_allclose(out.values, values[1:-1])
