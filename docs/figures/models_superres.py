"""Figure: a 2x super-resolution model and a 1/4-resolution head on the same extent."""

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
from scipy import ndimage

import xpatch  # noqa: F401  (registers .patch)

# A 60 m raster of 40 x 48 cells; x and y are cell centres in metres.
y, x = np.mgrid[0:40, 0:48]
values = np.sin(x / 5.0) * np.cos(y / 7.0) + 0.4 * ((x - 24) ** 2 + (y - 20) ** 2 < 60)
scene = xr.DataArray(
    values[None],
    dims=("band", "y", "x"),
    coords={"y": 2400 - 60 * (np.arange(40) + 0.5), "x": 60 * (np.arange(48) + 0.5)},
)
p = scene.patch(y=16, x=16, stride=8, window="hann")


def bilinear_x2(batch: np.ndarray) -> np.ndarray:
    """Zoom each patch bilinearly, a stand-in SR network: (b, 1, 16, 16) -> (b, 1, 32, 32)."""
    return ndimage.zoom(batch, (1, 1, 2, 2), order=1, mode="nearest", grid_mode=True)


def quarter_head(batch: np.ndarray) -> np.ndarray:
    """Average each 4 x 4 block, a head at 1/4 resolution."""
    b, c, ny, nx = batch.shape
    return batch.reshape(b, c, ny // 4, 4, nx // 4, 4).mean(axis=(3, 5))


panels = {
    "input, 60 m (40 x 48)": scene,
    "scale=2 model, 30 m (80 x 96)": p.apply(bilinear_x2, scale=2),
    "scale=1/4 head, 240 m (10 x 12)": p.apply(quarter_head, scale=0.25),
}
fig, axes = plt.subplots(1, 3, figsize=(11, 3.4), layout="constrained")
for ax, (title, da) in zip(axes, panels.items()):
    dx = float(da.x[1] - da.x[0])
    extent = [float(da.x[0]) - dx / 2, float(da.x[-1]) + dx / 2,
              float(da.y[-1]) - dx / 2, float(da.y[0]) + dx / 2]  # fmt: skip
    shown = ax.imshow(da.isel(band=0), extent=extent, cmap="viridis", vmin=-1, vmax=1.4,
                      interpolation="nearest")  # fmt: skip
    ax.set_title(title)
    ax.set_xlabel("x (m)")
axes[0].set_ylabel("y (m)")
fig.colorbar(shown, ax=axes, shrink=0.85)
fig.suptitle(
    "One patcher (16 x 16 patches, stride 8), three output resolutions over the same extent"
)
