"""Figure: many scenes under one layout, one footprint at three resolutions, weighted centres."""

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
from matplotlib.patches import Rectangle

import xpatch

rng = np.random.default_rng(0)
fig, axes = plt.subplots(1, 3, figsize=(11, 3.8))

# 1. Three scenes of different shapes, one layout; colour = which worker reads the patch.
shapes = {"a": (96, 128), "b": (64, 96), "c": (128, 64)}
scenes = {k: xr.DataArray(rng.random(s), dims=("y", "x")).chunk(32) for k, s in shapes.items()}
sp = xpatch.patch_scenes(scenes, y=32, x=32, stride=24)
src = sp.to_grain(cache_bytes=2**20)
order = src.chunk_shuffle(seed=0, worker_count=2, batch_size=8).permutation(0)
worker = np.empty(len(sp), dtype=int)
worker[order] = (np.arange(len(sp)) // 8) % 2
ax = axes[0]
left = 0
for k, name in enumerate(sp.names):
    height, width = shapes[name]
    ax.add_patch(Rectangle((left, 0), width, height, fill=False, lw=1.5, color="black"))
    ax.text(left + 2, height + 6, f"scene {name!r}", fontsize=8)
    anchors = sp.patchers[name].anchors().values
    for j, (y, x) in enumerate(anchors):
        colour = ("tab:blue", "tab:orange")[worker[sp.offsets[k] + j]]
        ax.add_patch(Rectangle((left + x, y), 32, 32, fill=True, alpha=0.18, color=colour))
    left += width + 16
ax.set(xlim=(-4, left), ylim=(140, -4), aspect="equal", xticks=[], yticks=[])
ax.set_title(f"patch_scenes: {len(sp)} patches over 3 scenes\nblue / orange: read by worker 0 / 1")


# 2. One 120 m footprint at 10, 20 and 60 m: the same ground in every node.
def grid(n, cell):
    """Return a square grid of `cell`-metre cells over the same 480 m, labelled at centres."""
    centres = cell / 2 + cell * np.arange(n)
    return xr.Dataset(
        {"band": (("y", "x"), rng.random((n, n)))}, coords={"y": 480 - centres, "x": centres}
    )


tree = xr.DataTree.from_dict({"/10m": grid(48, 10), "/20m": grid(24, 20), "/60m": grid(8, 60)})
tp = tree.patch(y=12, x=12, stride=12, reference="/10m")
ax = axes[1]
ax.imshow(tree["/60m"]["band"].values, extent=(0, 480, 0, 480), cmap="gray", alpha=0.6)
left, bottom, right, top = tp.bounds()["/10m"]["bounds"].values[5]
for path, style in (("/10m", "-"), ("/20m", "--"), ("/60m", ":")):
    b = tp.bounds()[path]["bounds"].values[5]
    size = tp.patchers[path].size["y"]
    ax.add_patch(
        Rectangle(
            (b[0], b[1]),
            b[2] - b[0],
            b[3] - b[1],
            fill=False,
            lw=2,
            ls=style,
            label=f"{path}: {size} x {size} cells",
        )
    )
ax.legend(loc="lower left", fontsize=7)
ax.set(xlabel="x (m)", ylabel="y (m)", title="patch 5 of a DataTree: the same\n120 m at every node")

# 3. WeightedAnchors: 1 % positive cells carry half the weight.
labels = xr.DataArray(np.zeros((128, 128), "uint8"), dims=("y", "x"))
labels[20:33, 90:103] = 1  # 169 cells, about 1 %
weights = xpatch.balanced_weights(labels)
p = labels.patch(y=16, x=16, sampler=xpatch.WeightedAnchors(weights, 400, seed=0))
centres = p.anchors().values + 8
positive = labels.values[centres[:, 0], centres[:, 1]] == 1
ax = axes[2]
ax.imshow(labels, cmap="Greys", vmax=2)
ax.plot(centres[~positive, 1], centres[~positive, 0], ".", ms=3, color="tab:blue")
ax.plot(centres[positive, 1], centres[positive, 0], ".", ms=3, color="tab:red")
ax.set(xticks=[], yticks=[])
ax.set_title(
    f"WeightedAnchors(balanced_weights(labels))\n{positive.mean():.0%} of 400 centres positive"
)
fig.tight_layout()
