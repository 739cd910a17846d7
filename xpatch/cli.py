"""The ``xpatch`` command.

``xpatch demo`` runs the whole story on a synthetic scene built in memory (no
download): chunk it with Dask, cut it into overlapping patches, run a pointwise toy
model on the patches, put the results back with weighted overlap-add, and check the
result against the model applied to the whole scene.

Examples
--------
>>> main(["demo", "--extent", "128", "--size", "32", "--stride", "24", "--chunks", "64"])
xpatch demo: synthetic scene, no download
...
OK: both errors are below 1e-05 (float32 tolerance)
0
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import dask
import numpy as np
import xarray as xr
from dask.callbacks import Callback

import xpatch
from xpatch.core.errors import XPatchError

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
    patch_tasks, reconstruct_tasks
        Tasks in the graphs of ``p.patches()`` and of the reconstructed model output.
    tasks_run
        Tasks the scheduler ran to compute both checks in one pass.
    tasks_run_while_building
        Tasks run before that, while the patches, reconstructions and checks were
        laid out: 0 when everything is lazy.
    roundtrip_error
        ``max |p.reconstruct(p.patches()) - scene|`` (NaN if a cell came back NaN).
    model_error
        ``max |p.reconstruct(model(p.patches())) - model(scene)|``.
    scene_seconds, build_seconds, compute_seconds
        Wall time to generate the scene (numpy), to build the lazy graphs, and to
        compute.
    """

    scene: xr.DataArray
    patcher: xpatch.Patcher
    patch_tasks: int
    reconstruct_tasks: int
    tasks_run: int
    tasks_run_while_building: int
    roundtrip_error: float
    model_error: float
    scene_seconds: float
    build_seconds: float
    compute_seconds: float

    @property
    def ok(self) -> bool:
        """Whether both errors are finite and within :data:`TOLERANCE`."""
        return bool(self.roundtrip_error <= TOLERANCE and self.model_error <= TOLERANCE)


def run_demo(
    size: int = 128,
    stride: int = 96,
    window: DemoWindow = "hann",
    chunks: int = 256,
    seed: int = 0,
    extent: int = 1024,
) -> DemoResult:
    """Patch a synthetic scene, run a toy model per patch, reconstruct and check.

    Everything up to the final :func:`dask.compute` is lazy; the round trip and
    the model check are computed together, so each input chunk is read once.

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

    Returns
    -------
    DemoResult
        The measurements; :attr:`DemoResult.ok` tells whether the checks passed.
    """
    start = time.perf_counter()
    scene = make_scene(extent, seed=seed, chunks=chunks)
    generated = time.perf_counter()
    with _TaskCounter() as eager:
        p = scene.patch(y=size, x=size, stride=stride, window=window)
        patches = p.patches()
        roundtrip = p.reconstruct(patches)
        scores = p.reconstruct(toy_model(patches))
        # skipna=False: a cell that comes back NaN must fail the check, not vanish from it.
        roundtrip_error = abs(roundtrip - scene).max(skipna=False)
        model_error = abs(scores - toy_model(scene)).max(skipna=False)
    built = time.perf_counter()
    with _TaskCounter() as counter:
        roundtrip_error, model_error = dask.compute(roundtrip_error, model_error)
    done = time.perf_counter()
    return DemoResult(
        scene=scene,
        patcher=p,
        patch_tasks=len(patches.data.__dask_graph__()),
        reconstruct_tasks=len(scores.data.__dask_graph__()),
        tasks_run=counter.count,
        tasks_run_while_building=eager.count,
        roundtrip_error=float(roundtrip_error),
        model_error=float(model_error),
        scene_seconds=generated - start,
        build_seconds=built - generated,
        compute_seconds=done - built,
    )


def _sizes(sizes: dict) -> str:
    return ", ".join(f"{dim}: {n}" for dim, n in sizes.items())


def format_summary(result: DemoResult) -> str:
    """Render a :class:`DemoResult` as the human summary ``xpatch demo`` prints.

    Parameters
    ----------
    result
        The output of :func:`run_demo`.

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
    total = result.scene_seconds + result.build_seconds + result.compute_seconds
    lines = [
        "xpatch demo: synthetic scene, no download",
        f"  scene       {scene.name} ({_sizes(dict(scene.sizes))}) {scene.dtype}",
        f"  chunks      ({_sizes(chunk_sizes)}), {n_chunks} chunk{plural}",
        f"  patches     {len(p)} patches of {size}, stride {stride}, "
        f"window {p.window!r}, boundary {p.boundary!r}",
        f"  dask tasks  patches() {result.patch_tasks}, reconstructed model output "
        f"{result.reconstruct_tasks}; {result.tasks_run} run to check both, "
        f"{result.tasks_run_while_building} while building",
        f"  round trip  max |reconstruct(patches) - scene| = {result.roundtrip_error:.3g}",
        f"  model       max |reconstruct(model(patches)) - model(scene)| = "
        f"{result.model_error:.3g}",
        f"  wall time   {total:.2f} s (scene {result.scene_seconds:.2f} s, lazy graphs "
        f"{result.build_seconds:.2f} s, compute {result.compute_seconds:.2f} s)",
    ]
    return "\n".join(lines)


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
        return value

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _usage_error(message: str) -> int:
    print(f"xpatch demo: error: {message}", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``xpatch`` command."""
    parser = argparse.ArgumentParser(
        prog="xpatch",
        description="Lazy N-D patches of xarray objects and exact weighted overlap-add.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {xpatch.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo = commands.add_parser(
        "demo",
        help="patch a synthetic scene, run a toy model per patch, reconstruct and check",
        description=(
            "Build a synthetic 3-band scene in memory (no download), chunk it with Dask, "
            "cut it into overlapping patches, run a pointwise toy model on the patches, "
            "reconstruct by weighted overlap-add and check the round trip and the model "
            f"output against the whole-scene result (tolerance {TOLERANCE:g}). Exit status "
            "0 when both checks pass, 1 when they do not, 2 on invalid options."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    demo.add_argument("--size", type=_positive_int, default=128, help="patch extent along y and x")
    demo.add_argument(
        "--stride", type=_positive_int, default=96, help="step between patch starts (<= size)"
    )
    demo.add_argument("--window", choices=DEMO_WINDOWS, default="hann", help="blending window")
    demo.add_argument("--chunks", type=_positive_int, default=256, help="dask chunk size along y/x")
    demo.add_argument("--seed", type=_non_negative_int, default=0, help="seed of the scene")
    demo.add_argument(
        "--extent", type=_positive_int, default=1024, help="scene extent along y and x"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``xpatch`` command.

    Parameters
    ----------
    argv
        Arguments without the program name; default ``sys.argv[1:]``.

    Returns
    -------
    int
        Exit status: 0 on success, 1 if the demo's checks fail, 2 on invalid options
        (``argparse`` usage errors exit with 2 through :class:`SystemExit`).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command != "demo":  # pragma: no cover - argparse only accepts known commands
        parser.error(f"unknown command {args.command!r}")
    if args.stride > args.size:
        return _usage_error(
            f"--stride {args.stride} is larger than --size {args.size}: the cells between "
            "patches would be covered by no patch. Use a stride <= size."
        )
    if args.size > args.extent:
        return _usage_error(
            f"--size {args.size} is larger than the scene (--extent {args.extent}); "
            "use a smaller --size or a larger --extent."
        )
    try:
        result = run_demo(
            size=args.size,
            stride=args.stride,
            window=args.window,
            chunks=args.chunks,
            seed=args.seed,
            extent=args.extent,
        )
    except XPatchError as error:
        return _usage_error(str(error))
    print(format_summary(result), flush=True)
    if not result.ok:
        print(
            f"xpatch demo: FAILED: an error exceeds {TOLERANCE:g} (float32 tolerance) or is "
            "NaN; the reconstruction does not match the input.",
            file=sys.stderr,
        )
        return 1
    print(f"OK: both errors are below {TOLERANCE:g} (float32 tolerance)")
    return 0
