"""xpatch's apply against MONAI's sliding_window_inference on one image: values and time.

Run ``python benchmarks/bench_monai.py`` (about a minute; ``--quick``: seconds). Needs
``pip install torch==2.13.0 monai`` (the test extra has both); without them it says so
and stops.

One image, one conv "model" (a 3x3 mean filter, zero outside the patch), 128² windows
at overlap 0.25 (stride 96), boxcar blending (MONAI's ``mode="constant"``), batches
of 16, both on the CPU with 2 threads. Cases:

- ``constant``: a 992² image, where MONAI's windows coincide with xpatch's
  (``(992 - 128) / 96`` is whole) and nobody pads;
- ``reflect``: a 100 x 992 image, shorter than the window, which MONAI pads on both
  sides (14 rows before, 14 after) and xpatch (``boundary="pad", pad_mode="reflect"``)
  after the end: compared on the rows past the first, where the padding agrees;
- ``2x output``: the filter's result repeated 2 x 2, MONAI's zoomed output against
  ``apply(..., scale=2)`` on the 992² image.

Each time is the best of ``--repeats``; the ratio is MONAI's time over xpatch's
(above 1: xpatch faster). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import numpy as np
import xarray as xr

import xpatch  # noqa: F401  (registers .patch)

ROI, STRIDE, BATCH = 128, 96, 16


def mean3x3(batch: np.ndarray) -> np.ndarray:
    padded = np.pad(batch, [(0, 0)] * (batch.ndim - 2) + [(1, 1), (1, 1)])
    out = np.zeros_like(batch)
    for dy in range(3):
        for dx in range(3):
            out += padded[..., dy : dy + batch.shape[-2], dx : dx + batch.shape[-1]]
    return out / 9


def up2(batch: np.ndarray) -> np.ndarray:
    return np.repeat(np.repeat(mean3x3(batch), 2, axis=-1), 2, axis=-2)


def best(run: Callable[[], np.ndarray], repeats: int) -> tuple[float, np.ndarray]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
    return min(times), out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 320² image, 1 repeat")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        import torch
        from monai.inferers import sliding_window_inference
    except ImportError as error:
        print(f"MONAI comparison skipped: {error}; pip install torch==2.13.0 monai")
        return 0
    torch.set_num_threads(2)
    side = 320 if args.quick else 992
    repeats = 1 if args.quick else args.repeats
    rng = np.random.default_rng(0)

    def theirs(image: np.ndarray, fn, **options) -> np.ndarray:
        x = torch.from_numpy(image[None, None])
        with torch.no_grad():
            out = sliding_window_inference(
                x, (ROI, ROI), BATCH, lambda b: torch.from_numpy(fn(b.numpy())),
                overlap=0.25, mode="constant", **options,
            )  # fmt: skip
        return out[0, 0].numpy()

    square = rng.normal(size=(side, side))
    short = rng.normal(size=(100, side))
    cases = {
        "constant": (
            lambda: theirs(square, mean3x3),
            lambda: xr.DataArray(square, dims=("y", "x"))
            .patch(y=ROI, x=ROI, stride=STRIDE).apply(mean3x3, BATCH).values,
            slice(None),
        ),
        "reflect": (
            lambda: theirs(short, mean3x3, padding_mode="reflect"),
            lambda: xr.DataArray(short, dims=("y", "x"))
            .patch(y=ROI, x=ROI, stride=STRIDE, boundary="pad", pad_mode="reflect")
            .apply(mean3x3, BATCH).values,
            slice(1, None),
        ),
        "2x output": (
            lambda: theirs(square, up2),
            lambda: xr.DataArray(square, dims=("y", "x"))
            .patch(y=ROI, x=ROI, stride=STRIDE).apply(up2, BATCH, scale=2).values,
            slice(None),
        ),
    }  # fmt: skip
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, image {side}² "
          f"(reflect: 100 x {side}), window {ROI}², stride {STRIDE}, batch {BATCH}")  # fmt: skip
    print(f"{'case':<10} {'MONAI s':>8} {'xpatch s':>9} {'ratio':>6} {'max |diff|':>11} shape")
    for name, (monai_run, xpatch_run, rows) in cases.items():
        t_monai, a = best(monai_run, repeats)
        t_ours, b = best(xpatch_run, repeats)
        diff = float(np.abs(a[rows] - b[rows]).max())
        print(f"{name:<10} {t_monai:8.3f} {t_ours:9.3f} {t_monai / t_ours:6.2f} {diff:11.2e} "
              f"{b.shape}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
