"""reduce="argmax" of scores that keep their class coordinate: the index, labels as CF flags."""

import numpy as np
import pytest
import xarray as xr

import xpatch  # noqa: F401  (the .patch accessor)

CLASSES = ["water", "land", "urban"]


def three_scores(batch: np.ndarray) -> np.ndarray:
    """(b, y, x) -> (b, 3, y, x): water where low, urban where high, land between."""
    return np.stack([1 - batch, 0.5 - np.abs(batch - 0.5), batch], axis=1)


def reference_labels(values: np.ndarray, size: int, stride: int) -> np.ndarray:
    """The boxcar mean of each patch's scores, then the argmax over the classes."""
    n = values.shape[0]
    total = np.zeros((3, *values.shape))
    count = np.zeros(values.shape)
    for a in range(0, n - size + 1, stride):
        for b in range(0, n - size + 1, stride):
            cut = values[a : a + size, b : b + size]
            total[:, a : a + size, b : b + size] += three_scores(cut[None])[0]
            count[a : a + size, b : b + size] += 1
    return np.argmax(total / count, axis=0)


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
def test_argmax_of_scores_with_a_class_coordinate(lazy):
    # A "cls" coordinate on the scores raised xarray's CoordinateValidationError: it was
    # carried onto the label map, which has no "cls" dim.
    rng = np.random.default_rng(3)
    values = rng.random((12, 12))
    image = xr.DataArray(values, dims=("y", "x"), coords={"y": np.arange(12.0)})
    p = (image.chunk(6) if lazy else image).patch(y=6, x=6, stride=3)
    patches = p.patches()
    scores = xr.DataArray(
        three_scores(np.asarray(patches.values)),
        dims=("patch", "cls", "y", "x"),
        coords={"cls": CLASSES, "colour": ("cls", ["blue", "green", "grey"])},
    )
    if lazy:
        scores = scores.chunk({"patch": 5})
    labels = p.reconstruct(scores, reduce="argmax").compute()
    assert labels.dims == ("y", "x") and labels.dtype == np.uint8
    assert "cls" not in labels.coords and "colour" not in labels.coords
    assert (labels["y"].values == np.arange(12.0)).all()
    np.testing.assert_array_equal(labels.values, reference_labels(values, 6, 3))
    assert labels.attrs["flag_meanings"] == "water land urban"
    assert labels.attrs["flag_values"].tolist() == [0, 1, 2]
    # apply makes the same map from fn's scores (no class names there: no flags).
    applied = p.apply(three_scores, output_dims={"cls": 3}, reduce="argmax").compute()
    np.testing.assert_array_equal(applied.values, labels.values)
    assert "flag_meanings" not in applied.attrs
