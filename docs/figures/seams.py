"""Figure: a model with an edge artefact, blended with a Hann window and with a boxcar."""

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

import xpatch  # noqa: F401  (registers .patch)

y, x = np.mgrid[0:200, 0:260]
image = xr.DataArray(
    0.6 + 0.25 * np.sin(x / 23.0) * np.cos(y / 31.0) + 0.1 * np.sin((x + 2 * y) / 17.0),
    dims=("y", "x"),
)
SIZE, STRIDE = 64, 32

# The "model" is the identity, except that it darkens the few cells along the border of
# every patch it sees, as a network with too little context there would.
distance = np.minimum(np.arange(SIZE) + 0.5, SIZE - np.arange(SIZE) - 0.5)
vignette = 1 - 0.45 * np.exp(-distance / 4)
darken = xr.DataArray(np.outer(vignette, vignette), dims=("y", "x"))

results = {}
for window in ("boxcar", "hann"):
    p = image.patch(y=SIZE, x=SIZE, stride=STRIDE, window=window)
    results[window] = p.reconstruct(p.patches() * darken)

fig, axes = plt.subplots(2, 3, figsize=(10, 5.6), layout="constrained")
panels = {
    "input": image,
    'reconstruct, window="boxcar"': results["boxcar"],
    'reconstruct, window="hann"': results["hann"],
}
for ax, (title, values) in zip(axes[0], panels.items()):
    shown = ax.imshow(values, cmap="gray", vmin=0.2, vmax=1.0, interpolation="nearest")
    ax.set_title(title)
fig.colorbar(shown, ax=axes[0], shrink=0.8)
axes[1, 0].imshow(darken, cmap="gray", vmin=0.2, vmax=1.0, interpolation="nearest")
axes[1, 0].set_title(f"the model's factor over a {SIZE} x {SIZE} patch")
inside = (slice(SIZE // 4, -SIZE // 4),) * 2  # away from the array's own edges
for ax, window in zip(axes[1, 1:], ("boxcar", "hann")):
    error = results[window] - image
    shown = ax.imshow(error, cmap="RdBu", vmin=-0.3, vmax=0.3, interpolation="nearest")
    ax.set_title(f"error, {window}: max {float(abs(error[inside]).max()):.3f} inside")
fig.colorbar(shown, ax=axes[1], shrink=0.8, label="output - input")
fig.suptitle(f"Patches of {SIZE} x {SIZE}, stride {STRIDE}, through a model with a border artefact")
