"""Train on a folder of GeoTIFF scenes through one Grain source, resume, then infer per scene.

The scenes are synthetic unless ``--folder`` names a folder of ``*.tif``: 4 GeoTIFFs of
different shapes in two CRSs, each with 3 image bands and a 4th band holding a mask
that a per-pixel logistic model can learn. The pipeline:

    xpatch.patch_scenes("folder/*.tif", ...).to_grain()  ->  chunk-local shuffle
    across scenes  ->  batch  ->  [mp_prefetch]  ->  with_fingerprint

Opening the folder reads headers only; every scene's chunks go through one cache
of ``--cache-chunks`` chunks per process, and the chunk shuffle deals each epoch
to the workers as runs of neighbouring chunks, so each chunk is read about once.
Training saves a checkpoint (the model and the iterator's state) and ``--resume``
continues with exactly the next batch. Then ``sp.apply`` runs the model over
every scene and ``xpatch.write`` writes one probability map per scene into
``--out`` (resumable as a whole).

Run ``python examples/train_scenes.py`` (``--workers 2`` for Grain worker
processes; needs ``pip install "xarray-patch[grain,geo]"``).
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
from pathlib import Path

import grain
import numpy as np
import rioxarray  # noqa: F401  (registers .rio)
import xarray as xr
from rasterio.transform import from_origin

import xpatch

TRUE_WEIGHTS = np.array([2.0, -1.0, 0.5], dtype=np.float32)
SHAPES = ((256, 384), (320, 256), (192, 448), (256, 256))
CHUNK = 128


def make_scenes(folder: Path) -> str:
    """Write the synthetic scenes; return the glob that finds them."""
    rng = np.random.default_rng(0)
    for k, (height, width) in enumerate(SHAPES):
        image = rng.normal(size=(3, height, width)).astype(np.float32)
        mask = (np.tensordot(TRUE_WEIGHTS, image, axes=1) > 0.25).astype(np.float32)
        bands = xr.DataArray(np.concatenate([image, mask[None]]), dims=("band", "y", "x"))
        crs, origin = ("EPSG:32631", (500000.0, 5e6)) if k % 2 else ("EPSG:3035", (4e6, 3e6))
        bands = bands.rio.write_transform(from_origin(*origin, 10.0, 10.0)).rio.write_crs(crs)
        bands.rio.to_raster(
            folder / f"scene{k}.tif", tiled=True, blockxsize=CHUNK, blockysize=CHUNK
        )
    return str(folder / "*.tif")


def predict(params: dict, image: np.ndarray) -> np.ndarray:
    """Per-pixel probability from bands ``(..., 3, y, x)``."""
    logits = np.tensordot(params["w"], image, axes=([0], [-3])) + params["b"]
    return 1.0 / (1.0 + np.exp(-logits))


def step(params: dict, batch: np.ndarray, learning_rate: float) -> tuple[dict, float]:
    """One gradient step of the logistic loss on a batch ``(b, 4, y, x)``."""
    image, mask = batch[:, :3], batch[:, 3]
    p = predict(params, image)
    eps = 1e-7
    loss = -float(np.mean(mask * np.log(p + eps) + (1 - mask) * np.log(1 - p + eps)))
    error = p - mask
    grad_w = np.tensordot(error, image, axes=([0, 1, 2], [0, 2, 3])) / error.size
    return {
        "w": params["w"] - learning_rate * grad_w,
        "b": params["b"] - learning_rate * float(error.mean()),
    }, loss


def pipeline(src, workers: int, batch_size: int):
    dataset = grain.MapDataset.source(src).pipe(
        src.chunk_shuffle, seed=0, worker_count=max(workers, 1), batch_size=batch_size
    )
    # A read-ahead of a few batches: Grain's default buffer of 500 elements (batches,
    # here) reads epochs ahead of the model through the cache of --cache-chunks chunks,
    # which evicts chunks the next steps then read again.
    read_ahead = grain.ReadOptions(num_threads=2, prefetch_buffer_size=4)
    dataset = dataset.repeat().batch(batch_size).to_iter_dataset(read_ahead)
    if workers:
        dataset = dataset.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    return dataset.pipe(src.with_fingerprint)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--folder", help="a folder of *.tif scenes; synthetic ones are written to it if it has none"
    )
    parser.add_argument("--out", help="folder of the per-scene outputs (default: temporary)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--cache-chunks", type=int, default=8)
    parser.add_argument("--checkpoint", default=None, help="checkpoint file (default: none)")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="xpatch-scenes-"))
    folder = Path(args.folder) if args.folder else work
    folder.mkdir(parents=True, exist_ok=True)
    pattern = str(folder / "*.tif") if any(folder.glob("*.tif")) else make_scenes(folder)

    sp = xpatch.patch_scenes(pattern, y=32, x=32, stride=24, window="hann", chunks=CHUNK)
    chunk_bytes = 4 * CHUNK * CHUNK * 4
    src = sp.to_grain(cache_bytes=args.cache_chunks * chunk_bytes, weights=False, dtype="float32")
    iterator = iter(pipeline(src, args.workers, args.batch_size))
    params = {"w": np.zeros(3, np.float32), "b": 0.0}
    done, losses = 0, []
    if args.resume:
        with open(args.checkpoint, "rb") as file:
            saved = pickle.load(file)
        try:
            iterator.set_state(saved["iterator"])
        except xpatch.OptionError as error:
            print(f"cannot resume from {args.checkpoint}: {error}", file=sys.stderr)
            raise SystemExit(2) from None
        params, done = saved["params"], saved["steps"]
    for _ in range(done, args.steps):
        batch = next(iterator)
        params, loss = step(params, batch["data"], learning_rate=2.0)
        losses.append(loss)
    if args.checkpoint:
        with open(args.checkpoint, "wb") as file:
            state = {"params": params, "iterator": iterator.get_state(), "steps": args.steps}
            pickle.dump(state, file)
    stats = src.cache_stats()
    if hasattr(iterator, "close"):
        iterator.close()

    # Inference: one lazy probability map per scene, written to one folder.
    results = sp.apply(lambda b: predict(params, b[:, :3])[:, None], output_dims={"band": 1})
    out = Path(args.out) if args.out else work / "probabilities"
    blocks = xpatch.write(results, out, progress=False)
    correct = total = 0
    for name in sp.names:
        truth = sp.patchers[name].obj.isel(band=3).values
        probability = xr.open_zarr(out / f"{name}.zarr")["data"].isel(band=0).values
        correct += int(((probability > 0.5) == (truth > 0.5)).sum())
        total += truth.size
    accuracy = correct / total
    first, last = (losses[0], losses[-1]) if losses else (float("nan"), float("nan"))
    print(
        f"{len(sp.names)} scenes, {len(sp)} patches; {len(losses)} steps, loss "
        f"{first:.3f} -> {last:.3f}; "
        f"chunk loads {stats.loads} "
        f"({'in this process; the workers read theirs' if args.workers else 'this process'}); "
        f"wrote {blocks} blocks to {out}; "
        f"accuracy {accuracy:.3f}"
    )
    return {
        "losses": losses,
        "params": params,
        "accuracy": accuracy,
        "out": out,
        "loads": stats.loads,
    }


if __name__ == "__main__":
    main()
