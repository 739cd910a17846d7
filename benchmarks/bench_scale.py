"""Scale benchmarks of xpatch: graph size, lazy vs eager, apply throughput, out-of-core memory.

Run ``python benchmarks/bench_scale.py`` (about a minute on 2 cores) or ``--quick`` (~10 s).

Every figure is a ratio or a count measured in this run (tasks per input chunk,
lazy / eager time, library / numpy-loop rate, peak memory / output size), because
absolute times on a shared 2-core machine are noisy. Each time is the best of
several repeats of ``time.perf_counter``. The out-of-core runs each start a fresh
Python process (``--child``) so that their peak resident memory is their own.
Nothing is asserted: the script prints tables, then one summary line per figure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import dask
import dask.array as dsa
import numpy as np
import xarray as xr

# Shared with the core benchmarks (this folder is on sys.path when a script runs).
from bench_core import best_of, fmt_time, print_table, raising_scheduler, version_line
from dask.callbacks import Callback

import xpatch

MiB = 2**20
#: Peak resident memory an out-of-core write should stay under, whatever the output size.
TARGET_PEAK = 768 * MiB
BANDS = 4
DIMS = ("band", "y", "x")


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of one run (full or quick)."""

    graph_grids: tuple[int, ...]  # square grid extents for figure 1 (the first is the main one)
    graph_chunk: int
    grid: int  # square grid extent for figures 2 and 3
    chunk: int  # dask chunk extent for figures 2 and 3
    ooc_grids: tuple[int, ...]  # square grid extents of the out-of-core writes (figure 4)
    ooc_chunk: int
    patch: int
    stride: int
    batch: int
    repeat: int


FULL = Sizes((8192, 16384), 1024, 4096, 1024, (8192, 16384), 1024, 256, 192, 32, 3)
QUICK = Sizes((2048, 4096), 512, 2048, 512, (2048, 4096), 1024, 256, 192, 32, 2)

#: Figure 5, the memory budget: a 1 GiB output of large chunks and patches at apply's
#: default batch size, whose write should stay under TARGET_BUDGETED at the default budget.
LARGE = Sizes((), 0, 0, 0, (8192,), 2048, 512, 384, 64, 1)
LARGE_QUICK = Sizes((), 0, 0, 0, (4096,), 2048, 512, 384, 64, 1)
TARGET_BUDGETED = 450 * MiB
#: The budget that leaves 2048² chunks whole: how writes ran before there was one.
UNBUDGETED = "4GiB"
#: Figure 5 also writes with a halo (reflect padding) of this many cells.
HALO = 8


# -- helpers ----------------------------------------------------------------------------


class ComputeCounter(Callback):
    """Count the dask computations that a local scheduler starts while active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def _start(self, dsk) -> None:
        self.count += 1


def fmt_mib(nbytes: float) -> str:
    """Bytes as MiB."""
    return f"{nbytes / MiB:,.0f} MiB"


def double(batch: np.ndarray) -> np.ndarray:
    """The cheap model: twice the input."""
    return batch * 2


def lazy_input(n: int, chunk: int, seed: int = 0) -> xr.DataArray:
    """A ``(4, n, n)`` float32 uniform[0, 1) DataArray generated lazily by dask."""
    data = dsa.random.default_rng(seed).random(
        (BANDS, n, n), dtype=np.float32, chunks=(BANDS, chunk, chunk)
    )
    return xr.DataArray(data, dims=DIMS, name="data")


#: A dask token inside a key name: 32 hex digits between dashes or at the end.
TOKEN = re.compile(r"-[0-9a-f]{32}(?=-|$)")


def key_kind(key: object) -> str:
    """A dask key's name without its token.

    ``('xpatch-apply-<token>-partial', 3)`` -> ``'xpatch-apply-partial'``.
    """
    name = key[0] if isinstance(key, tuple) else key
    return TOKEN.sub("", str(name))


# -- 1. graph tasks vs chunks ----------------------------------------------------------


def graph_figures(n: int, s: Sizes) -> dict:
    """Tasks of the lazy round trip and of apply on an ``n x n`` grid; nothing computed."""
    data = lazy_input(n, s.graph_chunk)
    n_chunks = data.data.npartitions
    input_tasks = len(data.data.__dask_graph__())
    counter = ComputeCounter()
    start = time.perf_counter()
    with counter, dask.config.set(scheduler=raising_scheduler):
        p = data.patch(y=s.patch, x=s.patch, stride=s.stride, window="hann")
        n_patches = len(p)
        patches = p.patches()
        recon = p.reconstruct(patches)
        applied = p.apply(lambda b: b * 2, batch_size=s.batch)
        recon_graph = recon.data.__dask_graph__()
        apply_graph = applied.data.__dask_graph__()
        recon_tasks = len(recon_graph)
        apply_tasks = len(apply_graph)
    seconds = time.perf_counter() - start
    # Group the keys by name, not the layers: one layer holds several kinds of tasks
    # (an apply layer has its per-group partials and overhangs and its output blocks).
    kinds: dict[str, dict[str, int]] = {}
    for label, graph in (("reconstruct", recon_graph), ("apply", apply_graph)):
        for key in graph:
            counts = kinds.setdefault(key_kind(key), {})
            counts[label] = counts.get(label, 0) + 1
    return {
        "n": n,
        "chunks": n_chunks,
        "input_tasks": input_tasks,
        "patches": n_patches,
        "groups": patches.data.npartitions,
        "recon": recon_tasks,
        "apply": apply_tasks,
        "recon_per_chunk": (recon_tasks - input_tasks) / n_chunks,
        "apply_per_chunk": (apply_tasks - input_tasks) / n_chunks,
        "computes": counter.count,
        "build_s": seconds,
        "kinds": kinds,
    }


def bench_graph(s: Sizes) -> dict:
    """Graph size of the lazy round trip and of apply against the number of input chunks."""
    figures = [graph_figures(n, s) for n in s.graph_grids]
    rows = []
    for f in figures:
        rows.append(
            [
                f"({BANDS}, {f['n']}, {f['n']})",
                f["chunks"],
                f"{f['patches']:,}",
                f["groups"],
                f["input_tasks"],
                f["recon"],
                f"{f['recon_per_chunk']:.2f}",
                f["apply"],
                f"{f['apply_per_chunk']:.2f}",
                f["computes"],
                fmt_time(f["build_s"]),
            ]
        )
    print_table(
        f"1. graph tasks vs chunks: lazy float32 input in ({BANDS}, {s.graph_chunk}, "
        f"{s.graph_chunk}) chunks, {s.patch}x{s.patch} patches, stride {s.stride}, hann",
        [
            "input",
            "chunks",
            "patches",
            "groups",
            "input tasks",
            "recon tasks",
            "(-input)/chunk",
            "apply tasks",
            "(-input)/chunk",
            "computes",
            "build",
        ],
        rows,
    )
    main = figures[0]
    print(
        "\ntasks by key name (token stripped) at "
        f"{main['n']}^2 (reconstruct / apply): "
        + ", ".join(
            f"{kind} {c.get('reconstruct', 0)}/{c.get('apply', 0)}"
            for kind, c in main["kinds"].items()
        )
    )
    print(
        "(recon = p.reconstruct(p.patches()), apply = p.apply(lambda b: b * 2, "
        f"batch_size={s.batch}); 'computes' = dask computations started while building, "
        "under a scheduler that raises; 'build' includes len(p) and both graphs; "
        "per patch group one '-partial' task (apply: extract + fn + add into the group's box) "
        "and one '-overhang' task (the pieces that overhang into neighbouring blocks; none "
        "if nothing does), "
        "per output block one combine task ('xpatch-apply', 'xpatch-overlap-add'))"
    )
    return {"figures": figures}


# -- 2. lazy vs eager ------------------------------------------------------------------


def bench_lazy(s: Sizes, values: np.ndarray) -> dict:
    """Eager (numpy) against lazy (dask, threads) ``p.reconstruct(p.patches())``."""
    n, c, k = s.grid, s.chunk, s.patch
    eager = xr.DataArray(values, dims=DIMS)
    lazy = xr.DataArray(dsa.from_array(values, chunks=(BANDS, c, c)), dims=DIMS)

    def eager_run() -> np.ndarray:
        p = eager.patch(y=k, x=k, stride=s.stride, window="hann")
        return p.reconstruct(p.patches()).values

    def lazy_run() -> np.ndarray:
        p = lazy.patch(y=k, x=k, stride=s.stride, window="hann")
        return p.reconstruct(p.patches()).values

    with dask.config.set(scheduler="threads"):
        t_lazy = best_of(lazy_run, s.repeat)
        lazy_out = lazy_run()
    t_eager = best_of(eager_run, s.repeat)
    eager_out = eager_run()
    diff = float(np.max(np.abs(lazy_out - eager_out)))
    err = float(np.max(np.abs(lazy_out - values)))
    eager_err = float(np.max(np.abs(eager_out - values)))
    n_patches = len(eager.patch(y=k, x=k, stride=s.stride))
    print_table(
        f"2. lazy vs eager p.reconstruct(p.patches()): ({BANDS}, {n}, {n}) float32 "
        f"({values.nbytes / MiB:.0f} MiB), {k}x{k} patches, stride {s.stride}, hann, "
        f"{n_patches} patches; lazy in {c}x{c} chunks ({lazy.data.npartitions} chunks)",
        ["path", "time", "vs eager", "max |out - input|"],
        [
            ["eager (numpy)", fmt_time(t_eager), "1.00x", f"{eager_err:.2e}"],
            ["lazy compute (threads)", fmt_time(t_lazy), f"{t_lazy / t_eager:.2f}x", f"{err:.2e}"],
        ],
    )
    print(f"\nmax |lazy - eager| = {diff:.2e} (lazy times include building the graph)")
    return {"eager_s": t_eager, "lazy_s": t_lazy, "diff": diff, "err": err, "patches": n_patches}


# -- 3. apply throughput -----------------------------------------------------------------


class CallCounter:
    """Wrap a batch function and count its calls and the patches it saw."""

    def __init__(self, fn: Callable[[np.ndarray], np.ndarray]) -> None:
        self.fn = fn
        self.calls = 0
        self.patches = 0
        self.lock = threading.Lock()

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        with self.lock:
            self.calls += 1
            self.patches += len(batch)
        return self.fn(batch)


def numpy_sliding_window(
    values: np.ndarray,
    anchors: np.ndarray,
    w: np.ndarray,
    fn: Callable[[np.ndarray], np.ndarray],
    batch_size: int,
) -> np.ndarray:
    """The plain numpy loop every user writes: slice, batch, predict, Σ w·p / Σ w."""
    ky, kx = w.shape
    out = np.zeros(values.shape, dtype=np.float32)
    wsum = np.zeros(values.shape[-2:], dtype=np.float32)
    for start in range(0, len(anchors), batch_size):
        corners = anchors[start : start + batch_size].tolist()
        batch = np.stack([values[:, y : y + ky, x : x + kx] for y, x in corners])
        pred = fn(batch)
        for (y, x), q in zip(corners, pred):
            sl = (slice(y, y + ky), slice(x, x + kx))
            out[(slice(None), *sl)] += w * q
            wsum[sl] += w
    return out / wsum


def bench_apply(s: Sizes, values: np.ndarray) -> dict:
    """Patches per second of ``p.apply`` (lazy, threads) against a numpy sliding-window loop."""
    n, c, k = s.grid, s.chunk, s.patch
    lazy = xr.DataArray(dsa.from_array(values, chunks=(BANDS, c, c)), dims=DIMS)
    eager = xr.DataArray(values, dims=DIMS)
    anchors = np.asarray(eager.patch(y=k, x=k, stride=s.stride).anchors())
    w = eager.patch(y=k, x=k, stride=s.stride, window="hann").weights().values
    w = w.astype(np.float32)
    n_patches = len(anchors)

    def lib_run(fn: Callable[[np.ndarray], np.ndarray] = double) -> np.ndarray:
        p = lazy.patch(y=k, x=k, stride=s.stride, window="hann")
        return p.apply(fn, batch_size=s.batch).values

    def base_run(fn: Callable[[np.ndarray], np.ndarray] = double) -> np.ndarray:
        return numpy_sliding_window(values, anchors, w, fn, s.batch)

    with dask.config.set(scheduler="threads"):
        t_lib = best_of(lib_run, s.repeat)
        lib_calls = CallCounter(double)
        lib_out = lib_run(lib_calls)
    t_base = best_of(base_run, s.repeat)
    base_calls = CallCounter(double)
    base_out = base_run(base_calls)
    diff = float(np.max(np.abs(lib_out - base_out)))
    err = float(np.max(np.abs(lib_out - 2 * values)))
    rate_lib, rate_base = n_patches / t_lib, n_patches / t_base
    print_table(
        f"3. apply throughput, fn = b * 2, batch_size {s.batch}: ({BANDS}, {n}, {n}) float32, "
        f"{k}x{k} patches, stride {s.stride}, hann, {n_patches} patches",
        ["path", "time", "patches/s", "vs numpy loop", "fn calls", "mean batch"],
        [
            [
                f"p.apply, lazy {c}x{c} chunks, threads",
                fmt_time(t_lib),
                f"{rate_lib:,.0f}",
                f"{rate_lib / rate_base:.2f}x",
                lib_calls.calls,
                f"{lib_calls.patches / lib_calls.calls:.1f}",
            ],
            [
                "numpy loop, in memory",
                fmt_time(t_base),
                f"{rate_base:,.0f}",
                "1.00x",
                base_calls.calls,
                f"{base_calls.patches / base_calls.calls:.1f}",
            ],
        ],
    )
    print(
        f"\nmax |apply - numpy loop| = {diff:.2e}; max |apply - 2 * input| = {err:.2e}; "
        f"patches through fn per run: apply {lib_calls.patches}, loop {base_calls.patches}"
    )
    print(
        "(apply times include building the graph; the loop adds w * p and w patch by patch, "
        "then divides)"
    )
    return {
        "rate_lib": rate_lib,
        "rate_base": rate_base,
        "patches": n_patches,
        "diff": diff,
        "err": err,
        "calls": (lib_calls.calls, base_calls.calls),
    }


# -- 4. out-of-core peak memory ---------------------------------------------------------


def current_rss() -> int:
    """Resident memory of this process now, in bytes (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def max_rss() -> int:
    """``ru_maxrss`` of this process, in bytes (it is KiB on Linux).

    On Linux it survives fork and exec: a child started by a big parent reports at
    least the parent's peak at the time of the fork. See :func:`peak_rss`.
    """
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_rss() -> int:
    """Peak resident memory of this process image, in bytes (``VmHWM``, reset by exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return max_rss()


class RssSampler(threading.Thread):
    """Sample the resident memory every ``interval`` seconds; keep the peak and when it came."""

    def __init__(self, interval: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.peak = 0
        self.peak_at = 0.0
        self.start_time = time.perf_counter()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            rss = current_rss()
            if rss > self.peak:
                self.peak = rss
                self.peak_at = time.perf_counter() - self.start_time
            time.sleep(self.interval)

    def stop(self) -> None:
        self.stopped.set()
        self.join()


def child(args: argparse.Namespace) -> int:
    """One out-of-core write in this (fresh) process; print its figures as one JSON line."""
    import zarr  # imported by the write anyway: count it in the baseline

    baseline = peak_rss()
    inherited = max_rss()
    sampler = RssSampler()
    sampler.start()
    data = lazy_input(args.n, args.chunk)
    halo = {"halo": args.halo, "pad_mode": "reflect"} if args.halo else {}
    p = data.patch(y=args.patch, x=args.patch, stride=args.stride, window="hann", **halo)
    fn = CallCounter(double)  # thread-safe: counts the patches that went through fn
    start = time.perf_counter()
    # Declared, so that apply does not call fn on a batch of zeros to find them.
    declared = {"output_dims": {"band": BANDS}, "dtype": "float32"}
    result = p.apply(fn, batch_size=args.batch, task_memory=args.task_memory, **declared)
    blocks = xpatch.write(result, args.out, progress=False)
    seconds = time.perf_counter() - start
    peak = peak_rss()
    maxrss = max_rss()
    sampler.stop()
    # Sanity: two output blocks against twice the (regenerated) input.
    stored = zarr.open_group(args.out, mode="r")["data"]
    c = args.chunk
    err = 0.0
    for y0, x0 in ((0, 0), (args.n // 2, args.n // 2 - c // 2)):
        region = (slice(None), slice(y0, y0 + c), slice(x0, x0 + c))
        expected = 2 * data.data[region].compute()
        err = max(err, float(np.max(np.abs(stored[region] - expected))))
    disk = sum(f.stat().st_size for f in Path(args.out).rglob("*") if f.is_file())
    figures = {
        "n": args.n,
        "chunk": c,
        "baseline": baseline,
        "peak": peak,
        "maxrss_start": inherited,
        "maxrss": maxrss,
        "sampled_peak": sampler.peak,
        "peak_at": sampler.peak_at,
        "seconds": seconds,
        "blocks": blocks,
        "patches": len(p),
        "fn_patches": fn.patches,
        "fn_calls": fn.calls,
        "groups": p.patches().data.npartitions,
        "blocks_shape": [max(c) for c in result.chunks[1:]],
        "output": int(np.prod(result.shape)) * result.dtype.itemsize,
        "disk": disk,
        "err": err,
    }
    print("RESULT " + json.dumps(figures))
    return 0


def run_child(n: int, chunk: int, s: Sizes, task_memory: str | None = None, halo: int = 0) -> dict:
    """Run one out-of-core write in a fresh process; delete its output afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="xpatch-bench-scale-"))
    options = {"n": n, "chunk": chunk, "patch": s.patch, "stride": s.stride, "batch": s.batch}
    if task_memory is not None:
        options["task-memory"] = task_memory
    if halo:
        options["halo"] = halo
    command = [sys.executable, os.path.abspath(__file__), "--child"]
    for name, value in options.items():
        command += [f"--{name}", str(value)]
    command += ["--out", str(tmp / "out.zarr")]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(
            f"child for n={n} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        )
    figures = json.loads(lines[-1].removeprefix("RESULT "))
    figures["wall"] = wall
    return figures


def bench_ooc(s: Sizes) -> dict:
    """Peak resident memory of ``xpatch.write(p.apply(...))`` at two output sizes."""
    runs = [run_child(n, s.ooc_chunk, s) for n in s.ooc_grids]
    rows = []
    for r in runs:
        n = r["n"]
        rows.append(
            [
                f"({BANDS}, {n}, {n})",
                fmt_mib(r["output"]),
                f"{r['patches']:,}",
                f"{r['fn_patches']:,}",
                r["groups"],
                r["blocks"],
                fmt_mib(r["baseline"]),
                fmt_mib(r["peak"]),
                fmt_mib(r["maxrss"]),
                fmt_mib(r["peak"] - r["baseline"]),
                f"{r['peak'] / r['output']:.3f}",
                "yes" if r["peak"] < TARGET_PEAK else "NO",
                f"{r['seconds']:.1f} s",
                f"{r['output'] / MiB / r['seconds']:.0f} MiB/s",
                f"{r['err']:.1e}",
            ]
        )
    print_table(
        f"4. out-of-core peak memory: xpatch.write(p.apply(b * 2, batch_size={s.batch}), "
        f"'out.zarr'), float32 input generated by dask in ({BANDS}, {s.ooc_chunk}, "
        f"{s.ooc_chunk}) chunks, {s.patch}x{s.patch} stride {s.stride} hann, local threads "
        "in waves of a few blocks, one fresh process per row",
        [
            "output",
            "size",
            "patches",
            "fn patches",
            "groups",
            "blocks",
            "baseline RSS",
            "peak RSS",
            "ru_maxrss",
            "peak - base",
            "peak/output",
            f"< {TARGET_PEAK // MiB} MiB",
            "write",
            "rate",
            "max|err|",
        ],
        rows,
    )
    print(
        "\nbaseline RSS = the child's VmHWM right after the imports (numpy, dask, xarray, zarr, "
        "xpatch); peak RSS = its VmHWM after the write; ru_maxrss = getrusage after the write, "
        "which on Linux carries over the parent's peak through fork and exec (here "
        f"{fmt_mib(runs[0]['maxrss_start'])} already at the child's start), so VmHWM is used; "
        "patches = len(p); fn patches = the patches that went through fn in the child "
        "(a thread-safe counter in fn); max|err| = two output blocks against 2 x input"
    )
    for r in runs:
        print(
            f"n={r['n']}: sampled peak {fmt_mib(r['sampled_peak'])} at {r['peak_at']:.1f} s "
            f"of {r['seconds']:.1f} s; zarr on disk {fmt_mib(r['disk'])}; "
            f"child wall {r['wall']:.1f} s"
        )
    return {"runs": runs}


def bench_budget(s: Sizes) -> dict:
    """Peak memory and time of a write of large chunks: the default budget against none."""
    n = s.ooc_grids[0]
    runs = {
        "default": run_child(n, s.ooc_chunk, s),
        f"task_memory={UNBUDGETED!r}": run_child(n, s.ooc_chunk, s, UNBUDGETED),
        f"default, halo={HALO}": run_child(n, s.ooc_chunk, s, halo=HALO),
        f"task_memory={UNBUDGETED!r}, halo={HALO}": run_child(
            n, s.ooc_chunk, s, UNBUDGETED, halo=HALO
        ),
    }
    rows = [
        [
            label,
            "x".join(map(str, r["blocks_shape"])),
            r["fn_calls"],
            fmt_mib(r["peak"]),
            fmt_mib(r["peak"] - r["baseline"]),
            f"{r['seconds']:.1f} s",
            f"{r['err']:.1e}",
        ]
        for label, r in runs.items()
    ]
    print_table(
        f"5. the memory budget: xpatch.write(p.apply(b * 2, batch_size={s.batch})) of a "
        f"({BANDS}, {n}, {n}) float32 output, input in ({BANDS}, {s.ooc_chunk}, "
        f"{s.ooc_chunk}) chunks, {s.patch}x{s.patch} stride {s.stride} hann, one fresh process "
        "per row",
        ["task_memory", "working blocks", "fn calls", "peak RSS", "peak - base", "write", "err"],
        rows,
    )
    default, whole, halo_default, halo_whole = runs.values()
    return {"default": default, "whole": whole, "halo": (halo_default, halo_whole)}


# -- main ------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options (the ``--child`` ones are for the out-of-core subprocesses)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, < 1 min")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--chunk", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--patch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--stride", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--task-memory", help=argparse.SUPPRESS)
    parser.add_argument("--halo", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run all benchmarks and print the tables and the summary."""
    args = parse(argv)
    if args.child:
        return child(args)
    s = QUICK if args.quick else FULL
    start = time.perf_counter()
    print(version_line("scale", args.quick, f"{os.cpu_count()} cores; best of {s.repeat}"))
    g = bench_graph(s)
    values = np.random.default_rng(1).random((BANDS, s.grid, s.grid), dtype=np.float32)
    lz = bench_lazy(s, values)
    ap = bench_apply(s, values)
    del values
    oc = bench_ooc(s)
    bu = bench_budget(LARGE_QUICK if args.quick else LARGE)

    print("\n## summary\n")
    for f in g["figures"]:
        print(
            f"- graph ({BANDS}, {f['n']}, {f['n']}), {f['chunks']} chunks, {f['patches']:,} "
            f"patches: reconstruct(patches()) {f['recon_per_chunk']:.2f} tasks/chunk, "
            f"apply {f['apply_per_chunk']:.2f} tasks/chunk (input excluded); "
            f"{f['computes']} computes while building"
        )
    print(
        f"- lazy round trip ({BANDS}, {s.grid}, {s.grid}) f32 in {s.chunk}^2 chunks: "
        f"{lz['lazy_s'] * 1e3:.0f} ms = {lz['lazy_s'] / lz['eager_s']:.2f}x eager "
        f"({lz['eager_s'] * 1e3:.0f} ms), max|lazy - eager| {lz['diff']:.1e}"
    )
    print(
        f"- apply b*2, batch {s.batch}, {ap['patches']} patches: {ap['rate_lib']:,.0f} patches/s "
        f"= {ap['rate_lib'] / ap['rate_base']:.2f}x a numpy sliding-window loop "
        f"({ap['rate_base']:,.0f} patches/s), max|diff| {ap['diff']:.1e}"
    )
    for r in oc["runs"]:
        print(
            f"- out-of-core write {fmt_mib(r['output'])}: peak RSS {fmt_mib(r['peak'])} "
            f"({fmt_mib(r['peak'] - r['baseline'])} over a {fmt_mib(r['baseline'])} baseline) "
            f"= {r['peak'] / r['output']:.3f}x the output; "
            f"{'under' if r['peak'] < TARGET_PEAK else 'OVER'} {TARGET_PEAK // MiB} MiB; "
            f"{r['fn_patches']:,} patches through fn for len(p) = {r['patches']:,} "
            f"({'each once' if r['fn_patches'] == r['patches'] else 'MISMATCH'}); "
            f"{r['seconds']:.1f} s"
        )
    default, whole = bu["default"], bu["whole"]
    print(
        f"- large chunks ({fmt_mib(default['output'])} output, {LARGE.ooc_chunk}^2 chunks, "
        f"{LARGE.patch}^2 patches, batch {LARGE.batch}): peak RSS {fmt_mib(default['peak'])} "
        f"at the default task_memory "
        f"({'under' if default['peak'] < TARGET_BUDGETED else 'OVER'} the target "
        f"{TARGET_BUDGETED // MiB} MiB) = {default['peak'] / whole['peak']:.2f}x the peak "
        f"with chunks whole ({fmt_mib(whole['peak'])}), in "
        f"{default['seconds'] / whole['seconds']:.2f}x the time"
    )
    halo_default, halo_whole = bu["halo"]
    print(
        f"- the same with halo={HALO}: peak RSS {fmt_mib(halo_default['peak'])} at the default "
        f"task_memory, {fmt_mib(halo_whole['peak'])} with chunks whole"
    )
    print(f"\n(total {time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
