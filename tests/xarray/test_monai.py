"""xpatch's ``apply`` against MONAI's ``sliding_window_inference`` where the two layouts agree.

MONAI places windows every ``roi * (1 - overlap)`` cells and moves the last one
back inside the image (xpatch's ``boundary="shift"``); it pads only an image
smaller than the window, on both sides (half before, half after), where xpatch
pads after the end. The comparisons below are where the placements coincide.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xpatch  # noqa: F401 (registers .patch)
from tests.xarray.test_pad_mode import mean3x3

torch = pytest.importorskip("torch")
inferers = pytest.importorskip("monai.inferers")


def monai(image: np.ndarray, fn, **options) -> np.ndarray:
    """MONAI's sliding_window_inference of a numpy ``fn`` over a (y, x) image, 32² windows."""

    def predictor(batch):
        return torch.from_numpy(fn(batch.numpy()))

    x = torch.from_numpy(image[None, None])
    out = inferers.sliding_window_inference(x, (32, 32), 4, predictor, overlap=0.25, **options)
    return out[0, 0].numpy()


def image(shape) -> xr.DataArray:
    return xr.DataArray(np.random.default_rng(0).normal(size=shape), dims=("y", "x"))


@pytest.mark.parametrize("lazy", [False, True])
def test_equal_everywhere_when_the_windows_coincide(lazy):
    # (104 - 32) and (80 - 32) are multiples of MONAI's interval 24: no window moves.
    da = image((104, 80))
    theirs = monai(da.values, mean3x3, mode="constant")
    obj = da.chunk(y=40, x=48) if lazy else da
    ours = obj.patch(y=32, x=32, stride=24).apply(mean3x3).values
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["reflect", "constant"])
def test_padding_equals_monai_past_the_end(mode):
    """An image of 20 rows in 32-row windows: MONAI pads 6 rows before and 6 after.

    Past the last row both pad alike (numpy's reflect, or zeros), so every row but
    the first agrees; MONAI's first row sees padding above it, xpatch's the patch
    edge, which the filter pads with zeros: the same as constant zero padding.
    """
    da = image((20, 80))
    theirs = monai(da.values, mean3x3, mode="constant", padding_mode=mode, cval=0.0)
    options = {"pad_mode": mode} if mode == "reflect" else {"pad_value": 0.0}
    p = da.patch(y=32, x=32, stride=24, boundary="pad", **options)
    ours = p.apply(mean3x3).values
    np.testing.assert_allclose(ours[1:], theirs[1:], rtol=1e-12, atol=1e-12)
    if mode == "constant":
        np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-12, atol=1e-12)
    else:  # the one row where the layouts differ
        assert not np.allclose(ours[0], theirs[0])


def test_twice_the_resolution_equals_monai():
    da = image((104, 80))

    def up2(batch):
        return np.repeat(np.repeat(mean3x3(batch), 2, axis=-1), 2, axis=-2)

    theirs = monai(da.values, up2, mode="constant")
    assert theirs.shape == (208, 160)
    ours = da.patch(y=32, x=32, stride=24).apply(up2, scale=2).values
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)


def test_a_deeper_model_differs_from_monai_in_as_many_rows_as_its_reach():
    """Three 3x3 means in a row reach 3 rows: the rows near the first edge that see
    MONAI's padding above the image differ, 3 of them, not 1 (docs/models.md)."""
    da = image((20, 80))

    def three_layers(batch):
        return mean3x3(mean3x3(mean3x3(batch)))

    theirs = monai(da.values, three_layers, mode="constant", padding_mode="reflect")
    ours = da.patch(y=32, x=32, stride=24, boundary="pad", pad_mode="reflect").apply(three_layers)
    ours = ours.values
    np.testing.assert_allclose(ours[3:], theirs[3:], rtol=1e-12, atol=1e-12)
    for row in range(3):
        assert not np.allclose(ours[row], theirs[row]), row
