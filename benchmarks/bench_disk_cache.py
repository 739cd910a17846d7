"""Later epochs from local disk: an epoch over moto's S3 with ``cache_dir`` against a local one.

insitubatch's case of ``bench_peers.py`` (ERA5-like ``t2m``, time 1024 x lat 181 x lon
360 float32, zarr chunks of 8 time steps, zstd; one chunk-shuffled epoch of single-time
samples, batch 16, through Grain's default ``ReadOptions``), each epoch in a fresh
process, timed as ``bench_peers.py`` times it (opening the store, building the source,
iterating every batch; not the interpreter's start):

- ``local``: the zarr in a local folder, no ``cache_dir`` (the target);
- ``s3-fill``: from moto's S3 server on 127.0.0.1, ``cache_dir`` empty: the first epoch,
  which decodes every chunk from the bucket and writes it to the cache;
- ``s3-disk``: the same again in a new process: the second epoch, every chunk from the
  cache folder (the loads counted are the source's; the bucket fetches are obstore's);
- ``local-disk``: the local folder with a filled ``cache_dir``.

The cache folder is on local disk (``--cache``, default under ``/tmp``) and is in the page
cache after the fill, as it is for a second epoch that follows a first on one machine.

Run::

    python benchmarks/bench_disk_cache.py               # 1024 time steps, 3 repeats
    python benchmarks/bench_disk_cache.py --quick       # 128 time steps, 1 repeat

Times are medians; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_peers as peers


def run_epoch(job: dict) -> dict:
    """One chunk-shuffled epoch through Grain's defaults; the source's counts."""
    import importlib
    import warnings

    # Imported before the clock starts, as bench_peers.py does.
    for module in peers.IMPORTS["xpatch-16"]:
        importlib.import_module(module)
    import grain

    from xpatch.grain.object_store import ObjectStoreReader

    fetched = []
    fetch = ObjectStoreReader.fetch

    def counted(self, key):
        fetched.append(key)
        return fetch(self, key)

    ObjectStoreReader.fetch = counted
    warnings.filterwarnings("ignore", message="Consolidated metadata")
    start = time.perf_counter()
    da = peers.open_dataarray(job)
    src = da.patch(**job["spec"]["patch"]).to_grain(
        cache_bytes=job["spec"]["cache_bytes"], cache_dir=job["cache_dir"]
    )
    dataset = grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=1).batch(peers.BATCH)
    for _ in dataset.to_iter_dataset():
        pass
    seconds = time.perf_counter() - start
    loads = src.cache_stats().loads / src.chunk_count
    fetches = len(fetched)
    # The next epoch of the same run: the store open, the source built; another order.
    src.clear_cache()
    fetched.clear()
    start = time.perf_counter()
    dataset = grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=2).batch(peers.BATCH)
    for _ in dataset.to_iter_dataset():
        pass
    next_seconds = time.perf_counter() - start
    disk = src.disk_cache_stats().get("data")
    return {
        "seconds": seconds,
        "next_seconds": next_seconds,
        "loads": loads,
        "disk_hits": None if disk is None else disk.hits,
        "bucket_fetches": fetches,
        "next_bucket_fetches": len(fetched),
        "rss_mib": peers.peak_rss_mib(),
    }


def spawn(job: dict) -> dict:
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(job)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="128 time steps, 1 repeat")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--data", type=Path, default=Path("/tmp/xpatch-bench-peers"))
    parser.add_argument("--cache", type=Path, default=Path("/tmp/xpatch-bench-disk-cache"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_epoch(json.loads(args.child))), flush=True)
        return 0
    repeats = args.repeats or (1 if args.quick else 3)
    args.data.mkdir(parents=True, exist_ok=True)
    case = peers.era5_case(args.data, args.quick)
    s3 = peers.LoopbackS3()
    try:
        prefix = s3.upload(case.path)
        local = {"storage": "local", "path": str(case.path)}
        remote = {"storage": "s3", "prefix": prefix, "endpoint": s3.endpoint}
        common = {"array": case.array, "spec": case.spec}
        runs: dict[str, list[dict]] = {}
        for _ in range(repeats):
            shutil.rmtree(args.cache, ignore_errors=True)
            for name, where, cache in (
                ("local", local, None),
                ("s3-fill", remote, str(args.cache)),
                ("s3-disk", remote, str(args.cache)),
                ("local-disk", local, str(args.cache / "local")),
            ):
                if name == "local-disk":  # its own folder, filled first
                    spawn({**common, **where, "cache_dir": cache})
                runs.setdefault(name, []).append(spawn({**common, **where, "cache_dir": cache}))
    finally:
        s3.stop()
    target = statistics.median(r["seconds"] for r in runs["local"])
    print(
        f"era5 {case.raw_bytes / 2**20:.0f} MiB, {case.chunk_count} chunks, "
        f"{repeats} repeat(s), medians"
    )
    next_target = statistics.median(r["next_seconds"] for r in runs["local"])
    print(
        "first: a fresh process opens the store, builds the source, iterates (as "
        "bench_peers.py); next: the same process iterates again (another seed)"
    )
    print(
        f"{'process':<12} {'first s':>8} {'x local':>8} {'next s':>8} {'x local':>8} "
        f"{'loads/chunk':>12} {'S3 fetches':>11} {'next fetches':>13} {'peak RSS MiB':>13}"
    )
    for name, found in runs.items():
        seconds = statistics.median(r["seconds"] for r in found)
        following = statistics.median(r["next_seconds"] for r in found)
        last = found[-1]
        print(
            f"{name:<12} {seconds:8.2f} {seconds / target:8.2f} {following:8.2f} "
            f"{following / next_target:8.2f} {last['loads']:12.2f} {last['bucket_fetches']:>11} "
            f"{last['next_bucket_fetches']:>13} "
            f"{statistics.median(r['rss_mib'] for r in found):13.0f}"
        )
        print(
            f"{'':<12} first: "
            + ", ".join(f"{r['seconds']:.2f}" for r in found)
            + "; next: "
            + ", ".join(f"{r['next_seconds']:.2f}" for r in found)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
