"""Plan benchmarks of xpatch: graph tasks per input chunk, build time, reconstruct's peak memory.

Run ``python benchmarks/bench_plan.py`` (under a minute on 2 cores) or ``--quick`` (~10 s).

Only the public API is used (``.patch``, ``patches``, ``reconstruct``, ``apply``, the
samplers, ``xpatch.write``), so the figures compare across refactors of the internals.

1. Graph size: for a regular grid, ``RandomAnchors`` and scattered explicit ``Anchors``
   on a lazy ``(4, n, n)`` input, the tasks that ``p.patches()``,
   ``p.reconstruct(pred)`` (predictions one patch per chunk), ``p.reconstruct(p.patches())``
   and ``p.apply(...)`` add to the graph of their input, per input chunk, and the time to
   build each graph. Everything is built under a dask scheduler that refuses to run and
   counts its calls (plus a callback counting local-scheduler runs): building computes
   nothing.
2. Peak memory: ``p.reconstruct(p.patches() * 2)`` with ``RandomAnchors`` on a lazy 2-D
   grid, streamed by a reduction (and by ``xpatch.write`` to zarr), each in a fresh
   process (``--child``) under an address-space limit and a timeout, next to a baseline
   process that only reduces the same lazy input and one that only imports xpatch.

Task counts are deterministic. Times and memory are printed next to a baseline measured
in the same run, as ratios, because absolute figures on a shared machine are noisy.
Nothing is asserted: the script prints tables, then one summary line per figure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import dask
import dask.array as dsa
import numpy as np
import xarray as xr

# Shared with the other benchmarks (this folder is on sys.path when a script runs).
from bench_core import fmt_time, print_table, version_line
from dask.callbacks import Callback

import xpatch

MiB = 2**20
GiB = 2**30


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of one run (full or quick)."""

    graph_grid: int  # square (4, n, n) input of part 1
    graph_chunk: int
    random_count: int  # RandomAnchors(count) of part 1
    anchor_count: int  # scattered explicit Anchors of part 1
    batch: int
    mem_grid: int  # square (n, n) input of part 2
    mem_chunk: int
    mem_count: int  # RandomAnchors(count) of part 2
    timeout: float  # seconds per part-2 process
    patch: int = 256
    stride: int = 192
    bands: int = 4
    limit: int = 8 * GiB  # RLIMIT_AS of a part-2 process


FULL = Sizes(8192, 1024, 5000, 10_000, 64, 16384, 2048, 2000, 1800.0)
# Same number of input chunks (64) and the same patch density in part 1.
QUICK = Sizes(4096, 512, 1250, 2500, 64, 8192, 1024, 500, 300.0)


# -- helpers ----------------------------------------------------------------------------


def lazy_input(shape: tuple[int, ...], chunks: tuple[int, ...], dims: tuple[str, ...]):
    """A float32 uniform[0, 1) DataArray generated lazily by dask (seed 0)."""
    data = dsa.random.default_rng(0).random(shape, dtype=np.float32, chunks=chunks)
    return xr.DataArray(data, dims=dims, name="data")


def graph_keys(obj: xr.DataArray) -> set:
    """The keys of a dask-backed DataArray's materialised graph, its lazy coordinates' too.

    ``pred.chunk(patch=1)`` chunks the ``{dim}_anchor`` coordinates as well; their
    tasks are the prediction's, not the reconstruction's.
    """
    keys = set(dict(obj.data.__dask_graph__()))
    for coord in obj.coords.values():
        if coord.chunks is not None:
            keys |= set(dict(coord.data.__dask_graph__()))
    return keys


class RefusingScheduler:
    """A dask scheduler that refuses to run anything and counts how often it was asked."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, dsk, keys, **kwargs):
        self.calls += 1
        raise ComputeRefused("dask was asked to compute while building a graph")


class ComputeRefused(RuntimeError):
    """A dask computation started where none was expected."""


class ComputeCounter(Callback):
    """Count the computations that a local dask scheduler starts (whatever the config)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def _start(self, dsk) -> None:
        self.count += 1


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    """``fn()`` and its wall time in seconds."""
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def short(error: BaseException, width: int = 70) -> str:
    """An exception as ``Type: message`` on one line."""
    text = f"{type(error).__name__}: {error}".splitlines()[0]
    return text if len(text) <= width else text[: width - 3] + "..."


def fmt_mib(nbytes: float) -> str:
    """Bytes as MiB."""
    return f"{nbytes / MiB:,.0f} MiB"


# -- 1. graph tasks per input chunk --------------------------------------------------------


def samplers(s: Sizes) -> list[tuple[str, object]]:
    """The three samplers of part 1, each with a label."""
    rng = np.random.default_rng(0)
    high = s.graph_grid - s.patch + 1  # starts in [0, n - patch]
    ys = rng.integers(0, high, s.anchor_count)
    xs = rng.integers(0, high, s.anchor_count)
    return [
        ("regular grid (None)", None),
        (f"RandomAnchors({s.random_count}, seed=0)", xpatch.RandomAnchors(s.random_count, seed=0)),
        (f"Anchors({s.anchor_count:,} scattered)", xpatch.Anchors({"y": ys, "x": xs})),
    ]


def graph_case(data: xr.DataArray, sampler: object, s: Sizes) -> dict:
    """Tasks and build times of the four operations for one sampler; nothing computed."""
    input_keys = graph_keys(data)
    refuse = RefusingScheduler()
    counter = ComputeCounter()
    ops: dict[str, dict] = {}
    figures: dict = {"ops": ops}

    def attempt(build: Callable[[], xr.DataArray], base: Callable[[], set]) -> tuple:
        result, build_s = timed(build)
        keys, mat_s = timed(lambda: graph_keys(result))
        return result, {"tasks": len(keys - base()), "build": build_s, "materialise": mat_s}

    def op(label: str, build: Callable[[], xr.DataArray], base: Callable[[], set]) -> object:
        """Build one graph; record its new tasks, build and materialise times, or failure.

        If building asks dask to compute, the refusing scheduler makes it fail; then it is
        built again with the synchronous scheduler allowed, to count the computations and
        still measure the graph.
        """
        refused, runs = refuse.calls, counter.count
        try:
            result, figures = attempt(build, base)
            figures["computes"] = refuse.calls - refused + counter.count - runs
        except Exception as error:
            if refuse.calls == refused:  # a failure of its own: report, keep going
                ops[label] = {"failed": short(error)}
                return None
            runs = counter.count
            try:
                with dask.config.set(scheduler="sync"):
                    result, figures = attempt(build, base)
            except Exception as again:
                ops[label] = {"failed": f"computes while building, then {short(again)}"}
                return None
            figures["computes"] = counter.count - runs
            figures["refused"] = True
        ops[label] = figures
        return result

    with counter, dask.config.set(scheduler=refuse):
        try:  # the patcher and its anchors (len) must not compute either
            p, seconds = timed(
                lambda: data.patch(y=s.patch, x=s.patch, stride=s.stride, sampler=sampler)
            )
            n, anchors_s = timed(lambda: len(p))
            figures.update(patches=n, patcher=seconds, anchors=anchors_s)
        except Exception as error:
            figures["failed"] = short(error)
            p = None
        setup_computes = refuse.calls + counter.count
        if p is not None:
            patches = op("patches()", p.patches, lambda: input_keys)
            if patches is not None:
                figures["groups"] = patches.data.npartitions
                pred = patches.chunk(patch=1)
                pred_keys = graph_keys(pred)
                op("reconstruct(pred, 1/chunk)", lambda: p.reconstruct(pred), lambda: pred_keys)
                patch_keys = graph_keys(patches)
                op("reconstruct(patches())", lambda: p.reconstruct(patches), lambda: patch_keys)
            op(
                f"apply(b -> b, batch_size={s.batch})",
                lambda: p.apply(lambda b: b, batch_size=s.batch),
                lambda: input_keys,
            )
    figures["computes"] = setup_computes + sum(o.get("computes", 0) for o in ops.values())
    return figures


def bench_graph(s: Sizes) -> dict:
    """Part 1: tasks per input chunk of each operation and sampler."""
    n, c, b = s.graph_grid, s.graph_chunk, s.bands
    data = lazy_input((b, n, n), (b, c, c), ("band", "y", "x"))
    n_chunks = data.data.npartitions
    cases = []
    for label, sampler in samplers(s):
        print(f"  part 1: {label} ...", file=sys.stderr, flush=True)
        cases.append((label, graph_case(data, sampler, s)))
    rows = []
    for label, f in cases:
        if "failed" in f:
            rows.append([label, "", "", "", f"failed: {f['failed']}", "", "", "", "", ""])
            continue
        for i, (name, o) in enumerate(f["ops"].items()):
            head = (
                [label, f"{f['patches']:,}", f"{f.get('groups', 0):,}", fmt_time(f["anchors"])]
                if i == 0
                else ["", "", "", ""]
            )
            if "failed" in o:
                rows.append([*head, name, f"failed: {o['failed']}", "", "", "", ""])
                continue
            rows.append(
                [
                    *head,
                    name,
                    f"{o['tasks']:,}",
                    f"{o['tasks'] / n_chunks:.2f}",
                    fmt_time(o["build"]),
                    fmt_time(o["materialise"]),
                    f"{o['computes']}{' (refused)' if o.get('refused') else ''}",
                ]
            )
    print_table(
        f"1. graph tasks per input chunk: lazy float32 ({b}, {n}, {n}) in ({b}, {c}, {c}) "
        f"chunks ({n_chunks} chunks, {len(data.data.__dask_graph__())} input tasks), "
        f"{s.patch}x{s.patch} patches, stride {s.stride}",
        [
            "sampler",
            "patches",
            "groups",
            "len(p)",
            "operation",
            "tasks",
            "tasks/chunk",
            "build",
            "materialise",
            "computes",
        ],
        rows,
    )
    print(
        "\ntasks = keys of the result's materialised graph that are not in its argument's "
        "graph (the input's for patches() and apply, pred's for reconstruct); "
        "pred = p.patches().chunk(patch=1); groups = dask chunks of p.patches() along "
        "'patch'; len(p) = time of the first len(p) (anchors) on a new patcher; build = "
        "time of the call; materialise = time of dict(graph); single runs, not best-of; "
        "computes = dask computations started while building, under a scheduler that "
        "refuses (and counts) them; '(refused)': building failed on the refusal, so it was "
        "built again with the sync scheduler allowed, whose computations are counted, and "
        "the tasks and times are of that build"
    )
    print(
        "computes while building (patcher, len(p) and the four operations): "
        + ", ".join(f"{label} {f['computes']}" for label, f in cases)
    )
    return {"chunks": n_chunks, "cases": cases}


# -- 2. peak memory of reconstruct (one fresh process per figure) ----------------------------


def peak_rss() -> int:
    """Peak resident memory of this process image, in bytes (``VmHWM``, reset by exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return max_rss()


def max_rss() -> int:
    """``ru_maxrss`` of this process in bytes (KiB on Linux); it survives fork and exec."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


MODES = {
    "import": "import xpatch (numpy, dask, xarray, zarr)",
    "input-sum": "input.sum()",
    "recon-sum": "p.reconstruct(p.patches() * 2), nansum + NaN count",
    "recon-write": "xpatch.write(p.reconstruct(p.patches() * 2), zarr)",
}


def child(args: argparse.Namespace) -> int:
    """One part-2 measurement in this (fresh) process; print its figures as one JSON line."""
    resource.setrlimit(resource.RLIMIT_AS, (args.limit, args.limit))
    import zarr  # noqa: F401  (imported by the write anyway: count it everywhere)

    figures: dict = {"mode": args.mode, "maxrss_start": max_rss(), "import_rss": peak_rss()}
    start = time.perf_counter()
    try:
        if args.mode != "import":
            data = lazy_input((args.n, args.n), (args.chunk, args.chunk), ("y", "x"))
            if args.mode == "input-sum":
                figures["value"] = float(data.data.sum().compute())
            else:
                p = data.patch(
                    y=args.patch,
                    x=args.patch,
                    stride=args.stride,
                    sampler=xpatch.RandomAnchors(args.count, seed=0),
                )
                out = p.reconstruct(p.patches() * 2)
                figures["tasks"] = len(out.data.__dask_graph__())
                if args.mode == "recon-sum":
                    total, nan = dask.compute(dsa.nansum(out.data), dsa.isnan(out.data).sum())
                    figures["value"] = float(total)
                    figures["covered"] = 1 - int(nan) / out.size
                else:
                    figures["blocks"] = xpatch.write(out, args.out, progress=False)
    except BaseException as error:  # MemoryError under the limit, or anything else
        figures["failed"] = short(error)
    figures["seconds"] = time.perf_counter() - start
    figures["peak"] = peak_rss()
    figures["maxrss"] = max_rss()
    print("RESULT " + json.dumps(figures), flush=True)
    return 0


def run_child(mode: str, s: Sizes) -> dict:
    """Run one part-2 measurement in a fresh process, with a timeout."""
    tmp = Path(tempfile.mkdtemp(prefix="xpatch-bench-plan-"))
    options = {
        "mode": mode,
        "n": s.mem_grid,
        "chunk": s.mem_chunk,
        "count": s.mem_count,
        "patch": s.patch,
        "stride": s.stride,
        "limit": s.limit,
        "out": tmp / "out.zarr",
    }
    command = [sys.executable, os.path.abspath(__file__), "--child"]
    for name, value in options.items():
        command += [f"--{name}", str(value)]
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=s.timeout
        )
    except subprocess.TimeoutExpired:
        return {"mode": mode, "failed": f"timeout after {s.timeout:.0f} s", "wall": s.timeout}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"mode": mode, "failed": f"exit {done.returncode}: {tail[:70]}", "wall": wall}
    figures = json.loads(lines[-1].removeprefix("RESULT "))
    figures["wall"] = wall
    return figures


def bench_memory(s: Sizes) -> dict:
    """Part 2: peak RSS of reconstruct against reducing the input alone."""
    runs = {}
    for mode in MODES:
        print(f"  part 2: {mode} ...", file=sys.stderr, flush=True)
        runs[mode] = run_child(mode, s)
    base = runs["input-sum"]
    n, c = s.mem_grid, s.mem_chunk
    rows = []
    for mode, r in runs.items():
        if "failed" in r:
            rows.append([mode, MODES[mode], f"failed: {r['failed']}", "", "", "", "", ""])
            continue
        ok = "failed" not in base
        rows.append(
            [
                mode,
                MODES[mode],
                fmt_mib(r["peak"]),
                f"{r['peak'] / base['peak']:.2f}x" if ok else "",
                fmt_mib(r["maxrss"]),
                f"{r['seconds']:.1f} s",
                f"{r['seconds'] / base['seconds']:.1f}x" if ok and mode != "import" else "",
                f"{r['wall']:.1f} s",
            ]
        )
    print_table(
        f"2. peak memory: lazy float32 ({n}, {n}) in {c}x{c} chunks, RandomAnchors("
        f"{s.mem_count}, seed=0), {s.patch}x{s.patch} stride {s.stride}, local threads, "
        f"one fresh process per row (RLIMIT_AS {s.limit / GiB:.0f} GiB, timeout "
        f"{s.timeout:.0f} s)",
        [
            "process",
            "what it computes",
            "peak RSS",
            "vs input.sum",
            "ru_maxrss",
            "compute",
            "vs input.sum",
            "process wall",
        ],
        rows,
    )
    print(
        "\npeak RSS = the process's VmHWM at its end; ru_maxrss = getrusage(RUSAGE_SELF) at its "
        "end, which on Linux also carries over the parent's peak through fork and exec (here "
        f"{fmt_mib(runs['import'].get('maxrss_start', 0))} at the start of the import-only "
        "process; the processes run before part 1, while the parent is small); compute = "
        "wall time from building the input to the end of the computation; process wall "
        "includes the interpreter start and the imports"
    )
    details = []
    for mode in ("input-sum", "recon-sum", "recon-write"):
        r = runs[mode]
        if "failed" in r:
            continue
        extra = f"{mode}: graph {r['tasks']:,} tasks, " if "tasks" in r else f"{mode}: "
        if "value" in r:
            extra += f"value {r['value']:.6g}"
        if "covered" in r:
            extra += f", covered cells {r['covered']:.4%}"
        if "blocks" in r:
            extra += f"{r['blocks']} blocks written"
        details.append(extra)
    print("; ".join(details))
    return {"runs": runs}


# -- main ------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options (the ``--child`` ones are for the part-2 subprocesses)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, < 1 min")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=list(MODES), help=argparse.SUPPRESS)
    for name in ("n", "chunk", "count", "patch", "stride", "limit"):
        parser.add_argument(f"--{name}", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run both parts and print the tables and the summary."""
    args = parse(argv)
    if args.child:
        return child(args)
    s = QUICK if args.quick else FULL
    start = time.perf_counter()
    print(version_line("plan", args.quick, f"{os.cpu_count()} cores; xpatch at {xpatch.__file__}"))
    # Memory first, while this process is small (ru_maxrss is inherited by the children).
    mem = bench_memory(s)
    g = bench_graph(s)

    print("\n## summary\n")
    for label, f in g["cases"]:
        if "failed" in f:
            print(f"- graph, {label}: failed: {f['failed']}")
            continue
        parts = []
        for name, o in f["ops"].items():
            if "failed" in o:
                parts.append(f"{name} failed: {o['failed']}")
            else:
                parts.append(
                    f"{name} {o['tasks']:,} tasks ({o['tasks'] / g['chunks']:.2f}/chunk, "
                    f"{o['build'] * 1e3:.0f} ms)"
                )
        print(
            f"- graph, {label}, {f['patches']:,} patches on {g['chunks']} chunks: "
            + "; ".join(parts)
            + f"; computes while building: {f['computes']}"
        )
    runs = mem["runs"]
    base = runs["input-sum"]
    for mode in ("input-sum", "recon-sum", "recon-write"):
        r = runs[mode]
        if "failed" in r:
            print(f"- memory, {MODES[mode]}: failed: {r['failed']}")
        elif "failed" in base or mode == "input-sum":
            print(
                f"- memory, {MODES[mode]}: peak RSS {fmt_mib(r['peak'])} "
                f"(import only: {fmt_mib(runs['import'].get('peak', 0))}), {r['seconds']:.1f} s"
            )
        else:
            print(
                f"- memory, {MODES[mode]}: peak RSS {fmt_mib(r['peak'])} = "
                f"{r['peak'] / base['peak']:.2f}x input.sum ({fmt_mib(base['peak'])}), "
                f"{r['seconds']:.1f} s = {r['seconds'] / base['seconds']:.1f}x"
            )
    print(f"\n(total {time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
