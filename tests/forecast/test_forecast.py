"""Forecast samples: origins with every label, inputs and targets equal to direct selections."""

from __future__ import annotations

import pickle

import dask
import numpy as np
import pandas as pd
import pytest
import xarray as xr

import xpatch
from xpatch import DimensionError, Forecast, OptionError

grain = pytest.importorskip("grain")

HOUR = pd.Timedelta("1h")


def era5_like(tmp_path=None) -> xr.Dataset:
    """6-hourly fields with a gap, lat descending, lon from 0 east, a static field."""
    times = pd.date_range("2021-01-01", periods=40, freq="6h")
    times = times.delete([17, 18, 19])  # a gap of 18 hours
    lat = np.linspace(87.5, -87.5, 32)
    lon = np.arange(64) * 5.625  # 0 ... 354.375
    rng = np.random.default_rng(0)
    shape = (len(times), len(lat), len(lon))
    data = xr.Dataset(
        {
            "t2m": (("time", "lat", "lon"), rng.normal(280, 10, shape).astype("float32")),
            "z500": (("time", "lat", "lon"), rng.normal(5500, 50, shape).astype("float32")),
            "orography": (("lat", "lon"), rng.normal(0, 500, shape[1:]).astype("float32")),
        },
        coords={"time": times, "lat": lat, "lon": lon},
    )
    if tmp_path is None:
        return data
    encoding = {v: {"chunks": (8, 16, 32)} for v in ("t2m", "z500")}
    encoding["orography"] = {"chunks": (16, 32)}
    data.to_zarr(tmp_path / "era5.zarr", encoding=encoding, consolidated=False, zarr_format=3)
    return xr.open_zarr(tmp_path / "era5.zarr", consolidated=False)


def check_shuffled_epoch(src, expected, threads: int) -> list[int]:
    """Check a chunk-shuffled epoch of ``src`` against ``expected``'s samples; the order seen."""
    dataset = grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=3)
    seen = []
    for item in dataset.to_iter_dataset(grain.ReadOptions(num_threads=threads)):
        i = int(item["index"])
        seen.append(i)
        sample = expected[i]
        for name, values in item["inputs"].items():
            np.testing.assert_array_equal(values, sample["inputs"][name].values)
        np.testing.assert_array_equal(item["targets"]["z500"], sample["targets"]["z500"].values)
    return seen


def valid_origins(times: pd.DatetimeIndex, offsets) -> list[pd.Timestamp]:
    present = set(times)
    return [t for t in times if all(t + pd.Timedelta(o) in present for o in offsets)]


HISTORY, LEAD = ["-6h", "0h"], ["6h"]


def test_the_origins_are_exactly_those_with_every_label_and_the_skipped_are_counted_by_offset():
    data = era5_like()
    fc = data.patch(time=Forecast(inputs=HISTORY, targets=LEAD), lat=16, lon=16, stride=16)
    times = data.indexes["time"]
    expected = valid_origins(times, HISTORY + LEAD)
    assert len(expected) == 37 - 2 - 2  # the ends and both sides of the gap
    assert list(pd.DatetimeIndex(fc.origins.values)) == expected
    assert len(fc) == len(expected) * 8  # 2 x 4 spatial patches
    present = set(times)
    assert fc.skipped.count == len(times) - len(expected)
    for offset in HISTORY + LEAD:
        lacking = sum(t + pd.Timedelta(offset) not in present for t in times)
        assert fc.skipped.missing[offset] == lacking
    assert "origins skipped" in str(fc.skipped) and "lack -6h" in str(fc.skipped)


def test_every_sample_equals_direct_selections_by_label_static_fields_in_the_inputs():
    data = era5_like()
    fc = data.patch(time=Forecast(inputs=HISTORY, targets=LEAD), lat=16, lon=32, stride=16)
    anchors = fc.patcher.anchors().values
    for i in range(len(fc)):
        sample = fc[i]
        origin = pd.Timestamp(sample["origin"])
        _, y, x = anchors[i]
        box = {"lat": slice(y, y + 16), "lon": slice(x, x + 32)}
        history = [origin + pd.Timedelta(o) for o in HISTORY]
        lead = [origin + pd.Timedelta(o) for o in LEAD]
        xr.testing.assert_identical(sample["inputs"], data.sel(time=history).isel(box))
        targets = data[["t2m", "z500"]].sel(time=lead).isel(box)
        xr.testing.assert_identical(sample["targets"], targets)


def test_the_grain_source_serves_the_same_samples_as_numpy_arrays():
    data = era5_like()
    forecast = Forecast(inputs=HISTORY, targets=LEAD, target_variables=["t2m"])
    fc = data.patch(time=forecast, lat=16, lon=32, stride=16)
    src = fc.to_grain()
    assert len(src) == len(fc)
    for i in [0, 5, len(fc) - 1]:
        item, sample = src[i], fc[i]
        assert item["origin"] == sample["origin"]
        assert set(item["inputs"]) == {"t2m", "z500", "orography"}
        assert set(item["targets"]) == {"t2m"}
        for name, values in item["inputs"].items():
            np.testing.assert_array_equal(values, sample["inputs"][name].values)
        np.testing.assert_array_equal(item["targets"]["t2m"], sample["targets"]["t2m"].values)
        assert item["targets"]["t2m"].shape == (1, 16, 32)


def test_a_chunk_shuffled_epoch_from_a_zarr_serves_every_sample_once_reading_each_chunk_once(
    tmp_path,
):
    data = era5_like()
    lazy = era5_like(tmp_path)
    fc = lazy.patch(time=Forecast(inputs=HISTORY, targets=LEAD), lat=16, lon=32, stride=16)
    src = fc.to_grain()
    expected = data.patch(time=Forecast(inputs=HISTORY, targets=LEAD), lat=16, lon=32, stride=16)
    seen = check_shuffled_epoch(src, expected, threads=2)
    assert sorted(seen) == list(range(len(src)))
    assert seen != sorted(seen)
    assert src.cache_stats().loads == src.chunk_count


def test_a_restored_iterator_into_a_fresh_source_continues_exactly(tmp_path):
    lazy = era5_like(tmp_path)
    fc = lazy.patch(time=Forecast(inputs=HISTORY, targets=LEAD), lat=16, lon=32, stride=16)
    src = fc.to_grain()

    def pipeline(source):
        return (
            grain.MapDataset.source(source)
            .pipe(source.chunk_shuffle, seed=5)
            .batch(4)
            .to_iter_dataset()
            .pipe(source.with_fingerprint)
        )

    iterator = iter(pipeline(src))
    for _ in range(7):
        next(iterator)
    state = iterator.get_state()
    rest = [(b["index"].tolist(), b["origin"].tolist()) for b in iterator]
    fresh = pickle.loads(pickle.dumps(src))
    restored = iter(pipeline(fresh))
    restored.set_state(state)
    assert [(b["index"].tolist(), b["origin"].tolist()) for b in restored] == rest
    other = lazy.patch(time=Forecast(inputs=["-12h", "0h"], targets=LEAD), lat=16, lon=32)
    with pytest.raises(OptionError):
        iter(pipeline(other.to_grain())).set_state(state)


def test_samples_of_lazy_input_stay_lazy(tmp_path):
    lazy = era5_like(tmp_path)
    computed = []

    class Count(dask.callbacks.Callback):
        def _start(self, dsk):
            computed.append(len(dsk))

    with Count():
        fc = lazy.patch(time=Forecast(inputs=HISTORY, targets=LEAD), lat=16, lon=16)
        sample = fc[3]
        assert sample["inputs"]["t2m"].chunks is not None
    assert computed == []


def test_a_rollout_of_leads_and_a_whole_field_without_spatial_patches():
    data = era5_like()
    leads = pd.timedelta_range("6h", "24h", freq="6h")
    fc = data["t2m"].patch(time=Forecast(inputs=["0h"], targets=leads))
    times = data.indexes["time"]
    assert len(fc) == len(valid_origins(times, ["0h", *leads]))
    sample = fc[2]
    origin = pd.Timestamp(sample["origin"])
    xr.testing.assert_identical(sample["targets"], data["t2m"].sel(time=origin + leads))
    item = fc.to_grain()[2]
    assert item["targets"].shape == (4, 32, 64)


def test_non_contiguous_offsets_across_a_gap_and_origins_chosen_by_label():
    data = era5_like()
    times = data.indexes["time"]
    chosen = slice("2021-01-03", "2021-01-08")
    fc = data["z500"].patch(time=Forecast(inputs=["-12h", "0h"], targets=["12h"], origins=chosen))
    candidates = times[times.slice_indexer(chosen.start, chosen.stop)]
    expected = [t for t in valid_origins(times, ["-12h", "0h", "12h"]) if t in candidates]
    assert list(pd.DatetimeIndex(fc.origins.values)) == expected
    assert fc.skipped.candidates == len(candidates)
    for i in range(len(fc)):
        origin = pd.Timestamp(fc[i]["origin"])
        np.testing.assert_array_equal(
            fc[i]["inputs"].values, data["z500"].sel(time=[origin - 12 * HOUR, origin]).values
        )


def test_steps_along_a_dim_without_datetimes():
    da = xr.DataArray(np.arange(10.0 * 4).reshape(10, 4), dims=("step", "x"))
    fc = da.patch(step=Forecast(inputs=[-1, 0], targets=[2]), x=2)
    assert len(fc) == 7 * 2
    sample = fc[1]
    assert sample["origin"] == 1
    np.testing.assert_array_equal(sample["inputs"].values, da.values[[0, 1], 2:4])
    np.testing.assert_array_equal(sample["targets"].values, da.values[[3], 2:4])


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda d: d.patch(time=Forecast(inputs=[-1], targets=[1])), OptionError, "steps"),
        (lambda d: d.patch(time=Forecast(["-5h"], ["6h"])), OptionError, "no origin"),
        (lambda d: d.patch(time=Forecast(inputs=["x"], targets=["6h"])), OptionError, "timedeltas"),
        (lambda d: d.patch(time=Forecast(inputs=[], targets=["6h"])), OptionError, "at least one"),
        (
            lambda d: d.patch(time=Forecast(["0h"], ["6h"]), lat=8, stride={"time": 2}),
            OptionError,
            "stride",
        ),
        (
            lambda d: d.patch(time=Forecast(["0h"], ["6h"], target_variables=["orography"])),
            OptionError,
            "no 'time' dim",
        ),
        (
            lambda d: d.patch(time=Forecast(["0h"], ["6h"], input_variables=["rain"])),
            OptionError,
            "rain",
        ),
        (lambda d: d.patch(level=Forecast(["0h"], ["6h"])), DimensionError, "level"),
        (lambda d: d.patch(8, time=Forecast(["0h"], ["6h"])), OptionError, "given twice"),
        (
            lambda d: d.patch({"lat": 8}, time=Forecast(["0h"], ["6h"])),
            OptionError,
            "given twice",
        ),
        (
            lambda d: d.patch(time=Forecast(["0h"], ["6h"]), lat=8, halo={"time": 1}),
            OptionError,
            "halo",
        ),
        (
            lambda d: d.patch(time=Forecast(["0h"], ["6h"]), lat=Forecast(["0h"], ["6h"])),
            OptionError,
            "one dim",
        ),
        (
            lambda d: d.patch(time=Forecast(["0h"], ["6h"], origins=["1999-01-01"])),
            OptionError,
            "does not have",
        ),
    ],
)
def test_bad_forecasts_are_refused_naming_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call(era5_like())


def test_the_forecast_is_exported_and_the_repr_says_what_it_serves():
    data = era5_like()
    in_size = data.patch({"time": Forecast(HISTORY, LEAD), "lat": 16})
    assert len(in_size) == 33 * 2
    fc = data.patch(time=xpatch.Forecast(inputs=HISTORY, targets=LEAD), lat=32, lon=64)
    assert "33 origins" in repr(fc) and "1 spatial patches" in repr(fc)
    assert "ForecastSource" in repr(fc.to_grain())


# -- forecast inference to the grid ------------------------------------------------------


def persistence(inputs: np.ndarray) -> np.ndarray:
    """The last input time, as the forecast of every target."""
    return inputs[:, -1:]


@pytest.mark.parametrize("lazy", [False, True])
def test_persistence_puts_each_output_at_origin_plus_lead_equal_to_the_shifted_input(lazy):
    data = era5_like()["t2m"]
    obj = data.chunk({"time": 8, "lat": 16, "lon": 32}) if lazy else data
    fc = obj.patch(time=Forecast(inputs=["-6h", "0h"], targets=["6h"]), lat=16, lon=32, stride=12)
    out = fc.apply(persistence, batch_size=5)
    assert out.dims == ("time", "lat", "lon")
    valid = pd.DatetimeIndex(out.time.values)
    origins = pd.DatetimeIndex(fc.origins.values)
    assert list(valid) == list(origins + pd.Timedelta("6h"))
    expected = data.sel(time=valid - pd.Timedelta("6h")).assign_coords(time=valid)
    xr.testing.assert_allclose(out.compute(), expected, rtol=1e-6)
    if lazy:
        eager = data.patch(time=Forecast(["-6h", "0h"], ["6h"]), lat=16, lon=32, stride=12)
        xr.testing.assert_allclose(out.compute(), eager.apply(persistence, batch_size=5))


def test_a_rollout_gives_a_lead_dim_with_valid_times_and_builds_lazily():
    data = era5_like()["z500"].chunk({"time": 8})
    leads = pd.timedelta_range("6h", "18h", freq="6h")
    fc = data.patch(time=Forecast(inputs=["0h"], targets=leads), lat=16, lon=16)
    computed = []

    class Count(dask.callbacks.Callback):
        def _start(self, dsk):
            computed.append(len(dsk))

    with Count():
        out = fc.apply(lambda x: np.repeat(x, 3, axis=1) + np.arange(3)[None, :, None, None])
    assert computed == []
    assert out.dims == ("time", "lead", "lat", "lon")
    assert list(out.lead.values) == list(leads.to_numpy())
    first = pd.Timestamp(out.time.values[0])
    assert pd.Timestamp(out.valid_time.values[0, 2]) == first + pd.Timedelta("18h")
    np.testing.assert_allclose(out.isel(time=0, lead=2).values, data.sel(time=first).values + 2)


def test_a_model_returning_the_wrong_shape_is_told_what_a_forecast_needs():
    data = era5_like()["t2m"]
    fc = data.patch(time=Forecast(["-6h", "0h"], ["6h"]), lat=16, lon=32)
    with pytest.raises(xpatch.PredictionError, match=r"needs \(\d+, 1, 16, 32\)"):
        fc.apply(lambda x: x)
    with pytest.raises(xpatch.PredictionError, match="return a dict"):  # a Dataset's model
        era5_like().patch(time=Forecast(["0h"], ["6h"])).apply(lambda x: x["t2m"][:, -1:])
    with pytest.raises(OptionError, match="output_dims"):
        fc.apply(persistence, output_dims={"lead": 1})


def test_other_dims_are_carried_through_the_model_whole_field_or_patches():
    data = era5_like()["t2m"]
    levels = xr.concat([data, data + 1000], dim="level").transpose("time", "lat", "level", "lon")
    shapes = {"whole": (1, 32, 2, 64), "patches": (1, 2, 16, 16)}  # after the batch axis
    for kind, spatial in (("whole", {}), ("patches", {"lat": 16, "lon": 16})):
        fc = levels.patch(time=Forecast(["0h"], ["6h"]), **spatial)
        seen = []

        def model(inputs, seen=seen):
            seen.append(inputs.shape)
            return inputs

        out = fc.apply(model)
        assert out.dims == levels.dims
        assert seen[-1][1:] == shapes[kind]
        valid = pd.DatetimeIndex(out.time.values)
        expected = levels.sel(time=valid - pd.Timedelta("6h")).assign_coords(time=valid)
        xr.testing.assert_allclose(out, expected)


def test_forecast_samples_from_a_zarr_through_two_worker_processes_equal_one_process(tmp_path):
    lazy = era5_like(tmp_path)
    fc = lazy.patch(time=Forecast(inputs=HISTORY, targets=LEAD), lat=16, lon=32, stride=16)
    src = fc.to_grain()
    pipeline = (
        grain.MapDataset.source(src)
        .pipe(src.chunk_shuffle, seed=1, worker_count=2, batch_size=8)
        .batch(8)
        .to_iter_dataset()
    )

    def summary(iterator):
        return [(b["index"].tolist(), float(b["targets"]["t2m"].sum())) for b in iterator]

    single = summary(pipeline)
    iterator = iter(pipeline.mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
    assert summary(iterator) == single
    iterator.close()
    assert sorted(i for indices, _ in single for i in indices) == list(range(len(src)))


def test_a_halo_grows_the_spatial_patches_of_a_sample_not_its_times():
    data = era5_like()["t2m"]
    fc = data.patch(
        time=Forecast(HISTORY, LEAD), lat=16, lon=16, halo=2, boundary="pad", pad_mode="edge"
    )
    sample = fc[0]
    assert sample["inputs"].shape == (2, 20, 20) and sample["targets"].shape == (1, 20, 20)


def test_a_rollout_through_a_halo_is_exact_away_from_the_seam():
    times = pd.date_range("2021-01-01", periods=12, freq="6h")
    lon = np.arange(64) * 5.625
    lat = np.linspace(60, -60, 24)
    base = np.sin(np.deg2rad(lon))[None, :] * np.cos(np.deg2rad(lat))[:, None]
    fields = np.stack([np.roll(base, t, axis=1) for t in range(12)])  # one cell east per 6 h
    da = xr.DataArray(
        fields, dims=("time", "lat", "lon"), coords={"time": times, "lat": lat, "lon": lon}
    )
    leads = pd.timedelta_range("6h", "18h", freq="6h")
    fc = da.chunk({"lat": 12, "lon": 32}).patch(
        time=Forecast(inputs=["0h"], targets=leads),
        lat=12,
        lon=16,
        stride=8,
        halo=3,
        boundary="pad",
        pad_mode="edge",
    )

    def advect(inputs):  # the grown patch in, the grown patch out: xpatch crops it
        return np.concatenate([np.roll(inputs, k, axis=-1) for k in (1, 2, 3)], axis=1)

    out = fc.apply(advect).compute()
    for i, origin in enumerate(pd.DatetimeIndex(out.time.values)):
        truth = da.sel(time=origin + leads).values
        error = np.abs(out.isel(time=i).values - truth)
        assert error[..., 3:].max() < 1e-12  # wrong only where the halo reaches past lon 0
        assert error[..., :3].max() > 0.01


def test_a_datasets_variables_opened_in_another_order_keep_the_fingerprint(tmp_path):
    # xarray can open a zarr's variables in another order from one open to the next.
    lazy = era5_like(tmp_path)
    turned = lazy[list(reversed(list(lazy.data_vars)))]
    forecast = Forecast(inputs=HISTORY, targets=LEAD)
    first = lazy.patch(time=forecast, lat=16, lon=32).to_grain()
    second = turned.patch(time=forecast, lat=16, lon=32).to_grain()
    assert first.fingerprint == second.fingerprint
    assert list(first[0]["inputs"]) == list(second[0]["inputs"])
    plain = lazy.patch(lat=16, lon=32).to_grain()
    assert plain.fingerprint == turned.patch(lat=16, lon=32).to_grain().fingerprint


def test_forcings_come_at_the_targets_times_beside_the_inputs():
    data = era5_like().assign(toa=lambda d: d["t2m"] * 0 + d["time"].dt.hour)
    forecast = Forecast(
        inputs=HISTORY,
        targets=LEAD,
        input_variables=["t2m", "orography"],
        target_variables=["t2m"],
        forcing_variables=["toa"],
    )
    fc = data.patch(time=forecast, lat=16, lon=32)
    sample = fc[4]
    lead = pd.Timestamp(sample["origin"]) + pd.Timedelta("6h")
    assert list(sample["forcings"].data_vars) == ["toa"]
    assert float(sample["forcings"]["toa"].isel(time=0, lat=0, lon=0)) == lead.hour
    assert set(sample["inputs"].data_vars) == {"t2m", "orography"}
    item = fc.to_grain()[4]
    np.testing.assert_array_equal(item["forcings"]["toa"], sample["forcings"]["toa"].values)
    assert "forcings" not in data.patch(time=Forecast(HISTORY, LEAD), lat=16).to_grain()[0]
    with pytest.raises(OptionError, match="forcing_variables"):
        data.patch(time=Forecast(HISTORY, LEAD, forcing_variables=["orography"]), lat=16)


def test_forecast_samples_from_a_waiting_store_fetch_bytes_ahead_and_stay_exact(tmp_path):
    from zarr.storage import LocalStore
    from zarr.testing.store import LatencyStore

    data = era5_like()
    era5_like(tmp_path)  # written to tmp_path / "era5.zarr"
    store = LatencyStore(LocalStore(tmp_path / "era5.zarr", read_only=True), get_latency=0.01)
    lazy = xr.open_zarr(store, consolidated=False)
    geometry = {"time": Forecast(inputs=HISTORY, targets=LEAD), "lat": 16, "lon": 32, "stride": 16}
    src = lazy.patch(**geometry).to_grain()
    src.fetch_ahead(8)
    assert src.chunk_reads.fetch_depth() == 8
    seen = check_shuffled_epoch(src, data.patch(**geometry), threads=4)
    assert sorted(seen) == list(range(len(src)))
    assert src.cache_stats().loads == src.chunk_count
