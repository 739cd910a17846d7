"""Train a JAX model on xpatch patches through Grain, checkpoint, resume, then infer.

The scene is synthetic (3 bands, 384 x 448, dask-chunked 128 x 128) with a mask that
a per-pixel logistic model can learn. The pipeline:

    scene.patch(...).to_grain()  ->  chunk-local shuffle  ->  batch  ->  [mp_prefetch]

Training saves a checkpoint (model parameters and the Grain iterator's state) and
a later run resumes from it with exactly the next batch: ``--steps 20`` in one go
gives the same parameters as ``--steps 12`` then ``--steps 20 --resume``. The
pipeline ends with ``.pipe(src.with_fingerprint)``, so the saved state carries the
source's fingerprint (its data and patch layout): resuming with another layout,
say ``--stride 32`` after a run with the default 48, is refused with a message
instead of continuing at the same position in other patches. Then the model
predicts every patch, in the pipeline's order, and the predictions go back to the
grid with ``p.reconstruct``.

Run ``python examples/train_jax.py`` (add ``--workers 2`` for Grain worker
processes; needs ``pip install "xarray-patch[grain]" jax``).
"""

from __future__ import annotations

import argparse
import pickle
import tempfile
from pathlib import Path

import dask.array as dsa
import grain
import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

import xpatch

TRUE_WEIGHTS = np.array([2.0, -1.0, 0.5], dtype=np.float32)


def make_scene() -> xr.Dataset:
    """Image (band, y, x) and mask (y, x) in dask chunks, as if opened from zarr."""
    rng = np.random.default_rng(0)
    image = rng.normal(size=(3, 384, 448)).astype(np.float32)
    mask = (np.tensordot(TRUE_WEIGHTS, image, axes=1) > 0.25).astype(np.float32)
    return xr.Dataset(
        {
            "image": (("band", "y", "x"), dsa.from_array(image, chunks=(3, 128, 128))),
            "mask": (("y", "x"), dsa.from_array(mask, chunks=128)),
        }
    )


def logits(params: dict, image: jnp.ndarray) -> jnp.ndarray:
    """Per-pixel logistic model: (b, band, y, x) -> (b, y, x)."""
    return jnp.einsum("c,bcyx->byx", params["w"], image) + params["b"]


@jax.jit
def train_step(params: dict, image, mask, weights, lr: float = 0.5):
    """One step of gradient descent on the window-weighted cross-entropy."""

    def loss_fn(p):
        z = logits(p, image)
        per_pixel = jnp.logaddexp(0.0, z) - mask * z
        return jnp.sum(weights * per_pixel) / jnp.sum(weights)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), loss


def pipeline(src, workers: int) -> grain.IterDataset:
    ds = src.chunk_shuffle(seed=42).repeat().batch(16, drop_remainder=True).to_iter_dataset()
    if workers:
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
    # Last, after mp_prefetch: the state names the source, and set_state refuses another.
    return ds.pipe(src.with_fingerprint)


def save_checkpoint(path: Path, step: int, params: dict, iterator_state: dict) -> None:
    numpy_params = {k: np.asarray(v) for k, v in params.items()}
    path.write_bytes(
        pickle.dumps({"step": step, "params": numpy_params, "iterator": iterator_state})
    )


def load_checkpoint(path: Path) -> tuple[int, dict, dict]:
    saved = pickle.loads(path.read_bytes())
    params = {k: jnp.asarray(v) for k, v in saved["params"].items()}
    return saved["step"], params, saved["iterator"]


def train(
    steps: int, checkpoint: Path, resume: bool, workers: int, stride: int = 48
) -> tuple[dict, list[float]]:
    """Train to ``steps`` steps, resuming from ``checkpoint`` if asked; save it at the end.

    A checkpoint saved from another source (other data, stride, ...) raises
    ``xpatch.OptionError`` naming both fingerprints, before any step.
    """
    scene = make_scene()
    p = scene.patch(y=64, x=64, stride=stride, window="hann")
    src = p.to_grain()
    iterator = iter(pipeline(src, workers))
    step, params = 0, {"w": jnp.zeros(3, jnp.float32), "b": jnp.zeros((), jnp.float32)}
    if resume:
        step, params, state = load_checkpoint(checkpoint)
        try:
            iterator.set_state(state)  # refused unless state["xpatch_fingerprint"] matches
        except xpatch.OptionError:
            iterator.close()  # stops the worker processes before the error reaches the caller
            raise
    losses = []
    while step < steps:
        batch = next(iterator)
        params, loss = train_step(params, batch["image"], batch["mask"], batch["weights"])
        losses.append(float(loss))
        step += 1
    save_checkpoint(checkpoint, step, params, iterator.get_state())
    iterator.close()  # stops the worker processes now, not at interpreter exit
    return params, losses


def infer(params: dict, stride: int = 48) -> tuple[xr.DataArray, xr.DataArray]:
    """Predict every patch through a sequential pipeline and reconstruct the grid."""
    scene = make_scene()
    p = scene.patch(y=64, x=64, stride=stride, window="hann")
    src = p.to_grain(variables=["image"])
    outputs, indices = [], []
    for batch in grain.MapDataset.source(src).batch(32):
        outputs.append(np.asarray(jax.nn.sigmoid(logits(params, batch["image"]))))
        indices.append(batch["index"])
    pred = src.predictions(np.concatenate(outputs), index=np.concatenate(indices), dims=("y", "x"))
    return p.reconstruct(pred), scene["mask"]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument(
        "--checkpoint", type=Path, default=None, help="where to save (default: a temporary file)"
    )
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument(
        "--stride", type=int, default=48, help="patch stride; a resume needs the saved one"
    )
    args = parser.parse_args(argv)
    if args.resume and args.checkpoint is None:
        parser.error("--resume needs --checkpoint PATH, the file an earlier run saved")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or Path(tmp) / "checkpoint.pkl"
        try:
            params, losses = train(args.steps, checkpoint, args.resume, args.workers, args.stride)
        except xpatch.OptionError as error:
            if not args.resume:
                raise
            # A checkpoint of another source (data or layout): say why, exit with status 2.
            parser.error(f"cannot resume from {checkpoint}: {error}")
    probability, mask = infer(params, args.stride)
    accuracy = float(((probability.values > 0.5) == (mask.values > 0.5)).mean())
    print(
        f"trained to step {args.steps}: loss {losses[0]:.3f} -> {losses[-1]:.3f}"
        if losses
        else f"nothing to train at step {args.steps}"
    )
    print(f"reconstructed prediction {dict(probability.sizes)}, pixel accuracy {accuracy:.3f}")
    return {"params": params, "losses": losses, "accuracy": accuracy}


if __name__ == "__main__":
    main()
