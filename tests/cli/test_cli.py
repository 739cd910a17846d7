"""The ``xpatch`` command and the quickstart example."""

from __future__ import annotations

import dataclasses
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import xpatch.cli.demo
from xpatch.cli import main
from xpatch.cli.demo import make_scene, run_demo, toy_model

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--extent", "256", "--chunks", "100"]


def test_demo_succeeds_and_prints_the_summary(capsys):
    assert main(["demo", "--size", "64", "--stride", "48", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "Completed" in out  # the progress bar is on by default
    assert "scene       reflectance (band: 3, y: 256, x: 256) float32" in out
    assert "chunks      (band: 3, y: 100, x: 100), 9 chunks" in out
    # Along 256 cells: anchors 0, 48, ..., 192 -> 5 per dim.
    assert "25 patches of 64x64, stride 48x48, window 'hann', boundary 'shift'" in out
    assert "toy model on 25 patches in " in out
    assert "0 run while building" in out  # the whole chain is lazy until the write
    assert "written     9 blocks of score (y, x) float32 to a temporary zarr store" in out
    assert "max |reconstruct(patches) - scene| = " in out
    assert "max |written output - model(scene)| = " in out
    assert "wall time" in out
    assert out.rstrip().endswith("OK: both errors are below 1e-05 (float32 tolerance)")


def test_demo_keeps_the_output_when_asked(tmp_path, capsys):
    store = tmp_path / "score.zarr"
    argv = ["demo", "--size", "32", "--stride", "24", "--extent", "64", "--chunks", "32"]
    assert main([*argv, "--output", str(store), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "Completed" not in out
    assert str(store) in out
    written = xr.open_zarr(store)["score"]
    assert written.dims == ("y", "x")
    np.testing.assert_allclose(
        written.values, toy_model(make_scene(64, chunks=None)).values, atol=1e-6
    )


@pytest.mark.parametrize("window", ["boxcar", "hann", "triangular", "tukey"])
def test_demo_errors_are_within_float32_tolerance(window):
    result = run_demo(size=48, stride=40, window=window, chunks=70, seed=3, extent=160)
    assert result.ok
    assert result.roundtrip_error <= 1e-6
    assert result.model_error <= 1e-6
    assert result.tasks_run_while_building == 0
    assert result.patches_seen == len(result.patcher)  # each patch through the model once
    assert result.blocks_written == 9


def test_demo_fails_with_exit_1_when_errors_exceed_the_tolerance(monkeypatch, capsys):
    monkeypatch.setattr(xpatch.cli.demo, "TOLERANCE", -1.0)
    assert main(["demo", "--size", "32", "--stride", "24", "--extent", "64"]) == 1
    captured = capsys.readouterr()
    assert "FAILED" in captured.err
    assert "OK" not in captured.out


def test_nan_error_is_a_failure():
    result = run_demo(size=32, stride=24, chunks=32, extent=64)
    assert result.ok
    assert not dataclasses.replace(result, roundtrip_error=float("nan")).ok
    assert not dataclasses.replace(result, model_error=float("nan")).ok


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--size", "32", "--stride", "40"], "--stride 40 is larger than --size 32"),
        (["--size", "300", "--extent", "256"], "--size 300 is larger than the scene"),
    ],
)
def test_demo_rejects_layouts_that_cannot_work(argv, message, capsys):
    assert main(["demo", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [[], ["demo", "--size", "0"], ["demo", "--window", "gaussian"], ["demo", "--seed", "-1"]],
)
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "usage: xpatch" in capsys.readouterr().err


def test_scene_is_deterministic_and_lazy():
    scene = make_scene(64, seed=7, chunks=32)
    assert scene.chunks == ((3,), (32, 32), (32, 32))
    assert scene.dtype == np.float32
    assert list(scene.band.values) == ["red", "green", "nir"]
    assert scene.attrs["seed"] == 7
    assert make_scene(64, seed=7, chunks=None).equals(scene)
    assert not make_scene(64, seed=8, chunks=None).equals(scene)


def test_python_dash_m_xpatch():
    argv = ["demo", "--size", "32", "--stride", "24", "--extent", "64", "--chunks", "32"]
    done = subprocess.run(
        [sys.executable, "-m", "xpatch", *argv], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "OK: both errors are below" in done.stdout


def test_quickstart_example_runs(capsys):
    runpy.run_path(str(ROOT / "examples" / "quickstart.py"), run_name="__main__")
    assert "reconstruction matches: OK" in capsys.readouterr().out
