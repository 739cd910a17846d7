"""Figure: a scene, its labels from other CRSs, and the patches a balanced sampler picks.

The land cover comes from EPSG:4326 and the fields from EPSG:3857, put on the scene's
grid by xpatch.on_grid.
"""

import geopandas
import matplotlib.pyplot as plt
import numpy as np
import rioxarray  # noqa: F401  (registers .rio)
import xarray as xr
from matplotlib.colors import ListedColormap
from matplotlib.patches import Rectangle
from shapely.geometry import box

import xpatch

n = 512
y, x = np.mgrid[0:n, 0:n]
scene = xr.DataArray(
    (np.sin(x / 37.0) * np.cos(y / 53.0) + 0.4 * np.sin((x + 2 * y) / 21.0))[None]
    .repeat(2, axis=0)
    .astype(np.float32),
    dims=("band", "y", "x"),
    coords={
        "band": [1, 2],
        "y": 5_000_000.0 - 5.0 - 10.0 * np.arange(n),
        "x": 400_000.0 + 5.0 + 10.0 * np.arange(n),
    },
    name="image",
).rio.write_crs("EPSG:32632")
scene = scene.chunk({"band": -1, "y": 128, "x": 128})

# Land cover in degrees, classes 1-4 in blocks of unequal size (class 4 the rarest),
# 0 as nodata; it stops short of the scene's east edge.
left, bottom, right, top = scene.rio.transform_bounds("EPSG:4326")
lat = top + 0.001 - 0.00015 - 0.0003 * np.arange(int((top - bottom) / 0.0003) + 8)
lon = left - 0.001 + 0.00015 + 0.0003 * np.arange(int(0.8 * (right - left) / 0.0003))
rows, cols = np.meshgrid(np.arange(lat.size), np.arange(lon.size), indexing="ij")
classes = np.where(rows < 60, 1, np.where(cols < 70, 2, 3)).astype(np.uint8)
classes[(rows > 110) & (rows < 125) & (cols > 100) & (cols < 120)] = 4
cover = (
    xr.DataArray(classes, dims=("y", "x"), coords={"y": lat, "x": lon})
    .rio.write_crs("EPSG:4326")
    .rio.write_nodata(0)
)

fields = geopandas.GeoDataFrame(
    {"crop": [1, 1]},
    geometry=[
        box(400_600, 4_996_600, 401_600, 4_997_900),
        box(402_200, 4_995_600, 403_900, 4_996_400),
    ],
    crs="EPSG:32632",
).to_crs("EPSG:3857")

ds = xpatch.on_grid(scene, labels=cover.chunk(128), fields=fields)
labels = ds.labels.compute()
weights = xpatch.balanced_weights(labels, classes=[1, 2, 3, 4])
p = ds.patch(y=48, x=48, sampler=xpatch.WeightedAnchors(weights, count=32, seed=1))
anchors = np.asarray(p.anchors())
centres = labels.values[anchors[:, 0] + 24, anchors[:, 1] + 24]

palette = ["white", "#8dd3c7", "#ffffb3", "#bebada", "#fb8072"]
fig, axes = plt.subplots(1, 3, figsize=(11, 4))
axes[0].imshow(ds.image.isel(band=0), cmap="gray")
axes[0].set_title("scene, EPSG:32632 (10 m)")
axes[1].imshow(labels, cmap=ListedColormap(palette), vmin=0, vmax=4, interpolation="nearest")
axes[1].contour(ds.fields, levels=[0.5], colors="black", linewidths=1)
axes[1].set_title("land cover from EPSG:4326,\nfields from EPSG:3857 (outlined)")
axes[2].imshow(labels, cmap=ListedColormap(palette), vmin=0, vmax=4, interpolation="nearest")
edges = ["black", "teal", "darkgoldenrod", "slateblue", "firebrick"]
for (ay, ax_), centre in zip(anchors, centres):
    axes[2].add_patch(Rectangle((ax_, ay), 48, 48, fill=False, lw=1.2, color=edges[centre]))
counts = np.bincount(centres, minlength=5)[1:]
axes[2].set_title(f"32 patches of balanced_weights:\ncentres per class 1-4: {counts.tolist()}")
for ax in axes:
    ax.set_xticks([])
    ax.set_yticks([])
fig.tight_layout()
