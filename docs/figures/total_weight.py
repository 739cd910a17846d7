"""Figure: total weight of a patch layout, edge-safe Hann vs a symmetric Hann."""

import matplotlib.pyplot as plt
import numpy as np
import scipy.signal
import xarray as xr
from matplotlib.colors import LogNorm
from matplotlib.patches import Rectangle

import xpatch  # noqa: F401  (registers .patch)

SHAPE, SIZE, STRIDE = (200, 260), 64, 48
grid = xr.DataArray(np.zeros(SHAPE), dims=("y", "x"))
p = grid.patch(y=SIZE, x=SIZE, stride=STRIDE, window="hann")
anchors = np.asarray(p.anchors())


def total_weight(window: np.ndarray) -> np.ndarray:
    """Return Σw: the 2-D window added at every anchor of the layout."""
    total = np.zeros(SHAPE)
    for y, x in anchors:
        total[y : y + SIZE, x : x + SIZE] += window
    return total


symmetric = scipy.signal.windows.hann(SIZE)
layouts = {
    'xpatch window="hann" (half-sample)': total_weight(p.weights().values),
    "symmetric Hann (scipy.signal.windows.hann)": total_weight(np.outer(symmetric, symmetric)),
}

CORNER = 12
norm = LogNorm(vmin=1e-7, vmax=max(total.max() for total in layouts.values()))
cmap = plt.get_cmap("viridis").with_extremes(under="red")
fig, axes = plt.subplots(2, 2, figsize=(9, 7.4), height_ratios=(1.4, 1), layout="constrained")
for (title, total), top, bottom in zip(layouts.items(), axes[0], axes[1]):
    shown = np.where(total > 0, total, 1e-12)  # zeros below vmin: drawn red
    zero = int((total == 0).sum())
    image = top.imshow(shown, cmap=cmap, norm=norm, interpolation="nearest")
    top.add_patch(Rectangle((-0.5, -0.5), CORNER, CORNER, fill=False, color="white", lw=1))
    top.set_title(f"{title}\n{zero} cells with Σw = 0 (red)")
    top.set(xlabel="x", ylabel="y")
    bottom.imshow(shown[:CORNER, :CORNER], cmap=cmap, norm=norm, interpolation="nearest")
    bottom.set_title(f"top-left corner, {CORNER} x {CORNER} cells")
    bottom.set(xlabel="x", ylabel="y")
fig.colorbar(image, ax=axes, label="Σw, total weight (log scale)", shrink=0.6, extend="min")
fig.suptitle(f"{len(anchors)} patches of {SIZE} x {SIZE}, stride {STRIDE}, on a 200 x 260 grid")
