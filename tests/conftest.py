from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

import dask
import numpy as np
import pytest
import xarray as xr
from dask.callbacks import Callback


class ComputeCounter(Callback):
    """Counts every dask graph execution started while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.computes = 0

    def _start(self, dsk) -> None:
        self.computes += 1


@contextlib.contextmanager
def forbid_compute() -> Iterator[ComputeCounter]:
    """Fail on any dask computation: a scheduler that raises, and a counter as well."""

    def refuse(dsk, keys, **kwargs):
        raise AssertionError(
            f"dask was asked to compute {list(keys)[:3]}... where nothing should run"
        )

    with dask.config.set(scheduler=refuse), ComputeCounter() as counter:
        yield counter
    assert counter.computes == 0


@pytest.fixture
def scene() -> xr.DataArray:
    rng = np.random.default_rng(42)
    return xr.DataArray(
        rng.normal(size=(3, 40, 50)),
        dims=("band", "y", "x"),
        coords={
            "band": ["r", "g", "b"],
            "y": 1000.0 - 10.0 * np.arange(40),
            "x": 500.0 + 10.0 * np.arange(50),
        },
        attrs={"units": "reflectance"},
        name="scene",
    )


def sorted_by_anchor(patches):
    """Patches reordered lexicographically by their ``{dim}_anchor`` coordinates.

    Dask input orders patches chunk by chunk, numpy input in the sampler's order;
    sorted by anchor, both stacks must be equal.
    """
    names = [c for c in patches.coords if str(c).endswith("_anchor")]
    order = np.lexsort([patches[c].values for c in reversed(names)])
    return patches.isel(patch=order)


def run_script(code: str) -> str:
    """Run ``code`` in a fresh Python process (say, with a package blocked) and return stdout."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
