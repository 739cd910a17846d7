"""Core benchmarks of xpatch: anchors, round-trip error, eager and lazy overlap-add.

Run ``python benchmarks/bench_core.py`` (a few minutes) or ``--quick`` (< 30 s).

Every speed figure is printed next to a baseline measured in the same run (plain
numpy, memcpy), because absolute times on a shared 2-core machine are noisy. Each
time is the best of several repeats of ``time.perf_counter``. Nothing is asserted:
the script prints tables, then one summary line per figure for an issue note.
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import dask
import dask.array as dsa
import numpy as np
import xarray as xr
from dask.callbacks import Callback

import xpatch

WINDOWS: list[object] = [
    "boxcar",
    "hann",
    "triangular",
    "tukey",
    ("tukey", 0.25),
    ("gaussian", 32.0),
    "blackman",
    "hamming",
]
BOUNDARIES = ("shift", "pad")


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of one run (full or quick)."""

    anchor_grid: int  # square grid extent for figure 1
    anchor_patch: int  # patch size = stride for figure 1
    roundtrip_shape: tuple[int, int, int]
    roundtrip_size: int
    roundtrip_stride: int
    recon_grid: int  # square grid extent for figures 3 and 4
    recon_patch: int
    recon_stride: int
    lazy_chunk: int
    repeat: int


FULL = Sizes(8000, 8, (3, 1000, 1100), 128, 96, 4096, 256, 192, 1024, 7)
QUICK = Sizes(4000, 8, (3, 400, 450), 128, 96, 2048, 256, 192, 512, 3)


# -- helpers ----------------------------------------------------------------------------


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """Best wall time in seconds of ``repeat`` calls of ``fn`` (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def best_of_each(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """:func:`best_of` for several functions, their calls taken in turn.

    A ratio of two sides timed one after the other moves with the machine (a
    busy neighbour, a slower minute) by as much as the targets' margins; taken
    in turn, both sides meet the same minutes.
    """
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            gc.collect()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: min(t) for name, t in times.items()}


class TaskCounter(Callback):
    """Count the dask tasks that a local scheduler runs while active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def _pretask(self, key, dsk, state) -> None:
        self.count += 1


class ComputeCalled(RuntimeError):
    """A dask computation started where none was expected."""


def raising_scheduler(dsk, keys, **kwargs):
    """A dask scheduler that refuses to run anything."""
    raise ComputeCalled(f"dask tried to compute {len(dsk)} task(s)")


def fmt_time(seconds: float) -> str:
    """Seconds as a short string in ms."""
    return f"{seconds * 1e3:9.2f} ms"


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    """Print a plain-text table with right-aligned columns."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    print(f"\n## {title}\n")
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(row, widths)))


# -- 1. anchors for a million patches ------------------------------------------------------


def bench_anchors(s: Sizes) -> dict:
    """Anchors of a regular grid on a lazy dask array; check that nothing is computed."""
    n = s.anchor_grid
    data = xr.DataArray(dsa.zeros((n, n), dtype=np.float32), dims=("y", "x"))
    k = s.anchor_patch

    def run() -> xr.DataArray:
        # A new patcher each time: anchors are cached on the Patcher.
        return data.patch(y=k, x=k, stride=k).anchors()

    counter = TaskCounter()
    with counter, dask.config.set(scheduler=raising_scheduler):
        anchors = run()
        n_patches = anchors.sizes["patch"]
        seconds = best_of(run, s.repeat)
        as_numpy = np.asarray(anchors)

    starts = np.arange(0, n - k + 1, k, dtype=np.int64)

    def baseline() -> np.ndarray:
        mesh = np.meshgrid(starts, starts, indexing="ij")
        return np.stack([m.ravel() for m in mesh], axis=1)

    base = best_of(baseline, s.repeat)
    same = bool(np.array_equal(as_numpy, baseline()))
    rate = n_patches / seconds
    print_table(
        f"1. anchors(): {n}x{n} lazy dask grid, {k}x{k} patches, stride {k}",
        ["patches", "time", "patches/s", "numpy meshgrid", "ratio", "tasks run", "== meshgrid"],
        [
            [
                f"{n_patches:,}",
                fmt_time(seconds),
                f"{rate:,.0f}",
                fmt_time(base),
                f"{seconds / base:.1f}x",
                counter.count,
                same,
            ]
        ],
    )
    return {
        "n": n_patches,
        "ms": seconds * 1e3,
        "rate": rate,
        "ratio": seconds / base,
        "tasks": counter.count,
        "same": same,
    }


# -- 2. round-trip error per window ------------------------------------------------------


def bench_roundtrip(s: Sizes) -> dict:
    """Max round-trip error and min total weight for every window x boundary x dtype."""
    rng = np.random.default_rng(0)
    base = rng.random(s.roundtrip_shape)
    rows = []
    worst = {"float64": (0.0, None), "float32": (0.0, None)}
    min_weight = (np.inf, None)
    problems = []
    for window in WINDOWS:
        for boundary in BOUNDARIES:
            row = [repr(window), boundary]
            weight_min = weight_bad = None
            for dtype in ("float64", "float32"):
                values = base.astype(dtype)
                da_in = xr.DataArray(values, dims=("band", "y", "x"))
                with warnings.catch_warnings():
                    warnings.simplefilter("error")  # no patch may be dropped silently
                    p = da_in.patch(
                        y=s.roundtrip_size,
                        x=s.roundtrip_size,
                        stride=s.roundtrip_stride,
                        window=window,
                        boundary=boundary,
                    )
                    patches = p.patches()
                    out = p.reconstruct(patches)
                diff = np.abs(out.transpose(*da_in.dims).values.astype(np.float64) - values)
                n_nan = int(np.isnan(diff).sum())
                err = float(np.nanmax(diff)) if n_nan < diff.size else np.inf
                if n_nan:
                    err = np.inf
                row += [f"{err:.2e}", n_nan, str(out.dtype)]
                label = f"{window!r}/{boundary}"
                if err > worst[dtype][0] or worst[dtype][1] is None:
                    worst[dtype] = (err, label)
                tol = 1e-6 if dtype == "float64" else 1e-5
                if not err <= tol:
                    problems.append(f"{dtype} error {err:.2e} for {label}")
                if dtype == "float64":
                    ones = xr.ones_like(patches)
                    total = p.reconstruct(ones, reduce="sum").values
                    weight_bad = int((~(total > 0)).sum())  # zero, negative or NaN
                    weight_min = float(np.nanmin(total)) if weight_bad < total.size else np.nan
                    if weight_bad:
                        problems.append(f"{weight_bad} cells with total weight <= 0 for {label}")
                    if weight_min < min_weight[0]:
                        min_weight = (weight_min, label)
            row += [len(p), f"{weight_min:.3e}", weight_bad]
            rows.append(row)
    b, ny, nx = s.roundtrip_shape
    print_table(
        f"2. round trip p.reconstruct(p.patches()) on ({b}, {ny}, {nx}) uniform[0,1), "
        f"size {s.roundtrip_size}, stride {s.roundtrip_stride}",
        [
            "window",
            "boundary",
            "f64 max|err|",
            "f64 NaN",
            "f64 out",
            "f32 max|err|",
            "f32 NaN",
            "f32 out",
            "patches",
            "min Σw",
            "Σw<=0|NaN",
        ],
        rows,
    )
    print("\n(max|err| = inf when the output has NaN cells; Σw from reduce='sum' of ones)")
    return {"worst": worst, "min_weight": min_weight, "problems": problems}


# -- 3. eager reconstruct speed ------------------------------------------------------------


def naive_overlap_add(
    pred: np.ndarray, anchors: np.ndarray, shape: tuple[int, int], w: np.ndarray
) -> np.ndarray:
    """The plain numpy loop every user writes: Σ w·x / Σ w."""
    out = np.zeros(shape, dtype=np.float32)
    wsum = np.zeros(shape, dtype=np.float32)
    sy, sx = w.shape
    for i, (y0, x0) in enumerate(anchors.tolist()):
        sl = (slice(y0, y0 + sy), slice(x0, x0 + sx))
        out[sl] += w * pred[i]
        wsum[sl] += w
    return out / wsum


def bench_eager(s: Sizes) -> dict:
    """Eager ``p.reconstruct`` against a naive numpy loop and a memcpy floor."""
    rng = np.random.default_rng(1)
    n, k, stride = s.recon_grid, s.recon_patch, s.recon_stride
    values = rng.random((n, n), dtype=np.float32)
    data = xr.DataArray(values, dims=("y", "x"))
    p = data.patch(y=k, x=k, stride=stride, window="hann")
    pred = p.patches()
    pred.values  # materialised (numpy already; makes it explicit)  # noqa: B018
    anchors = np.asarray(p.anchors())
    w = p.weights().values.astype(np.float32)
    pred_np = np.asarray(pred.transpose("patch", "y", "x").values)

    t_lib = best_of(lambda: p.reconstruct(pred), s.repeat)
    t_naive = best_of(lambda: naive_overlap_add(pred_np, anchors, (n, n), w), s.repeat)

    # memcpy bandwidth: np.copyto of an output-sized float32 array reads B and writes B.
    src = rng.random((n, n), dtype=np.float32)
    dst = np.empty_like(src)
    t_copy = best_of(lambda: np.copyto(dst, src), max(s.repeat, 10))
    bandwidth = 2 * src.nbytes / t_copy  # bytes read + written per second
    # Minimum traffic of any overlap-add: read every prediction once, write the output
    # once (the window and the weight sum fit in cache or are computed analytically).
    pred_bytes = pred_np.nbytes
    out_bytes = n * n * np.dtype(np.float32).itemsize
    floor = (pred_bytes + out_bytes) / bandwidth

    lib_out = p.reconstruct(pred).values
    agree = float(np.max(np.abs(lib_out - naive_overlap_add(pred_np, anchors, (n, n), w))))
    err = float(np.max(np.abs(lib_out - values)))

    print_table(
        f"3. eager reconstruct: ({n}, {n}) float32, {k}x{k} patches, stride {stride}, hann, "
        f"{len(anchors)} patches",
        ["path", "time", "vs naive loop", "vs memcpy floor"],
        [
            [
                "p.reconstruct(pred)",
                fmt_time(t_lib),
                f"{t_lib / t_naive:.2f}x",
                f"{t_lib / floor:.1f}x",
            ],
            ["numpy loop", fmt_time(t_naive), "1.00x", f"{t_naive / floor:.1f}x"],
            ["memcpy floor", fmt_time(floor), f"{floor / t_naive:.2f}x", "1.0x"],
        ],
    )
    print(
        f"\nfloor model: read predictions ({pred_bytes / 1e6:.1f} MB) + write output "
        f"({out_bytes / 1e6:.1f} MB) = {(pred_bytes + out_bytes) / 1e6:.1f} MB at the "
        f"np.copyto bandwidth {bandwidth / 1e9:.1f} GB/s (read+write bytes of a "
        f"{src.nbytes / 1e6:.1f} MB copy in {t_copy * 1e3:.2f} ms)"
    )
    print(f"max |library - numpy loop| = {agree:.2e}; max |library - input| = {err:.2e}")
    return {
        "lib_ms": t_lib * 1e3,
        "naive_ms": t_naive * 1e3,
        "floor_ms": floor * 1e3,
        "gbps": bandwidth / 1e9,
        "agree": agree,
        "err": err,
        "values": values,
    }


# -- 4. lazy vs eager ----------------------------------------------------------------------


def bench_lazy(s: Sizes, values: np.ndarray) -> dict:
    """Graph size and compute time of the dask round trip against the eager one."""
    n, k, stride, c = s.recon_grid, s.recon_patch, s.recon_stride, s.lazy_chunk
    eager = xr.DataArray(values, dims=("y", "x"))
    lazy = xr.DataArray(dsa.from_array(values, chunks=(c, c)), dims=("y", "x"))
    n_chunks = lazy.data.npartitions

    def eager_run() -> np.ndarray:
        p = eager.patch(y=k, x=k, stride=stride, window="hann")
        return p.reconstruct(p.patches()).values

    def lazy_build() -> xr.DataArray:
        p = lazy.patch(y=k, x=k, stride=stride, window="hann")
        return p.reconstruct(p.patches())

    counter = TaskCounter()
    with counter, dask.config.set(scheduler=raising_scheduler):
        t_build = best_of(lazy_build, s.repeat)
        result = lazy_build()
    graph = dict(result.data.__dask_graph__())
    n_tasks = len(graph)
    n_patches = len(lazy.patch(y=k, x=k, stride=stride))
    layers = result.data.__dask_graph__().layers
    per_layer: dict[str, list[int]] = {}
    for name, layer in layers.items():
        counts = per_layer.setdefault(name.rsplit("-", 1)[0], [0, 0])
        counts[0] += 1
        counts[1] += len(layer)

    # Scaling: a graph proportional to chunks keeps its size when the stride shrinks.
    fine = max(stride // 3, 1)
    with dask.config.set(scheduler=raising_scheduler):
        p_fine = lazy.patch(y=k, x=k, stride=fine, window="hann")
        fine_tasks = len(dict(p_fine.reconstruct(p_fine.patches()).data.__dask_graph__()))
        fine_patches = len(p_fine)

    with dask.config.set(scheduler="threads"):
        run_counter = TaskCounter()
        with run_counter:
            lazy_out = result.values
        t_lazy = best_of(lambda: result.values, s.repeat)
        t_lazy_full = best_of(lambda: lazy_build().values, s.repeat)
    t_eager = best_of(eager_run, s.repeat)
    err = float(np.max(np.abs(lazy_out - values)))
    same = float(np.max(np.abs(lazy_out - eager_run())))

    print_table(
        f"4. lazy round trip: ({n}, {n}) float32 in {c}x{c} dask chunks ({n_chunks} chunks), "
        f"{k}x{k} patches, stride {stride}, hann, {n_patches} patches",
        ["figure", "value"],
        [
            ["tasks in graph", n_tasks],
            ["tasks per input chunk", f"{n_tasks / n_chunks:.1f}"],
            ["tasks per patch", f"{n_tasks / n_patches:.2f}"],
            ["tasks run by compute", run_counter.count],
            [f"tasks in graph at stride {fine} ({fine_patches} patches)", fine_tasks],
            ["computed while building", counter.count],
            ["build graph (lazy)", fmt_time(t_build)],
            ["compute (threads, 2 cores)", fmt_time(t_lazy)],
            ["build + compute", fmt_time(t_lazy_full)],
            ["eager numpy patches+reconstruct", fmt_time(t_eager)],
            ["lazy compute / eager", f"{t_lazy / t_eager:.2f}x"],
            ["max |lazy - input|", f"{err:.2e}"],
            ["max |lazy - eager|", f"{same:.2e}"],
        ],
    )
    print(
        "\ntasks by layer kind (layers/tasks): "
        + ", ".join(f"{name} {n}/{t}" for name, (n, t) in per_layer.items())
    )
    return {
        "tasks": n_tasks,
        "chunks": n_chunks,
        "patches": n_patches,
        "run": run_counter.count,
        "fine": (fine, fine_patches, fine_tasks),
        "built": counter.count,
        "lazy_ms": t_lazy * 1e3,
        "eager_ms": t_eager * 1e3,
        "err": err,
    }


def version_line(kind: str, quick: bool, extra: str) -> str:
    """First line of a benchmark's output: what ran, on which versions."""
    return (
        f"# xpatch {xpatch.__version__} {kind} benchmarks ({'quick' if quick else 'full'}): "
        f"python {platform.python_version()}, numpy {np.__version__}, dask {dask.__version__}, "
        f"xarray {xr.__version__}; {extra}"
    )


# -- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run all benchmarks and print the tables and the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, < 30 s")
    args = parser.parse_args(argv)
    s = QUICK if args.quick else FULL
    start = time.perf_counter()
    print(version_line("core", args.quick, f"best of {s.repeat}"))
    a = bench_anchors(s)
    r = bench_roundtrip(s)
    e = bench_eager(s)
    lz = bench_lazy(s, e.pop("values"))

    (e64, w64), (e32, w32) = r["worst"]["float64"], r["worst"]["float32"]
    wmin, wlabel = r["min_weight"]
    print("\n## summary\n")
    print(
        f"- anchors: {a['n']:,} patches in {a['ms']:.1f} ms ({a['rate'] / 1e6:.1f} M patches/s, "
        f"{a['ratio']:.1f}x a bare numpy meshgrid), {a['tasks']} dask tasks computed"
    )
    print(
        f"- round trip ({len(WINDOWS)} windows x shift/pad): worst max|err| float64 {e64:.1e} "
        f"({w64}), float32 {e32:.1e} ({w32}); min total weight {wmin:.2e} ({wlabel})"
    )
    print(
        f"- eager reconstruct {s.recon_grid}^2 f32, {s.recon_patch}^2 stride {s.recon_stride}: "
        f"{e['lib_ms']:.0f} ms = {e['lib_ms'] / e['naive_ms']:.2f}x a numpy loop "
        f"({e['naive_ms']:.0f} ms), {e['lib_ms'] / e['floor_ms']:.1f}x the memcpy floor "
        f"({e['floor_ms']:.1f} ms at {e['gbps']:.1f} GB/s)"
    )
    print(
        f"- lazy round trip, {lz['chunks']} chunks / {lz['patches']} patches: {lz['tasks']} "
        f"tasks ({lz['tasks'] / lz['chunks']:.1f}/chunk), {lz['built']} computed while building; "
        f"compute {lz['lazy_ms']:.0f} ms = {lz['lazy_ms'] / lz['eager_ms']:.2f}x eager "
        f"({lz['eager_ms']:.0f} ms)"
    )
    fine, fine_patches, fine_tasks = lz["fine"]
    print(
        f"- lazy graph scaling: stride {s.recon_stride} -> {fine} multiplies patches by "
        f"{fine_patches / lz['patches']:.1f}x and tasks by {fine_tasks / lz['tasks']:.1f}x "
        f"({lz['tasks']} -> {fine_tasks}, same {lz['chunks']} chunks)"
    )
    if r["problems"]:
        print("- PROBLEMS: " + "; ".join(r["problems"]))
    print(f"\n(total {time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
