"""Train-in-place loaders side by side: zarr's floor, xpatch, insitubatch and xbatcher.

Every variant runs in its own process (a fresh one per repeat), so each is timed and
measured alone: the time to open the store (the variant's own way: ``xr.open_zarr``,
insitubatch's ``open_geometries``, ``zarr.open_array``), the time of one epoch after it
(building the loader and iterating every batch once; the interpreter's start and imports
are not counted), the child's peak RSS (its ``VmHWM`` from ``/proc/self/status``:
``getrusage`` in a child of ``subprocess`` would report the parent's size, see
``peak_rss_mib``) and chunk loads per chunk where the loader counts them.

Two cases:

- ``era5``, insitubatch's own case: an ERA5-like ``t2m`` (time 1024, lat 181, lon 360,
  float32, smooth random values quantized to 0.01 K so zstd compresses), zarr chunks of 8
  time steps x the whole field (128 chunks, zstd); one shuffled epoch of single-time
  samples (the whole field), batch 16.
- ``straddle``, xpatch's own case (``bench_storage.py``'s zarr, built by its helpers):
  4 x 16384 x 8192 uint16 (1 GiB raw) in 512² chunks, 256² patches at stride 192, so
  patches straddle chunks; batch 16; xpatch's budget 5 % of the data.

Variants:

- ``floor-obstore``: zarr reading and decoding every chunk once, chunk after chunk,
  through ``zarr.storage.ObjectStore`` over obstore (``LocalStore`` / ``S3Store``).
  1.00 loads per chunk by construction; every ratio is to this floor, measured in the
  same run on the same storage.
- ``floor-default``: the same through zarr's default store (``LocalStore`` / s3fs's
  ``FsspecStore``).
- ``xpatch-16`` and ``xpatch-2``: as a user writes it, ``p = da.patch(...)``,
  ``src = p.to_grain(cache_bytes=...)`` (era5: 5 % of the data, at least 24 chunks; raised
  to the sweep's floor, ``src.memory_report().floor_bytes``, where that is more),
  ``grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=1).batch(16)``, iterated
  through Grain's default ``ReadOptions`` (16 read threads) and ``ReadOptions(num_threads=2)``.
- ``xpatch-batches``: the same source served as whole batches,
  ``xpatch.grain.BatchSource(src, 16, seed=1).dataset()``, through Grain's default
  ``ReadOptions``: one Python call per batch, its patches of one chunk gathered at once.
  The array is opened with ``xr.open_zarr`` on the local folder or on ``s3://`` with
  ``storage_options`` (s3fs). Loads are the source's own counter (``cache_stats``).
- ``xpatch-obstore``: ``xpatch-batches`` with the zarr opened as the floor and
  insitubatch open it, ``xr.open_zarr(zarr.storage.ObjectStore(store))`` over obstore's
  ``LocalStore`` / ``S3Store`` (no s3fs: opening through s3fs costs 0.3-0.4 s of
  botocore's start-up, inside the epoch's time).
- ``xpatch-nodask``: ``xpatch-obstore`` with the zarr opened without dask chunks,
  ``xr.open_zarr(..., chunks=None)``: xpatch reads it by its own chunks, and nothing
  imports ``dask.array`` (about 20 MiB of the process; a note says if it was). dask's
  core is imported all the same: xarray's ``is_dask_collection`` imports it whenever
  dask is installed, as it is for xpatch.
- ``insitubatch``: as its README writes it, ``open_geometries``, ``split_by_chunk`` (all
  chunks to train), ``InSituDataset(store, manifest, geometries=..., batch_size=16)``
  over ``obstore_store(...)``; ``for batch in ds.train``. Loads are its ``cache_misses``.
  Not run on ``straddle``: its samples are whole slices along one axis, so 2-D patches
  that straddle chunks cannot be expressed.
- ``xbatcher``: ``BatchGenerator(da, input_dims=...)`` over the same zarr opened with
  ``xr.open_zarr`` (dask chunks equal to zarr's), samples taken in a shuffled order as a
  map-style dataset would (``bgen[i]``) and stacked 16 at a time. Loads: n/a. On
  ``straddle`` it takes minutes per epoch; ``--skip xbatcher`` leaves it out.

Storage: a local folder, and moto's S3 server on 127.0.0.1 (started by this script,
loopback traffic only; the zarr is uploaded once per run).

insitubatch needs Python >= 3.12 (xpatch runs on 3.11+), so it runs in its own venv::

    /root/.pyenv/versions/3.12.1/bin/python -m venv /work/venv-peers
    /work/venv-peers/bin/pip install insitubatch xbatcher zarr obstore xarray dask numpy s3fs

and is given with ``--peer-python /work/venv-peers/bin/python`` (xbatcher runs there too;
without it both are skipped with a note). The floors and xpatch run under this interpreter,
which needs ``pip install -e ".[test]"`` (obstore, s3fs, moto, grain).

Grain imports JAX whenever it is installed (``import grain`` then holds 118 MiB more, on
this machine 235 MiB against 117 without it), and the test extra installs JAX for the JAX
example; a PyTorch user's environment has none. ``--xpatch-python`` runs the xpatch
variants under another interpreter, e.g. one with only the extras a user installs::

    python -m venv /work/venv-xpatch
    /work/venv-xpatch/bin/pip install -e ".[grain,cloud]"

Run::

    python benchmarks/bench_peers.py --peer-python /work/venv-peers/bin/python
    python benchmarks/bench_peers.py --quick --storage local       # small sizes, ~1 min
    python benchmarks/bench_peers.py --case era5 --storage local --variants floor-obstore,xpatch-16

Times are medians of ``--repeats`` runs (3; 1 with ``--quick``); nothing is asserted.
An epoch's ratio to the floor compares epochs after their opens; a training run opens
once and reads many epochs. On moto's server ``xr.open_zarr`` lists the bucket and
reads the coordinates' chunks one request after another (0.04-0.14 s, against 0.02-0.04 s
for insitubatch's ``open_geometries``): the ``open`` column shows it.
The zarrs are written once under ``--data`` and reused.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MiB = 2**20
BATCH = 16
ERA5_CHUNK_TIME = 8
ERA5_LAT, ERA5_LON = 181, 360
ERA5_MIN_CACHE_CHUNKS = 24
BUCKET = "bench"
KEY, SECRET, REGION = "x", "y", "us-east-1"
VARIANTS = (
    "floor-obstore",
    "floor-default",
    "xpatch-16",
    "xpatch-2",
    "xpatch-batches",
    "xpatch-obstore",
    "xpatch-nodask",
    "insitubatch",
    "xbatcher",
)
PEER_VARIANTS = ("insitubatch", "xbatcher")


# -- the data (parent process, this interpreter) -----------------------------------------------


def era5_values(times: int, start: int, rng_seed: int = 0):
    """Smooth t2m-like values for time steps ``start .. start + times``, quantized to 0.01 K.

    A smooth field plus a slowly moving wave, rounded so that the low mantissa bits are
    constant and zstd finds something to compress, as in real reanalysis output.
    """
    import numpy as np

    lat = np.linspace(-90, 90, ERA5_LAT, dtype=np.float32)[:, None]
    lon = np.linspace(0, 359, ERA5_LON, dtype=np.float32)[None, :]
    base = 273.15 + 30 * np.cos(np.deg2rad(lat)) - 15
    t = np.arange(start, start + times, dtype=np.float32)[:, None, None]
    wave = 5 * np.sin(np.deg2rad(lon) * 3 + t / 20) * np.cos(np.deg2rad(lat) * 2 + t / 50)
    noise = np.random.default_rng(rng_seed + start).normal(0, 0.3, (times, ERA5_LAT, ERA5_LON))
    return np.round(base + wave + noise, 2).astype(np.float32)


def write_era5(path: Path, times: int) -> Path:
    """Write (once) the ERA5-like zarr: a group with ``t2m`` (time, lat, lon), zstd chunks.

    1024 time steps are 255 MiB raw and about 125 MiB on disk (zstd level 3).
    """
    if (path / "zarr.json").exists():
        return path
    import numpy as np
    import xarray as xr
    import zarr

    coords = {
        "time": np.arange(times),
        "lat": np.linspace(-90, 90, ERA5_LAT),
        "lon": np.linspace(0, 359, ERA5_LON),
    }
    # Written chunk by chunk: the whole array is never held at once.
    import dask
    import dask.array as dsa

    values = dsa.concatenate(
        [
            dsa.from_delayed(
                dask.delayed(era5_values)(ERA5_CHUNK_TIME, start),
                (ERA5_CHUNK_TIME, ERA5_LAT, ERA5_LON),
                np.float32,
            )
            for start in range(0, times, ERA5_CHUNK_TIME)
        ]
    )
    data = xr.Dataset({"t2m": (("time", "lat", "lon"), values)}, coords=coords)
    encoding = {
        "t2m": {
            "chunks": (ERA5_CHUNK_TIME, ERA5_LAT, ERA5_LON),
            "compressors": [zarr.codecs.ZstdCodec(level=3)],
        }
    }
    # Written beside and renamed: an interrupted write is never taken for a finished zarr.
    partial = path.with_name(path.name + ".partial")
    data.to_zarr(partial, mode="w", encoding=encoding, consolidated=False, zarr_format=3)
    partial.rename(path)
    return path


@dataclass(frozen=True)
class Case:
    """One case's zarr and what every variant needs to read it the same way."""

    name: str
    path: Path
    array: str
    raw_bytes: int
    chunk_count: int
    spec: dict


def era5_case(data: Path, quick: bool) -> Case:
    times = 128 if quick else 1024
    path = write_era5(data / f"era5-t2m-{times}.zarr", times)
    chunk_bytes = ERA5_CHUNK_TIME * ERA5_LAT * ERA5_LON * 4
    raw = times * ERA5_LAT * ERA5_LON * 4
    cache_bytes = max(int(0.05 * raw), ERA5_MIN_CACHE_CHUNKS * chunk_bytes)
    spec = {
        "patch": {"time": 1, "lat": ERA5_LAT, "lon": ERA5_LON},
        "cache_bytes": cache_bytes,
    }
    return Case("era5", path, "t2m", raw, times // ERA5_CHUNK_TIME, spec)


def straddle_case(data: Path, quick: bool) -> Case:
    import bench_storage as storage

    # --quick: 32 MiB (4 x 4 chunks), small enough for the suite's smoke test.
    sizes = storage.Sizes(2048, 2048) if quick else storage.FULL
    path = storage.write_zarr(
        data / f"scene-{sizes.rows}x{sizes.cols}.zarr", sizes.rows, sizes.cols
    )
    raw = storage.BANDS * sizes.rows * sizes.cols * 2
    chunks = (sizes.rows // storage.CHUNK) * (sizes.cols // storage.CHUNK)
    spec = {
        "patch": {"y": storage.PATCH, "x": storage.PATCH},
        "stride": storage.STRIDE,
        # At least 6 chunks (12 MiB): --quick's 5 % would be less than one chunk.
        "cache_bytes": max(
            int(storage.BUDGET_SHARE * raw), 6 * storage.BANDS * storage.CHUNK**2 * 2
        ),
    }
    return Case("straddle", path, "image", raw, chunks, spec)


def at_least_the_floor(case: Case) -> Case:
    """``case`` with ``cache_bytes`` raised to the sweep's floor if the share is below it.

    Below the floor ``chunk_shuffle`` refuses the budget (it would read chunks again); the
    floor comes from the geometry alone (``src.memory_report()``), nothing is read.
    """
    import warnings

    import xarray as xr

    import xpatch  # noqa: F401 - registers .patch

    warnings.filterwarnings("ignore", message="Consolidated metadata")
    spec = case.spec
    da = xr.open_zarr(case.path, consolidated=False)[case.array]
    p = da.patch(**spec["patch"], **({"stride": spec["stride"]} if "stride" in spec else {}))
    floor = p.to_grain(cache_bytes=2**40).memory_report().floor_bytes
    if spec["cache_bytes"] >= floor:
        return case
    print(
        f"{case.name}: cache_bytes {spec['cache_bytes'] / MiB:.1f} MiB is below the sweep's "
        f"floor, raised to it: {floor / MiB:.1f} MiB"
    )
    return dataclasses.replace(case, spec=spec | {"cache_bytes": floor})


# -- S3 on loopback ----------------------------------------------------------------------------


class LoopbackS3:
    """moto's S3 server on 127.0.0.1 (any free port) with one bucket."""

    def __init__(self) -> None:
        import logging

        import boto3
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=KEY,
            aws_secret_access_key=SECRET,
        )
        self.client.create_bucket(Bucket=BUCKET)

    def upload(self, folder: Path) -> str:
        """Copy a zarr folder into the bucket under its own name; return the key prefix."""
        for file in sorted(folder.rglob("*")):
            if file.is_file():
                key = f"{folder.name}/{file.relative_to(folder).as_posix()}"
                self.client.upload_file(str(file), BUCKET, key)
        return folder.name

    def stop(self) -> None:
        self.server.stop()


# -- the children: one variant, one epoch ------------------------------------------------------


#: When the running variant finished opening its store (``time.perf_counter``).
_opened: list[float] = []


def opened() -> None:
    """Mark the end of the variant's open: its epoch is timed from here."""
    _opened.append(time.perf_counter())


def obstore_zarr_store(job: dict):
    """zarr's ObjectStore over obstore's LocalStore or S3Store."""
    import obstore.store
    import zarr.storage

    if job["storage"] == "local":
        inner = obstore.store.LocalStore(prefix=job["path"])
    else:
        inner = obstore.store.S3Store(
            BUCKET,
            prefix=job["prefix"],
            endpoint=job["endpoint"],
            access_key_id=KEY,
            secret_access_key=SECRET,
            region=REGION,
            client_options={"allow_http": True},
        )
    return zarr.storage.ObjectStore(inner, read_only=True)


def storage_options(job: dict) -> dict:
    """s3fs's options for the loopback server."""
    return {
        "key": KEY,
        "secret": SECRET,
        "client_kwargs": {"endpoint_url": job["endpoint"], "region_name": REGION},
    }


def default_zarr_store(job: dict):
    """zarr's default store: LocalStore, or s3fs's FsspecStore."""
    import zarr.storage

    if job["storage"] == "local":
        return zarr.storage.LocalStore(job["path"], read_only=True)
    return zarr.storage.FsspecStore.from_url(
        f"s3://{BUCKET}/{job['prefix']}", storage_options=storage_options(job), read_only=True
    )


def open_dataarray(job: dict):
    """The array as a user opens it with xarray (dask chunks equal to zarr's)."""
    import xarray as xr

    if job["storage"] == "local":
        data = xr.open_zarr(job["path"], consolidated=False)
    else:
        data = xr.open_zarr(
            f"s3://{BUCKET}/{job['prefix']}",
            consolidated=False,
            storage_options=storage_options(job),
        )
    return data[job["array"]]


def run_floor(job: dict, store) -> float:
    """Read and decode every chunk once, chunk after chunk; nothing is kept."""
    import itertools
    import math

    import zarr

    array = zarr.open_array(store, path=job["array"], mode="r")
    opened()
    grid = [range(math.ceil(s / c)) for s, c in zip(array.shape, array.chunks)]
    for index in itertools.product(*grid):
        array[tuple(slice(i * c, (i + 1) * c) for i, c in zip(index, array.chunks))]
    return 1.0


def run_xpatch(job: dict, threads: int | None) -> float:
    """One chunk-shuffled epoch of batches through Grain; loads per chunk."""
    import warnings

    import grain

    import xpatch  # noqa: F401 - registers .patch

    warnings.filterwarnings("ignore", message="Consolidated metadata")
    da = open_dataarray(job)
    opened()
    spec = job["spec"]
    p = da.patch(**spec["patch"], **({"stride": spec["stride"]} if "stride" in spec else {}))
    src = p.to_grain(cache_bytes=spec["cache_bytes"])
    dataset = grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=1).batch(BATCH)
    options = () if threads is None else (grain.ReadOptions(num_threads=threads),)
    for _ in dataset.to_iter_dataset(*options):
        pass
    return src.cache_stats().loads / src.chunk_count


def run_xpatch_batches(job: dict, obstore: bool = False, dask: bool = True) -> float:
    """One chunk-shuffled epoch of whole batches (``BatchSource``); loads per chunk."""
    import warnings

    from xpatch.grain import BatchSource

    warnings.filterwarnings("ignore", message="Consolidated metadata")
    if obstore:
        import xarray as xr

        chunks = {} if dask else None
        store = obstore_zarr_store(job)
        da = xr.open_zarr(store, consolidated=False, chunks=chunks)[job["array"]]
    else:
        da = open_dataarray(job)
    opened()
    spec = job["spec"]
    p = da.patch(**spec["patch"], **({"stride": spec["stride"]} if "stride" in spec else {}))
    src = p.to_grain(cache_bytes=spec["cache_bytes"])
    batches = BatchSource(src, BATCH, seed=1)
    for _ in batches.dataset().to_iter_dataset():
        pass
    return src.cache_stats().loads / src.chunk_count


def run_insitubatch(job: dict) -> float:
    """One shuffled epoch of insitubatch's train split (all chunks); loads per chunk."""
    from insitubatch import InSituDataset, obstore_store, open_geometries, split_by_chunk

    if job["storage"] == "local":
        store = obstore_store(Path(job["path"]).resolve().as_uri())
    else:
        store = obstore_store(
            f"s3://{BUCKET}/{job['prefix']}",
            endpoint=job["endpoint"],
            access_key_id=KEY,
            secret_access_key=SECRET,
            region=REGION,
            client_options={"allow_http": True},
        )
    geoms = open_geometries(store, variables=[job["array"]])
    opened()
    manifest = split_by_chunk(geoms[job["array"]], fractions=(1.0, 0.0, 0.0))
    ds = InSituDataset(store, manifest, geometries=geoms, batch_size=BATCH)
    samples = 0
    for batch in ds.train:
        samples += len(batch.sample_indices)
    assert samples == geoms[job["array"]].n_samples, (samples, geoms[job["array"]].n_samples)
    return ds.cache_misses / job["chunk_count"]


def run_xbatcher(job: dict) -> None:
    """A shuffled epoch of xbatcher's samples (``bgen[i]``), stacked 16 at a time."""
    import numpy as np
    import xbatcher

    da = open_dataarray(job)
    opened()
    spec = job["spec"]
    overlap = {}
    if "stride" in spec:
        overlap = {dim: size - spec["stride"] for dim, size in spec["patch"].items()}
    bgen = xbatcher.BatchGenerator(da, input_dims=spec["patch"], input_overlap=overlap)
    order = np.random.default_rng(1).permutation(len(bgen))
    for start in range(0, len(order), BATCH):
        np.stack([bgen[int(i)].values for i in order[start : start + BATCH]])


#: What each variant imports before its clock starts (an epoch's time, not the imports').
#: Those that open the zarr with dask chunks import dask.array: xarray would import it
#: on opening, inside the epoch (0.5-0.6 s), and xpatch no longer imports it.
IMPORTS = {
    "floor-obstore": ("zarr", "obstore"),
    "floor-default": ("zarr", "s3fs"),
    "xpatch-16": ("xarray", "zarr", "s3fs", "dask.array", "grain", "xpatch"),
    "xpatch-2": ("xarray", "zarr", "s3fs", "dask.array", "grain", "xpatch"),
    "xpatch-batches": ("xarray", "zarr", "s3fs", "dask.array", "grain", "xpatch"),
    "xpatch-obstore": ("xarray", "zarr", "obstore", "dask.array", "grain", "xpatch"),
    "xpatch-nodask": ("xarray", "zarr", "obstore", "grain", "xpatch"),
    "insitubatch": ("zarr", "obstore", "insitubatch"),
    "xbatcher": ("xarray", "zarr", "s3fs", "dask.array", "xbatcher"),
}


def peak_rss_mib() -> float:
    """This process's peak resident set since its exec, in MiB.

    ``VmHWM`` rather than ``getrusage``: Linux carries the pre-exec high-water mark of the
    forking parent (subprocess's vfork) into the child's ``ru_maxrss``, which would charge
    every variant the parent's size.
    """
    import resource

    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(job: dict) -> None:
    """Run one variant once and print its result as the last line of stdout."""
    import importlib

    variant = job["variant"]
    # Imported before the clock starts: an epoch's time, not the interpreter's start-up.
    for module in IMPORTS.get(variant, ()):
        importlib.import_module(module)
    start = time.perf_counter()
    loads: float | None
    if variant == "floor-obstore":
        loads = run_floor(job, obstore_zarr_store(job))
    elif variant == "floor-default":
        loads = run_floor(job, default_zarr_store(job))
    elif variant == "xpatch-batches":
        loads = run_xpatch_batches(job)
    elif variant == "xpatch-obstore":
        loads = run_xpatch_batches(job, obstore=True)
    elif variant == "xpatch-nodask":
        loads = run_xpatch_batches(job, obstore=True, dask=False)
    elif variant.startswith("xpatch-"):
        threads = int(variant.split("-")[1])
        loads = run_xpatch(job, None if threads == 16 else threads)
    elif variant == "insitubatch":
        loads = run_insitubatch(job)
    elif variant == "xbatcher":
        run_xbatcher(job)
        loads = None
    else:
        raise ValueError(f"variant={variant!r} is not one of {VARIANTS}")
    end = time.perf_counter()
    if not _opened:
        raise RuntimeError(f"variant {variant!r} never marked its store opened")
    result = {
        "open_seconds": _opened[0] - start,
        "seconds": end - _opened[0],
        "loads": loads,
        "rss_mib": peak_rss_mib(),
    }
    # xarray imports dask's core when dask is installed (is_dask_collection), not dask.array.
    result["dask_array_loaded"] = "dask.array" in sys.modules
    print("RESULT " + json.dumps(result), flush=True)


# -- the parent: spawn, measure, print ---------------------------------------------------------


@dataclass
class Run:
    open_seconds: float
    seconds: float
    rss_mib: float
    loads: float | None


def spawn(python: str, job: dict, timeout: float) -> Run:
    """Run one variant in a fresh process and read back its time, peak RSS and loads."""
    process = subprocess.Popen(
        [python, str(Path(__file__).resolve()), "--child", json.dumps(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=Path(__file__).resolve().parent,
    )
    deadline = time.monotonic() + timeout
    output, _ = process.communicate()
    if time.monotonic() > deadline:
        print(f"  note: {job['variant']} took longer than {timeout:.0f} s")
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    if process.returncode != 0 or not lines:
        raise RuntimeError(
            f"{job['variant']} on {job['storage']} failed (exit {process.returncode}):\n"
            + output[-3000:]
        )
    result = json.loads(lines[-1][len("RESULT ") :])
    if job["variant"] == "xpatch-nodask" and result.get("dask_array_loaded"):
        print("  note: xpatch-nodask imported dask.array (its figures include it)")
    return Run(result["open_seconds"], result["seconds"], result["rss_mib"], result["loads"])


def print_case(case: Case, storage: str, runs: dict[str, list[Run]], notes: list[str]) -> None:
    from bench_core import print_table

    def median(values):
        return statistics.median(values)

    repeats = len(next(iter(runs.values())))
    floor = median([r.seconds for r in runs["floor-obstore"]]) if "floor-obstore" in runs else None
    rows = []
    for variant, done in runs.items():
        seconds = median([r.seconds for r in done])
        loads = [r.loads for r in done if r.loads is not None]
        rows.append(
            [
                variant,
                f"{median([r.open_seconds for r in done]):.2f} s",
                f"{seconds:.2f} s",
                f"{min(r.seconds for r in done):.2f}-{max(r.seconds for r in done):.2f}",
                f"{seconds / floor:.2f}x" if floor else "-",
                f"{median([r.rss_mib for r in done]):.0f}",
                f"{median(loads):.2f}" if loads else "n/a",
            ]
        )
    print_table(
        f"{case.name}, {storage}: open, then one epoch, batch {BATCH}, median of {repeats}",
        ["variant", "open", "epoch", "range", "/ floor", "peak RSS MiB", "loads per chunk"],
        rows,
    )
    for note in notes:
        print(f"note: {note}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="small sizes (32 MiB), 1 repeat")
    parser.add_argument("--case", choices=("era5", "straddle", "all"), default="all")
    parser.add_argument("--storage", choices=("local", "s3", "all"), default="all")
    parser.add_argument("--repeats", type=int, help="runs per variant (default 3; 1 --quick)")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated, of {', '.join(VARIANTS)} (default all)",
    )
    parser.add_argument(
        "--skip", default="", help="comma-separated variants to leave out, e.g. xbatcher"
    )
    parser.add_argument(
        "--peer-python", help="the Python >= 3.12 that has insitubatch and xbatcher installed"
    )
    parser.add_argument(
        "--xpatch-python",
        help="the interpreter of the xpatch variants (default this one), e.g. one without JAX",
    )
    parser.add_argument(
        "--data", type=Path, default=Path("/tmp/xpatch-bench-peers"), help="where the zarrs go"
    )
    parser.add_argument(
        "--timeout", type=float, default=900, help="seconds after which a child is noted as slow"
    )
    args = parser.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    skipped = {v.strip() for v in args.skip.split(",") if v.strip()}
    for name in variants + sorted(skipped):
        if name not in VARIANTS:
            parser.error(f"--variants/--skip: {name!r} is not one of {', '.join(VARIANTS)}")
    variants = [v for v in variants if v not in skipped]
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats={args.repeats}: give 1 or more")
    repeats = args.repeats or (1 if args.quick else 3)
    peer = args.peer_python
    if any(v in PEER_VARIANTS for v in variants) and not (peer and Path(peer).exists()):
        print(
            f"note: --peer-python {'not given' if not peer else f'{peer!r} does not exist'}: "
            "insitubatch and xbatcher are skipped (see the module docstring for the venv)"
        )
        variants = [v for v in variants if v not in PEER_VARIANTS]
    if not variants:
        parser.error(
            f"--variants={args.variants!r} --skip={args.skip!r}: no variant left to run; "
            "name one this interpreter runs, or give --peer-python"
        )

    import grain
    import zarr
    from bench_core import version_line

    print(
        version_line(
            "peers", args.quick, f"zarr {zarr.__version__}, grain {grain.__version__}, "
            f"{repeats} repeat(s), peer python {peer or '-'}, "
            f"xpatch python {args.xpatch_python or sys.executable}"
        )
    )  # fmt: skip
    args.data.mkdir(parents=True, exist_ok=True)
    cases = []
    if args.case in ("era5", "all"):
        cases.append(era5_case(args.data, args.quick))
    if args.case in ("straddle", "all"):
        cases.append(straddle_case(args.data, args.quick))
    cases = [at_least_the_floor(case) for case in cases]
    storages = ["local", "s3"] if args.storage == "all" else [args.storage]
    s3 = LoopbackS3() if "s3" in storages else None
    try:
        for case in cases:
            on_disk = sum(f.stat().st_size for f in case.path.rglob("*") if f.is_file())
            print(
                f"\n{case.name}: {case.path}, {case.raw_bytes / MiB:.0f} MiB raw, "
                f"{on_disk / MiB:.0f} MiB on disk, {case.chunk_count} chunks; "
                f"xpatch cache_bytes {case.spec['cache_bytes'] / MiB:.1f} MiB"
            )
            for storage in storages:
                job = {
                    "case": case.name,
                    "storage": storage,
                    "path": str(case.path),
                    "array": case.array,
                    "chunk_count": case.chunk_count,
                    "spec": case.spec,
                }
                if storage == "s3":
                    started = time.perf_counter()
                    job |= {"endpoint": s3.endpoint, "prefix": s3.upload(case.path)}
                    print(f"uploaded to moto in {time.perf_counter() - started:.1f} s")
                notes = []
                chosen = list(variants)
                if case.name == "straddle" and "insitubatch" in chosen:
                    chosen.remove("insitubatch")
                    notes.append(
                        "insitubatch: n/a, its samples are whole slices along one axis "
                        "(2-D patches straddling chunks cannot be expressed)"
                    )
                if not chosen:
                    print(f"\n{case.name}, {storage}: nothing to run. " + " ".join(notes))
                    continue
                runs: dict[str, list[Run]] = {v: [] for v in chosen}
                # Rounds of every variant, so a busy moment lands on all of them alike.
                for _ in range(repeats):
                    for variant in chosen:
                        python = peer if variant in PEER_VARIANTS else sys.executable
                        if variant.startswith("xpatch") and args.xpatch_python:
                            python = args.xpatch_python
                        runs[variant].append(
                            spawn(python, job | {"variant": variant}, args.timeout)
                        )
                print_case(case, storage, runs, notes)
    finally:
        if s3 is not None:
            s3.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
