"""Figure: a model with edge artefacts on a global grid, blended with and without a periodic lon."""

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

import xpatch  # noqa: F401  (registers .patch)

lon = np.arange(128) * 2.8125
lat = np.linspace(70, -70, 48)
y, x = np.deg2rad(lat)[:, None], np.deg2rad(lon)[None, :]
field = xr.DataArray(
    1 + 0.4 * np.sin(2 * x) * np.cos(y) + 0.2 * np.cos(3 * x + 2 * y),
    dims=("lat", "lon"),
    coords={"lat": lat, "lon": lon},
)
SIZE = 32
distance = np.minimum(np.arange(SIZE) + 0.5, SIZE - np.arange(SIZE) - 0.5)
edge = np.exp(-distance / 2)
artefact = 0.3 * np.maximum.outer(edge, edge)  # wrong by the patch's edges, right inside


def model(batch):
    """Return the patch, off along its edges as a model with too little context there."""
    return batch + artefact


layouts = {
    'boundary="shift"': {},
    'boundary={"lon": "periodic"}': {"boundary": {"lon": "periodic"}},
}
fig, axes = plt.subplots(1, 2, figsize=(10, 3.2), layout="constrained", sharey=True)
for ax, (title, options) in zip(axes, layouts.items()):
    p = field.patch(lat=SIZE, lon=SIZE, stride=SIZE // 4, window="hann", **options)
    error = np.abs(p.apply(model) - field)
    shown = ax.pcolormesh(lon, lat, error, cmap="magma", vmin=0, vmax=0.1)
    seam = float(error.isel(lat=slice(8, -8), lon=[0, -1]).max())
    inside = float(error.isel(lat=slice(8, -8), lon=slice(8, -8)).max())
    ax.set_title(f"{title}\nlargest |error| by the seam {seam:.3f}, inside {inside:.3f}")
    ax.set_xlabel("lon")
axes[0].set_ylabel("lat")
fig.colorbar(shown, ax=axes, shrink=0.9)
