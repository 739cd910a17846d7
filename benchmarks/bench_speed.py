"""Issue 13's speed and memory targets, each printed as a ratio measured in this run.

Run ``python benchmarks/bench_speed.py`` (a few minutes on 2 cores, the cluster and
out-of-core writes included) or ``--quick`` (about half a minute: small sizes, no
out-of-core or cluster writes). ``--check`` exits 1 when a figure misses its target
by more than 10x: a gross regression, not machine noise (CI runs ``--quick --check``).

Figures, each beside its target:

1. eager overlap-add (4096² float32, 256² patches, stride 192, hann) against the
   naive numpy loop, with the machine's threads and with one, and against the
   memory-copy floor of reading the predictions and writing the output once;
2. small patches (1024², 8x8 stride 8 boxcar and 16x16 stride 8 hann): microseconds
   per patch of ``reconstruct`` and ``apply``, eager and lazy, and the naive loop's;
3. ``apply(lambda b: b * 2)`` against MONAI's ``sliding_window_inference`` (gaussian)
   on the same array and layout, and against extraction plus overlap-add alone;
4. out of core: peak RSS of ``xpatch.write(p.apply(...))`` at 1 GiB and 4 GiB
   outputs, in fresh processes (``bench_scale.py``'s writer);
5. on a ``LocalCluster(n_workers=2, memory_limit="1GiB")``: the same 4 GiB write,
   peak worker memory, and whether a worker paused, spilled or restarted;
6. the Grain source: first-epoch patches/s against xbatcher and numpy slicing, and
   chunk loads per chunk in a chunk-shuffled epoch with a cache of 8 chunks.

Each time is the best of several repeats, the sides of a ratio timed in turn (so
that both meet the same minutes of a noisy machine); a figure whose library is not
installed (MONAI, xbatcher) says so and is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import dask
import dask.array as dsa
import numpy as np
import xarray as xr

# Shared with the other benchmarks (this folder is on sys.path when a script runs).
from bench_core import best_of, best_of_each, naive_overlap_add

import xpatch
from xpatch.core.blend.overlap_add import overlap_add

MiB = 2**20


@dataclass(frozen=True)
class Sizes:
    big: int  # grid of figure 1
    big_patch: int
    big_stride: int
    small: int  # grid of figure 2
    apply_grid: int  # figure 3
    repeat: int
    heavy: bool  # figures 4 and 5


FULL = Sizes(4096, 256, 192, 1024, 2048, 3, True)
QUICK = Sizes(1024, 64, 48, 512, 512, 2, False)

rows: list[tuple[str, float, str, float, bool]] = []  # figure, value, relation, target, higher


#: glibc's ``mallopt`` parameters, and the values :func:`steady_allocator` gives them.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
STEADY_MMAP, STEADY_TRIM = 32 * MiB, 2**31 - 1


def steady_allocator() -> None:
    """Have glibc keep and reuse freed memory in this process, whatever came before.

    By default glibc maps a large array on its own pages or takes it from its heaps
    depending on the largest block freed so far, and hands freed memory back to the
    OS past a threshold that moves with it: from one process to the next the same
    side of a ratio took fresh pages on every call or none (MONAI's
    ``sliding_window_inference`` 12-13 ms or 18-23 ms, extraction plus overlap-add
    12-14 or 18-20, while ``apply``, which holds no large array, stayed at 8.2-8.8).
    Fixed thresholds give every side its warm allocator, the figures their best
    case. The timing figures call this first; the memory figures (4, 5) measure
    fresh processes of their own, which keep glibc's defaults.
    """
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to steady
        return
    libc.mallopt(M_MMAP_THRESHOLD, STEADY_MMAP)
    libc.mallopt(M_TRIM_THRESHOLD, STEADY_TRIM)


def report(figure: str, value: float, target: float, higher: bool = True) -> None:
    """Record and print one figure beside its target (``higher``: at least, else at most)."""
    met = value >= target if higher else value <= target
    rows.append((figure, value, ">=" if higher else "<=", target, higher))
    relation = ">=" if higher else "<="
    verdict = "met" if met else "NOT met"
    print(f"  {figure:<62} {value:9.2f}   target {relation} {target:<6g} {verdict}")


def skipped(figure: str, why: str) -> None:
    print(f"  {figure:<62} skipped: {why}")


# -- 1. eager overlap-add ------------------------------------------------------------------


def figure_eager(s: Sizes) -> None:
    steady_allocator()
    n, k, stride = s.big, s.big_patch, s.big_stride
    print(f"1. eager overlap-add: ({n}, {n}) float32, {k}² patches, stride {stride}, hann")
    rng = np.random.default_rng(1)
    values = rng.random((n, n), dtype=np.float32)
    p = xr.DataArray(values, dims=("y", "x")).patch(y=k, x=k, stride=stride, window="hann")
    pred = p.patches()
    stack = np.ascontiguousarray(pred.values)
    anchors = np.asarray(p.plan.anchors)
    w = p.weights().values.astype(np.float32)
    dst = np.empty_like(values)
    times = best_of_each(
        {
            "naive": lambda: naive_overlap_add(stack, anchors, (n, n), w),
            "lib": lambda: p.reconstruct(pred),
            "one": lambda: overlap_add(stack, anchors, (n, n), p.blend_window, "mean",
                                       dtype=np.dtype("float32"), threads=1),
            "copy": lambda: np.copyto(dst, values),
        },
        max(s.repeat, 5),
    )  # fmt: skip
    t_naive, t_lib, t_one, t_copy = (times[k] for k in ("naive", "lib", "one", "copy"))
    floor = (stack.nbytes + values.nbytes) / (2 * values.nbytes / t_copy)
    report("naive loop / reconstruct, machine's threads", t_naive / t_lib, 3.0)
    report("naive loop / overlap_add, one thread", t_naive / t_one, 2.0)
    report("reconstruct / memory-copy floor", t_lib / floor, 3.0, higher=False)


# -- 2. small patches --------------------------------------------------------------------


def figure_small(s: Sizes) -> None:
    steady_allocator()
    n = s.small
    print(f"2. small patches on ({n}, {n}) float32: microseconds per patch")
    values = np.random.default_rng(2).random((n, n), dtype=np.float32)
    for size, stride, window in ((8, 8, "boxcar"), (16, 8, "hann")):
        small_case(xr.DataArray(values, dims=("y", "x")), size, stride, window, s)


def small_case(da: xr.DataArray, size: int, stride: int, window: str, s: Sizes) -> None:
    layout = dict(y=size, x=size, stride=stride, window=window)
    p = da.patch(**layout)
    lazy = da.chunk(512).patch(**layout)
    pred = p.patches()
    lazy_pred = lazy.patches().persist()
    stack = np.ascontiguousarray(pred.values)
    w = p.weights().values.astype(np.float32)
    per = 1e6 / len(p)
    # Calls take 2-30 ms, where a pause of the VM is a large share of one: best of 15.
    repeat = 5 * s.repeat
    times = best_of_each(
        {
            "naive": lambda: naive_overlap_add(stack, p.plan.anchors, da.shape, w),
            "reconstruct, eager": lambda: p.reconstruct(pred),
            "reconstruct, lazy": lambda: lazy.reconstruct(lazy_pred).compute(),
            "apply, eager": lambda: p.apply(lambda b: b * 2),
            "apply, lazy": lambda: lazy.apply(lambda b: b * 2).compute(),
        },
        repeat,
    )
    t_naive = times.pop("naive")
    for name, seconds in times.items():
        report(f"{size}x{size}/{stride} {name}: us per patch", seconds * per, 1.0, False)
    report(
        f"{size}x{size}/{stride} naive loop / reconstruct, eager",
        t_naive / times["reconstruct, eager"], 5.0,
    )  # fmt: skip


# -- 3. apply against MONAI and the floor ---------------------------------------------------


def figure_apply(s: Sizes) -> None:
    steady_allocator()
    n, roi = s.apply_grid, 256 if s.apply_grid >= 1024 else 128
    stride = roi * 3 // 4
    print(f"3. apply(b * 2) on ({n}, {n}) float32, {roi}² windows, overlap 0.25, gaussian")
    values = np.random.default_rng(3).random((1, n, n), dtype=np.float32)
    da = xr.DataArray(values, dims=("band", "y", "x"))
    p = da.patch(y=roi, x=roi, stride=stride, window=("gaussian", roi / 8))
    # A call takes ~10 ms: more repeats cost little and steady both sides' best.
    repeat = 5 * s.repeat
    sides: dict[str, Callable[[], object]] = {
        "apply": lambda: p.apply(lambda b: b * 2, batch_size=16),
        "floor": lambda: p.reconstruct(p.patches() * 2),
    }
    try:
        import torch
        from monai.inferers import sliding_window_inference
    except ImportError as error:
        missing = f"{error}: pip install torch monai"
    else:
        missing = None
        torch.set_num_threads(os.cpu_count() or 1)
        x = torch.from_numpy(values[None])

        def monai() -> None:
            with torch.no_grad():
                sliding_window_inference(x, (roi, roi), 16, lambda b: b * 2, overlap=0.25,
                                         mode="gaussian")  # fmt: skip

        sides["monai"] = monai
    times = best_of_each(sides, repeat)
    report("(extraction + overlap-add alone) / apply", times["floor"] / times["apply"], 0.8)
    if missing is not None:
        skipped("MONAI sliding_window_inference / apply", missing)
        return
    report("MONAI sliding_window_inference / apply (throughput)", times["monai"] / times["apply"],
           1.5)  # fmt: skip


# -- 4. out of core ------------------------------------------------------------------------


def figure_ooc(s: Sizes) -> None:
    import bench_scale

    print("4. out of core: peak RSS of xpatch.write(p.apply(b * 2)) in a fresh process")
    sizes = bench_scale.FULL
    runs = {}
    for label, n in (("1 GiB", 8192), ("4 GiB", 16384)):
        runs[label] = bench_scale.run_child(n, sizes.ooc_chunk, sizes)
        peak = runs[label]["peak"] / MiB
        print(f"     {label} output: peak RSS {peak:.0f} MiB in {runs[label]['seconds']:.1f} s")
    report("1 GiB output: peak RSS (MiB)", runs["1 GiB"]["peak"] / MiB, 400, higher=False)
    growth = runs["4 GiB"]["peak"] / runs["1 GiB"]["peak"]
    report("4 GiB output: peak RSS / the 1 GiB one's", growth, 1.10, higher=False)


# -- 5. on a cluster -----------------------------------------------------------------------


def figure_cluster(s: Sizes) -> None:
    import bench_scale
    from distributed import Client, LocalCluster

    print("5. LocalCluster(n_workers=2, memory_limit='1GiB'): a 4 GiB write")
    tmp = tempfile.mkdtemp(prefix="xpatch-bench-speed-")
    peaks: dict[str, int] = {}
    trouble: set[str] = set()
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, memory_limit="1GiB",
                     dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        before = set(client.scheduler_info()["workers"])
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.25):
                try:
                    states = client.run(_worker_state)
                except Exception:  # a worker restarting
                    trouble.add("restarted")
                    continue
                for address, (rss, status, spilled) in states.items():
                    peaks[address] = max(peaks.get(address, 0), rss)
                    if status != "running":
                        trouble.add(status)
                    if spilled:
                        trouble.add("spilled")

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        data = bench_scale.lazy_input(16384, 1024)
        p = data.patch(y=256, x=256, stride=192, window="hann")
        start = time.perf_counter()
        xpatch.write(p.apply(bench_scale.double, batch_size=32), f"{tmp}/out.zarr",
                     progress=False)  # fmt: skip
        seconds = time.perf_counter() - start
        done.set()
        watcher.join()
        if set(client.scheduler_info()["workers"]) != before:
            trouble.add("restarted")
    shutil.rmtree(tmp, ignore_errors=True)
    peak = max(peaks.values(), default=0) / MiB
    print(f"     wrote in {seconds:.1f} s; peak worker RSS {peak:.0f} MiB; events: "
          f"{sorted(trouble) or 'none'}")  # fmt: skip
    report("peak worker memory / memory_limit", peak / 1024, 1.0, higher=False)
    report("workers paused, spilled or restarted (count of kinds)", len(trouble), 0, False)


def _worker_state(dask_worker) -> tuple[int, str, bool]:
    import psutil

    slow = getattr(dask_worker.data, "slow", None)
    return (
        psutil.Process().memory_info().rss,
        dask_worker.status.name,
        bool(slow is not None and len(slow)),
    )


# -- 6. Grain ----------------------------------------------------------------------------------


def figure_grain(s: Sizes) -> None:
    steady_allocator()
    import bench_grain

    n = 4096 if s.heavy else 2048
    chunk = n // 4
    print(f"6. Grain source: (4, {n}, {n}) float32 in {chunk}² chunks, 256² patches, stride 192")
    values = np.random.default_rng(4).random((4, n, n), dtype=np.float32)
    lazy = xr.DataArray(dsa.from_array(values, chunks=(4, chunk, chunk)),
                        dims=("band", "y", "x"))  # fmt: skip
    p = lazy.patch(y=256, x=256, stride=192)
    anchors = p.plan.anchors

    def first_epoch(weights: bool) -> Callable[[], None]:
        def run() -> None:
            src = p.to_grain(weights=weights)
            for i in range(len(src)):
                src[i]

        return run

    def numpy_slicing() -> None:
        for y, x in anchors.tolist():
            values[:, y : y + 256, x : x + 256].copy()

    # An epoch takes ~60 ms, where one pause of the VM moved a best of three by 10 %.
    times = best_of_each(
        {"source": first_epoch(False), "weights": first_epoch(True), "numpy": numpy_slicing},
        5 * s.repeat,
    )
    t_source, t_weights, t_numpy = times["source"], times["weights"], times["numpy"]
    # numpy slicing serves the patches only; so does the source with weights=False.
    report("source first epoch (weights=False) / numpy slicing (rate)", t_numpy / t_source, 0.8)
    print(f"     with weights (the default, 25 % more bytes): {t_numpy / t_weights:.2f} of numpy")
    if bench_grain.xbatcher is None:
        skipped("source / xbatcher, first epoch (rate)", "pip install xbatcher")
    else:
        count = 60
        generator = bench_grain.xbatcher.BatchGenerator(
            lazy.rename("data"), input_dims={"y": 256, "x": 256},
            input_overlap={"y": 64, "x": 64},
        )  # fmt: skip
        # Best of three, as the other sides: one pass (0.1 s) caught the VM's pauses.
        t_xb = best_of(lambda: bench_grain.xbatcher_patches(generator, count), 3) / count
        report("source / xbatcher, first epoch (rate)", t_xb / (t_source / len(p)), 20.0)
        ceiling = t_xb / (t_numpy / len(p))
        print(f"     numpy slicing / xbatcher: {ceiling:.1f} (the ceiling of copying the patches)")
    chunk_bytes = 4 * chunk * chunk * 4
    src = p.to_grain(cache_bytes=8 * chunk_bytes + MiB)
    stats, whole = bench_grain.loads_per_chunk(src, "chunk-local shuffle", threaded=False)
    assert whole
    report("chunk-shuffled epoch: chunk loads per chunk, cache of 8", stats.loads / 16, 1.25,
           higher=False)  # fmt: skip


ROWS_TAG = "ROWS "


def run_alone(number: str, quick: bool) -> None:
    """Run one figure in a fresh process and take its rows.

    Each figure measures in a process of its own: memory that an earlier figure's
    arrays left to glibc (or freed to the OS) changes how many fresh pages the
    next one takes, and on these machines a fresh page costs more than the
    arithmetic on it (the same ``apply`` took 12 or 60 ms after figure 2).
    """
    command = [sys.executable, os.path.abspath(__file__), "--only", number, "--rows"]
    done = subprocess.run([*command, *(["--quick"] if quick else [])], capture_output=True,
                          text=True, check=False)  # fmt: skip
    for line in done.stdout.splitlines():
        if line.startswith(ROWS_TAG):
            rows.extend(tuple(row) for row in json.loads(line.removeprefix(ROWS_TAG)))
        elif not line.startswith("xpatch "):  # the version line, printed once by the parent
            print(line)
    if done.returncode != 0:
        print(done.stderr)
        raise SystemExit(f"figure {number} failed ({done.returncode})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, no heavy writes")
    parser.add_argument("--check", action="store_true", help="exit 1 on a miss by over 10x")
    parser.add_argument("--only", default=None, help="comma-separated figure numbers")
    parser.add_argument("--rows", action="store_true", help=argparse.SUPPRESS)  # for run_alone
    args = parser.parse_args(argv)
    s = QUICK if args.quick else FULL
    import platform

    print(f"xpatch {xpatch.__version__}, numpy {np.__version__}, dask {dask.__version__}, "
          f"python {platform.python_version()}, {os.cpu_count()} cores, "
          f"{'quick' if args.quick else 'full'} run")  # fmt: skip
    figures = {
        "1": figure_eager, "2": figure_small, "3": figure_apply, "4": figure_ooc,
        "5": figure_cluster, "6": figure_grain,
    }  # fmt: skip
    chosen = args.only.split(",") if args.only else list(figures)
    for number in chosen:
        if number in ("4", "5") and not s.heavy:
            print(f"{number}. skipped in a quick run (heavy writes)")
            continue
        if args.only:
            figures[number](s)
        else:
            run_alone(number, args.quick)
    if args.rows:
        print(ROWS_TAG + json.dumps(rows))
        return 0
    gross = [
        figure for figure, value, _, target, higher in rows
        if (value < target / 10 if higher else value > max(target, 0.1) * 10)
    ]  # fmt: skip
    met = sum(
        (value >= target) if higher else (value <= target) for _, value, _, target, higher in rows
    )
    print(f"\n{met} of {len(rows)} targets met; gross regressions (10x): {gross or 'none'}")
    return 1 if args.check and gross else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    raise SystemExit(main())
