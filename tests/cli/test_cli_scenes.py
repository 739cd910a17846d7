"""``xpatch apply 'scenes/*.tif' out/``: one output per matching scene, resumable as a whole."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import xarray as xr

import xpatch
from tests.io.test_crash import assert_same_output, read_output
from xpatch.cli import main
from xpatch.io.scenes import MANIFEST_FOLDER

MODEL = textwrap.dedent(
    """
    def double(batch):
        return batch * 2 + 1

    def triple(batch):
        return batch * 3
    """
)

OPTIONS = ["--size", "32", "--stride", "24", "--chunks", "64", "--no-progress"]

#: name -> (rows, columns, CRS): different shapes, two CRSs.
SCENES = {
    "alpha": (70, 90, "EPSG:32631"),
    "bravo": (64, 50, "EPSG:4326"),
    "charlie": (100, 40, "EPSG:32631"),
}


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "scene_model_fns.py"
    path.write_text(MODEL)
    return path


def raster(rows: int, cols: int, crs: str, seed: int) -> xr.DataArray:
    values = np.random.default_rng(seed).random((2, rows, cols)).astype("float32")
    step, top, left = (10.0, 5_000_000.0, 400_000.0) if crs != "EPSG:4326" else (1e-4, 45.0, 5.0)
    return xr.DataArray(
        values,
        dims=("band", "y", "x"),
        coords={
            "band": [1, 2],
            "y": top - step * (np.arange(rows) + 0.5),
            "x": left + step * (np.arange(cols) + 0.5),
        },
    )


@pytest.fixture
def scenes(tmp_path):
    pytest.importorskip("rioxarray")
    folder = tmp_path / "scenes"
    folder.mkdir()
    for seed, (name, (rows, cols, crs)) in enumerate(SCENES.items()):
        raster(rows, cols, crs, seed).rio.write_crs(crs).rio.to_raster(folder / f"{name}.tif")
    return folder


def apply(pattern, output, model_file, fn="double", *extra):
    return main(
        ["apply", str(pattern), str(output), "--fn", f"{model_file}:{fn}", *OPTIONS, *extra]
    )


def test_a_glob_writes_each_scene_as_its_own_apply_and_a_rerun_skips(
    scenes, model_file, tmp_path, capsys
):
    out = tmp_path / "out"
    assert apply(scenes / "*.tif", f"{out}/", model_file) == 0
    summary = capsys.readouterr().out
    assert "in 3 scenes (alpha, bravo, charlie)" in summary, summary
    assert sorted(p.name for p in out.iterdir()) == [
        "alpha.tif",
        "bravo.tif",
        "charlie.tif",
        MANIFEST_FOLDER,
    ]
    alone = tmp_path / "alone"
    crss = set()
    for name in SCENES:
        assert apply(scenes / f"{name}.tif", alone / f"{name}.tif", model_file) == 0
        reference = read_output(alone / f"{name}.tif", "geotiff")
        assert_same_output(out / f"{name}.tif", "geotiff", reference)  # values, CRS, transform
        crss.add(reference["profile"]["crs"])
    assert len(crss) == 2
    capsys.readouterr()

    assert apply(scenes / "*.tif", out, model_file) == 0
    printed = capsys.readouterr().out
    assert "-> 3 .tif outputs" in printed and "wrote 0 blocks" in printed, printed

    # Another function: refused, naming the scene and the way out; --restart rewrites.
    assert apply(scenes / "*.tif", out, model_file, "triple") == 2
    err = capsys.readouterr().err
    assert "scene 'alpha'" in err and "another computation" in err, err
    assert apply(scenes / "*.tif", out, model_file, "triple", "--restart") == 0
    with xr.open_dataarray(out / "bravo.tif", engine="rasterio") as written:
        source = xr.open_dataarray(scenes / "bravo.tif", engine="rasterio").values
        np.testing.assert_allclose(written.values, source * 3, rtol=1e-6)


def test_zarr_scenes_are_written_as_zarr(tmp_path, model_file, capsys):
    folder = tmp_path / "scenes"
    folder.mkdir()
    for seed, (name, (rows, cols, crs)) in enumerate(SCENES.items()):
        raster(rows, cols, crs, seed).to_dataset(name="v").to_zarr(folder / f"{name}.zarr")
    out = tmp_path / "out"
    assert apply(folder / "*.zarr", out, model_file) == 0
    assert "3 .zarr outputs" in capsys.readouterr().out
    for name in SCENES:
        assert apply(folder / f"{name}.zarr", tmp_path / "alone" / f"{name}.zarr", model_file) == 0
        want = read_output(tmp_path / "alone" / f"{name}.zarr", "zarr")
        assert_same_output(out / f"{name}.zarr", "zarr", want)


def test_a_glob_that_matches_nothing_exits_2(tmp_path, model_file, capsys):
    assert apply(tmp_path / "nothing" / "*.tif", tmp_path / "out", model_file) == 2
    err = capsys.readouterr().err
    assert "matches no file" in err and "*.tif" in err, err
    assert not (tmp_path / "out").exists()


def test_a_glob_with_a_file_output_exits_2(scenes, tmp_path, model_file, capsys):
    assert apply(scenes / "*.tif", tmp_path / "out.tif", model_file) == 2
    assert "OUTPUT" in (err := capsys.readouterr().err) and "folder" in err, err
    assert not (tmp_path / "out.tif").exists()


def test_matches_that_share_a_stem_exit_2(scenes, tmp_path, model_file, capsys):
    other = tmp_path / "more"
    other.mkdir()
    (other / "alpha.tif").write_bytes((scenes / "alpha.tif").read_bytes())
    assert apply(tmp_path / "*" / "alpha.tif", tmp_path / "out", model_file) == 2
    assert "share a stem" in capsys.readouterr().err


def test_the_scenes_record_explains_itself(scenes, model_file, tmp_path):
    out = tmp_path / "out"
    assert apply(scenes / "*.tif", out, model_file) == 0
    record = out / MANIFEST_FOLDER
    assert sorted(p.name for p in record.iterdir()) == [
        "README.txt",
        *(f"{name}.tif.json" for name in sorted(SCENES)),
    ]
    readme = (record / "README.txt").read_text()
    assert "skips the finished scenes" in readme and "--restart" in readme


@pytest.mark.parametrize("interleave", ["pixel", "band"])
def test_a_truncated_geotiff_in_a_glob_is_named_before_any_work(
    tmp_path, model_file, capsys, interleave
):
    # Its header opens; before, the run failed mid-write with rasterio's "Read failed",
    # naming no file, after writing the scenes before it.
    pytest.importorskip("rioxarray")
    folder = tmp_path / "scenes"
    folder.mkdir()
    for seed, name in enumerate(["a", "b", "c"]):
        raster(300, 300, "EPSG:32631", seed).rio.write_crs("EPSG:32631").rio.to_raster(
            folder / f"{name}.tif", tiled=True, compress="deflate", interleave=interleave
        )
    broken = folder / "b.tif"
    with open(broken, "r+b") as handle:
        handle.truncate(broken.stat().st_size * 2 // 3)
    out = tmp_path / "out"
    assert apply(folder / "*.tif", out, model_file) == 2
    err = capsys.readouterr().err
    assert f"INPUT {str(broken)!r} is truncated" in err and "Traceback" not in err, err
    assert not out.exists()  # refused before the first scene was written
    with pytest.raises(xpatch.OptionError, match="is truncated"):
        xpatch.patch_scenes(sorted(folder.glob("*.tif")), y=32, x=32)
