"""Spill folders of killed writers are removed by the next spill, and only theirs.

Writers are real processes (:mod:`tests.spill_writer`) killed by a real SIGKILL,
at the narrow windows of a folder's life and at random moments of a write.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import dask
import numpy as np
import pytest
import xarray as xr

import xpatch
import xpatch.spill_folders
import xpatch.waves
from tests import spill_writer
from xpatch.spill_folders import PREFIX, remove_stale

pytestmark = pytest.mark.skipif(
    xpatch.spill_folders.fcntl is None, reason="folders are locked with fcntl.flock (POSIX)"
)

ROOT = Path(__file__).resolve().parents[1]
COMMAND = [sys.executable, "-c", "from tests.spill_writer import main; main()"]


def spill_folders(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.name.startswith(PREFIX))


def start_writer(root: Path, out: Path, point: str) -> subprocess.Popen:
    """Start a writer whose spill folder goes under ``root``; return once it is ready."""
    env = {**os.environ, "TMPDIR": str(root), "PYTHONPATH": str(ROOT)}
    writer = subprocess.Popen(
        [*COMMAND, str(out), point], cwd=ROOT, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert writer.stdout.readline().strip() == "ready", writer.stderr.read()
    return writer


def go(writer: subprocess.Popen) -> None:
    writer.stdin.write("go\n")
    writer.stdin.flush()


def finish(writer: subprocess.Popen) -> tuple[int, str]:
    _, err = writer.communicate(timeout=120)
    return writer.returncode, err


@pytest.fixture
def spills_into(tmp_path, monkeypatch):
    """Point this process's spills at ``tmp_path / "tmp"``, every piece spilled."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(xpatch.waves.tempfile, "tempdir", str(root))
    for name, value in spill_writer.SPILL_EVERYTHING.items():  # as the writers do
        monkeypatch.setattr(xpatch.waves, name, value)
    return root


def write_and_check(root: Path, out: Path, left: tuple[Path, ...] = ()) -> None:
    """Write the writer's result here (spilling under ``root``): right, and only ``left`` left."""
    lazy = spill_writer.result()
    with dask.config.set(scheduler="synchronous"):
        xpatch.write(lazy, out, progress=False)
        expected = lazy.compute()
    np.testing.assert_array_equal(xr.open_zarr(out)["temp"], expected)
    assert spill_folders(root) == list(left)


@pytest.mark.slow
@pytest.mark.parametrize("point", spill_writer.KILL_POINTS)
def test_a_writer_killed_at_a_narrow_window_leaves_a_folder_the_next_spill_removes(
    point, tmp_path, spills_into, monkeypatch
):
    writer = start_writer(spills_into, tmp_path / "killed.zarr", point)
    go(writer)
    code, err = finish(writer)
    assert code == -signal.SIGKILL, err
    [left] = spill_folders(spills_into)
    files = sorted(os.listdir(left))
    if point in ("unlocked", "locked"):
        assert files == []
    else:
        assert files  # pieces were spilled, and not all removed
    # Changed moments ago, it is kept: it cannot be told from the folder of a live
    # process that has made it and not yet taken its lock.
    assert remove_stale(str(spills_into)) == []
    monkeypatch.setattr(xpatch.spill_folders, "STALE_SECONDS", 0.0)
    write_and_check(spills_into, tmp_path / "next.zarr")


@pytest.mark.slow
def test_writers_killed_at_random_moments_leave_nothing_after_the_next_spill(
    tmp_path, spills_into, monkeypatch
):
    monkeypatch.setattr(xpatch.spill_folders, "STALE_SECONDS", 0.0)
    writer = start_writer(spills_into, tmp_path / "whole.zarr", "none")
    go(writer)
    done, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err
    duration = float(done.split()[-1])  # of the write alone, in the writer
    assert spill_folders(spills_into) == []
    rng = random.Random(13)
    seen_folder = 0
    for case in range(3):
        writer = start_writer(spills_into, tmp_path / f"killed-{case}.zarr", "none")
        go(writer)
        time.sleep(rng.uniform(case, case + 1) / 3 * duration)  # one kill per third
        writer.send_signal(signal.SIGKILL)
        code, err = finish(writer)
        assert code in (0, -signal.SIGKILL), err
        seen_folder += bool(spill_folders(spills_into))
        assert len(remove_stale(str(spills_into))) <= 1
        assert spill_folders(spills_into) == []
    assert seen_folder  # some kill hit a write with its folder made
    write_and_check(spills_into, tmp_path / "next.zarr")


def test_the_folder_of_a_live_writer_is_kept_however_old(tmp_path, spills_into, monkeypatch):
    monkeypatch.setattr(xpatch.spill_folders, "STALE_SECONDS", 0.0)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from xpatch.spill_folders import LockedFolder; "
         "f = LockedFolder(); print(f.path, flush=True); sys.stdin.readline()"],
        env={**os.environ, "TMPDIR": str(spills_into)}, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    path = Path(holder.stdout.readline().strip())
    (path / "0.pickle").write_bytes(b"pieces")
    os.utime(path, (0, 0))  # last changed in 1970: only its lock keeps it
    try:
        assert remove_stale(str(spills_into)) == []
        write_and_check(spills_into, tmp_path / "beside.zarr", left=(path,))
        assert os.listdir(path) == ["0.pickle"]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert remove_stale(str(spills_into)) == [str(path)]
    assert spill_folders(spills_into) == []


def test_a_young_unlocked_folder_is_kept_and_other_names_are_never_touched(tmp_path):
    root = tmp_path
    young = Path(xpatch.spill_folders.tempfile.mkdtemp(prefix=PREFIX, dir=root))
    other = root / "someone-else"
    other.mkdir()
    os.utime(other, (0, 0))
    a_file = root / f"{PREFIX}file"
    a_file.write_text("")
    os.utime(a_file, (0, 0))
    assert remove_stale(str(root)) == []
    os.utime(young, (time.time() - xpatch.spill_folders.STALE_SECONDS - 1,) * 2)
    assert remove_stale(str(root)) == [str(young)]
    assert sorted(p.name for p in root.iterdir()) == sorted([other.name, a_file.name])
