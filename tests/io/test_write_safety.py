"""xpatch.write's refusals, in process: a resume never mixes runs, one writer at a time,
damaged records and metadata give XPatchErrors naming the fix, URLs never become folders."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import dask
import dask.array as da
import fsspec
import numpy as np
import pytest
import xarray as xr
import zarr
from fsspec.implementations.local import LocalFileSystem

import xpatch
from tests.conftest import run_script
from tests.io.writing import Affine, lazy_temperature
from xpatch.io import progress_record
from xpatch.io.record import STALE_AFTER_SECONDS, ProgressRecord, WriterLock

#: The ways out a refused resume must name.
WAYS_OUT = ("overwrite=True", "--restart", "resume='force'")


@pytest.fixture
def lazy() -> xr.DataArray:
    return lazy_temperature(seed=11)


BLOCKS = 16


def patcher(da: xr.DataArray, **changes) -> xpatch.Patcher:
    options = {"y": 8, "x": 8, "stride": 4, "window": "hann", **changes}
    return da.patch(**options)


def applied(da: xr.DataArray, fn=None, **changes) -> xr.DataArray:
    return patcher(da, **changes).apply(fn if fn is not None else Affine(), batch_size=64)


def interrupt(result: xr.DataArray, path) -> None:
    """Write ``result`` (whose model crashes) to ``path`` under the synchronous scheduler."""
    with dask.config.set(scheduler="synchronous"):
        with pytest.raises(RuntimeError, match="simulated crash"):
            xpatch.write(result, path, progress=False)


def interrupted(lazy: xr.DataArray, path, fail_after: int = 12) -> list[str]:
    """Interrupt the write of the reference result at ``path``; return its markers."""
    interrupt(applied(lazy, Affine(fail_after=fail_after)), path)
    done = markers(path)
    assert 0 < len(done) < BLOCKS, done
    return done


def markers(path) -> list[str]:
    """The block markers of the unfinished run at ``path``, relative to ``done/``."""
    done = progress_record(path) / "done"
    return sorted(str(m.relative_to(done)) for m in done.rglob("*") if m.is_file())


def record_bytes(path) -> bytes:
    return (progress_record(path) / "record.json").read_bytes()


def expected(lazy: xr.DataArray, k: int = 2) -> np.ndarray:
    return applied(lazy, Affine(k)).compute(scheduler="synchronous").values


def assert_written(path, values: np.ndarray, name: str = "temp") -> None:
    out = xr.open_zarr(path)
    np.testing.assert_array_equal(out[name].values, values)
    assert not progress_record(path).exists(), list(progress_record(path).rglob("*"))


def resume(result: xr.DataArray, path, **kwargs) -> int:
    with dask.config.set(scheduler="synchronous"):
        return xpatch.write(result, path, progress=False, **kwargs)


# -- a resume never mixes runs -----------------------------------------------------------


CHANGES = {
    "model": lambda lazy: applied(lazy, Affine(k=3)),
    "input": lambda lazy: applied(lazy + 1),
    "size": lambda lazy: applied(lazy, y=12, x=12),
    "stride": lambda lazy: applied(lazy, stride=2),
    "window": lambda lazy: applied(lazy, window="boxcar"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_resume_of_another_computation_refuses_and_leaves_the_run_alone(lazy, tmp_path, change):
    path = tmp_path / "o.zarr"
    done = interrupted(lazy, path)
    before = record_bytes(path)
    other = CHANGES[change](lazy)
    assert other.shape == lazy.shape  # the blocks line up: only the computation differs

    with pytest.raises(xpatch.OutputError) as caught:
        resume(other, path)

    message = str(caught.value)
    assert not isinstance(caught.value, xpatch.OutputLockedError)
    for way_out in WAYS_OUT:
        assert way_out in message, message
    assert "temp" in message, message  # names what differs
    # Nothing was written and nothing was forgotten: the run is still resumable.
    assert markers(path) == done
    assert record_bytes(path) == before
    assert not (progress_record(path) / "lock.json").exists()
    assert resume(applied(lazy), path) == BLOCKS - len(done)
    assert_written(path, expected(lazy))


def test_resume_force_continues_another_computation_block_by_block(lazy, tmp_path):
    path = tmp_path / "o.zarr"
    done = interrupted(lazy, path)
    with pytest.raises(xpatch.OutputError, match="resume='force'"):
        resume(applied(lazy, Affine(k=3)), path)

    new = Affine(k=3)
    assert resume(applied(lazy, new), path, resume="force") == BLOCKS - len(done)

    # Each block comes from the run that wrote it: the old model's blocks stay.
    old_values, new_values = expected(lazy, k=2), expected(lazy, k=3)
    want = new_values.copy()
    for marker in done:
        _, index = marker.split("/")
        _, i, j = map(int, index.split("."))
        region = (slice(None), slice(16 * i, 16 * i + 16), slice(16 * j, 16 * j + 16))
        want[region] = old_values[region]
    assert_written(path, want)
    assert 0 < new.patches


def test_an_unfinished_run_of_another_shape_refuses_even_forced(lazy, tmp_path):
    path = tmp_path / "o.zarr"
    done = interrupted(lazy, path)
    other = applied(lazy.isel(x=slice(0, 48)))
    with pytest.raises(xpatch.OutputError, match=r"overwrite=True") as caught:
        resume(other, path, resume="force")
    assert "resume='force'" not in str(caught.value)  # forcing cannot line blocks up
    assert markers(path) == done


def test_the_same_computation_resumes(lazy, tmp_path):
    # The control of the refusals above: an equal computation, rebuilt from scratch.
    path = tmp_path / "o.zarr"
    done = interrupted(lazy, path)
    healthy = Affine()
    assert resume(applied(lazy.copy(deep=True), healthy), path) == BLOCKS - len(done)
    assert 0 < healthy.patches < len(patcher(lazy))
    assert_written(path, expected(lazy))


MODEL_SOURCE = """
import numpy as np

FAIL_AFTER = None
CALLS = [0]


def model(batch):
    if len(batch) == 1 and not batch.any():
        return {expression}  # apply's call on zeros that finds the output: not counted
    if FAIL_AFTER is not None and CALLS[0] >= FAIL_AFTER:
        raise RuntimeError("simulated crash in the middle of the run")
    CALLS[0] += 1
    return {expression}
"""


@pytest.fixture
def model_module(tmp_path, monkeypatch):
    """A module in a file of tmp_path whose model(batch) computes the expression given."""
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"xpatch_model_{uuid.uuid4().hex}"
    path = tmp_path / f"{name}.py"
    bumps = [0]

    def load(expression: str):
        path.write_text(MODEL_SOURCE.format(expression=expression))
        # A later modification time whatever the clock's resolution.
        bumps[0] += 1
        stamp = time.time_ns() + bumps[0] * 10**9
        os.utime(path, ns=(stamp, stamp))
        if name in sys.modules:
            return importlib.reload(sys.modules[name])
        importlib.invalidate_caches()
        return importlib.import_module(name)

    yield load
    sys.modules.pop(name, None)


def test_a_model_whose_module_file_changed_refuses(lazy, tmp_path, model_module):
    path = tmp_path / "o.zarr"
    module = model_module("batch * 2 + 1")
    module.FAIL_AFTER = 12
    interrupt(applied(lazy, module.model), path)
    done = markers(path)
    assert 0 < len(done) < BLOCKS

    # "It crashed, I fixed the model, I ran the same command."
    module = model_module("batch * 2 + 1.5")
    with pytest.raises(xpatch.OutputError) as caught:
        resume(applied(lazy, module.model), path)
    for way_out in WAYS_OUT:
        assert way_out in str(caught.value), str(caught.value)
    assert markers(path) == done
    assert module.CALLS[0] == 0


def test_a_model_whose_module_file_did_not_change_resumes(lazy, tmp_path, model_module):
    path = tmp_path / "o.zarr"
    module = model_module("batch * 2 + 1")
    module.FAIL_AFTER = 12
    interrupt(applied(lazy, module.model), path)
    done = markers(path)

    module = model_module("batch * 2 + 1")  # rewritten and reloaded, but the same code
    assert resume(applied(lazy, module.model), path) == BLOCKS - len(done)
    assert_written(path, expected(lazy))


# -- damaged records and metadata ------------------------------------------------------------


def _truncated(text: str) -> str:
    return text[: len(text) // 2]


def _without_fingerprint(text: str) -> str:
    record = json.loads(text)
    del record["fingerprint"]
    return json.dumps(record)


def _fingerprint_not_a_dict(text: str) -> str:
    record = json.loads(text)
    record["fingerprint"] = "abc"
    return json.dumps(record)


def _unknown_state(text: str) -> str:
    record = json.loads(text)
    record["state"] = "resting"
    return json.dumps(record)


DAMAGES = {
    "truncated": _truncated,
    "garbage": lambda text: "\x00\x01 not a record {",
    "empty": lambda text: "",
    "a list": lambda text: "[1, 2, 3]",
    "unknown state": _unknown_state,
    "no fingerprint": _without_fingerprint,
    "fingerprint not a dict": _fingerprint_not_a_dict,
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_record_names_the_record_and_the_fix(lazy, tmp_path, damage):
    path = tmp_path / "o.zarr"
    done = interrupted(lazy, path)
    record = progress_record(path) / "record.json"
    record.write_text(DAMAGES[damage](record.read_text()))
    damaged = record.read_bytes()

    with pytest.raises(xpatch.OutputError) as caught:
        resume(applied(lazy), path)

    message = str(caught.value)
    assert str(record) in message, message
    assert "overwrite=True" in message and "--restart" in message, message
    # Refused, not repaired behind the user's back.
    assert record.read_bytes() == damaged
    assert markers(path) == done
    assert not (progress_record(path) / "lock.json").exists()
    # The way out works.
    assert resume(applied(lazy), path, overwrite=True) == BLOCKS
    assert_written(path, expected(lazy))


def test_a_removed_done_folder_rewrites_every_block(lazy, tmp_path):
    path = tmp_path / "o.zarr"
    interrupted(lazy, path)
    shutil.rmtree(progress_record(path) / "done")

    healthy = Affine()
    assert resume(applied(lazy, healthy), path) == BLOCKS
    assert healthy.patches == len(patcher(lazy))
    assert_written(path, expected(lazy))


ZARR_DAMAGES = {
    "root zarr.json garbage": ("zarr.json", b"{ not json"),
    "root zarr.json empty": ("zarr.json", b""),
    "root zarr.json removed": ("zarr.json", None),
    "variable zarr.json garbage": ("temp/zarr.json", b"\x00\x00"),
}


@pytest.mark.parametrize("damage", list(ZARR_DAMAGES))
def test_damaged_zarr_metadata_of_an_unfinished_run_is_an_output_error(lazy, tmp_path, damage):
    path = tmp_path / "o.zarr"
    done = interrupted(lazy, path)
    key, content = ZARR_DAMAGES[damage]
    if content is None:
        (path / key).unlink()
    else:
        (path / key).write_bytes(content)

    with pytest.raises(xpatch.OutputError) as caught:
        resume(applied(lazy), path)

    message = str(caught.value)
    assert "overwrite=True" in message and str(path) in message, message
    assert markers(path) == done
    assert resume(applied(lazy), path, overwrite=True) == BLOCKS
    assert_written(path, expected(lazy))


@pytest.fixture
def raster() -> xr.DataArray:
    pytest.importorskip("rioxarray")
    values = np.random.default_rng(3).random((2, 64, 96)).astype("float32")
    da = xr.DataArray(
        values,
        dims=("band", "y", "x"),
        coords={
            "band": [1, 2],
            "y": 4_000_000.0 - 10.0 * np.arange(64) - 5.0,
            "x": 300_000.0 + 10.0 * np.arange(96) + 5.0,
        },
        name="reflectance",
    )
    return da.rio.write_crs("EPSG:32633").chunk({"band": 2, "y": 32, "x": 32})


@pytest.mark.parametrize("suffix", [".zarr", ".tif"])
def test_leftover_markers_of_a_complete_output_refuse_as_existing_and_go(
    lazy, raster, tmp_path, suffix
):
    # A kill after record.json was deleted, before the markers were: the output is complete.
    data = lazy if suffix == ".zarr" else raster
    path = tmp_path / f"o{suffix}"
    assert xpatch.write(data, path, progress=False) > 0
    before = read_output(path)
    leftover = progress_record(path) / "done" / "v-x" / "0.0"
    leftover.parent.mkdir(parents=True)
    leftover.touch()

    with pytest.raises(xpatch.OutputExistsError, match="overwrite=True") as caught:
        xpatch.write(data, path, progress=False)

    assert isinstance(caught.value, FileExistsError)
    assert not progress_record(path).exists()
    after = read_output(path)
    for key in before:
        np.testing.assert_array_equal(after[key], before[key])


def read_output(path: Path) -> dict:
    if path.suffix == ".zarr":
        ds = xr.open_zarr(path)
        return {name: ds[name].values for name in ds.variables}
    import rasterio

    with rasterio.open(path) as src:
        return {"values": src.read(), "transform": np.array(src.transform)}


def interrupted_geotiff(raster: xr.DataArray, path) -> list[str]:
    interrupt(raster.patch(y=16, x=16, stride=8).apply(Affine(fail_after=3), batch_size=16), path)
    done = markers(path)
    assert 0 < len(done) < 6, done
    return done


def geotiff_result(raster: xr.DataArray, k: int = 2) -> xr.DataArray:
    return raster.patch(y=16, x=16, stride=8).apply(Affine(k), batch_size=16)


def test_a_geotiff_run_with_nan_nodata_resumes_and_refuses_another_model(raster, tmp_path):
    import rasterio

    path = tmp_path / "o.tif"
    done = interrupted_geotiff(raster, path)
    assert not path.exists()  # the final path holds nothing until the file is complete

    with pytest.raises(xpatch.OutputError, match="resume='force'"):
        resume(geotiff_result(raster, k=3), path)
    assert markers(path) == done

    assert resume(geotiff_result(raster), path) == 6 - len(done)
    with rasterio.open(path) as src:
        assert np.isnan(src.nodata)
        want = geotiff_result(raster).compute(scheduler="synchronous").values
        np.testing.assert_array_equal(src.read(), want)
    assert not progress_record(path).exists()


@pytest.mark.parametrize("size", [0, 100])
def test_a_damaged_partial_geotiff_is_an_output_error(raster, tmp_path, size):
    path = tmp_path / "o.tif"
    done = interrupted_geotiff(raster, path)
    partial = progress_record(path) / "partial.tif"
    with open(partial, "r+b") as file:
        file.truncate(size)

    with pytest.raises(xpatch.OutputError, match="overwrite=True") as caught:
        resume(geotiff_result(raster), path)
    assert "partial.tif" in str(caught.value)
    assert markers(path) == done
    assert not path.exists()
    assert resume(geotiff_result(raster), path, overwrite=True) == 6


# -- one writer at a time ------------------------------------------------------------------


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def plant_lock(path, **fields) -> Path:
    """Write a lock.json into the record folder of ``path`` as a writer would."""
    now = time.time()
    info = {
        "owner": uuid.uuid4().hex,
        "host": socket.gethostname(),
        "boot": _boot_id(),
        "pid": 1,
        "pid_start": "1",
        "since": now - 60,
        "heartbeat": now,
        "command": "xpatch apply in.zarr out.zarr",
        **fields,
    }
    lock = progress_record(path) / "lock.json"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps(info))
    return lock


def dead_pid() -> int:
    """The pid of a process that ran on this machine and is gone."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_the_lock_of_a_killed_writer_is_taken_over_by_a_plain_rerun_saying_whose(lazy, tmp_path):
    # An OOM kill or a scheduler's time limit: the writer provably no longer runs.
    path = tmp_path / "o.zarr"
    done = interrupted(lazy, path)
    pid = dead_pid()
    plant_lock(path, pid=pid)

    with pytest.warns(UserWarning, match="took over the lock") as caught:
        assert resume(applied(lazy), path) == BLOCKS - len(done)
    message = str(caught[0].message)
    assert str(pid) in message and "no longer runs" in message, message
    assert caught[0].filename == __file__  # the warning points at the caller's line
    assert_written(path, expected(lazy))
    assert not progress_record(path).exists()  # no claim nor lock left behind


def test_a_lock_whose_pid_was_reused_by_another_process_is_taken_over(lazy, tmp_path):
    # Same machine, the pid runs, but it is another process (started at another time).
    path = tmp_path / "o.zarr"
    plant_lock(path, pid=os.getpid(), pid_start="0")
    with pytest.warns(UserWarning, match="took over the lock.*no longer runs"):
        assert resume(lazy, path) == BLOCKS
    assert_written(path, lazy.values)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_the_lock_of_a_killed_writer_not_yet_reaped_is_taken_over(lazy, tmp_path):
    # SIGKILLed, but its parent has not waited for it yet: a zombie runs no code.
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stat = Path(f"/proc/{process.pid}/stat").read_text()
        started = stat.rsplit(")", 1)[1].split()[19]
        os.kill(process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the process did not die"
            time.sleep(0.01)
        path = tmp_path / "o.zarr"
        plant_lock(path, pid=process.pid, pid_start=started)
        with pytest.warns(UserWarning, match="took over the lock.*no longer runs"):
            assert resume(lazy, path) == BLOCKS
        assert_written(path, lazy.values)
    finally:
        process.kill()
        process.wait()


def test_one_of_two_writers_takes_over_a_killed_writers_lock(lazy, tmp_path):
    # Both find the same stale lock; the takeover is claimed exclusively, so the
    # loser finds the winner's live lock instead of removing it.
    path = tmp_path / "o.zarr"
    plant_lock(path, pid=dead_pid())
    folder = str(progress_record(path))
    first = WriterLock(LocalFileSystem(), folder, str(path))
    second = WriterLock(LocalFileSystem(), folder, str(path))
    stale = first.holder()
    assert first._take_over(stale) is True
    assert second._take_over(stale) is False  # the claim is taken: the lock stays
    first._acquire(break_lock=False)
    first._forget_takeover()
    try:
        with pytest.raises(xpatch.OutputLockedError, match="another writer"):
            second.acquire()
        first.check_held()
    finally:
        first.release()
    assert sorted(p.name for p in Path(folder).iterdir()) == []


def test_a_claim_left_by_a_writer_killed_while_taking_over_is_cleared(lazy, tmp_path):
    path = tmp_path / "o.zarr"
    stale = json.loads(plant_lock(path, pid=dead_pid()).read_text())
    claim = progress_record(path) / f"lock.json.takeover-{stale['owner']}"
    claim.write_text(json.dumps({**stale, "owner": "killed-claimer", "pid": dead_pid()}))
    with pytest.warns(UserWarning, match="took over the lock"):
        assert resume(lazy, path) == BLOCKS
    assert_written(path, lazy.values)
    assert not progress_record(path).exists()


def test_a_live_writers_lock_is_never_taken(lazy, tmp_path):
    path = tmp_path / "o.zarr"
    folder = str(progress_record(path))
    holder = WriterLock(LocalFileSystem(), folder, str(path))
    holder.acquire()
    try:
        for break_lock in (False, True):
            with pytest.raises(xpatch.OutputLockedError) as caught:
                resume(lazy, path, break_lock=break_lock)
            message = str(caught.value)
            assert "another writer" in message and str(os.getpid()) in message, message
        assert not (path / "zarr.json").exists()  # nothing was written
        holder.check_held()  # and the lock is still ours
    finally:
        holder.release()
    assert resume(lazy, path) == BLOCKS
    assert_written(path, lazy.values)


def test_overwrite_does_not_touch_an_output_another_writer_holds(lazy, tmp_path):
    path = tmp_path / "o.zarr"
    done = interrupted(lazy, path)
    before = record_bytes(path)
    data_before = sorted(p for p in path.rglob("*") if ".xpatch" not in p.parts)
    holder = WriterLock(LocalFileSystem(), str(progress_record(path)), str(path))
    holder.acquire()
    try:
        with pytest.raises(xpatch.OutputLockedError, match="another writer"):
            resume(applied(lazy), path, overwrite=True, break_lock=True)
        assert markers(path) == done
        assert record_bytes(path) == before
        assert sorted(p for p in path.rglob("*") if ".xpatch" not in p.parts) == data_before
    finally:
        holder.release()


def test_a_lock_from_another_machine_is_stale_only_when_its_heartbeat_stopped(lazy, tmp_path):
    path = tmp_path / "o.zarr"
    elsewhere = {"host": "elsewhere.invalid", "boot": "another-boot", "pid": 4242}
    plant_lock(path, **elsewhere, heartbeat=time.time() - 5)
    for break_lock in (False, True):
        with pytest.raises(xpatch.OutputLockedError) as caught:
            resume(lazy, path, break_lock=break_lock)
        message = str(caught.value)
        assert "another writer" in message and "elsewhere.invalid" in message, message

    plant_lock(path, **elsewhere, heartbeat=time.time() - 2 * STALE_AFTER_SECONDS)
    with pytest.raises(xpatch.OutputLockedError) as caught:
        resume(lazy, path)
    message = str(caught.value)
    assert "heartbeat" in message and "break_lock=True" in message, message
    assert resume(lazy, path, break_lock=True) == BLOCKS
    assert_written(path, lazy.values)


def test_an_unreadable_lock_is_taken_over_only_when_asked(lazy, tmp_path):
    path = tmp_path / "o.zarr"
    lock = progress_record(path) / "lock.json"
    lock.parent.mkdir(parents=True)
    lock.write_bytes(b"\x00garbage")
    with pytest.raises(xpatch.OutputLockedError, match="break_lock=True"):
        resume(lazy, path)
    assert resume(lazy, path, break_lock=True) == BLOCKS
    assert_written(path, lazy.values)


def test_a_finished_write_releases_its_lock(lazy, tmp_path):
    path = tmp_path / "o.zarr"
    assert resume(lazy, path) == BLOCKS
    assert not progress_record(path).exists()
    holder = WriterLock(LocalFileSystem(), str(progress_record(path)), str(path))
    holder.acquire()  # would raise if the writer had left its lock
    holder.release()


# -- URLs ----------------------------------------------------------------------------------


@pytest.fixture
def cwd(tmp_path, monkeypatch) -> Path:
    """An empty working directory: no URL may become a folder in it."""
    folder = tmp_path / "cwd"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


@pytest.fixture
def memory_root():
    root = f"/xpatch-tests-{uuid.uuid4().hex}"
    yield root
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


def test_memory_urls_are_written_resumed_and_read_back(lazy, cwd, memory_root):
    url = f"memory://{memory_root}/o.zarr"
    fs = fsspec.filesystem("memory")
    interrupt(applied(lazy, Affine(fail_after=12)), url)
    done = fs.find(f"{memory_root}/o.zarr/.xpatch/done")
    assert 0 < len(done) < BLOCKS

    assert resume(applied(lazy), url) == BLOCKS - len(done)

    np.testing.assert_array_equal(xr.open_zarr(url)["temp"].values, expected(lazy))
    assert fs.find(f"{memory_root}/o.zarr/.xpatch") == []  # no record, markers or lock
    assert os.listdir(cwd) == []


def test_file_urls_write_to_the_local_path(lazy, tmp_path, cwd):
    url = f"file://{tmp_path}/o.zarr"
    assert xpatch.write(lazy, url, progress=False) == BLOCKS
    assert (tmp_path / "o.zarr" / "zarr.json").is_file()
    np.testing.assert_array_equal(xr.open_zarr(tmp_path / "o.zarr")["temp"].values, lazy.values)
    assert os.listdir(cwd) == []


def test_an_unknown_scheme_is_an_option_error_and_no_folder(lazy, cwd):
    with pytest.raises(xpatch.OptionError, match="foo"):
        xpatch.write(lazy, "foo://x.zarr", progress=False)
    assert os.listdir(cwd) == []


@pytest.mark.parametrize("url", ["gs://bucket/x.zarr", "gs://bucket/x.tif"])
def test_a_scheme_without_its_package_names_the_package(lazy, cwd, url):
    try:
        importlib.import_module("gcsfs")
    except ImportError:
        pass
    else:
        pytest.skip("gcsfs is installed")
    with pytest.raises(xpatch.MissingDependencyError, match="gcsfs") as caught:
        xpatch.write(lazy, url, progress=False)
    assert isinstance(caught.value, ImportError)
    assert os.listdir(cwd) == []


def test_https_is_refused_as_read_only(lazy, cwd):
    with pytest.raises(xpatch.OptionError, match="read-only"):
        xpatch.write(lazy, "https://example.invalid/x.zarr", progress=False)
    assert os.listdir(cwd) == []


def test_a_geotiff_to_an_object_store_is_refused(raster, cwd, memory_root):
    url = f"memory://{memory_root}/x.tif"
    with pytest.raises(xpatch.OptionError, match="local"):
        xpatch.write(raster, url, progress=False)
    assert not fsspec.filesystem("memory").exists(memory_root)
    assert os.listdir(cwd) == []


def test_a_zarr_local_store_object_is_the_same_output_as_its_path(lazy, tmp_path):
    from zarr.storage import LocalStore

    path = tmp_path / "o.zarr"
    interrupt(applied(lazy, Affine(fail_after=12)), LocalStore(str(path)))
    done = markers(path)
    assert 0 < len(done) < BLOCKS  # the record is where a path's would be
    assert resume(applied(lazy), path) == BLOCKS - len(done)
    assert_written(path, expected(lazy))


def test_other_zarr_stores_are_refused_naming_what_works(lazy):
    from zarr.storage import MemoryStore

    with pytest.raises(xpatch.OptionError, match="memory://"):
        xpatch.write(lazy, MemoryStore(), progress=False)


def test_s3_without_s3fs_names_the_package_and_the_extra(tmp_path):
    code = f"""
import sys
sys.modules["s3fs"] = None  # as if it were not installed
import os, numpy as np, xarray as xr, xpatch
os.chdir({str(tmp_path)!r})
da = xr.DataArray(np.zeros((4, 4)), dims=("y", "x")).chunk(2)
try:
    xpatch.write(da, "s3://bucket/x.zarr", progress=False)
except xpatch.MissingDependencyError as error:
    assert isinstance(error, ImportError)
    print(error)
print(sorted(os.listdir(".")))
"""
    out = run_script(code).splitlines()
    assert "s3fs" in out[0] and "xarray-patch[cloud]" in out[0], out
    assert out[-1] == "[]", out


# -- marker names ------------------------------------------------------------------------------


def test_markers_of_similar_variable_names_do_not_collide(tmp_path, monkeypatch):
    # Named "<variable>.<block>", "a" block (1, 2) and "a.1" block (2,) are both "a.1.2".
    rng = np.random.default_rng(0)
    ds = xr.Dataset(
        {
            "a": (("y", "x"), da.from_array(rng.random((48, 48)), chunks=16)),
            "a.1": (("z",), da.from_array(rng.random(48), chunks=16)),
        }
    )
    path = tmp_path / "o.zarr"
    # Stop after every block is stored, before the run is marked finished.
    write_record = ProgressRecord.write

    def stop_before_finishing(self, state, fingerprint):
        if state == "finishing":
            raise RuntimeError("stopped before finishing")
        write_record(self, state, fingerprint)

    monkeypatch.setattr(ProgressRecord, "write", stop_before_finishing)
    with pytest.raises(RuntimeError, match="stopped before finishing"):
        xpatch.write(ds, path, progress=False)
    monkeypatch.setattr(ProgressRecord, "write", write_record)
    assert len(markers(path)) == 9 + 3  # one marker per block

    # Lose a.1's last block and its marker: the resume must write it, and only it.
    record = ProgressRecord(LocalFileSystem(), str(progress_record(path)), str(path))
    Path(record.marker("a.1", (2,))).unlink()
    zarr.open_group(str(path), mode="r+")["a.1"][32:] = -1.0
    assert xpatch.write(ds, path, progress=False) == 1
    out = xr.open_zarr(path)
    np.testing.assert_array_equal(out["a.1"].values, ds["a.1"].values)
    np.testing.assert_array_equal(out["a"].values, ds["a"].values)


def test_marker_paths_stay_in_the_record_for_any_variable_name(tmp_path):
    record = ProgressRecord(LocalFileSystem(), str(tmp_path / ".xpatch"), "o.zarr")
    names = ["x", "x/y", "x/..", "..", ".", "a.1", "a%2E1", "a b", "ü"]
    paths = {name: record.marker(name, (0, 1)) for name in names}
    assert len(set(paths.values())) == len(names)
    done = Path(record.done_folder)
    for path in paths.values():
        relative = Path(path).relative_to(done)
        assert len(relative.parts) == 2 and ".." not in relative.parts, relative
        assert relative.parts[0] not in (".", "..")


# -- a full disk ------------------------------------------------------------------------------


def test_a_full_disk_is_an_output_error_naming_the_path_and_the_run_resumes(
    lazy, tmp_path, monkeypatch
):
    # The device fills up after a few chunks (zarr's own writes get ENOSPC, as on a
    # full disk): before, a raw OSError from inside zarr's store.
    import errno

    from zarr.storage import LocalStore

    path = tmp_path / "o.zarr"
    put = LocalStore.set
    room = {"keys": 20}

    async def set_until_full(self, key, value):
        if room["keys"] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device", str(key))
        room["keys"] -= 1
        await put(self, key, value)

    monkeypatch.setattr(LocalStore, "set", set_until_full)
    with pytest.raises(xpatch.OutputError) as caught:
        resume(applied(lazy), path)
    message = str(caught.value)
    assert f"no space left on the device of {str(path)!r}" in message, message
    assert "run the same call again" in message, message
    done = markers(path)
    assert 0 < len(done) < BLOCKS, done  # the blocks stored before the disk filled are kept
    monkeypatch.setattr(LocalStore, "set", put)  # space was freed
    assert resume(applied(lazy), path) == BLOCKS - len(done)
    assert_written(path, expected(lazy))
