"""Forecast samples by time label on every kind of time coordinate, and every offset form.

NaT in the times, cftime calendars (with gaps), tz-aware times, None offsets, and the
timedelta forms numpy, pandas and the standard library spell.
"""

from __future__ import annotations

import datetime

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from xpatch import DimensionError, Forecast, OptionError
from xpatch.forecast.stencil import plan_origins

SIX_HOURS = pd.date_range("2021-01-01", periods=8, freq="6h")


def series(times, name: str = "t2m") -> xr.DataArray:
    """Values 0, 1, 2, ... along ``time``: a sample's values say which cells it read."""
    return xr.DataArray(
        np.arange(float(len(times))), dims="time", coords={"time": times}, name=name
    )


# -- 1. NaT in the time coordinate ------------------------------------------------------


@pytest.mark.parametrize("tz", [None, "UTC"])
def test_a_time_coordinate_holding_nat_is_refused_naming_the_dim_the_positions_and_the_fix(tz):
    times = SIX_HOURS.tz_localize(tz).to_numpy().copy()
    times[[3, 6]] = None
    data = series(pd.DatetimeIndex(times)).to_dataset()
    with pytest.raises(DimensionError, match=r"'time'.* NaT .*2 position\(s\): 3, 6") as error:
        data.patch(time=Forecast(inputs=["0h"], targets=["0h", "6h"]))
    assert "ds.sel(time=ds['time'].notnull())" in str(error.value)
    assert "ds.dropna('time', subset=['time'])" in str(error.value)
    # The fixes the message names leave the valid times, and a forecast on them.
    for fixed in (data.sel(time=data["time"].notnull()), data.dropna("time", subset=["time"])):
        fc = fixed.patch(time=Forecast(inputs=["0h"], targets=["6h"]))
        origins = pd.DatetimeIndex(fc.origins.values)
        assert list(origins.tz_localize(None) if tz else origins) == list(SIX_HOURS[[0, 1, 4]])


def test_nat_is_refused_before_any_sample_or_output_exists():
    times = SIX_HOURS.to_numpy().copy()
    times[0] = None
    # Not even a persistence model's apply: the NaT would be an origin whose input and
    # target are the same cell (the old result).
    with pytest.raises(DimensionError, match="position"):
        series(times).patch(time=Forecast(inputs=["0h"], targets=["0h"])).apply(lambda x: x)


# -- 2. cftime calendars ----------------------------------------------------------------


def cftime_times(calendar: str = "noleap", start: str = "2021-01-01", periods: int = 8, freq="6h"):
    return xr.date_range(start, periods=periods, freq=freq, calendar=calendar, use_cftime=True)


@pytest.mark.parametrize("calendar", ["noleap", "360_day", "standard"])
def test_timedeltas_on_a_cftime_calendar_with_a_gap_skip_exactly_as_on_datetime64(calendar):
    gap = [0, 1, 2, 3, 5, 6, 7]  # the 5th 6-hourly time is missing
    cf = series(cftime_times(calendar)[gap])
    dt = series(SIX_HOURS[gap])
    forecast = Forecast(inputs=["-6h", "0h"], targets=[pd.Timedelta("6h")])
    on_cf, on_dt = cf.patch(time=forecast), dt.patch(time=forecast)
    assert on_cf.plan.origins.tolist() == on_dt.plan.origins.tolist() == [1, 2, 5]
    assert on_cf.skipped == on_dt.skipped
    assert on_cf.skipped.count == 4 and on_cf.skipped.missing == {"-6h": 2, "0h": 0, "6h": 2}
    for i, origin in enumerate(on_cf.origins.values):
        sample = on_cf[i]
        assert sample["origin"] == origin
        six = datetime.timedelta(hours=6)
        xr.testing.assert_identical(sample["inputs"], cf.sel(time=[origin - six, origin]))
        xr.testing.assert_identical(sample["targets"], cf.sel(time=[origin + six]))


def test_a_day_on_a_cftime_calendar_is_the_calendars_day():
    # 24 h after 28 February is 1 March without leap days, and 30 February in 360-day.
    noleap = series(cftime_times("noleap", "2020-02-27", 3, "1D"))
    assert noleap["time"].dt.day.values.tolist() == [27, 28, 1]
    assert len(noleap.patch(time=Forecast(inputs=["0h"], targets=["1D"]))) == 2
    days360 = series(cftime_times("360_day", "2020-02-29", 2, "1D"))
    assert days360["time"].dt.day.values.tolist() == [29, 30]
    assert len(days360.patch(time=Forecast(inputs=["0h"], targets=["24h"]))) == 1


def test_integer_steps_on_cftime_stay_positions_across_a_gap():
    # The documented meaning: a step is one position, whatever time it spans.
    cf = series(cftime_times()[[0, 1, 2, 3, 5, 6, 7]])
    fc = cf.patch(time=Forecast(inputs=[0], targets=[1]))
    assert fc.plan.origins.tolist() == [0, 1, 2, 3, 4, 5]
    assert fc.skipped.count == 1 and fc.skipped.missing == {"+0 steps": 0, "+1 steps": 1}
    assert "timedeltas" in Forecast.__doc__ and "gap" in Forecast.__doc__
    with pytest.raises(OptionError, match="one kind"):
        cf.patch(time=Forecast(inputs=[0], targets=["6h"]))


def test_a_cftime_forecast_is_written_at_its_valid_times_and_a_plain_index_of_cftime_works():
    times = cftime_times()[[0, 1, 2, 3, 5, 6, 7]]
    cf = series(times)
    out = cf.patch(time=Forecast(inputs=["0h"], targets=["6h"])).apply(lambda x: x)
    assert list(out["time"].values) == list(times[[1, 2, 3, 5, 6]])
    assert out.values.tolist() == [0.0, 1.0, 2.0, 4.0, 5.0]  # the input, at origin + 6 h
    plain = plan_origins(
        pd.Index(np.asarray(times), dtype=object), "time", Forecast(["0h"], ["6h"])
    )
    assert plain.origins.tolist() == [0, 1, 2, 4, 5]


# -- 3. tz-aware times ------------------------------------------------------------------


@pytest.mark.parametrize("tz", ["UTC", "Europe/Paris"])
def test_timedeltas_on_tz_aware_times_measure_absolute_time_and_keep_the_labels(tz):
    # 6-hourly in UTC across the spring DST change in Paris (28 March 2021, 02:00 -> 03:00).
    utc = pd.date_range("2021-03-27 12:00", periods=8, freq="6h", tz="UTC").delete(4)
    labels = utc.tz_convert(tz)
    da = series(labels)
    fc = da.patch(time=Forecast(inputs=[np.timedelta64(-6, "h"), "0h"], targets=["6h"]))
    assert fc.plan.origins.tolist() == [1, 2, 5]
    assert [pd.Timestamp(t) for t in fc.origins.values] == list(labels[[1, 2, 5]])
    assert pd.Timestamp(fc[0]["origin"]).tz is not None
    assert fc[2]["inputs"].values.tolist() == [4.0, 5.0]
    assert fc[2]["targets"].values.tolist() == [6.0]
    out = fc.apply(lambda x: x[:, -1:])
    assert [pd.Timestamp(t) for t in out["time"].values] == list(labels[[2, 3, 6]])
    assert out.values.tolist() == [1.0, 2.0, 5.0]


# -- 4. None offsets --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "targets", "match"),
    [
        ([None], ["6h"], r"inputs=\[None\]\) holds None at position 0"),
        (["0h"], None, r"targets=None\) gives no offset"),
        (None, ["6h"], r"inputs=None\) gives no offset"),
        (["0h"], ["6h", pd.NaT], r"targets=.*holds NaT at position 1"),
        (["0h"], [np.timedelta64("NaT")], r"targets=.*holds .*NaT.* at position 0"),
        (["0h"], [float("nan")], r"targets=\[nan\]\) holds nan"),
        (["0h"], [1.5], r"targets=\[1.5\]\) are not timedeltas"),
        (["0h"], [True], r"targets=\[True\]\) are not timedeltas"),
    ],
)
def test_a_missing_or_unreadable_offset_is_refused_naming_the_argument_and_value(
    inputs, targets, match
):
    with pytest.raises(OptionError, match=match):
        series(SIX_HOURS).patch(time=Forecast(inputs=inputs, targets=targets))


# -- 5. every timedelta form ------------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "targets"),
    [
        ([np.timedelta64(-6, "h"), np.timedelta64(0, "h")], [np.timedelta64(6, "h")]),
        (np.array([-6, 0], dtype="timedelta64[h]"), np.timedelta64(6, "h")),
        (np.array([-360, 0], dtype="timedelta64[m]"), np.array(6, dtype="timedelta64[h]")),
        ([pd.Timedelta("-6h"), pd.Timedelta(0)], pd.Timedelta("6h")),
        ([datetime.timedelta(hours=-6), datetime.timedelta(0)], datetime.timedelta(hours=6)),
        (pd.TimedeltaIndex(["-6h", "0h"]), pd.timedelta_range("6h", periods=1)),
        (["-6h", np.timedelta64(0, "s")], "6h"),
    ],
)
def test_every_timedelta_form_gives_the_plan_of_strings(inputs, targets):
    expected = plan_origins(SIX_HOURS, "time", Forecast(inputs=["-6h", "0h"], targets=["6h"]))
    for times in (SIX_HOURS, cftime_times()):
        plan = plan_origins(times, "time", Forecast(inputs=inputs, targets=targets))
        assert plan.origins.tolist() == expected.origins.tolist() == list(range(1, 7))
        assert plan.inputs.tolist() == expected.inputs.tolist()
        assert plan.targets.tolist() == expected.targets.tolist()
        assert plan.skipped == expected.skipped
        assert plan.target_offsets.tolist() == expected.target_offsets.tolist()
    fc = series(SIX_HOURS).patch(time=Forecast(inputs=inputs, targets=targets))
    assert fc[0]["targets"].values.tolist() == [2.0]


def test_timedeltas_on_a_dim_without_times_ask_for_steps():
    da = xr.DataArray(np.arange(5.0), dims="step")
    with pytest.raises(OptionError, match=r"no time coordinate.*integer steps"):
        da.patch(step=Forecast(inputs=[np.timedelta64(0, "h")], targets=["6h"]))


def test_times_far_from_1970_do_not_overflow_nanoseconds():
    # Second resolution holds year 2500; nanoseconds (the offsets' unit) would not.
    times = pd.DatetimeIndex(
        np.arange("2500-01-01", "2500-01-03", np.timedelta64(6, "h"), dtype="datetime64[s]")
    ).delete(3)
    plan = plan_origins(times, "time", Forecast(inputs=["0h"], targets=["6h"]))
    assert plan.origins.tolist() == [0, 1, 3, 4, 5]
