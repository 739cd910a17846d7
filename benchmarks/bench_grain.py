"""Grain source benchmarks of xpatch: patches per second against xbatcher and numpy, chunk loads.

Run ``python benchmarks/bench_grain.py`` (about 40 s on 2 cores) or ``--quick`` (< 30 s).

Figure 1 serves every patch of a ``(4, n, n)`` float32 array (256x256 patches,
stride 192) through ``p.to_grain()``, and compares the rate with xbatcher's
``BatchGenerator`` on the same Dask array and with plain numpy slicing of the same
data in memory; then the same on a zarr store of that data, opened with
``xr.open_zarr``. Figure 2 counts chunk loads per input chunk over one epoch in
four orders (sequential, the sweep, the chunk order, Grain's global shuffle) and four
cache sizes. Every speed figure is a ratio to a baseline measured in the same run,
because absolute times on a shared 2-core machine are noisy; each time is the best
of several repeats of ``time.perf_counter``. Nothing is asserted: the script prints
tables, then one summary line per figure for an issue note.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import dask.array as dsa
import grain
import numpy as np
import xarray as xr

try:
    import xbatcher
except ImportError:  # bench_speed.py reuses this module; figure 1 needs xbatcher
    xbatcher = None

# Shared with the core benchmarks (this folder is on sys.path when a script runs).
from bench_core import best_of, fmt_time, print_table, version_line

from xpatch.core.chunk_cache import DEFAULT_CACHE_BYTES
from xpatch.grain import PatchSource

MiB = 2**20
BANDS = 4
DIMS = ("band", "y", "x")
#: The rate the source should reach, as a multiple of xbatcher's on the same Dask array.
TARGET_RATIO = 10.0
#: About how many of xbatcher's patches are compared with numpy slices.
CHECKED = 30

# zarr 3's notice that consolidated metadata (which xarray writes) is not in its spec yet.
warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of one run (full or quick)."""

    grid: int  # square grid extent of the (BANDS, grid, grid) array
    chunk: int  # dask / zarr chunk extent along y and x
    patch: int
    stride: int
    repeat: int  # best-of repeats of the cheap timings
    slow_repeat: int  # best-of repeats of the xbatcher and zarr timings
    xbatcher_patches: int  # xbatcher is timed over its first this many patches
    # Cache sizes of figure 2, in chunks. The grid is 4x4 chunks: 4 is one row of
    # chunks, 5 one row plus one (what the cache_bytes doc says a sequential pass needs).
    cache_chunks: tuple[int, ...]


FULL = Sizes(4096, 1024, 256, 192, 3, 2, 150, (4, 5, 8, 16))
QUICK = Sizes(2048, 512, 256, 192, 2, 1, 60, (4, 5, 8, 16))


# -- helpers ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Rate:
    """One timed way of serving patches."""

    label: str
    source: str  # the input it reads: "numpy", "dask" or "zarr"
    patches: int  # patches per timed run
    seconds: float  # best time of one run
    correct: bool  # the patches equal numpy slices of the same data

    @property
    def rate(self) -> float:
        """Patches per second."""
        return self.patches / self.seconds


def epoch(src: PatchSource) -> int:
    """Read every patch of ``src`` in index order, on this thread; return the count."""
    for i in range(len(src)):
        src[i]
    return len(src)


def grain_epoch(src: PatchSource) -> list[int]:
    """Read every patch through a Grain pipeline (default read options); return the indices."""
    dataset = grain.MapDataset.source(src).to_iter_dataset()
    return [int(item["index"]) for item in dataset]


def xbatcher_patches(generator: xbatcher.BatchGenerator, count: int) -> int:
    """Materialise the first ``count`` patches of ``generator`` as numpy, dropping each one.

    The sources' epochs drop their items too: keeping them all would add a page
    fault per fresh page to one side only.
    """
    seen = 0
    for batch in generator:
        np.asarray(batch)
        seen += 1
        if seen == count:
            break
    return seen


def xbatcher_starts(n: int, size: int, stride: int) -> list[tuple[int, int]]:
    """Starts of xbatcher's patches in its order: row-major, the remainder dropped."""
    starts = range(0, n - size + 1, stride)
    return [(y, x) for y in starts for x in starts]


def matches(values: np.ndarray, patch: np.ndarray, start: tuple[int, int], size: int) -> bool:
    """Whether ``patch`` equals ``values`` cut at ``start`` (y, x)."""
    y, x = (int(v) for v in start)
    return bool(np.array_equal(patch, values[:, y : y + size, x : x + size]))


def source_correct(src: PatchSource, values: np.ndarray, size: int) -> bool:
    """Whether every patch of ``src`` equals the numpy slice at its anchor."""
    return all(
        matches(values, item["data"], item["anchor"], size)
        for item in map(src.__getitem__, range(len(src)))
    )


def time_source(
    label: str,
    source: str,
    make: Callable[[], PatchSource],
    values: np.ndarray,
    s: Sizes,
    repeat: int,
) -> list[Rate]:
    """Cold and warm epochs of a source by index, and a cold one through a Grain pipeline."""
    n_patches = len(make())
    cold = best_of(lambda: epoch(make()), repeat)
    warm_src = make()
    epoch(warm_src)
    warm = best_of(lambda: epoch(warm_src), repeat)
    correct = source_correct(warm_src, values, s.patch)
    piped = best_of(lambda: grain_epoch(make()), repeat)
    piped_once = sorted(grain_epoch(make())) == list(range(n_patches))
    return [
        Rate(f"xpatch source, cold epoch ({label})", source, n_patches, cold, correct),
        Rate(f"xpatch source, warm epoch ({label})", source, n_patches, warm, correct),
        Rate(
            f"grain MapDataset.source(src).to_iter_dataset(), cold ({label})",
            source,
            n_patches,
            piped,
            correct and piped_once,
        ),
    ]


def time_xbatcher(source: str, scene: xr.DataArray, values: np.ndarray, s: Sizes) -> Rate:
    """xbatcher's first ``s.xbatcher_patches`` patches, each ``np.asarray``-ed."""
    generator = xbatcher.BatchGenerator(
        scene,
        input_dims={"y": s.patch, "x": s.patch},
        input_overlap={"y": s.patch - s.stride, "x": s.patch - s.stride},
    )
    count = min(len(generator), s.xbatcher_patches)
    seconds = best_of(lambda: xbatcher_patches(generator, count), s.slow_repeat)
    # Check about CHECKED patches spread over all of xbatcher's, against numpy slices.
    starts = xbatcher_starts(s.grid, s.patch, s.stride)
    sample = range(0, len(generator), max(1, len(generator) // CHECKED))
    correct = len(generator) == len(starts) and all(
        matches(values, np.asarray(generator[i]), starts[i], s.patch) for i in sample
    )
    return Rate(
        f"xbatcher BatchGenerator, first {count} of {len(generator)}",
        source,
        count,
        seconds,
        correct,
    )


# -- 1. patches per second -----------------------------------------------------------------


def bench_rates(s: Sizes, values: np.ndarray, store: Path) -> dict:
    """Patches per second of the source, xbatcher and numpy slicing, on Dask and zarr input."""
    n, c, k = s.grid, s.chunk, s.patch
    lazy = xr.DataArray(dsa.from_array(values, chunks=(BANDS, c, c)), dims=DIMS, name="data")
    p = lazy.patch(y=k, x=k, stride=s.stride)
    anchors = np.asarray(p.anchors())
    n_patches = len(p)

    def numpy_slicing() -> None:
        # Each copy is dropped, as the sources' items are: keeping them all would
        # add a page fault per fresh page to the baseline alone.
        for y, x in anchors:
            values[:, y : y + k, x : x + k].copy()

    t_numpy = best_of(numpy_slicing, s.repeat)
    numpy_rate = Rate(
        "numpy slicing arr[:, y:y+k, x:x+k].copy()", "numpy", n_patches, t_numpy, True
    )

    build = best_of(p.to_grain, s.repeat)
    dask_rates = time_source("dask", "dask", p.to_grain, values, s, s.repeat)
    xb_dask = time_xbatcher("dask", lazy, values, s)

    start = time.perf_counter()
    lazy.to_dataset().to_zarr(store, mode="w")
    write_s = time.perf_counter() - start
    zarred = xr.open_zarr(store)["data"]
    pz = zarred.patch(y=k, x=k, stride=s.stride)
    same_anchors = bool(np.array_equal(np.asarray(pz.anchors()), anchors))
    zarr_rates = time_source("zarr", "zarr", pz.to_grain, values, s, s.slow_repeat)
    xb_zarr = time_xbatcher("zarr", zarred, values, s)

    baseline = {"numpy": xb_dask, "dask": xb_dask, "zarr": xb_zarr}
    rows = []
    for r in [numpy_rate, *dask_rates, xb_dask, *zarr_rates, xb_zarr]:
        rows.append(
            [
                r.label,
                r.source,
                r.patches,
                fmt_time(r.seconds),
                f"{r.rate:,.0f}",
                f"{r.rate / baseline[r.source].rate:.2f}x",
                f"{r.rate / numpy_rate.rate:.2f}x",
                "yes" if r.correct else "NO",
            ]
        )
    chunk_mib = BANDS * c * c * values.itemsize / MiB
    print_table(
        f"1. patches/s: ({BANDS}, {n}, {n}) float32 in ({BANDS}, {c}, {c}) chunks "
        f"({chunk_mib:.0f} MiB), {k}x{k} patches, stride {s.stride}, {n_patches} patches",
        [
            "path",
            "input",
            "patches",
            "time",
            "patches/s",
            "vs xbatcher (same input)",
            "vs numpy slicing",
            "== numpy",
        ],
        rows,
    )
    n_xb = len(xbatcher_starts(n, k, s.stride))
    print(
        f"\ninputs: numpy = the array in memory; dask = dask.array.from_array of it; zarr = "
        f"xr.open_zarr of a local store of it ({c}^2 chunks, zstd, written in {write_s:.1f} s, "
        f"read through the OS page cache; same anchors as dask: {same_anchors})."
    )
    print(
        f"cold = a fresh p.to_grain() per run (chunk loads included; building one takes "
        f"{build * 1e3:.1f} ms), warm = a second pass over one source; grain = default "
        f"ReadOptions (16 threads), a fresh source per run. == numpy: every patch of the "
        f"source, and {CHECKED} of xbatcher's spread over the array, equal numpy slices."
    )
    print(
        f"xbatcher yields {n_xb} patches for len(p) = {n_patches}: its starts are 0, "
        f"{s.stride}, ... up to {n - k} and it drops any remainder, where boundary='shift' "
        f"adds a last patch flush with the edge. It is timed over its first patches (about "
        f"uniform cost each)."
    )
    return {
        "numpy": numpy_rate,
        "dask": dask_rates,
        "xb_dask": xb_dask,
        "zarr": zarr_rates,
        "xb_zarr": xb_zarr,
        "patches": n_patches,
        "xb_patches": n_xb,
    }


# -- 2. chunk loads per chunk ----------------------------------------------------------------


ORDERS = ("sequential", "chunk_shuffle (sweep)", "chunk order", "global shuffle")


def ordered(src: PatchSource, order: str):
    """The epoch's dataset: ``src`` itself, or a MapDataset in the given order."""
    if order == "sequential":
        return src
    if order == "chunk_shuffle (sweep)":
        return src.chunk_shuffle(seed=1)
    if order == "chunk order":
        return src.chunk_shuffle(seed=1, order="chunk")
    return grain.MapDataset.source(src).shuffle(seed=1)


def loads_per_chunk(src: PatchSource, order: str, threaded: bool) -> tuple:
    """Cache counters after one epoch in ``order`` from an empty cache, and whether it was whole.

    ``threaded`` iterates the dataset as a Python iterable, which Grain runs on
    16 read threads; otherwise index by index on this thread.
    """
    src.clear_cache()
    dataset = ordered(src, order)
    if threaded:
        items = (
            grain.MapDataset.source(dataset).to_iter_dataset() if order == "sequential" else dataset
        )
        seen = [int(item["index"]) for item in items]
    else:
        seen = [int(dataset[i]["index"]) for i in range(len(dataset))]
    once = sorted(seen) == list(range(len(src)))
    return src.cache_stats(), once


def bench_loads(s: Sizes, values: np.ndarray) -> dict:
    """Chunk loads per input chunk over one epoch, per order and cache size."""
    c, k = s.chunk, s.patch
    lazy = xr.DataArray(dsa.from_array(values, chunks=(BANDS, c, c)), dims=DIMS, name="data")
    p = lazy.patch(y=k, x=k, stride=s.stride)
    chunk_bytes = BANDS * c * c * values.itemsize
    slack = MiB
    caches = [(f"{m} chunks", m * chunk_bytes + slack) for m in s.cache_chunks]
    caches.append((f"default ({DEFAULT_CACHE_BYTES // chunk_bytes} chunks)", DEFAULT_CACHE_BYTES))
    sources = [p.to_grain(cache_bytes=b) for _, b in caches]
    n_chunks = sources[0].chunk_count
    grid_side = s.grid // c
    anchors = np.asarray(p.anchors())
    per_patch = float(np.mean(np.prod((anchors + k - 1) // c - anchors // c + 1, axis=1)))

    table: dict[tuple[str, bool], list[float]] = {}
    rows = []
    all_once = True
    for threaded in (False, True):
        for order in ORDERS:
            loads = []
            cells = []
            for src in sources:
                if order == "chunk_shuffle (sweep)" and src.memory_report().below_floor:
                    # chunk_shuffle refuses a budget below the sweep's floor before reading.
                    floor = src.memory_report().floor_chunks
                    loads.append(float("nan"))
                    cells.append(f"refused (floor {floor:.1f} chunks)")
                    continue
                stats, once = loads_per_chunk(src, order, threaded)
                all_once &= once
                loads.append(stats.loads / n_chunks)
                cells.append(f"{stats.loads / n_chunks:.2f} ({stats.evictions})")
            table[order, threaded] = loads
            how = "16 read threads" if threaded else "by index, 1 thread"
            rows.append([order, how, *cells])
    print_table(
        f"2. chunk loads per chunk in one epoch (evictions): {n_chunks} chunks of "
        f"{chunk_bytes / MiB:.0f} MiB, {len(p)} patches touching {per_patch:.2f} chunks each "
        f"on average",
        ["order", "iteration", *[label for label, _ in caches]],
        rows,
    )
    print(
        f"\ncache_bytes = chunks x {chunk_bytes / MiB:.0f} MiB + {slack // MiB} MiB; seed 1; "
        f"every epoch visited each patch once: {all_once}. The grid is {grid_side}x{grid_side} "
        "chunks; patch order (sequential) is chunk by chunk for Dask input. 16 read threads = "
        "`for item in dataset` (Grain's default ReadOptions); those counts vary run to run."
    )
    return {"table": table, "labels": [label for label, _ in caches], "once": all_once}


# -- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run all benchmarks and print the tables and the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, < 30 s")
    args = parser.parse_args(argv)
    if xbatcher is None:
        parser.error("figure 1 compares with xbatcher: pip install xbatcher")
    s = QUICK if args.quick else FULL
    start = time.perf_counter()
    versions = f"grain {grain.__version__}, xbatcher {xbatcher.__version__}"
    print(version_line("grain", args.quick, f"{versions}; best of {s.repeat} "
                       f"(xbatcher and zarr: {s.slow_repeat})"))  # fmt: skip
    values = np.random.default_rng(1).random((BANDS, s.grid, s.grid), dtype=np.float32)
    with tempfile.TemporaryDirectory(prefix="xpatch-bench-") as tmp:
        r = bench_rates(s, values, Path(tmp) / "scene.zarr")
    ld = bench_loads(s, values)

    cold, warm, piped = r["dask"]
    zcold, _, zpiped = r["zarr"]
    xb, xbz, npy = r["xb_dask"], r["xb_zarr"], r["numpy"]
    verdict = "meets" if cold.rate / xb.rate >= TARGET_RATIO else "misses"
    print("\n## summary\n")
    print(
        f"- source vs xbatcher, same Dask array ({BANDS}, {s.grid}, {s.grid}) f32 in "
        f"{s.chunk}^2 chunks, {s.patch}^2 stride {s.stride}: {cold.rate / xb.rate:.1f}x (cold "
        f"epoch, {cold.rate:,.0f} patches/s), {warm.rate / xb.rate:.1f}x (warm), "
        f"{piped.rate / xb.rate:.1f}x (grain pipeline, cold) against {xb.rate:,.0f} patches/s; "
        f"{verdict} the {TARGET_RATIO:.0f}x target (cold)"
    )
    print(
        f"- source vs numpy slicing in memory ({npy.rate:,.0f} patches/s): "
        f"{cold.rate / npy.rate:.2f}x cold, {warm.rate / npy.rate:.2f}x warm, "
        f"{piped.rate / npy.rate:.2f}x grain; xbatcher {xb.rate / npy.rate:.2f}x"
    )
    print(
        f"- zarr store ({s.chunk}^2 chunks, zstd): source {zcold.rate:,.0f} patches/s cold = "
        f"{zcold.rate / xbz.rate:.1f}x xbatcher on it ({xbz.rate:,.0f} patches/s), grain "
        f"pipeline {zpiped.rate / xbz.rate:.1f}x"
    )
    print(
        f"- xbatcher yields {r['xb_patches']} patches for len(p) = {r['patches']} "
        f"(it drops any remainder); patches equal numpy slices: "
        f"{all(x.correct for x in [npy, *r['dask'], xb, *r['zarr'], xbz])}"
    )
    labels = ld["labels"]
    for order in ORDERS:
        cells = ", ".join(f"{label} {v:.2f}" for label, v in zip(labels, ld["table"][order, False]))
        print(f"- chunk loads per chunk, {order} epoch: {cells}")
    j = s.cache_chunks.index(8) if 8 in s.cache_chunks else 0
    threaded = ", ".join(f"{order} {ld['table'][order, True][j]:.2f}" for order in ORDERS)
    print(f"- same with 16 read threads, {labels[j]} cache: {threaded} (varies run to run)")
    print(f"\n(total {time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
