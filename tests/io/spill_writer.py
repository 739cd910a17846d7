"""A writer process whose overhangs all spill to disk, for tests/test_spill_folders.py.

Run it as ``python -c "from tests.io.spill_writer import main; main()" OUT POINT`` with
``TMPDIR`` set to the folder where its spill folder must go. It writes once to
``OUT.warm.zarr`` (first-time costs), prints ``ready``, waits for a line on stdin, then writes
:func:`result` to OUT in waves, every overhang piece spilled (a budget of 0
bytes). With ``POINT`` one of :data:`KILL_POINTS` it SIGKILLs itself exactly
there; with ``none`` it runs on (the parent may kill it at any moment) and
prints ``written <seconds>`` at the end.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time

import numpy as np
import xarray as xr

import xpatch
import xpatch.io.block_waves
import xpatch.io.spill_folders

#: Where the writer kills itself.
KILL_POINTS = (
    "unlocked",  # the folder is made, its lock not yet taken
    "locked",  # the folder is made and locked, no file in it yet
    "spilled",  # the first file of pieces is written
    "removing",  # the write is done and the folder half removed, its lock still held
)

#: Seconds each model call sleeps, so that a write lasts long enough for random kills.
SLEEP = 0.03


def model(batch: np.ndarray) -> np.ndarray:
    """An affine map that takes :data:`SLEEP` seconds a batch."""
    time.sleep(SLEEP)
    return batch * 2 + 1


def result() -> xr.DataArray:
    """4 x 4 blocks whose patch groups overhang right and down."""
    values = np.random.default_rng(5).normal(size=(2, 128, 128))
    da = xr.DataArray(values, dims=("band", "y", "x"), name="temp")
    p = da.chunk({"band": 2, "y": 32, "x": 32}).patch(y=8, x=8, stride=6, window="hann")
    return p.apply(model, batch_size=32)


#: Settings of :mod:`xpatch.io.block_waves` that spill every overhang piece, in waves of two
#: blocks (waves of one block would recompute too much here, and run as one).
SPILL_EVERYTHING = {"OVERHANG_BYTES": 0, "BLOCKS_PER_THREAD": 2, "worker_count": lambda: 1}


def kill_after(owner: object, name: str) -> None:
    """Make ``owner.name`` SIGKILL this process once it has returned."""
    real = getattr(owner, name)

    @functools.wraps(real)
    def killing(*args, **kwargs):
        value = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
        return value

    setattr(owner, name, killing)


def remove_one_file_then_die(path: str, **_: object) -> None:
    """Remove one file of the folder, then SIGKILL this process: a clean-up cut short."""
    os.remove(os.path.join(path, sorted(os.listdir(path))[0]))
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    out, point = sys.argv[1], sys.argv[2]
    if point not in (*KILL_POINTS, "none"):
        raise SystemExit(f"unknown kill point {point!r}; one of {KILL_POINTS} or 'none'")
    for name, value in SPILL_EVERYTHING.items():
        setattr(xpatch.io.block_waves, name, value)
    lazy = result()
    # A first write pays numba's compilation and first imports: the timed one is waves.
    xpatch.write(lazy, f"{out}.warm.zarr", progress=False)
    if point == "unlocked":
        kill_after(xpatch.io.spill_folders.tempfile, "mkdtemp")
    elif point == "locked":
        kill_after(xpatch.io.spill_folders.fcntl, "flock")
    elif point == "spilled":
        kill_after(xpatch.io.block_waves.OverhangSpill, "_write")
    elif point == "removing":
        # A file is kept to the end so that the clean-up finds one left.
        xpatch.io.block_waves.OverhangSpill.forget = lambda self, key: None
        xpatch.io.spill_folders.shutil.rmtree = remove_one_file_then_die
    print("ready", flush=True)
    sys.stdin.readline()
    began = time.perf_counter()
    xpatch.write(lazy, out, progress=False)
    print(f"written {time.perf_counter() - began:.4f}", flush=True)
