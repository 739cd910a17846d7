"""Figure: the anchors of a patch layout drawn over an image, with a few of its patches."""

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
from matplotlib.patches import Rectangle

import xpatch  # noqa: F401  (registers .patch)

y, x = np.mgrid[0:200, 0:260]
image = xr.DataArray(
    np.sin(x / 23.0) * np.cos(y / 31.0) + 0.5 * np.sin((x + 2 * y) / 17.0),
    dims=("y", "x"),
)
p = image.patch(y=64, x=64, stride=48)
anchors = np.asarray(p.anchors())
size = p.size

fig, ax = plt.subplots(figsize=(7, 5.2))
ax.imshow(image, cmap="gray", interpolation="nearest")
ax.plot(anchors[:, 1], anchors[:, 0], "o", color="yellow", markersize=4, label="anchors")
# The first two patches of the first row overlap by size - stride = 16 cells; the last
# one is shifted back to end flush with the right edge (boundary="shift").
shown = {0: "tab:red", 1: "tab:blue", 5: "tab:orange", 6: "tab:green"}
for index, color in shown.items():
    ay, ax_ = anchors[index]
    ax.add_patch(
        Rectangle((ax_ - 0.5, ay - 0.5), size["x"], size["y"], fill=True, alpha=0.25, color=color)
    )
    ax.add_patch(
        Rectangle((ax_ - 0.5, ay - 0.5), size["x"], size["y"], fill=False, lw=2, color=color)
    )
    ax.annotate(f"p[{index}] at ({ay}, {ax_})", (ax_ + 2, ay + 9), color="white", fontsize=8)
ax.set(xlabel="x", ylabel="y")
rows, columns = (sorted({int(a) for a in anchors[:, i]}) for i in (0, 1))
ax.set_title(f"{len(p)} patches of 64 x 64, stride 48\nanchors: y in {rows}, x in {columns}")
ax.legend(loc="lower left", fontsize=8)
fig.tight_layout()
