"""What the writer tests share: a model that crashes on cue, and a small lazy input."""

from __future__ import annotations

import numpy as np
import xarray as xr


class Affine:
    """``b * k + 1``, counting its calls and patches; raises once ``fail_after`` calls ran.

    ``apply``'s call on a batch of zeros (which finds the output's dims and dtype
    while the graph is built) is counted apart, in ``probes``.

    Its identity (``__dask_tokenize__``) is ``k`` alone: a crashing and a healthy
    instance compute the same thing, so a resumed write may continue the crashed
    one. A plain class (not a closure) so that it pickles; under the synchronous
    scheduler the counters are those of this very object.
    """

    def __init__(self, k: int = 2, fail_after: int | None = None) -> None:
        self.k = k
        self.fail_after = fail_after
        self.calls = 0
        self.patches = 0
        self.probes = 0

    def __dask_tokenize__(self) -> str:
        return f"affine-{self.k}x+1"

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        if len(batch) == 1 and not batch.any():
            # apply's one call on a batch of zeros, while building, that finds the output's
            # dims and dtype: not a patch of the write (the test data are never all zero).
            self.probes += 1
            return batch * self.k + 1
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise RuntimeError("simulated crash in the middle of the run")
        self.calls += 1
        self.patches += len(batch)
        return batch * self.k + 1


def lazy_temperature(seed: int) -> xr.DataArray:
    """(band, y, x) = (2, 64, 64) in 16 x 16 chunks: 16 output blocks, 16 patch groups."""
    rng = np.random.default_rng(seed)
    return xr.DataArray(
        rng.normal(size=(2, 64, 64)),
        dims=("band", "y", "x"),
        coords={"band": [10, 20], "y": 100.0 - 2.0 * np.arange(64), "x": 3.0 * np.arange(64)},
        attrs={"units": "K"},
        name="temp",
    ).chunk({"band": 2, "y": 16, "x": 16})
