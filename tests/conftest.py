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
    """Counts the dask graph executions of the local schedulers while it is active.

    Dask runs callbacks only in its own schedulers (threaded, processes, sync);
    under a custom scheduler function use :func:`forbid_compute`, which counts
    inside the scheduler.
    """

    def __init__(self) -> None:
        super().__init__()
        self.computes = 0

    def _start(self, dsk) -> None:
        self.computes += 1


class RefusedComputes:
    """The computations a refusing scheduler was asked for (each also raised)."""

    def __init__(self) -> None:
        self.computes = 0
        self.keys: list = []


@contextlib.contextmanager
def forbid_compute() -> Iterator[RefusedComputes]:
    """Fail on any dask computation: the scheduler raises, and counts the attempts.

    The count catches a computation whose error the code under test swallowed.
    """
    refused = RefusedComputes()

    def refuse(dsk, keys, **kwargs):
        refused.computes += 1
        refused.keys.append(list(keys)[:3])
        raise AssertionError(
            f"dask was asked to compute {list(keys)[:3]}... where nothing should run"
        )

    with dask.config.set(scheduler=refuse):
        yield refused
    assert refused.computes == 0, f"{refused.computes} computation(s) attempted: {refused.keys}"


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
