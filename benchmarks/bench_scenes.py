"""Many scenes in one Grain source against one scene of the same total data.

Run ``python benchmarks/bench_scenes.py`` (about a minute on 2 cores) or ``--quick``.

The same cells are laid out twice: as one ``(4, n, 4n)`` float32 scene and as 4
scenes of ``(4, n, n)`` (with ``n`` = 1024, or 512 with ``--quick``), dask-backed with
256 x 256 chunks, patched 128 x 128 with stride 112. For each layout the script
times a sequential pass and a chunk-shuffled epoch on this thread, and one
chunk-shuffled epoch through Grain's 16 read threads, and counts chunk loads per
chunk with a cache of 8 chunks. Rates are printed with the multi-scene rate as a
ratio of the one-scene rate measured in the same run (best of 3). Then the same
for 3 GeoTIFF scenes of different shapes read through ``patch_scenes("*.tif")``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import dask.array as dsa
import numpy as np
import rioxarray  # noqa: F401  (registers .rio)
import xarray as xr
from bench_core import best_of, print_table, version_line
from rasterio.transform import from_origin

import xpatch

BANDS = 4
CHUNK = 256
PATCH = 128
STRIDE = 112


def scene(values: np.ndarray) -> xr.DataArray:
    data = dsa.from_array(values, chunks=(BANDS, CHUNK, CHUNK))
    return xr.DataArray(data, dims=("band", "y", "x"))


def pass_over(src, order) -> int:
    for i in order:
        src[int(i)]
    return len(order)


def grain_epoch(src) -> int:
    return sum(1 for _ in src.chunk_shuffle(seed=1).to_iter_dataset())


def measure(name: str, src, repeat: int) -> dict:
    """Rates (patches/s) of three passes and the loads per chunk of a shuffled epoch."""
    order = src.chunk_shuffled_order(seed=1)
    sequential = best_of(lambda: (src.clear_cache(), pass_over(src, range(len(src)))), repeat)
    shuffled = best_of(lambda: (src.clear_cache(), pass_over(src, order)), repeat)
    threaded = best_of(lambda: (src.clear_cache(), grain_epoch(src)), repeat)
    src.clear_cache()
    pass_over(src, order)
    loads = src.cache_stats().loads / src.chunk_count
    n = len(src)
    return {
        "name": name,
        "patches": n,
        "chunks": src.chunk_count,
        "sequential": n / sequential,
        "shuffled": n / shuffled,
        "threaded": n / threaded,
        "loads": loads,
    }


def row(m: dict, base: dict | None) -> list[str]:
    def rate(key: str) -> str:
        ratio = f" ({m[key] / base[key]:.2f}x)" if base is not None else ""
        return f"{m[key]:,.0f}{ratio}"

    return [
        m["name"],
        str(m["patches"]),
        str(m["chunks"]),
        rate("sequential"),
        rate("shuffled"),
        rate("threaded"),
        f"{m['loads']:.2f}",
    ]


def write_geotiffs(folder: Path, n: int) -> str:
    rng = np.random.default_rng(0)
    shapes = ((n, n), (n // 2, 2 * n), (3 * n // 4, n))
    for k, (h, w) in enumerate(shapes):
        values = rng.random((BANDS, h, w), dtype="float32")
        da = xr.DataArray(values, dims=("band", "y", "x"))
        da = da.rio.write_transform(from_origin(300000.0 * (k + 1), 5e6, 10.0, 10.0))
        da = da.rio.write_crs("EPSG:32631" if k != 1 else "EPSG:3857")
        da.rio.to_raster(folder / f"s{k}.tif", tiled=True, blockxsize=CHUNK, blockysize=CHUNK)
    return str(folder / "*.tif")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller data, fewer repeats")
    args = parser.parse_args(argv)
    n, repeat = (512, 2) if args.quick else (1024, 3)
    print(version_line("scenes", args.quick, "grain source"))
    cache = 8 * BANDS * CHUNK * CHUNK * 4
    values = np.random.default_rng(0).random((BANDS, n, 4 * n), dtype="float32")
    one = scene(values).patch(y=PATCH, x=PATCH, stride=STRIDE).to_grain(cache_bytes=cache)
    parts = [scene(np.ascontiguousarray(values[:, :, k * n : (k + 1) * n])) for k in range(4)]
    many = xpatch.patch_scenes(parts, y=PATCH, x=PATCH, stride=STRIDE).to_grain(cache_bytes=cache)
    base = measure("1 scene (4, n, 4n)", one, repeat)
    multi = measure("4 scenes (4, n, n)", many, repeat)
    header = ["layout", "patches", "chunks", "sequential /s", "shuffled /s", "16 threads /s",
              "loads/chunk"]  # fmt: skip
    print_table(
        f"Figure 1: one source over 4 scenes vs one scene, same {BANDS}x{n}x{4 * n} float32 "
        f"cells, {PATCH}^2 patches stride {STRIDE}, cache of 8 chunks",
        header,
        [row(base, None), row(multi, base)],
    )
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        pattern = write_geotiffs(Path(folder), n)
        sp = xpatch.patch_scenes(pattern, y=PATCH, x=PATCH, stride=STRIDE, chunks=CHUNK)
        opened = time.perf_counter() - start
        tifs = measure("3 GeoTIFF scenes", sp.to_grain(cache_bytes=cache), repeat)
    print_table(
        f"Figure 2: 3 GeoTIFF scenes of different shapes and CRSs (written and opened in "
        f"{opened:.1f} s)",
        header,
        [row(tifs, None)],
    )
    # Frames (the edges straddling patches read) pay when patches are small beside
    # chunks: 32^2 patches, with 8 chunks cached and with a cache that holds them all.
    small = xpatch.patch_scenes(parts, y=32, x=32, stride=28)
    costs = [source.reader.frame_costs() for source in small.to_grain().sources]
    needed = sum(c[0] for c in costs) + max(c[1] for c in costs)
    eight = measure("32^2 patches, 8 chunks cached", small.to_grain(cache_bytes=cache), 1)
    framed = measure(
        f"32^2 patches, {needed / (cache / 8):.1f} chunks cached",
        small.to_grain(cache_bytes=needed),
        1,
    )
    print_table(
        "Figure 3: the 4 scenes with 32^2 patches (stride 28): a cache of 8 chunks, and one "
        "that holds every chunk's frame besides a chunk",
        header,
        [row(eight, None), row(framed, eight)],
    )
    print(
        f"\nSummary: 4 scenes / 1 scene patches/s: sequential "
        f"{multi['sequential'] / base['sequential']:.2f}, chunk-shuffled "
        f"{multi['shuffled'] / base['shuffled']:.2f}, 16 threads "
        f"{multi['threaded'] / base['threaded']:.2f}; loads per chunk of a chunk-shuffled "
        f"epoch, cache of 8 chunks: 1 scene {base['loads']:.2f}, 4 scenes {multi['loads']:.2f}, "
        f"3 GeoTIFFs {tifs['loads']:.2f} (target <= 1.25); 32^2 patches: "
        f"{eight['loads']:.2f} with 8 chunks cached, {framed['loads']:.2f} with "
        f"{needed / (cache / 8):.1f} (every frame)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
