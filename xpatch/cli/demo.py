"""``xpatch demo``: the whole story on a synthetic scene built in memory (no download).

Patch the scene, ``apply`` a small model with a Hann window, write the result to
zarr, read it back and check it against the model run on the whole scene. This
module owns it: the scene, the toy model, the run, its checks, its summary and its
command-line options.

Examples
--------
>>> from xpatch.cli import main
>>> main(["demo", "--extent", "128", "--size", "32", "--stride", "24", "--chunks", "64",
...       "--no-progress"])
xpatch demo: synthetic scene, no download
...
OK: both errors are below 1e-05 (float32 tolerance)
0
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import dask
import numpy as np
import xarray as xr
from dask.callbacks import Callback

from xpatch.cli.common import (
    DefaultsOnceFormatter,
    format_sizes,
    non_negative_int,
    positive_int,
    usage_error,
)
from xpatch.core.errors import XPatchError
from xpatch.io import write
from xpatch.patcher import Patcher

DemoWindow = Literal["boxcar", "hann", "triangular", "tukey"]
DEMO_WINDOWS: tuple[str, ...] = get_args(DemoWindow)

#: Largest error the demo accepts: a few float32 ulps of values of order 1.
TOLERANCE = 1e-5

BANDS = ("red", "green", "nir")


def make_scene(extent: int = 1024, *, seed: int = 0, chunks: int | None = 256) -> xr.DataArray:
    """Build a deterministic synthetic multispectral scene.

    Each band is a smooth product of a sine along ``y`` and a cosine along ``x``
    (frequencies and phases drawn from ``seed``) plus a little Gaussian noise.
    Values lie in about ``[0.15, 0.85]``, like surface reflectance.

    Parameters
    ----------
    extent
        Number of cells along ``y`` and along ``x``.
    seed
        Seed of the numpy generator: the same seed gives the same scene everywhere.
    chunks
        Dask chunk size along ``y`` and ``x`` (bands stay whole); ``None`` returns a
        numpy-backed array.

    Returns
    -------
    xarray.DataArray
        float32, dims ``("band", "y", "x")`` with band names, projected ``y``
        (descending, like a raster) and ``x`` coordinates in metres, and attributes.

    Examples
    --------
    >>> scene = make_scene(64, seed=1, chunks=32)
    >>> scene.sizes, scene.dtype, scene.chunks
    (Frozen({'band': 3, 'y': 64, 'x': 64}), dtype('float32'), ((3,), (32, 32), (32, 32)))
    >>> bool(make_scene(64, seed=1, chunks=None).equals(scene))
    True
    """
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 1.0, extent)
    layers = []
    for _ in BANDS:
        freq_y, freq_x = rng.uniform(1.0, 4.0, size=2)
        phase_y, phase_x = rng.uniform(0.0, 2.0 * np.pi, size=2)
        smooth = np.outer(
            np.sin(2.0 * np.pi * freq_y * t + phase_y), np.cos(2.0 * np.pi * freq_x * t + phase_x)
        )
        noise = rng.standard_normal((extent, extent))
        layers.append(0.5 + 0.25 * smooth + 0.02 * np.clip(noise, -5.0, 5.0))
    resolution = 10.0
    scene = xr.DataArray(
        np.stack(layers).astype(np.float32),
        dims=("band", "y", "x"),
        coords={
            "band": list(BANDS),
            "y": 5_000_000.0 - resolution * (np.arange(extent) + 0.5),
            "x": 400_000.0 + resolution * (np.arange(extent) + 0.5),
        },
        name="reflectance",
        attrs={
            "title": "xpatch synthetic demo scene",
            "units": "1",
            "resolution_m": resolution,
            "seed": seed,
        },
    )
    return scene if chunks is None else scene.chunk({"band": -1, "y": chunks, "x": chunks})


def toy_model(bands: xr.DataArray) -> xr.DataArray:
    """Score each cell with a pointwise stand-in model, ``tanh(2 (nir - red) / (nir + red))``.

    It maps ``(..., band, y, x)`` to ``(..., y, x)``: each output cell depends on
    that cell's bands only, so running it patch by patch and reconstructing must
    give the same result as running it on the whole scene.

    Parameters
    ----------
    bands
        Values with a ``"band"`` dim labelled ``"red"`` and ``"nir"`` (and others).

    Returns
    -------
    xarray.DataArray
        Scores in ``(-1, 1)``, named ``"score"``, lazy if ``bands`` is.

    Examples
    --------
    >>> x = xr.DataArray([[0.2], [0.5], [0.6]], dims=("band", "y"), coords={"band": list(BANDS)})
    >>> toy_model(x).round(3).values.tolist()
    [0.762]
    """
    red = bands.sel(band="red", drop=True)
    nir = bands.sel(band="nir", drop=True)
    return np.tanh(2.0 * (nir - red) / (nir + red)).rename("score")


def toy_batch_model(batch: np.ndarray) -> np.ndarray:
    """Score a batch of patches: the numpy form of :func:`toy_model`, for ``p.apply``.

    Parameters
    ----------
    batch
        ``(b, band, y, x)`` with the bands in the order of :data:`BANDS`.

    Returns
    -------
    numpy.ndarray
        ``(b, y, x)`` float32 scores.

    Examples
    --------
    >>> toy_batch_model(np.array([[[[0.2]], [[0.5]], [[0.6]]]])).round(3).tolist()
    [[[0.762]]]
    """
    red = batch[:, BANDS.index("red")]
    nir = batch[:, BANDS.index("nir")]
    return np.tanh(2.0 * (nir - red) / (nir + red)).astype(np.float32)


class CountingFunction:
    """Wrap a batch function and count the patches it sees (thread-safe).

    Examples
    --------
    >>> counted = CountingFunction(np.negative)
    >>> counted(np.ones((3, 2))).shape, counted.patches, counted.calls
    ((3, 2), 3, 1)
    """

    def __init__(self, fn: Callable[[np.ndarray], np.ndarray]) -> None:
        self.fn = fn
        self.patches = 0
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        """Count the batch, then return ``fn(batch)``."""
        with self._lock:
            self.patches += len(batch)
            self.calls += 1
        return self.fn(batch)


class _TaskCounter(Callback):
    """Count the Dask tasks that the local scheduler runs."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def _posttask(self, key, result, dsk, state, worker_id) -> None:
        self.count += 1


@dataclass(frozen=True)
class DemoResult:
    """What ``xpatch demo`` measured.

    Attributes
    ----------
    scene
        The (lazy) input scene.
    patcher
        The patch layout over the scene (its ``window`` is the blending window).
    output
        Where the model output was written (a zarr store).
    patch_tasks, apply_tasks
        Tasks in the graphs of ``p.patches()`` and of ``p.apply(model)``.
    tasks_run_while_building
        Tasks run while the lazy graphs were laid out: 0 when everything is lazy.
    blocks_written
        Output blocks the write streamed to zarr.
    patches_seen, model_calls
        Patches the model received (each once: equal to ``len(patcher)``) and
        the batches it was called with.
    roundtrip_error
        ``max |p.reconstruct(p.patches()) - scene|`` (NaN if a cell came back NaN).
    model_error
        ``max |written output - model(scene)|``.
    scene_seconds, build_seconds, write_seconds, check_seconds
        Wall time to generate the scene, build the lazy graphs, compute and write
        the output, and run the checks.
    """

    scene: xr.DataArray
    patcher: Patcher
    output: Path
    patch_tasks: int
    apply_tasks: int
    tasks_run_while_building: int
    blocks_written: int
    patches_seen: int
    model_calls: int
    roundtrip_error: float
    model_error: float
    scene_seconds: float
    build_seconds: float
    write_seconds: float
    check_seconds: float

    @property
    def ok(self) -> bool:
        """Whether both errors are within :data:`TOLERANCE` and each patch ran once."""
        return bool(
            self.roundtrip_error <= TOLERANCE
            and self.model_error <= TOLERANCE
            and self.patches_seen == len(self.patcher)
        )


def run_demo(
    size: int = 128,
    stride: int = 96,
    window: DemoWindow = "hann",
    chunks: int = 256,
    seed: int = 0,
    extent: int = 1024,
    output: str | Path | None = None,
    progress: bool = False,
) -> DemoResult:
    """Patch a synthetic scene, ``apply`` a toy model, write it to zarr and check it.

    Everything up to the write is lazy. The written output is read back and
    compared with the model run on the whole scene; the round trip
    ``reconstruct(patches())`` is checked too.

    Parameters
    ----------
    size
        Patch extent along ``y`` and ``x``.
    stride
        Step between patch starts along ``y`` and ``x``.
    window
        Blending window of the reconstruction.
    chunks
        Dask chunk size of the scene along ``y`` and ``x``.
    seed
        Seed of the synthetic scene.
    extent
        Scene extent along ``y`` and ``x``.
    output
        The zarr store to write (replaced if it exists); default a temporary
        folder, removed afterwards.
    progress
        Show a progress bar while writing.

    Returns
    -------
    DemoResult
        The measurements; :attr:`DemoResult.ok` tells whether the checks passed.
    """
    with contextlib.ExitStack() as stack:
        if output is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="xpatch-demo-"))
            output = Path(folder) / "score.zarr"
        output = Path(output)
        start = time.perf_counter()
        scene = make_scene(extent, seed=seed, chunks=chunks)
        generated = time.perf_counter()
        model = CountingFunction(toy_batch_model)
        with _TaskCounter() as eager:
            p = Patcher(scene, y=size, x=size, stride=stride, window=window)
            patches = p.patches()
            scores = p.apply(model, batch_size=32, output_dims={}, dtype="float32")
            roundtrip_error = abs(p.reconstruct(patches) - scene).max(skipna=False)
        built = time.perf_counter()
        blocks = write(scores.rename("score"), output, overwrite=True, progress=progress)
        written = time.perf_counter()
        stored = xr.open_zarr(output)["score"]
        model_error = abs(stored - toy_model(scene)).max(skipna=False)
        roundtrip_error, model_error = dask.compute(roundtrip_error, model_error)
        checked = time.perf_counter()
        return DemoResult(
            scene=scene,
            patcher=p,
            output=output,
            patch_tasks=len(patches.data.__dask_graph__()),
            apply_tasks=len(scores.data.__dask_graph__()),
            tasks_run_while_building=eager.count,
            blocks_written=blocks,
            patches_seen=model.patches,
            model_calls=model.calls,
            roundtrip_error=float(roundtrip_error),
            model_error=float(model_error),
            scene_seconds=generated - start,
            build_seconds=built - generated,
            write_seconds=written - built,
            check_seconds=checked - written,
        )


def format_summary(result: DemoResult, kept: bool = False) -> str:
    """Render a :class:`DemoResult` as the human summary ``xpatch demo`` prints.

    Parameters
    ----------
    result
        The output of :func:`run_demo`.
    kept
        Whether the output store was kept (``--output``) or was temporary.

    Returns
    -------
    str
        A few aligned lines, without the verdict (see :attr:`DemoResult.ok`).
    """
    scene, p = result.scene, result.patcher
    chunk_sizes = {dim: max(c) for dim, c in zip(scene.dims, scene.chunks)}
    n_chunks = int(np.prod([len(c) for c in scene.chunks]))
    plural = "" if n_chunks == 1 else "s"
    size = "x".join(str(s) for s in p.size.values())
    stride = "x".join(str(s) for s in p.stride.values())
    total = result.scene_seconds + result.build_seconds + result.write_seconds
    where = str(result.output) if kept else "a temporary zarr store (removed)"
    lines = [
        "xpatch demo: synthetic scene, no download",
        f"  scene       {scene.name} ({format_sizes(dict(scene.sizes))}) {scene.dtype}",
        f"  chunks      ({format_sizes(chunk_sizes)}), {n_chunks} chunk{plural}",
        f"  patches     {len(p)} patches of {size}, stride {stride}, "
        f"window {p.window!r}, boundary {p.boundary!r}",
        f"  apply       toy model on {result.patches_seen} patches in {result.model_calls} "
        f"batches (each patch once)",
        f"  dask tasks  patches() {result.patch_tasks}, apply {result.apply_tasks}; "
        f"{result.tasks_run_while_building} run while building",
        f"  written     {result.blocks_written} blocks of score (y, x) float32 to {where}",
        f"  round trip  max |reconstruct(patches) - scene| = {result.roundtrip_error:.3g}",
        f"  model       max |written output - model(scene)| = {result.model_error:.3g}",
        f"  wall time   {total:.2f} s (scene {result.scene_seconds:.2f} s, lazy graphs "
        f"{result.build_seconds:.2f} s, apply + write {result.write_seconds:.2f} s); "
        f"checks {result.check_seconds:.2f} s",
    ]
    return "\n".join(lines)


def add_demo_command(commands: argparse._SubParsersAction) -> None:
    """Add ``xpatch demo`` and its options to the ``xpatch`` parser's commands."""
    demo = commands.add_parser(
        "demo",
        help="apply a toy model to a synthetic scene patch by patch, write it, check it",
        description=(
            "Build a synthetic 3-band scene in memory (no download), chunk it with Dask, "
            "run a pointwise toy model over overlapping patches with p.apply, blend them by "
            "weighted overlap-add, write the result to zarr block by block, read it back and "
            "check it (and the round trip of the patches) against the whole-scene result "
            f"(tolerance {TOLERANCE:g}). Exit status 0 when the checks pass, 1 when they do "
            "not, 2 on invalid options."
        ),
        formatter_class=DefaultsOnceFormatter,
    )
    demo.add_argument("--size", type=positive_int, default=128, help="patch extent along y and x")
    demo.add_argument(
        "--stride", type=positive_int, default=96, help="step between patch starts (<= size)"
    )
    demo.add_argument("--window", choices=DEMO_WINDOWS, default="hann", help="blending window")
    demo.add_argument("--chunks", type=positive_int, default=256, help="dask chunk size along y/x")
    demo.add_argument("--seed", type=non_negative_int, default=0, help="seed of the scene")
    demo.add_argument(
        "--extent", type=positive_int, default=1024, help="scene extent along y and x"
    )
    demo.add_argument(
        "--output", default=None, help="zarr store to keep the output in (default: temporary)"
    )
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run_demo_command(args: argparse.Namespace) -> int:
    """Run ``xpatch demo`` as parsed; return its exit status."""
    if args.stride > args.size:
        return usage_error(
            "demo",
            f"--stride {args.stride} is larger than --size {args.size}: the cells between "
            "patches would be covered by no patch. Use a stride <= size.",
        )
    if args.size > args.extent:
        return usage_error(
            "demo",
            f"--size {args.size} is larger than the scene (--extent {args.extent}); "
            "use a smaller --size or a larger --extent.",
        )
    try:
        result = run_demo(
            size=args.size,
            stride=args.stride,
            window=args.window,
            chunks=args.chunks,
            seed=args.seed,
            extent=args.extent,
            output=args.output,
            progress=not args.no_progress,
        )
    except XPatchError as error:
        return usage_error("demo", str(error))
    print(format_summary(result, kept=args.output is not None), flush=True)
    if not result.ok:
        print(
            f"xpatch demo: FAILED: an error exceeds {TOLERANCE:g} (float32 tolerance), is "
            "NaN, or a patch did not go through the model exactly once.",
            file=sys.stderr,
        )
        return 1
    print(f"OK: both errors are below {TOLERANCE:g} (float32 tolerance)")
    return 0
