"""``xpatch apply`` resumes only the same computation, and says what to do otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import dask
import numpy as np
import pytest
import xarray as xr
from fsspec.implementations.local import LocalFileSystem

from xpatch.cli import main
from xpatch.io.record import WriterLock

pytest.importorskip("rioxarray")

MODEL = textwrap.dedent(
    """
    import os

    CALLS = [0]


    def double(batch):
        # Crashes after XPATCH_TEST_CRASH_AFTER batches: the environment is not the
        # model's code, so a rerun without it is the same model.
        CALLS[0] += 1
        crash_after = os.environ.get("XPATCH_TEST_CRASH_AFTER")
        if crash_after and CALLS[0] > int(crash_after):
            raise RuntimeError("simulated crash")
        return batch * FACTOR


    FACTOR = 2
    """
)


@pytest.fixture
def scene(tmp_path):
    values = np.random.default_rng(11).random((2, 96, 128)).astype("float32")
    da = xr.DataArray(
        values,
        dims=("band", "y", "x"),
        coords={"band": [1, 2], "y": 5000.0 - 10.0 * np.arange(96), "x": 10.0 * np.arange(128)},
        name="reflectance",
    ).rio.write_crs("EPSG:32633")
    path = tmp_path / "in.tif"
    da.rio.to_raster(path)
    return path, values


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "resume_model.py"
    path.write_text(MODEL)
    return path


def run(argv, crash_after=None, monkeypatch=None):
    """Run ``xpatch apply`` in this process on the synchronous scheduler."""
    if crash_after is not None:
        monkeypatch.setenv("XPATCH_TEST_CRASH_AFTER", str(crash_after))
    try:
        with dask.config.set(scheduler="synchronous"):
            return main(["apply", *argv, "--no-progress"])
    finally:
        if monkeypatch is not None:
            monkeypatch.delenv("XPATCH_TEST_CRASH_AFTER", raising=False)


def base_argv(scene, model_file, target):
    source, _ = scene
    return [
        str(source),
        str(target),
        "--fn",
        f"{model_file}:double",
        "--size",
        "32",
        "--stride",
        "24",
        "--chunks",
        "32",
        "--window",
        "hann",
    ]


def crash(argv, monkeypatch):
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(argv, crash_after=5, monkeypatch=monkeypatch)


def done_markers(target) -> list[str]:
    return sorted(p.name for p in (target / ".xpatch" / "done").glob("*/*"))


def change_option(argv, option, value):
    argv = list(argv)
    argv[argv.index(option) + 1] = value
    return argv


@pytest.mark.parametrize(
    ("what", "expected"),
    [
        ("model", "model (fn)"),
        ("input", "input"),
        ("size", "size"),
        ("stride", "stride"),
        ("window", "window"),
    ],
)
def test_a_changed_computation_is_refused_and_the_run_stays_resumable(
    what, expected, scene, model_file, tmp_path, monkeypatch, capsys
):
    target = tmp_path / "out.zarr"
    argv = base_argv(scene, model_file, target)
    crash(argv, monkeypatch)
    done = done_markers(target)
    assert done, "the crashed run wrote no block: the test would prove nothing"

    changed = list(argv)
    if what == "model":
        model_file.write_text(MODEL.replace("FACTOR = 2", "FACTOR = 3"))
    elif what == "input":
        source, values = scene
        other = xr.open_dataarray(source, engine="rasterio").load()
        other.values[:] = values + 1
        other.rio.to_raster(source)
    elif what == "size":
        changed = change_option(argv, "--size", "40")
    elif what == "stride":
        changed = change_option(argv, "--stride", "16")
    else:
        changed = change_option(argv, "--window", "triangular")
    capsys.readouterr()

    assert run(changed) == 2
    err = capsys.readouterr().err
    assert "another computation" in err, err
    assert expected in err, err
    assert "--restart" in err and "--force-resume" in err, err
    assert done_markers(target) == done  # nothing written, nothing removed

    # Starting again with the change is what --restart is for.
    assert run([*changed, "--restart"]) == 0
    factor = 3 if what == "model" else 2
    source, values = scene
    if what == "input":
        values = values + 1
    written = xr.open_zarr(target)["out"].values
    np.testing.assert_allclose(written, values * factor, rtol=1e-6)


def test_the_same_command_resumes_and_writes_only_the_missing_blocks(
    scene, model_file, tmp_path, monkeypatch, capsys
):
    target = tmp_path / "out.zarr"
    argv = base_argv(scene, model_file, target)
    crash(argv, monkeypatch)
    done = len(done_markers(target))
    capsys.readouterr()

    # Another batch size changes no value: still the same computation.
    assert run([*argv, "--batch-size", "7"]) == 0
    out = capsys.readouterr().out
    total = 3 * 4  # 96 x 128 in 32-cell chunks
    assert f"wrote {total - done} blocks" in out, out
    np.testing.assert_allclose(xr.open_zarr(target)["out"].values, scene[1] * 2, rtol=1e-6)
    assert not (target / ".xpatch").exists()


def test_force_resume_continues_after_a_change_that_alters_no_value(
    scene, model_file, tmp_path, monkeypatch, capsys
):
    target = tmp_path / "out.zarr"
    argv = base_argv(scene, model_file, target)
    crash(argv, monkeypatch)
    model_file.write_text(MODEL.replace("def double", "# a comment\ndef double"))
    assert run(argv) == 2
    assert "another computation" in capsys.readouterr().err
    assert run([*argv, "--force-resume"]) == 0
    np.testing.assert_allclose(xr.open_zarr(target)["out"].values, scene[1] * 2, rtol=1e-6)
    assert run([*argv, "--force-resume", "--restart"]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_a_killed_writers_lock_is_taken_over_by_the_same_command(
    scene, model_file, tmp_path, capsys
):
    target = tmp_path / "out.zarr"
    argv = base_argv(scene, model_file, target)
    # A writer that was killed: its process is gone, its lock is not.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    folder = target / ".xpatch"
    folder.mkdir(parents=True)
    info = WriterLock(LocalFileSystem(), str(folder), str(target)).content()
    info.update(pid=gone.pid, command="xpatch apply (killed)")
    (folder / "lock.json").write_text(json.dumps(info))

    assert run(argv) == 0
    err = capsys.readouterr().err
    assert "xpatch: warning: took over the lock" in err and "no longer runs" in err, err
    np.testing.assert_allclose(xr.open_zarr(target)["out"].values, scene[1] * 2, rtol=1e-6)
    assert not (folder / "lock.json").exists()


def test_an_object_store_url_is_not_a_local_folder(
    scene, model_file, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    argv = base_argv(scene, model_file, "memory://cli-test/out.zarr")
    assert run(argv) == 0
    assert not (tmp_path / "memory:").exists()
    written = xr.open_zarr("memory://cli-test/out.zarr")["out"].values
    np.testing.assert_allclose(written, scene[1] * 2, rtol=1e-6)
    unknown = [argv[0], "nosuch://x/out.zarr", *argv[2:]]
    assert run(unknown) == 2
    assert "fsspec knows no filesystem" in capsys.readouterr().err
    assert not list(tmp_path.glob("nosuch*"))


def test_a_run_that_failed_before_its_first_block_does_not_stand_in_the_way(
    scene, model_file, tmp_path, monkeypatch, capsys
):
    # A first try that failed at once left a record that refused the corrected command
    # until --restart: nothing was written, so nothing was protected.
    target = tmp_path / "out.zarr"
    argv = base_argv(scene, model_file, target)
    with pytest.raises(RuntimeError, match="simulated crash"):
        # The first call (a batch of zeros that finds fn's output) passes; the first batch fails.
        run(argv, crash_after=1, monkeypatch=monkeypatch)
    assert done_markers(target) == []
    model_file.write_text(MODEL.replace("FACTOR = 2", "FACTOR = 3"))  # the corrected model
    assert run(argv) == 0
    err = capsys.readouterr().err
    assert "xpatch: warning:" in err and "wrote no block before it stopped; starting over" in err
    _, values = scene
    np.testing.assert_allclose(xr.open_zarr(target)["out"].values, values * 3, rtol=1e-6)


SLOW_MODEL = textwrap.dedent(
    """
    import os
    import time

    CALLS = [0]


    def block_done():
        # A marker, done/<variable>/<block>, as the test waits for: the variable's
        # folder alone, made before its first marker, held every thread, the block
        # being written among them, and no marker ever came (seen under two test
        # workers: "no block done in 120 s").
        done = os.path.join(os.environ.get("XPATCH_TEST_TARGET", ""), ".xpatch", "done")
        if not os.path.isdir(done):
            return False
        return any(
            any(os.scandir(folder.path)) for folder in os.scandir(done) if folder.is_dir()
        )


    def double(batch):
        # Once a block is done, wait while the test holds the run (it then sends
        # Ctrl-C): however loaded the machine, the run cannot finish before the signal.
        # Holding after a count of batches instead held for ever when the threads had
        # each begun another block (none done, none to finish).
        CALLS[0] += 1
        while (
            CALLS[0] > 2
            and block_done()
            and os.path.exists(os.environ.get("XPATCH_TEST_HOLD", ""))
        ):
            time.sleep(0.02)
        return batch * 2
    """
)


def test_ctrl_c_stops_with_one_line_and_the_same_command_resumes(scene, tmp_path):
    import os
    import signal
    import time

    model = tmp_path / "slow_model.py"
    model.write_text(SLOW_MODEL)
    hold = tmp_path / "hold"
    hold.touch()
    target = tmp_path / "out.zarr"
    argv = base_argv(scene, model, target)
    # SIGINT's default handler, even where the test runs with SIGINT ignored (a job
    # started in the background inherits that, and Python then leaves it ignored).
    command = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv[0] = 'xpatch'; runpy.run_module('xpatch', run_name='__main__')"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", command, "apply", *argv, "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "PYTHONWARNINGS": "ignore",
            "XPATCH_TEST_HOLD": str(hold),
            "XPATCH_TEST_TARGET": str(target),
        },
    )
    try:
        deadline = time.monotonic() + 120
        while not done_markers(target):
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()  # its stderr ends only with it
                pytest.fail(f"no block done in 120 s: {process.communicate()[1][-3000:]}")
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        time.sleep(0.5)
        hold.unlink()  # the batches in flight finish; the run must stop, not go on
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert "Traceback" not in err, err
    assert "xpatch: interrupted. Run the same command again to resume" in err, err
    written = done_markers(target)
    assert 0 < len(written) < 12  # the run stopped among its blocks

    assert run(argv) == 0  # the same command, nothing else: no lock in the way
    np.testing.assert_allclose(xr.open_zarr(target)["out"].values, scene[1] * 2, rtol=1e-6)


def test_another_task_memory_that_changes_the_blocks_is_refused_not_mixed(
    scene, model_file, tmp_path, monkeypatch, capsys
):
    target = tmp_path / "out.zarr"
    argv = base_argv(scene, model_file, target)
    argv = change_option(change_option(argv, "--chunks", "64"), "--size", "16")
    argv = change_option(argv, "--stride", "12")
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(argv, crash_after=4, monkeypatch=monkeypatch)
    done = done_markers(target)
    assert done
    capsys.readouterr()
    # Working blocks of 32 cells instead of the 64-cell chunks: other zarr chunks.
    assert run([*argv, "--task-memory", "48KiB"]) == 2
    err = capsys.readouterr().err
    assert "do not line up" in err and "--task-memory" in err and "--restart" in err, err
    assert done_markers(target) == done
    assert run(argv) == 0
    np.testing.assert_allclose(xr.open_zarr(target)["out"].values, scene[1] * 2, rtol=1e-6)


def test_another_halo_is_refused_as_another_computation(
    scene, model_file, tmp_path, monkeypatch, capsys
):
    target = tmp_path / "out.zarr"
    argv = [*base_argv(scene, model_file, target), "--halo", "2", "--pad-mode", "edge"]
    crash(argv, monkeypatch)
    done = done_markers(target)
    assert done
    capsys.readouterr()
    assert run(change_option(argv, "--halo", "3")) == 2
    err = capsys.readouterr().err
    assert "another computation" in err and "halo" in err, err
    assert done_markers(target) == done
