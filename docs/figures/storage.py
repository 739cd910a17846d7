"""Figure: one shuffled epoch from a compressed zarr, per order, cache budget and latency.

Measured at build time on a small zarr (4 x 4096 x 2048 uint16 in 8 x 4 chunks of
512², 256² patches with stride 192) written to a temporary folder; the latency is
zarr's ``LatencyStore``. Times are ratios to reading every chunk once: chunk after
chunk without latency, with zarr's own concurrency with it. The sweep refuses a
budget below its floor (``src.memory_report().floor_bytes``) before reading: those
points are not drawn.
"""

import tempfile
import time
import warnings
from pathlib import Path

import grain
import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
import zarr
from zarr.storage import LocalStore
from zarr.testing.store import LatencyStore

import xpatch  # noqa: F401  (registers .patch)

warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
BANDS, ROWS, COLS, CHUNK, PATCH, STRIDE = 4, 4096, 2048, 512, 256, 192
BUDGETS = (4, 8, 12, 16, 32)  # in chunks; 32 holds the whole array
LATENCY = 0.01
rng = np.random.default_rng(0)
values = (1000 + rng.integers(0, 400, (BANDS, ROWS, COLS))).astype("uint16")
folder = Path(tempfile.mkdtemp())
path = folder / "scene.zarr"
xr.Dataset({"image": (("band", "y", "x"), values)}).to_zarr(
    path, encoding={"image": {"chunks": (BANDS, CHUNK, CHUNK)}}, consolidated=False
)
CHUNK_BYTES = BANDS * CHUNK * CHUNK * 2


def floor_seconds(store, concurrent: bool) -> float:
    """Read every chunk once: one after the other, or with zarr's concurrency."""
    array = zarr.open_array(store, path="image", mode="r")
    start = time.perf_counter()
    if concurrent:
        array[...]
    else:
        for y in range(0, ROWS, CHUNK):
            for x in range(0, COLS, CHUNK):
                array[:, y : y + CHUNK, x : x + CHUNK]
    return time.perf_counter() - start


def epoch(store, order: str, chunks: int) -> tuple[float, float, object]:
    """One epoch through Grain's default read threads: seconds, loads per chunk, source."""
    image = xr.open_zarr(store, consolidated=False)["image"]
    src = image.patch(y=PATCH, x=PATCH, stride=STRIDE).to_grain(
        cache_bytes=chunks * CHUNK_BYTES, weights=False
    )
    if order == "sweep" and src.memory_report().below_floor:
        return np.nan, np.nan, src  # refused before any read: not drawn
    base = grain.MapDataset.source(src)
    if order == "global shuffle":
        dataset = base.shuffle(seed=1)
    else:
        dataset = base.pipe(src.chunk_shuffle, seed=1, order=order)
    start = time.perf_counter()
    for _ in dataset.to_iter_dataset():
        pass
    return time.perf_counter() - start, src.cache_stats().loads / src.chunk_count, src


local = LocalStore(path, read_only=True)
slow = LatencyStore(local, get_latency=LATENCY)
floors = {0.0: floor_seconds(local, False), LATENCY: floor_seconds(slow, True)}
orders = {"sweep": "C0", "chunk": "C1", "global shuffle": "C2"}
fig, (loads_ax, time_ax, mix_ax) = plt.subplots(1, 3, figsize=(11, 3.4), layout="constrained")
for order, colour in orders.items():
    for latency, style in ((0.0, "-"), (LATENCY, "--")):
        if order == "global shuffle" and latency:
            continue  # a read of 10 ms per patch: long, and the point is made without it
        store = slow if latency else local
        results = [epoch(store, order, chunks) for chunks in BUDGETS]
        label = f"{order}" + (f", {LATENCY * 1e3:.0f} ms a read" if latency else "")
        times = [r[0] / floors[latency] for r in results]
        time_ax.plot(BUDGETS, times, style, c=colour, marker="o", label=label)
        if not latency:
            loads = [r[1] for r in results]
            loads_ax.plot(BUDGETS, loads, style, c=colour, marker="o", label=order)
for ax in (loads_ax, time_ax):
    ax.set_xticks(BUDGETS)
    ax.set_xlabel("cache_bytes, in chunks (32: the whole array)")
for ax in (loads_ax, time_ax):
    ax.set_ylim(bottom=0)
loads_ax.set_ylabel("chunk loads per chunk, one epoch")
time_ax.set_ylabel("epoch time / reading every chunk once")
loads_ax.legend(frameon=False)
time_ax.legend(frameon=False, fontsize=7)

# Mixing: distinct chunks holding the anchors of 16 consecutive patches.
image = xr.open_zarr(local, consolidated=False)["image"]
src = image.patch(y=PATCH, x=PATCH, stride=STRIDE).to_grain(cache_bytes=12 * CHUNK_BYTES)
permutations = {
    "sweep": src.chunk_shuffled_order(seed=1),
    "chunk": src.chunk_shuffled_order(seed=1, order="chunk"),
    "global shuffle": np.random.default_rng(1).permutation(len(src)),
}
for k, (order, permutation) in enumerate(permutations.items()):
    mix_ax.bar(k, src.anchor_chunks_per_batch(permutation), color=orders[order])
mix_ax.set_xticks(range(3), list(permutations))
mix_ax.set_ylabel("distinct chunks in a batch of 16")
mix_ax.set_title("cache of 12 chunks", fontsize=8)
