"""The training examples run: JAX with checkpoint and resume, PyTorch map-style."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_jax_training_resumes_at_the_exact_next_batch_and_learns(tmp_path):
    pytest.importorskip("jax")
    pytest.importorskip("grain")
    example = load("train_jax")
    straight = example.main(["--steps", "20", "--checkpoint", str(tmp_path / "a.pkl")])
    first = example.main(["--steps", "12", "--checkpoint", str(tmp_path / "b.pkl")])
    resumed = example.main(["--steps", "20", "--checkpoint", str(tmp_path / "b.pkl"), "--resume"])
    assert first["losses"] + resumed["losses"] == pytest.approx(straight["losses"], rel=1e-6)
    for name in ("w", "b"):
        np.testing.assert_allclose(resumed["params"][name], straight["params"][name], rtol=1e-6)
    assert straight["losses"][-1] < 0.5 * straight["losses"][0]
    assert straight["accuracy"] > 0.95


def test_jax_training_refuses_to_resume_a_checkpoint_of_another_layout(tmp_path, capsys):
    pytest.importorskip("jax")
    pytest.importorskip("grain")
    example = load("train_jax")
    checkpoint = tmp_path / "c.pkl"
    example.main(["--steps", "3", "--checkpoint", str(checkpoint)])
    saved = checkpoint.read_bytes()
    with pytest.raises(SystemExit) as refused:
        example.main(["--steps", "6", "--checkpoint", str(checkpoint), "--resume", "--stride=32"])
    assert refused.value.code == 2
    message = capsys.readouterr().err
    scene = example.make_scene()
    for stride in (48, 32):
        fingerprint = scene.patch(y=64, x=64, stride=stride, window="hann").to_grain().fingerprint
        assert fingerprint in message
    assert "cannot resume from" in message and "rebuild the source as it was saved" in message
    assert checkpoint.read_bytes() == saved  # refused before a step, nothing overwritten


def test_the_source_is_a_pytorch_map_style_dataset():
    pytest.importorskip("torch")
    result = load("torch_dataset").main(["--epochs", "2"])
    assert result["losses"][-1] < result["losses"][0]
    assert result["accuracy"] > 0.8


def test_training_over_a_folder_of_scenes_resumes_exactly_and_writes_each_scene(tmp_path):
    pytest.importorskip("grain")
    pytest.importorskip("rioxarray")
    example = load("train_scenes")
    scenes = ["--folder", str(tmp_path / "scenes")]  # written by the first run, then reused
    straight = example.main([*scenes, "--steps", "24", "--out", str(tmp_path / "a")])
    checkpoint = str(tmp_path / "b.pkl")
    first = example.main(
        [*scenes, "--steps", "10", "--checkpoint", checkpoint, "--out", str(tmp_path / "b")]
    )
    resumed = example.main(
        [
            *scenes,
            "--steps",
            "24",
            "--checkpoint",
            checkpoint,
            "--resume",
            "--out",
            str(tmp_path / "c"),
        ]
    )
    assert first["losses"] + resumed["losses"] == pytest.approx(straight["losses"], rel=1e-6)
    np.testing.assert_allclose(resumed["params"]["w"], straight["params"]["w"], rtol=1e-6)
    assert straight["losses"][-1] < 0.5 * straight["losses"][0]
    assert straight["accuracy"] > 0.95
    assert sorted(p.name for p in (tmp_path / "a").iterdir() if p.suffix == ".zarr") == [
        f"scene{k}.zarr" for k in range(4)
    ]
    # 24 batches of 8 patches: within one epoch each chunk is read about once.
    assert straight["loads"] <= 24


def test_forecast_training_over_a_zarr_resumes_exactly_and_finds_the_dynamics(tmp_path):
    pytest.importorskip("grain")
    example = load("train_forecast")
    data = ["--data", str(tmp_path / "archive.zarr")]
    straight = example.main([*data, "--steps", "30", "--checkpoint", str(tmp_path / "a.pkl")])
    first = example.main([*data, "--steps", "12", "--checkpoint", str(tmp_path / "b.pkl")])
    resumed = example.main(
        [*data, "--steps", "30", "--checkpoint", str(tmp_path / "b.pkl"), "--resume"]
    )
    assert first["losses"] + resumed["losses"] == straight["losses"]
    np.testing.assert_array_equal(resumed["params"]["xtx"], straight["params"]["xtx"])
    a, b, c = straight["coefficients"]
    truth = example.TRUE
    assert abs(a - truth["a"]) < 0.02 and abs(b - truth["b"]) < 0.02 and abs(c) < 0.05
    assert straight["samples"] == 464 and straight["skipped"].count == 4
