"""Spill folders of killed writers are removed by the next spill, and only theirs.

Writers are real processes (:mod:`tests.io.spill_writer`) killed by a real SIGKILL,
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
import xpatch.io.block_waves
import xpatch.io.spill_folders
from tests.io import spill_writer
from xpatch.io.spill_folders import UNLOCKED_MARK, folder_prefix, remove_stale

pytestmark = pytest.mark.skipif(
    xpatch.io.spill_folders.fcntl is None, reason="folders are locked with fcntl.flock (POSIX)"
)

ROOT = Path(__file__).resolve().parents[2]
COMMAND = [sys.executable, "-c", "from tests.io.spill_writer import main; main()"]


def spill_folders(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.name.startswith(folder_prefix()))


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
    """Tell a ready writer to start its write."""
    writer.stdin.write("go\n")
    writer.stdin.flush()


def finish(writer: subprocess.Popen) -> tuple[int, str]:
    """Wait for a writer to end; return its exit status and its stderr."""
    _, err = writer.communicate(timeout=120)
    return writer.returncode, err


@pytest.fixture
def spills_into(tmp_path, monkeypatch):
    """Point this process's spills at ``tmp_path / "tmp"``, every piece spilled."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(xpatch.io.block_waves.tempfile, "tempdir", str(root))
    for name, value in spill_writer.SPILL_EVERYTHING.items():  # as the writers do
        monkeypatch.setattr(xpatch.io.block_waves, name, value)
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
    monkeypatch.setattr(xpatch.io.spill_folders, "STALE_SECONDS", 0.0)
    write_and_check(spills_into, tmp_path / "next.zarr")


@pytest.mark.slow
def test_writers_killed_at_random_moments_leave_nothing_after_the_next_spill(
    tmp_path, spills_into, monkeypatch
):
    monkeypatch.setattr(xpatch.io.spill_folders, "STALE_SECONDS", 0.0)
    writer = start_writer(spills_into, tmp_path / "whole.zarr", "none")
    go(writer)
    done, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err
    duration = float(done.split()[-1])  # of the write alone, in the writer
    assert spill_folders(spills_into) == []
    rng = random.Random(13)
    for case in range(3):
        writer = start_writer(spills_into, tmp_path / f"killed-{case}.zarr", "none")
        go(writer)
        deadline = time.monotonic() + 60
        while not spill_folders(spills_into) and writer.poll() is None:
            assert time.monotonic() < deadline, "no spill folder appeared"
            time.sleep(0.002)
        # A random moment of the folder's life, which lasts about 3/4 of the write.
        time.sleep(rng.uniform(0, 0.5) * duration)
        writer.send_signal(signal.SIGKILL)
        code, err = finish(writer)
        assert code in (0, -signal.SIGKILL), err
        left = spill_folders(spills_into)
        assert remove_stale(str(spills_into)) == [str(p) for p in left]
        assert spill_folders(spills_into) == []
    write_and_check(spills_into, tmp_path / "next.zarr")


def test_the_folder_of_a_live_writer_is_kept_however_old(tmp_path, spills_into, monkeypatch):
    monkeypatch.setattr(xpatch.io.spill_folders, "STALE_SECONDS", 0.0)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from xpatch.io.spill_folders import LockedFolder; "
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


def test_only_old_unlocked_folders_of_this_user_and_host_are_removed(tmp_path, monkeypatch):
    root = tmp_path
    prefix = folder_prefix()
    old = time.time() - xpatch.io.spill_folders.STALE_SECONDS - 1

    def folder(name: str, age: float = 0.0) -> Path:
        path = root / name
        path.mkdir()
        (path / "0.pickle").write_bytes(b"pieces")
        os.utime(path, (age, age))
        return path

    young = folder(f"{prefix}young", time.time())
    marked = folder(f"{prefix}marked")
    (marked / UNLOCKED_MARK).write_text("")
    os.utime(marked, (0, 0))
    kept = [
        young,  # maybe a live process about to lock it
        marked,  # its process could not lock it: only it removes the folder
        folder("xpatch-overhangs-another.host@abc"),  # the other host may hold its lock
        folder(f"{prefix[:-1]}-longer.name@abc"),  # a host whose name starts with ours
        folder("someone-else"),
    ]
    a_file = root / f"{prefix}file"
    a_file.write_text("")
    target = folder("target")
    link = root / f"{prefix}link"
    link.symlink_to(target)
    os.utime(link, (0, 0), follow_symlinks=False)
    kept += [a_file, target, link]
    assert remove_stale(str(root)) == []
    with monkeypatch.context() as m:  # folders of another user
        me = os.getuid()
        m.setattr(xpatch.io.spill_folders.os, "getuid", lambda: me + 1)
        os.utime(young, (old, old))
        assert remove_stale(str(root)) == []
    assert remove_stale(str(root)) == [str(young)]
    assert sorted(root.iterdir()) == sorted(p for p in kept if p != young)
    assert os.listdir(target) == ["0.pickle"]


def test_a_folder_its_process_cannot_lock_is_marked_used_and_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(xpatch.io.spill_folders.tempfile, "tempdir", str(tmp_path))

    def no_locks(fd, operation):
        raise OSError(37, "No locks available")

    monkeypatch.setattr(xpatch.io.spill_folders.fcntl, "flock", no_locks)
    folder = xpatch.io.spill_folders.LockedFolder()
    assert os.listdir(folder.path) == [UNLOCKED_MARK]
    os.utime(folder.path, (0, 0))
    monkeypatch.undo()
    assert remove_stale(str(tmp_path)) == []  # the mark keeps it, however old
    folder.remove()
    assert list(tmp_path.iterdir()) == []
