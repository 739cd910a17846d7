"""The same xpatch source as a PyTorch map-style dataset.

``p.to_grain()`` has ``__len__`` and ``__getitem__(int)``, which is all
``torch.utils.data.DataLoader`` needs; its default collate turns the item's numpy
arrays into tensors. The chunk-local order comes from
``src.chunk_shuffled_order(seed, epoch)``, a plain array of indices, so no Grain
is needed here. A tiny per-pixel model trains for two epochs, then ``p.apply``
runs it over the whole image.

Run ``python examples/torch_dataset.py`` (needs ``pip install torch``).
"""

from __future__ import annotations

import argparse

import dask.array as dsa
import numpy as np
import torch
import xarray as xr

import xpatch  # noqa: F401  (registers .patch)


def make_scene() -> xr.Dataset:
    """Image (band, y, x) and a mask a per-pixel linear model can learn, dask-chunked."""
    rng = np.random.default_rng(0)
    image = rng.normal(size=(3, 256, 320)).astype(np.float32)
    mask = (np.tensordot([2.0, -1.0, 0.5], image, axes=1) > 0.25).astype(np.float32)
    return xr.Dataset(
        {
            "image": (("band", "y", "x"), dsa.from_array(image, chunks=(3, 128, 128))),
            "mask": (("y", "x"), dsa.from_array(mask, chunks=128)),
        }
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    scene = make_scene()
    p = scene.patch(y=64, x=64, stride=48, window="hann")
    src = p.to_grain()
    model = torch.nn.Conv2d(3, 1, kernel_size=1)  # per-pixel logistic regression
    optimiser = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for epoch in range(args.epochs):
        loader = torch.utils.data.DataLoader(
            src,
            batch_size=16,
            sampler=src.chunk_shuffled_order(seed=42, epoch=epoch).tolist(),
            num_workers=args.workers,
        )
        for batch in loader:
            logits = model(batch["image"])[:, 0]
            per_pixel = torch.nn.functional.binary_cross_entropy_with_logits(
                logits, batch["mask"], reduction="none"
            )
            loss = (batch["weights"] * per_pixel).sum() / batch["weights"].sum()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            losses.append(loss.item())

    def predict(batch: np.ndarray) -> np.ndarray:  # (b, band, y, x) -> (b, y, x)
        with torch.no_grad():
            return torch.sigmoid(model(torch.from_numpy(batch))[:, 0]).numpy()

    inference = scene["image"].patch(y=64, x=64, stride=48, window="hann")
    probability = inference.apply(predict, output_dims={}, dtype="float32").compute()
    accuracy = float(((probability.values > 0.5) == (scene["mask"].values > 0.5)).mean())
    print(f"{len(src)} patches, {args.epochs} epochs: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    print(f"p.apply prediction {dict(probability.sizes)}, pixel accuracy {accuracy:.3f}")
    return {"losses": losses, "accuracy": accuracy}


if __name__ == "__main__":
    main()
