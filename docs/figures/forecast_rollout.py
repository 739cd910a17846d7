"""Figure: a rollout through fc.apply with a halo and a periodic longitude: exact everywhere."""

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import xarray as xr

import xpatch

times = pd.date_range("2021-01-01", periods=12, freq="6h")
lon = np.arange(128) * 2.8125
lat = np.linspace(70, -70, 48)
y, x = np.deg2rad(lat)[:, None], np.deg2rad(lon)[None, :]
base = np.sin(2 * x) * np.cos(y) + 0.5 * np.cos(3 * x + 2 * y)
fields = np.stack([np.roll(base, 2 * t, axis=1) for t in range(12)])  # 2 cells east per 6 h
coords = {"time": times, "lat": lat, "lon": lon}
field = xr.DataArray(fields, dims=("time", "lat", "lon"), coords=coords)

leads = pd.timedelta_range("6h", "24h", freq="6h")
fc = field.patch(
    time=xpatch.Forecast(inputs=["0h"], targets=leads),
    lat=24,
    lon=32,
    stride=16,
    halo=8,
    boundary={"lon": "periodic", "lat": "pad"},
    pad_mode="edge",
)


def advect(inputs):
    """Move the field 2 cells east per lead (the model sees the grown patch)."""
    return np.concatenate([np.roll(inputs, 2 * k, axis=-1) for k in (1, 2, 3, 4)], axis=1)


out = fc.apply(advect)
origin = pd.Timestamp(out.time.values[0])
worst = 0.0
fig, axes = plt.subplots(2, 4, figsize=(11, 4.2), layout="constrained", sharex=True, sharey=True)
for j, lead in enumerate(leads):
    forecast = out.sel(time=origin).isel(lead=j)
    truth = field.sel(time=origin + lead)
    shown = axes[0, j].pcolormesh(lon, lat, forecast, cmap="RdBu_r", vmin=-1.5, vmax=1.5)
    axes[0, j].set_title(f"forecast +{int(lead / pd.Timedelta('1h'))} h")
    error = np.abs(forecast.values - truth.values)
    wrong = axes[1, j].pcolormesh(lon, lat, error, cmap="magma", vmin=0, vmax=1)
    axes[1, j].set_title(f"|error| +{int(lead / pd.Timedelta('1h'))} h")
    worst = max(worst, float(error.max()))
fig.colorbar(shown, ax=axes[0], shrink=0.8)
fig.colorbar(wrong, ax=axes[1], shrink=0.8)
for ax in axes[1]:
    ax.set_xlabel("lon")
fig.suptitle(f"largest error anywhere, the seam at 0°E included: {worst:.1g}")
