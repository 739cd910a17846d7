"""A forecast rollout over a global grid: periodic longitude, halo, the seam included."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import xpatch

LEADS = pd.timedelta_range("6h", "24h", freq="6h")


def advected_field() -> xr.DataArray:
    """A field moving 2 cells east per 6 h on a global grid (it wraps around the seam)."""
    times = pd.date_range("2021-01-01", periods=10, freq="6h")
    lon = np.arange(64) * 5.625
    lat = np.linspace(70, -70, 24)
    y, x = np.deg2rad(lat)[:, None], np.deg2rad(lon)[None, :]
    base = np.sin(2 * x) * np.cos(y) + 0.5 * np.cos(3 * x + 2 * y)
    fields = np.stack([np.roll(base, 2 * t, axis=1) for t in range(len(times))])
    coords = {"time": times, "lat": lat, "lon": lon}
    return xr.DataArray(fields, dims=("time", "lat", "lon"), coords=coords)


def advect(inputs: np.ndarray) -> np.ndarray:
    """Move the grown patch 2 cells east per lead; the halo brings the cells in."""
    return np.concatenate([np.roll(inputs, 2 * k, axis=-1) for k in (1, 2, 3, 4)], axis=1)


@pytest.mark.parametrize("lazy", [False, True])
def test_a_rollout_with_a_periodic_longitude_and_a_halo_equals_the_whole_field(lazy):
    field = advected_field()
    obj = field.chunk({"time": 4, "lon": 20}) if lazy else field
    fc = obj.patch(
        time=xpatch.Forecast(inputs=["0h"], targets=LEADS),
        lat=12,
        lon=16,
        stride=8,
        halo=8,
        boundary={"lon": "periodic", "lat": "pad"},
        pad_mode="edge",
    )
    out = fc.apply(advect)
    # The whole-field rollout: the model on the whole (wrapped) field, cells unchanged.
    whole = np.stack([advect(field.values[t][None, None])[0] for t in range(field.sizes["time"])])
    assert out.sizes["time"] == field.sizes["time"] - len(LEADS)
    for i, origin in enumerate(out.time.values):
        t = int(np.flatnonzero(field.time.values == origin)[0])
        np.testing.assert_allclose(out.isel(time=i).values, whole[t], atol=1e-12)
        for j, lead in enumerate(LEADS):
            truth = field.sel(time=pd.Timestamp(origin) + lead).values
            np.testing.assert_allclose(out.isel(time=i, lead=j).values, truth, atol=1e-12)
