"""``xpatch.write`` of a mapping of scenes: one output per scene in a folder, resumable.

The scenes are cut from the crash tests' input (:mod:`tests.io.scene_crash_writer`), so
that writer processes killed with SIGKILL compute the same fingerprints as this one.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import xpatch
from tests.io import crash_writer
from tests.io.scene_crash_writer import BLOCKS, SCENES, SceneWriter, results
from tests.io.test_crash import (
    assert_same_output,
    looks_complete,
    markers,
    read_output,
    record_folder,
)
from xpatch.io.scenes import MANIFEST_FOLDER

SUFFIX = {"zarr": ".zarr", "geotiff": ".tif"}
TOTAL = sum(BLOCKS.values())


@pytest.fixture(autouse=True)
def fast_model(monkeypatch):
    """Writes in this process need no sleep (the model's values do not depend on it)."""
    monkeypatch.setattr(crash_writer, "SLEEP", 0.0)


def needs(fmt: str) -> None:
    if fmt == "geotiff":
        pytest.importorskip("rioxarray")


def entry(folder: Path, scene: str, fmt: str = "zarr") -> dict | None:
    path = folder / MANIFEST_FOLDER / f"{scene}{SUFFIX[fmt]}.json"
    return json.loads(path.read_text()) if path.exists() else None


def with_model(model: str, geo: bool = False) -> dict[str, xr.DataArray]:
    scene = crash_writer.scene(geo)
    scenes = {name: scene.isel(y=rows, x=cols) for name, (rows, cols) in SCENES.items()}
    sp = xpatch.patch_scenes(scenes, y=32, x=32, stride=16, window="hann")
    return sp.apply(crash_writer.MODELS[model], batch_size=4)


_REFERENCES: dict = {}


def references(fmt: str, model: str, tmp_path_factory) -> dict[str, dict]:
    """Each scene written alone by ``xpatch.write``, as readers see it."""
    if (fmt, model) not in _REFERENCES:
        folder = tmp_path_factory.mktemp(f"alone-{fmt}-{model}")
        outputs = {}
        for name, result in with_model(model, geo=fmt == "geotiff").items():
            path = folder / f"{name}{SUFFIX[fmt]}"
            assert xpatch.write(result, path, progress=False) == BLOCKS[name]
            outputs[name] = read_output(path, fmt)
        _REFERENCES[fmt, model] = outputs
    return _REFERENCES[fmt, model]


def assert_scenes(folder: Path, fmt: str, reference: dict[str, dict]) -> None:
    """Every scene's output equals its reference, and nothing of a run is left."""
    for name, want in reference.items():
        path = folder / f"{name}{SUFFIX[fmt]}"
        assert_same_output(path, fmt, want)
        record = record_folder(path, fmt)
        left = [p for p in record.rglob("*") if p.is_file()] if record.exists() else []
        assert all(p.name.endswith(".tmp") for p in left), left
        assert entry(folder, name, fmt)["state"] == "done"
    assert not (folder / MANIFEST_FOLDER / "lock.json").exists()


@pytest.mark.parametrize("fmt", ["zarr", "geotiff"])
def test_each_scene_equals_its_own_write_and_a_rerun_skips(fmt, tmp_path, tmp_path_factory):
    needs(fmt)
    folder = tmp_path / "out"
    lazy = results(geo=fmt == "geotiff")
    assert xpatch.write(lazy, folder, format=fmt, progress=False) == TOTAL
    assert_scenes(folder, fmt, references(fmt, "a", tmp_path_factory))
    written = sorted(p.name for p in folder.iterdir())
    assert written == sorted([*(f"{n}{SUFFIX[fmt]}" for n in SCENES), MANIFEST_FOLDER])
    # The same call again, and the same computation built afresh: nothing to write.
    assert xpatch.write(lazy, folder, format=fmt, progress=False) == 0
    assert xpatch.write(results(fmt == "geotiff"), folder, format=fmt, progress=False) == 0


def test_auto_format_writes_zarr_and_str_keys_name_the_files(tmp_path):
    lazy = results()
    small = {"tile 1": lazy["s2"], 7: lazy["s1"]}
    assert xpatch.write(small, tmp_path, progress=False) == BLOCKS["s2"] + BLOCKS["s1"]
    assert (tmp_path / "tile 1.zarr").is_dir() and (tmp_path / "7.zarr").is_dir()
    assert xr.open_zarr(tmp_path / "7.zarr")["scene"].shape == (2, 128, 128)


def test_a_changed_function_is_refused_before_anything_is_written(tmp_path, tmp_path_factory):
    folder = tmp_path / "out"
    assert xpatch.write(results(), folder, progress=False) == TOTAL
    before = {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}

    with pytest.raises(xpatch.OutputError) as caught:
        xpatch.write(with_model("b"), folder, progress=False)
    message = str(caught.value)
    assert "scene 's1'" in message and "another computation" in message, message
    assert "model_b" in message, message  # what differs: the model
    assert "overwrite=True" in message and "resume='force'" in message, message
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()} == before
    assert_scenes(folder, "zarr", references("zarr", "a", tmp_path_factory))

    # resume="force" keeps the outputs and records the computation that ran now...
    assert xpatch.write(with_model("b"), folder, resume="force", progress=False) == 0
    assert_scenes(folder, "zarr", references("zarr", "a", tmp_path_factory))
    assert xpatch.write(with_model("b"), folder, progress=False) == 0
    # ...and overwrite=True writes every scene again.
    assert xpatch.write(with_model("a"), folder, overwrite=True, progress=False) == TOTAL
    assert_scenes(folder, "zarr", references("zarr", "a", tmp_path_factory))


def test_overwrite_writes_every_scene_of_the_new_function(tmp_path, tmp_path_factory):
    folder = tmp_path / "out"
    assert xpatch.write(results(), folder, progress=False) == TOTAL
    assert xpatch.write(with_model("b"), folder, overwrite=True, progress=False) == TOTAL
    assert_scenes(folder, "zarr", references("zarr", "b", tmp_path_factory))


def test_an_output_that_is_not_the_folders_run_is_refused(tmp_path):
    lazy = results()
    xpatch.write(lazy["s3"], tmp_path / "s3.zarr", progress=False)  # written alone
    with pytest.raises(xpatch.OutputExistsError) as caught:
        xpatch.write(lazy, tmp_path, progress=False)
    message = str(caught.value)
    assert "scene 's3'" in message and "no entry" in message and "overwrite=True" in message
    assert not (tmp_path / "s1.zarr").exists()  # refused before the first scene
    # Another program's data in a scene's place.
    (tmp_path / "s1.zarr").mkdir()
    (tmp_path / "s1.zarr" / "notes.txt").write_text("mine")
    with pytest.raises(xpatch.OutputExistsError, match=r"scene 's1'.*not an output that xpatch"):
        xpatch.write(lazy, tmp_path, progress=False)
    assert xpatch.write(lazy, tmp_path, overwrite=True, progress=False) == TOTAL


@pytest.mark.parametrize("name", ["a/b", "", "..", "back\\slash"])
def test_a_scene_name_that_is_not_a_file_name_is_refused(name, tmp_path):
    lazy = results()
    with pytest.raises(xpatch.OptionError) as caught:
        xpatch.write({"s1": lazy["s1"], name: lazy["s2"]}, tmp_path / "out", progress=False)
    assert f"scene name {name!r}" in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_scenes_of_other_calls_are_left_alone(tmp_path):
    lazy = results()
    first = {n: lazy[n] for n in ("s1", "s2")}
    assert xpatch.write(first, tmp_path, progress=False) == BLOCKS["s1"] + BLOCKS["s2"]
    s1 = entry(tmp_path, "s1")
    assert xpatch.write({"s3": lazy["s3"]}, tmp_path, progress=False) == BLOCKS["s3"]
    assert entry(tmp_path, "s1") == s1
    assert xpatch.write(lazy, tmp_path, progress=False) == BLOCKS["s4"] + BLOCKS["s5"]


def test_a_scene_written_but_not_marked_done_is_marked_without_rewriting(tmp_path):
    lazy = results()
    assert xpatch.write(lazy, tmp_path, progress=False) == TOTAL
    path = tmp_path / MANIFEST_FOLDER / "s2.zarr.json"
    path.write_text(path.read_text().replace('"state": "done"', '"state": "started"'))
    with pytest.raises(xpatch.OutputExistsError, match=r"scene 's2'.*interrupted"):
        xpatch.write(lazy, tmp_path, resume=False, progress=False)
    assert xpatch.write(lazy, tmp_path, progress=False) == 0
    assert entry(tmp_path, "s2")["state"] == "done"
    # A done scene whose output was deleted since is written again.
    shutil.rmtree(tmp_path / "s4.zarr")
    assert xpatch.write(lazy, tmp_path, progress=False) == BLOCKS["s4"]


def test_an_overwrite_cut_off_before_a_scenes_record_rewrites_that_scene(
    tmp_path, tmp_path_factory, monkeypatch
):
    """The old complete output under the new run's entry must not pass for the new one."""
    from xpatch.io import scenes as scene_writes

    assert xpatch.write(results(), tmp_path, progress=False) == TOTAL
    real_run, calls = scene_writes.run_output, []

    def cut_off_at_the_second_scene(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # as a kill (or a stale lock) before the record is written
            raise KeyboardInterrupt
        return real_run(*args, **kwargs)

    monkeypatch.setattr(scene_writes, "run_output", cut_off_at_the_second_scene)
    with pytest.raises(KeyboardInterrupt):
        xpatch.write(with_model("b"), tmp_path, overwrite=True, progress=False)
    monkeypatch.setattr(scene_writes, "run_output", real_run)
    assert entry(tmp_path, "s2")["state"] == "overwriting"
    # The scenes the cut-off run never reached still hold model a: refused, not mixed.
    with pytest.raises(xpatch.OutputError, match=r"scene 's3'.*another computation"):
        xpatch.write(with_model("b"), tmp_path, progress=False)
    reached = {n: r for n, r in with_model("b").items() if n in ("s1", "s2")}
    with pytest.raises(xpatch.OutputExistsError, match=r"scene 's2'.*interrupted"):
        xpatch.write(reached, tmp_path, resume=False, progress=False)
    assert xpatch.write(reached, tmp_path, progress=False) == BLOCKS["s2"]
    assert_same_output(
        tmp_path / "s2.zarr", "zarr", references("zarr", "b", tmp_path_factory)["s2"]
    )


def test_a_damaged_manifest_entry_is_refused(tmp_path):
    lazy = {"s1": results()["s1"]}
    xpatch.write(lazy, tmp_path, progress=False)
    (tmp_path / MANIFEST_FOLDER / "s1.zarr.json").write_text("{not json")
    with pytest.raises(xpatch.OutputError, match=r"s1.zarr.json.*damaged.*overwrite=True"):
        xpatch.write(lazy, tmp_path, progress=False)
    assert xpatch.write(lazy, tmp_path, overwrite=True, progress=False) == BLOCKS["s1"]


def test_an_fsspec_folder_holds_zarr_scenes(tmp_path):
    lazy = {n: results()[n] for n in ("s1", "s2")}
    url = f"memory://xpatch-scenes-test/{tmp_path.name}"
    assert xpatch.write(lazy, url, progress=False) == BLOCKS["s1"] + BLOCKS["s2"]
    assert xpatch.write(lazy, url, progress=False) == 0
    np.testing.assert_array_equal(xr.open_zarr(f"{url}/s2.zarr")["scene"].values, lazy["s2"].values)
    pytest.importorskip("rioxarray")
    with pytest.raises(xpatch.OptionError, match=r"scene 's1'.*local path"):
        xpatch.write(lazy, url, format="geotiff", progress=False)


# -- writer processes killed with SIGKILL -------------------------------------------------


def remaining_blocks(folder: Path, fmt: str) -> int:
    """The blocks a resumed run must write, from what the kill left on disk."""
    remaining = 0
    for name, blocks in BLOCKS.items():
        path = folder / f"{name}{SUFFIX[fmt]}"
        record = record_folder(path, fmt) / "record.json"
        if record.exists():
            state = json.loads(record.read_text())["state"]
            remaining += {"creating": blocks, "writing": blocks - markers(path, fmt)}.get(state, 0)
        elif not looks_complete(path, fmt):
            remaining += blocks
        else:
            assert entry(folder, name, fmt) is not None, name  # only the run's own outputs
    return remaining


def run_writer(folder: Path, fmt: str, *options: str, delay: float | None = None) -> tuple:
    """Start a scene writer; SIGKILL it after ``delay`` s if given; return its exit."""
    writer = SceneWriter(folder, fmt, *options)
    try:
        start = writer.go()
        if delay is not None:
            time.sleep(max(0.0, start + delay - time.perf_counter()))
            writer.signal(signal.SIGKILL)
        return writer.wait()
    finally:
        writer.stop()


def resume_and_check(folder: Path, fmt: str, reference: dict) -> int:
    expected = remaining_blocks(folder, fmt)
    lazy = results(geo=fmt == "geotiff")
    locked = (folder / MANIFEST_FOLDER / "lock.json").exists()
    # A plain rerun, as after an OOM kill: the killed writer's locks are taken over.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        written = xpatch.write(lazy, folder, format=fmt, progress=False)
    takeovers = [str(w.message) for w in caught if "took over the lock" in str(w.message)]
    assert all("no longer runs" in message for message in takeovers), takeovers
    assert bool(takeovers) >= locked, "the killed writer's lock was not reported"
    assert written == expected
    assert_scenes(folder, fmt, reference)
    return written


#: (kill options, blocks the resumed run writes, or None where it depends on timing).
NARROW = {
    "scene-written@2": (["--kill", "scene-written", "--at", "2"], TOTAL - 7),
    "marker@10": (["--kill", "marker", "--at", "10"], None),  # in the third scene
    "scene-started@3": (["--kill", "scene-started", "--at", "3"], TOTAL - 7),
    "scene-done@4": (["--kill", "scene-done", "--at", "4"], BLOCKS["s5"]),
    "remove": (["--kill", "remove"], TOTAL - BLOCKS["s1"]),  # the first scene's markers
    "release": (["--kill", "release"], TOTAL - BLOCKS["s1"]),  # the first scene's lock
    "finishing": (["--kill", "finishing"], TOTAL - BLOCKS["s1"]),
}
DEFAULT = ["scene-written@2", "marker@10"]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize(
    ("fmt", "case"),
    [
        *(("zarr", case) for case in DEFAULT),
        *(pytest.param("zarr", c, marks=pytest.mark.slow) for c in NARROW if c not in DEFAULT),
        *(pytest.param("geotiff", c, marks=pytest.mark.slow) for c in NARROW),
    ],
)
def test_a_writer_killed_at_a_narrow_window_resumes_to_the_uninterrupted_outputs(
    fmt, case, tmp_path, tmp_path_factory
):
    needs(fmt)
    options, expected = NARROW[case]
    folder = tmp_path / "out"
    code, _, err = run_writer(folder, fmt, *options)
    assert code == -signal.SIGKILL, f"{case}: the writer exited {code}: {err[-2000:]}"
    written = resume_and_check(folder, fmt, references(fmt, "a", tmp_path_factory))
    if expected is not None:
        assert written == expected
    else:
        assert 0 < written < TOTAL - 7  # the first two scenes and a part of the third kept


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_writer_killed_at_a_random_moment_resumes_to_the_uninterrupted_outputs(
    tmp_path, tmp_path_factory
):
    reference = references("zarr", "a", tmp_path_factory)
    # An uninterrupted writer process: the same outputs as this process, and its duration.
    code, out, err = run_writer(tmp_path / "whole", "zarr")
    assert code == 0, err
    _, written, seconds = out.split()
    assert int(written) == TOTAL
    assert_scenes(tmp_path / "whole", "zarr", reference)
    rng = np.random.default_rng(14)
    for i, delay in enumerate(rng.uniform(0.25, 0.75, 1) * float(seconds)):
        folder = tmp_path / f"case{i}"
        code, _, err = run_writer(folder, "zarr", delay=float(delay))
        assert code == -signal.SIGKILL, f"the writer was not killed mid-run: {code} {err}"
        resume_and_check(folder, "zarr", reference)


def test_scene_names_that_differ_only_in_case_are_refused(tmp_path):
    lazy = results()
    with pytest.raises(xpatch.OptionError, match=r"\['S1', 's1'\] differ only in case"):
        xpatch.write({"s1": lazy["s1"], "S1": lazy["s2"]}, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["north\nsouth", "a:b", "tile*", "why?", "x" * 250])
def test_scene_names_that_cannot_be_file_names_are_refused(tmp_path, name):
    results = {name: xr.DataArray(np.zeros((4, 4)), dims=("y", "x")).chunk(2)}
    with pytest.raises(xpatch.OptionError, match="cannot be a file name"):
        xpatch.write(results, tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("suffix", [".tif", ".tiff", ".zarr"])
def test_a_mapping_of_scenes_is_not_written_to_a_file_name(tmp_path, suffix):
    results = {"a": xr.DataArray(np.zeros((4, 4)), dims=("y", "x")).chunk(2)}
    with pytest.raises(xpatch.OptionError, match="written into a folder"):
        xpatch.write(results, tmp_path / f"out{suffix}", progress=False)
    assert not (tmp_path / f"out{suffix}").exists()


def test_force_does_not_keep_a_finished_scene_of_another_shape_or_dtype(tmp_path):
    # resume="force" kept finished scenes of the old dtype, marked them done, returned 0;
    # a single output refuses the same change.
    scenes = {"a": xr.DataArray(np.arange(64.0).reshape(8, 8), dims=("y", "x")).chunk(4)}
    sp = xpatch.patch_scenes(scenes, y=4, x=4)
    assert xpatch.write(sp.apply(lambda b: b * 2), tmp_path, progress=False) == 4
    as_int = sp.apply(lambda b: b * 2, out_dtype="int16")
    with pytest.raises(xpatch.OutputError, match=r"another layout.*dtype"):
        xpatch.write(as_int, tmp_path, resume="force", progress=False)
    assert xr.open_zarr(tmp_path / "a.zarr")["data"].dtype == np.float64  # untouched
    assert xpatch.write(as_int, tmp_path, overwrite=True, progress=False) == 4
