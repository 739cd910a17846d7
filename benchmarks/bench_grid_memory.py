"""Peak memory of xpatch.on_grid over a Sentinel-2-sized scene and a large label raster.

Issue 40's memory case: a 4 x 10980 x 10980 float32 scene in EPSG:32632 (a GeoTIFF,
tiled 512, DEFLATE) and a "continental-style" label raster in EPSG:4326 at 0.00027
degrees (about 30 m; 30000 x 30000 uint8 over 8.1 x 8.1 degrees, tiled 512, DEFLATE),
both synthetic and written to disk first, in a process of their own. Then, in a fresh
process, measured: opening both lazily (rioxarray, chunks of 1024), ``on_grid``
(the labels warped per output chunk, nearest), ``patch(y=256, x=256)``, a Grain source
with a cache of 16 chunks, and one chunk-shuffled epoch through Grain (2 threads): the
peak resident memory (``ru_maxrss``), the time, the loads and the label windows warped.

Run::

    python benchmarks/bench_grid_memory.py                 # the issue's sizes
    python benchmarks/bench_grid_memory.py --quick         # 4 x 2048², labels 8000²

The target (issue 40): under 1 GiB peak. Nothing is asserted.

GDAL keeps a block cache of its own, by default 5 % of the machine's RAM (1.2 GB on a
23 GB machine), which fills with the scene's decoded blocks and dominated the peak
(1.8 GiB). ``on_grid`` lowers it to 64 MiB for the process (and each of its warp tasks
in the process it runs in) unless ``GDAL_CACHEMAX`` is set, in the environment or an
active ``rasterio.Env``: the user's choice wins. The runs leave the environment as it is
(``--gdal-cache`` sets it). Measured 2026-11-28 with ``GDAL_CACHEMAX`` unset, on 2 cores
busy with other work, the issue's sizes, one epoch of 1849 patches, 121 chunks, each run
in a fresh process (``env -u GDAL_CACHEMAX /usr/bin/time -v python
benchmarks/bench_grid_memory.py``):

==================  ==========  ===========  ==========  ===========
buffer              32          32           500         500
what                image only  with labels  image only  with labels
peak RSS (MiB)      1777        705          1789        702
epoch (s)           14.3        58.4         13.4        76.3
==================  ==========  ===========  ==========  ===========

(buffer: Grain's ``prefetch_buffer_size``; 500 is its default.) "Image only" does not
call ``on_grid``, so GDAL's default cache stays: with ``GDAL_CACHEMAX=64`` it peaked at
673 MiB (buffer 32) and 703 (500) on 2026-11-27. Before on_grid bounded the cache, the
runs with labels peaked at 1799-1853 MiB with ``GDAL_CACHEMAX`` unset; three runs of
each, alternated (buffer 32), took 59-75 s (84.8-89.0 s of CPU) with GDAL's default
cache and 69-79 s (85.4-89.8 s of CPU) bounded: the same work, the wall times noisy on
a shared machine. Each chunk loaded once (121 loads) and each label window was warped
once (121); the labels cost most of the time: GDAL's exact transform over 1024 x 1024
cells, about 0.5 s a chunk on one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

RES = 0.00027  # degrees


def write_inputs(folder: Path, size: int, label_size: int) -> None:
    import numpy as np
    import pyproj
    import rasterio
    from rasterio.transform import from_origin
    from rasterio.windows import Window

    folder.mkdir(parents=True, exist_ok=True)
    profile = {
        "driver": "GTiff",
        "tiled": True,
        "blockxsize": 512,
        "blockysize": 512,
        "compress": "deflate",
    }
    scene = folder / f"scene_{size}.tif"
    if not scene.exists():
        # Smooth bands (they compress): a scene of 4 x size² float32, written a row of blocks
        # at a time so that writing it holds little.
        with rasterio.open(
            scene,
            "w",
            **profile,
            count=4,
            height=size,
            width=size,
            dtype="float32",
            crs="EPSG:32632",
            transform=from_origin(300_000.0, 5_000_040.0, 10.0, 10.0),
        ) as out:
            for row in range(0, size, 512):
                h = min(512, size - row)
                y, x = np.mgrid[row : row + h, 0:size].astype(np.float32)
                block = np.stack(
                    [np.sin((x + k * 97) / 150.0) * np.cos(y / 211.0) for k in range(4)]
                )
                out.write(block, window=Window(0, row, size, h))
    labels = folder / f"labels_{label_size}.tif"
    # Centred on the scene, whatever their sizes.
    lon, lat = pyproj.Transformer.from_crs(32632, 4326, always_xy=True).transform(
        300_000.0 + 5.0 * size, 5_000_040.0 - 5.0 * size
    )
    west, north = lon - RES * label_size / 2, lat + RES * label_size / 2
    if not labels.exists():
        # Classes 1-12 in blocks of 40 cells.
        with rasterio.open(
            labels,
            "w",
            **profile,
            count=1,
            height=label_size,
            width=label_size,
            dtype="uint8",
            nodata=0,
            crs="EPSG:4326",
            transform=from_origin(west, north, RES, RES),
        ) as out:
            for row in range(0, label_size, 512):
                h = min(512, label_size - row)
                rows = np.arange(row, row + h)[:, None] // 40
                cols = np.arange(label_size)[None, :] // 40
                out.write(
                    ((rows + cols) % 12 + 1).astype(np.uint8),
                    1,
                    window=Window(0, row, label_size, h),
                )


def measure(folder: Path, size: int, label_size: int, variant: str, buffer: int) -> dict:
    import resource

    import grain
    import rioxarray

    import xpatch
    from xpatch.grid import warp

    warped = []
    original = warp._warp_block

    def counting(block, **kwargs):
        warped.append(1)
        return original(block, **kwargs)

    warp._warp_block = counting
    start = time.perf_counter()
    image = rioxarray.open_rasterio(
        folder / f"scene_{size}.tif", chunks={"band": -1, "y": 1024, "x": 1024}
    )
    labels = rioxarray.open_rasterio(folder / f"labels_{label_size}.tif", chunks=1024)
    if variant == "image":  # the same epoch without labels: what the labels add
        ds = image.rename("image").to_dataset()
    else:
        ds = xpatch.on_grid(image.rename("image"), labels=labels.squeeze("band", drop=True))
    built = time.perf_counter() - start
    chunk_bytes = 4 * 1024 * 1024 * 4 + 1024 * 1024
    src = ds.patch(y=256, x=256).to_grain(cache_bytes=16 * chunk_bytes)
    pipeline = (
        grain.MapDataset.source(src)
        .pipe(src.chunk_shuffle, seed=0)
        .to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=buffer))
    )
    served = sum(1 for _ in pipeline)
    return {
        "variant": variant,
        "prefetch_buffer_size": buffer,
        "scene": f"4 x {size}²",
        "labels": f"{label_size}²",
        "build_s": round(built, 2),
        "epoch_s": round(time.perf_counter() - start - built, 1),
        "patches": served,
        "chunks": src.chunk_count,
        "loads": src.cache_stats().loads,
        "label_windows_warped": len(warped),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 x 2048² scene, labels 8000²")
    parser.add_argument("--folder", default="/tmp/xpatch_bench_grid", help="where the inputs go")
    parser.add_argument(
        "--gdal-cache",
        default=None,
        help="GDAL_CACHEMAX of the runs, MB (default: as the environment has it; unset, "
        "on_grid bounds GDAL's cache to 64 MiB, which is otherwise 5 %% of the RAM)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="labels", help=argparse.SUPPRESS)
    parser.add_argument("--buffer", type=int, default=500, help=argparse.SUPPRESS)
    args = parser.parse_args()
    size, label_size = (2048, 8000) if args.quick else (10980, 30000)
    folder = Path(args.folder)
    if args.child:
        print(json.dumps(measure(folder, size, label_size, args.variant, args.buffer)))
        return
    started = time.perf_counter()
    write_inputs(folder, size, label_size)
    print(f"inputs written in {time.perf_counter() - started:.0f} s under {folder}")
    results = []
    # Each run in a fresh process: Grain's default read-ahead (500 patches of 1 MiB here)
    # and a training-like one (32), with and without the labels.
    for buffer in (500, 32):
        for variant in ("image", "labels"):
            command = [sys.executable, __file__, "--child", "--folder", str(folder)]
            command += ["--variant", variant, "--buffer", str(buffer)]
            command += ["--quick"] if args.quick else []
            env = dict(os.environ)
            if args.gdal_cache is not None:
                env["GDAL_CACHEMAX"] = args.gdal_cache
            done = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    for key in results[0]:
        print(f"{key:>22}  " + "  ".join(f"{r[key]!s:>12}" for r in results))


if __name__ == "__main__":
    main()
