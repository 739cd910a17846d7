"""A writer process for the crash tests (tests/test_crash.py, tests/test_s3.py).

Run it as ``python -c "from tests.io.crash_writer import main; main()" OUT [options]``
(not ``python -m``: the model must live in the module ``tests.io.crash_writer`` in
every process, or its fingerprint differs and a resume is refused). It builds a
deterministic input, imports everything (and writes a tiny output once, so that
no first-time import is left), prints ``ready`` and waits for a line on stdin
before it writes ``p.apply(model)`` to OUT, so that the parent can time a kill
from the start of the write rather than from the start of the imports.
:class:`Writer` is the parent's side.

``--kill POINT`` makes it SIGKILL itself exactly at a narrow window of the write
(see :data:`KILL_POINTS`), by wrapping xpatch's functions in this process only.

``--timeline`` prints ``state <state> <seconds>`` whenever the record changes
state. It prints ``written <blocks> <seconds>`` and exits 0 on success; on an
``XPatchError`` it prints ``<ErrorClass>: <message>`` on stderr and exits
:data:`REFUSED`.
"""

from __future__ import annotations

import argparse
import functools
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

import xpatch

#: How a parent starts a writer process (in the repository's root).
COMMAND = [sys.executable, "-c", "from tests.io.crash_writer import main; main()"]
ROOT = Path(__file__).resolve().parents[2]

#: Exit status of a writer that xpatch refused (an XPatchError).
REFUSED = 3

#: (band, y, x) of the input; the output has one block per CHUNK x CHUNK tile.
SHAPE = (2, 256, 256)
CHUNK = 64

#: Seconds each model call sleeps, so that blocks take long enough for random kills.
SLEEP = 0.015

#: Where a writer can kill itself; see :func:`install_kill`.
KILL_POINTS = (
    "lock-link",  # the lock's temporary copy is written, not yet linked into place
    "takeover",  # a stale lock taken over (claimed and removed), this writer's not created
    "creating",  # the record says "creating", nothing created yet
    "zarr-key",  # inside to_zarr(compute=False), after its --at-th key
    "geotiff-create",  # inside the creation of partial.tif (opened for writing, not closed)
    "created",  # creation done, the record still says "creating"
    "writing",  # the record has just become "writing"
    "block",  # the --at-th block marker is about to be written (after the block's bytes)
    "marker",  # the --at-th block marker has just been written
    "finishing",  # the record has just become "finishing"
    "finished",  # zarr metadata consolidated / GeoTIFF renamed into place, record still there
    "remove",  # record.json deleted, the block markers not yet
    "release",  # everything done but the lock's release
)


def model_a(batch: np.ndarray) -> np.ndarray:
    """The model of most runs."""
    time.sleep(SLEEP)
    return batch * 2 + 1


def model_b(batch: np.ndarray) -> np.ndarray:
    """Another model, for a second writer."""
    time.sleep(SLEEP)
    return batch * 3 - 1


MODELS = {"a": model_a, "b": model_b}


def scene(geo: bool = False) -> xr.DataArray:
    """The input: float32 noise on a regular 10 m grid, in CHUNK x CHUNK dask chunks."""
    band, ny, nx = SHAPE
    values = np.random.default_rng(2024).normal(size=SHAPE).astype("float32")
    da = xr.DataArray(
        values,
        dims=("band", "y", "x"),
        coords={
            "band": np.arange(1, band + 1),
            "y": 4_000_000.0 - 10.0 * np.arange(ny) - 5.0,
            "x": 300_000.0 + 10.0 * np.arange(nx) + 5.0,
        },
        name="scene",
    )
    if geo:
        import rioxarray  # noqa: F401  (registers .rio)

        da = da.rio.write_crs("EPSG:32633")
    return da.chunk({"band": band, "y": CHUNK, "x": CHUNK})


def result(model: str = "a", geo: bool = False) -> xr.DataArray:
    """The lazy result every writer writes: ``model`` over 32 x 32 patches, stride 16."""
    p = scene(geo).patch(y=32, x=32, stride=16, window="hann")
    return p.apply(MODELS[model], batch_size=4)


def warm_up(fmt: str) -> None:
    """Write a tiny result once, so that the timed write pays no first-time imports."""
    import shutil

    folder = tempfile.mkdtemp()
    try:
        tiny = scene(geo=fmt == "geotiff").isel(y=slice(0, 16), x=slice(0, 16)).chunk(8)
        tiny = tiny.patch(y=8, x=8, stride=4).apply(np.negative)
        suffix = ".zarr" if fmt == "zarr" else ".tif"
        xpatch.write(tiny, os.path.join(folder, "warm" + suffix), progress=False)
    finally:
        shutil.rmtree(folder)


def log_states(start: list[float]) -> None:
    """Print when the record changes state: ``state <name> <seconds since go>``."""
    from xpatch.io import record

    write_record = record.ProgressRecord.write

    @functools.wraps(write_record)
    def write(self, state, fingerprint):
        write_record(self, state, fingerprint)
        print(f"state {state} {time.perf_counter() - start[0]:.4f}", flush=True)

    record.ProgressRecord.write = write


def die() -> None:
    """Die here, as a power cut or the OOM killer would: no cleanup at all."""
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def install_kill(point: str, at: int) -> None:
    """Make this process SIGKILL itself at ``point`` (the ``at``-th time, where it counts)."""
    from xpatch.io import geotiff, outputs, record

    if point not in KILL_POINTS:
        raise SystemExit(f"unknown kill point {point!r}; one of {KILL_POINTS}")
    lock = threading.Lock()
    count = [0]

    def nth() -> bool:
        with lock:
            count[0] += 1
            return count[0] == at

    write_record = record.ProgressRecord.write
    last_state = [None]

    @functools.wraps(write_record)
    def write(self, state, fingerprint):
        if point == "created" and state == "writing" and last_state[0] == "creating":
            die()
        write_record(self, state, fingerprint)
        last_state[0] = state
        if state == point:  # creating, writing, finishing
            die()

    record.ProgressRecord.write = write

    if point == "zarr-key":
        from zarr.storage import LocalStore

        creating = threading.Event()
        create = outputs.ZarrOutput.create
        set_key = LocalStore.set

        def create_then_mark(self):
            creating.set()
            create(self)
            raise SystemExit("to_zarr wrote fewer keys than --at; nothing was killed")

        async def set_then_die(self, key, value):
            await set_key(self, key, value)
            if creating.is_set() and nth():
                die()

        outputs.ZarrOutput.create = create_then_mark
        LocalStore.set = set_then_die

    if point == "geotiff-create":
        import rasterio

        open_ = rasterio.open

        def open_then_die(path, mode="r", *args, **kwargs):
            dataset = open_(path, mode, *args, **kwargs)
            if mode == "w":
                die()
            return dataset

        rasterio.open = open_then_die

    if point in ("block", "marker"):
        # The at-th block marker: "block" dies just before it is written (the block's
        # bytes are stored by then), "marker" just after. Local markers are touched
        # files; on an object store, write_marker PUTs them.
        touch = Path.touch

        def touch_then_die(self, *args, **kwargs):
            if "/done/v-" not in str(self):
                return touch(self, *args, **kwargs)
            last = nth()
            if last and point == "block":
                die()
            touch(self, *args, **kwargs)
            if last:
                die()

        write_marker = outputs.write_marker

        def write_marker_then_die(fs, path):
            if record.is_local(fs):
                return write_marker(fs, path)  # counted by touch_then_die
            last = nth()
            if last and point == "block":
                die()
            write_marker(fs, path)
            if last:
                die()

        Path.touch = touch_then_die
        outputs.write_marker = write_marker_then_die

    if point == "finished":
        for cls in (outputs.ZarrOutput, geotiff.GeoTiffOutput):

            def finish_then_die(self, _finish=cls.finish):
                _finish(self)
                die()

            cls.finish = finish_then_die

    if point == "remove":
        remove_record = record.ProgressRecord.remove
        clear_markers = record.ProgressRecord.clear_markers
        removing = threading.Event()

        def remove(self):
            removing.set()
            remove_record(self)

        def clear_then_die(self):
            if removing.is_set():  # record.json is gone by now; the markers are not
                die()
            clear_markers(self)

        record.ProgressRecord.remove = remove
        record.ProgressRecord.clear_markers = clear_then_die

    if point == "release":

        def release(self):
            die()

        record.WriterLock.release = release

    if point == "lock-link":
        link = os.link

        def link_or_die(source, target, *args, **kwargs):
            if str(target).endswith("lock.json"):
                die()
            return link(source, target, *args, **kwargs)

        os.link = link_or_die

    if point == "takeover":
        take_over = record.WriterLock._take_over

        def take_over_then_die(self, info):
            if take_over(self, info):
                die()
            return False

        record.WriterLock._take_over = take_over_then_die


class Writer:
    """The parent's handle on a writer process: it imports, says ready, writes on go."""

    #: The process to start (a subclass names another writer's main).
    command = COMMAND

    def __init__(self, out: Any, fmt: str, *options: str, env: dict | None = None) -> None:
        self.out = out
        self.process = subprocess.Popen(
            [*self.command, str(out), "--format", fmt, *options],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.pid = self.process.pid

    def ready(self, timeout: float = 60.0) -> None:
        """Wait until the writer has imported everything and built its input."""
        readable, _, _ = select.select([self.process.stdout], [], [], timeout)
        line = self.process.stdout.readline() if readable else ""
        if line.strip() != "ready":
            if self.process.poll() is None:
                self.process.kill()
            _, stderr = self.process.communicate()  # read before the pipes close
            raise AssertionError(f"writer not ready: {line!r}; stderr: {stderr}")

    def go(self, timeout: float = 60.0) -> float:
        """Wait until the writer is ready, let it write; return when it started."""
        self.ready(timeout)
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        return time.perf_counter()

    def signal(self, signum: int) -> bool:
        """Send ``signum``; return whether the writer was still running."""
        if self.process.poll() is not None:
            return False
        self.process.send_signal(signum)
        return True

    def wait(self, timeout: float = 60.0) -> tuple[int, str, str]:
        """Wait for the exit and reap the process (a zombie's lock would look alive)."""
        try:
            out, err = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        return self.process.returncode, out, err

    def stop(self) -> None:
        """Kill the writer if it still runs, and reap it."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments, wait for the parent's go, write, report."""
    global SLEEP

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", help="local path or URL of the output")
    parser.add_argument("--model", choices=sorted(MODELS), default="a")
    parser.add_argument("--format", choices=("zarr", "geotiff"), default="zarr")
    parser.add_argument("--kill", choices=KILL_POINTS)
    parser.add_argument("--at", type=int, default=1)
    parser.add_argument("--sleep", type=float, default=SLEEP)
    parser.add_argument("--break-lock", action="store_true")
    parser.add_argument("--no-wait", action="store_true", help="write without waiting for go")
    parser.add_argument("--timeline", action="store_true", help="print the record's states")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    SLEEP = args.sleep

    storage_options = None
    endpoint = os.environ.get("XPATCH_TEST_S3_ENDPOINT")  # moto's server, for s3:// URLs
    if endpoint and "://" in args.out:
        storage_options = {
            "key": "x",
            "secret": "y",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }
    # Two writer threads on any machine: the tests bound how many markers can be in
    # flight when the process dies by this number.
    import dask

    dask.config.set(num_workers=2)
    lazy = result(args.model, geo=args.format == "geotiff")
    warm_up(args.format)
    start = [0.0]
    if args.timeline:
        log_states(start)
    if args.kill:
        install_kill(args.kill, args.at)
    print("ready", flush=True)
    if not args.no_wait:
        sys.stdin.readline()
    start[0] = time.perf_counter()
    try:
        written = xpatch.write(
            lazy,
            args.out,
            format=args.format,
            progress=False,
            break_lock=args.break_lock,
            storage_options=storage_options,
        )
    except xpatch.XPatchError as error:
        print(f"{type(error).__name__}: {error}", file=sys.stderr, flush=True)
        raise SystemExit(REFUSED) from None
    print(f"written {written} {time.perf_counter() - start[0]:.4f}", flush=True)
