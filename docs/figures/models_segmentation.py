"""Figure: a 3-class segmentation model blended into a label map (argmax) and by a vote."""

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
from matplotlib.colors import ListedColormap

import xpatch  # noqa: F401  (registers .patch)

y, x = np.mgrid[0:160, 0:200]
field = np.sin(x / 19.0) + np.cos(y / 23.0) + 0.3 * np.sin((x - y) / 7.0)
scene = xr.DataArray(field[None], dims=("band", "y", "x"))


def three_class_scores(batch: np.ndarray) -> np.ndarray:
    """(b, 1, y, x) -> (b, 3, y, x) scores, blurred near each patch's border as a CNN's are."""
    value = batch[:, 0]
    edge = np.minimum.outer(np.arange(48) + 1, 48 - np.arange(48)).astype(float)
    confidence = 1 - np.exp(-np.minimum(edge, edge.T) / 6)  # low near the border
    centres = np.array([-1.0, 0.3, 1.5])[None, :, None, None]
    scores = -((value[:, None] - centres) ** 2)
    return scores * confidence + (1 - confidence) * np.random.default_rng(0).normal(
        0, 0.4, scores.shape
    )


p = scene.patch(y=48, x=48, stride=32, window="hann")
labels = p.apply(three_class_scores, output_dims={"class": 3}, reduce="argmax")
per_patch = p.apply(
    lambda b: three_class_scores(b).argmax(axis=1)[:, None].astype("uint8"),
    output_dims={"label": 1},
    dtype="uint8",
    reduce="vote",
).isel(label=0)
truth = np.digitize(field, [-0.35, 0.9])

cmap = ListedColormap(["#3b6ea8", "#e0c36a", "#a33b3b"])
fig, axes = plt.subplots(1, 4, figsize=(12, 3.2), layout="constrained")
axes[0].imshow(field, cmap="gray", interpolation="nearest")
axes[0].set_title("input (one band)")
for ax, (title, values) in zip(
    axes[1:],
    {
        "nearest class centre (the truth)": truth,
        f"argmax of blended scores ({labels.dtype})": labels,
        f"vote of patch labels ({per_patch.dtype})": per_patch,
    }.items(),
):
    ax.imshow(values, cmap=cmap, vmin=0, vmax=2, interpolation="nearest")
    ax.set_title(title)
for ax, values in zip(axes[2:], (labels, per_patch)):
    agree = float((np.asarray(values) == truth).mean())
    ax.set_xlabel(f"{agree:.1%} of cells agree with the truth")
for ax in axes:
    ax.set_xticks([])
    ax.set_yticks([])
fig.suptitle("A 3-class model on 48 x 48 patches, stride 32, hann window: blended, then labels")
