"""Figure: forecast samples along a 6-hourly archive with a gap; valid and skipped origins."""

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import xarray as xr

import xpatch

times = pd.date_range("2021-01-01", periods=16, freq="6h").delete([7, 8])  # 12 h missing
field = xr.DataArray(np.zeros(len(times)), dims="time", coords={"time": times})
forecast = xpatch.Forecast(inputs=["-12h", "-6h", "0h"], targets=["6h", "12h"])
fc = field.patch(time=forecast)

every = pd.date_range(times[0], times[-1], freq="6h")
hours = (every - every[0]) / pd.Timedelta("1h")
fig, ax = plt.subplots(figsize=(10, 4.2), layout="constrained")
present = np.isin(every, times)
ax.scatter(hours[present], np.zeros(present.sum()), marker="|", s=200, color="black")
ax.scatter(hours[~present], np.zeros((~present).sum()), marker="x", s=60, color="crimson")
origins = pd.DatetimeIndex(fc.origins.values)
for row, origin in enumerate(origins, start=1):
    at = (origin - every[0]) / pd.Timedelta("1h")
    history = at + np.array([-12, -6, 0])
    leads = at + np.array([6, 12])
    ax.plot(history, [row] * 3, "o-", color="tab:blue", label="inputs" if row == 1 else None)
    ax.plot(leads, [row] * 2, "s-", color="tab:orange", label="targets" if row == 1 else None)
for origin in times.difference(origins):
    at = (origin - every[0]) / pd.Timedelta("1h")
    ax.scatter([at], [-0.8], marker="v", color="gray")
ax.set_yticks([0, -0.8], ["archive labels (x: missing)", "skipped origins"])
ax.set_ylim(-1.5, len(origins) + 1)
ax.set_xlabel("hours since the first label")
ax.set_title(f"{len(origins)} samples; {fc.skipped}")
ax.legend(loc="upper left")
