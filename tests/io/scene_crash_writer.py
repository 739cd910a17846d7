"""A writer process of several scenes into a folder, for tests/test_scene_writes.py.

Run it as ``python -c "from tests.io.scene_crash_writer import main; main()" FOLDER [options]``
(the model must live in ``tests.io.crash_writer`` in every process, or its fingerprint
differs). It builds :func:`results` (five scenes cut from the crash tests' input, of
different shapes, under one patch layout), imports everything, prints ``ready``,
waits for a line on stdin, then writes them with ``xpatch.write(results, FOLDER)``.

``--kill POINT --at N`` makes it SIGKILL itself at a narrow window: the points of
:mod:`tests.io.crash_writer` (counted over all scenes: ``marker`` at 10 dies in the
third scene), or one of :data:`SCENE_KILL_POINTS`.
"""

from __future__ import annotations

import argparse
import functools
import sys
import threading
import time

import dask
import xarray as xr

import xpatch
from tests.io import crash_writer
from tests.io.crash_writer import Writer, die

COMMAND = [sys.executable, "-c", "from tests.io.scene_crash_writer import main; main()"]

#: Scene name -> (rows, columns) of the crash tests' 256 x 256 input, on its 64-cell chunks.
SCENES = {
    "s1": (slice(0, 128), slice(0, 128)),
    "s2": (slice(0, 64), slice(0, 192)),
    "s3": (slice(64, 256), slice(0, 128)),
    "s4": (slice(0, 128), slice(128, 256)),
    "s5": (slice(128, 256), slice(64, 256)),
}

#: Output blocks per scene (64 x 64 tiles), in the order the scenes are written.
BLOCKS = {"s1": 4, "s2": 3, "s3": 6, "s4": 4, "s5": 6}

SCENE_KILL_POINTS = (
    "scene-started",  # the N-th scene's entry has just become "started"
    "scene-written",  # the N-th scene's write returned; its entry still says "started"
    "scene-done",  # the N-th scene's entry has just become "done"
)


def results(geo: bool = False) -> dict[str, xr.DataArray]:
    """The lazy results every writer writes: model a over each scene, 32 x 32, stride 16."""
    scene = crash_writer.scene(geo)
    scenes = {name: scene.isel(y=rows, x=cols) for name, (rows, cols) in SCENES.items()}
    sp = xpatch.patch_scenes(scenes, y=32, x=32, stride=16, window="hann")
    return sp.apply(crash_writer.model_a, batch_size=4)


def install_scene_kill(point: str, at: int) -> None:
    """Make this process SIGKILL itself at ``point`` of the ``at``-th scene."""
    from xpatch.io import scenes as scene_writes

    count = [0]
    lock = threading.Lock()

    def nth() -> bool:
        with lock:
            count[0] += 1
            return count[0] == at

    if point == "scene-written":
        run_output = scene_writes.run_output

        @functools.wraps(run_output)
        def run_then_die(*args, **kwargs):
            written = run_output(*args, **kwargs)
            if nth():
                die()
            return written

        scene_writes.run_output = run_then_die
        return
    write_entry = scene_writes.Manifest.write
    state_of = {"scene-started": "started", "scene-done": "done"}[point]

    @functools.wraps(write_entry)
    def write_then_die(self, plan, state):
        write_entry(self, plan, state)
        if state == state_of and nth():
            die()

    scene_writes.Manifest.write = write_then_die


class SceneWriter(Writer):
    """The parent's handle on a scene writer process (see :class:`tests.io.crash_writer.Writer`)."""

    command = COMMAND


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments, wait for the parent's go, write the scenes, report."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", help="the output folder")
    parser.add_argument("--format", choices=("zarr", "geotiff"), default="zarr")
    parser.add_argument("--kill", choices=(*crash_writer.KILL_POINTS, *SCENE_KILL_POINTS))
    parser.add_argument("--at", type=int, default=1)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    dask.config.set(num_workers=2)  # as the crash tests' writers: few markers in flight
    lazy = results(geo=args.format == "geotiff")
    crash_writer.warm_up(args.format)
    if args.kill in SCENE_KILL_POINTS:
        install_scene_kill(args.kill, args.at)
    elif args.kill:
        crash_writer.install_kill(args.kill, args.at)
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.perf_counter()
    try:
        written = xpatch.write(lazy, args.out, format=args.format, progress=False)
    except xpatch.XPatchError as error:
        print(f"{type(error).__name__}: {error}", file=sys.stderr, flush=True)
        raise SystemExit(crash_writer.REFUSED) from None
    print(f"written {written} {time.perf_counter() - start:.4f}", flush=True)
