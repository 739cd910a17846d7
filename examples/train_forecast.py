"""Train a forecast model on samples of a local zarr through Grain, checkpoint and resume.

The archive is synthetic and ERA5-like (6-hourly, with a gap; lat descending, lon
from 0 east; a static orography): written once as a compressed zarr, opened lazily.
Each sample takes the fields at ``-6h`` and ``0h`` of an origin as inputs and ``+6h``
as target, in 32 x 32 patches; origins whose labels are not all in the archive (its
ends, both sides of the gap) are skipped and counted. The model is linear per cell
(``t2m(+6h) = a t2m(0h) + b t2m(-6h) + c``), fitted batch after batch by least squares
(its normal equations summed over the batches seen), in numpy.

    ds.patch(time=xpatch.Forecast(...), lat=32, lon=32)  ->  to_grain()  ->
    chunk_shuffle (each chunk decoded once per epoch)  ->  batch  ->  fingerprint

A run saves the parameters and the Grain iterator's state; ``--resume`` continues
with exactly the next batch: ``--steps 30`` in one go equals ``--steps 12`` then
``--steps 30 --resume``, and the fit finds the archive's dynamics. Run
``python examples/train_forecast.py`` (needs ``pip install "xarray-patch[grain]"``).
"""

from __future__ import annotations

import argparse
import pickle
import tempfile
from pathlib import Path

import grain
import numpy as np
import pandas as pd
import xarray as xr

import xpatch

#: The archive's dynamics: t2m(t + 6h) = 1.5 t2m(t) - 0.6 t2m(t - 6h) + 28 (+ noise).
TRUE = {"a": 1.5, "b": -0.6, "c": 28.0}


def write_archive(path: Path) -> Path:
    """Write (once) an ERA5-like zarr: t2m (time, lat, lon) 6-hourly with a gap, orography."""
    if (path / "zarr.json").exists():
        return path
    times = pd.date_range("2022-01-01", periods=64, freq="6h").delete([30, 31])
    lat = np.linspace(88.59375, -88.59375, 64)
    lon = np.arange(128) * 2.8125
    rng = np.random.default_rng(0)
    fields = np.empty((len(times), len(lat), len(lon)), dtype=np.float32)
    fields[0] = fields[1] = 280 + rng.normal(0, 3, fields.shape[1:])
    for t in range(2, len(times)):  # the gap drops labels, not the dynamics
        noise = rng.normal(0, 1.0, fields.shape[1:])
        fields[t] = TRUE["a"] * fields[t - 1] + TRUE["b"] * fields[t - 2] + TRUE["c"] + noise
    data = xr.Dataset(
        {
            "t2m": (("time", "lat", "lon"), fields),
            "orography": (("lat", "lon"), rng.normal(0, 500, fields.shape[1:]).astype("f4")),
        },
        coords={"time": times, "lat": lat, "lon": lon},
    )
    encoding = {"t2m": {"chunks": (8, 32, 64)}, "orography": {"chunks": (32, 64)}}
    data.to_zarr(path, mode="w", encoding=encoding, consolidated=False, zarr_format=3)
    return path


def samples(archive: Path):
    """The forecast layout and its Grain source (the archive opened lazily)."""
    data = xr.open_zarr(archive, consolidated=False)
    forecast = xpatch.Forecast(inputs=["-6h", "0h"], targets=["6h"], target_variables=["t2m"])
    fc = data.patch(time=forecast, lat=32, lon=32)
    return fc, fc.to_grain()


def pipeline(src) -> grain.IterDataset:
    return (
        grain.MapDataset.source(src)
        .pipe(src.chunk_shuffle, seed=7)
        .repeat()
        .batch(8, drop_remainder=True)
        .to_iter_dataset(grain.ReadOptions(num_threads=2))
        .pipe(src.with_fingerprint)  # the state names the samples: no resume into others
    )


def features(batch: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per cell: (t2m(0h), t2m(-6h), 1) and t2m(+6h), centred at 280 K."""
    history = batch["inputs"]["t2m"].astype(np.float64) - 280.0  # (batch, 2, lat, lon)
    target = batch["targets"]["t2m"][:, 0].astype(np.float64) - 280.0
    columns = [history[:, 1].ravel(), history[:, 0].ravel(), np.ones(target.size)]
    return np.stack(columns, axis=1), target.ravel()


def coefficients(params: dict) -> np.ndarray:
    """``(a, b, c)`` of the normal equations seen so far (zeros before any batch)."""
    if not params["count"]:
        return np.zeros(3)
    return np.linalg.solve(params["xtx"], params["xty"])


def step(params: dict, batch: dict) -> tuple[dict, float]:
    """Score the batch with the model so far, then add it to the normal equations."""
    x, y = features(batch)
    loss = float(np.mean((x @ coefficients(params) - y) ** 2))
    new = {
        "xtx": params["xtx"] + x.T @ x,
        "xty": params["xty"] + x.T @ y,
        "count": params["count"] + 1,
    }
    return new, loss


def train(steps: int, archive: Path, checkpoint: Path, resume: bool) -> tuple[dict, list]:
    _, src = samples(archive)
    iterator = iter(pipeline(src))
    done, params = 0, {"xtx": np.zeros((3, 3)), "xty": np.zeros(3), "count": 0}
    if resume:
        saved = pickle.loads(checkpoint.read_bytes())
        done, params = saved["step"], saved["params"]
        iterator.set_state(saved["iterator"])  # refused unless the samples are the same
    losses = []
    while done < steps:
        params, loss = step(params, next(iterator))
        losses.append(loss)
        done += 1
    state = {"step": done, "params": params, "iterator": iterator.get_state()}
    checkpoint.write_bytes(pickle.dumps(state))
    return params, losses


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--data", type=Path, default=None, help="where the zarr goes (reused)")
    parser.add_argument("--checkpoint", type=Path, default=None, help="default: a temporary file")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    if args.resume and args.checkpoint is None:
        parser.error("--resume needs --checkpoint PATH, the file an earlier run saved")
    with tempfile.TemporaryDirectory() as tmp:
        archive = write_archive(args.data or Path(tmp) / "era5-like.zarr")
        fc, _ = samples(archive)
        print(f"{len(fc)} samples: {fc.skipped}")
        checkpoint = args.checkpoint or Path(tmp) / "checkpoint.pkl"
        params, losses = train(args.steps, archive, checkpoint, args.resume)
    if losses:
        print(f"trained to step {args.steps}: mse {losses[0]:.2f} -> {losses[-1]:.2f} K^2")
    a, b, c = coefficients(params)
    print(f"t2m(+6h) - 280 = {a:.3f} (t2m(0h) - 280) {b:+.3f} (t2m(-6h) - 280) {c:+.3f}")
    return {
        "params": params,
        "coefficients": (a, b, c),
        "losses": losses,
        "samples": len(fc),
        "skipped": fc.skipped,
    }


if __name__ == "__main__":
    main()
