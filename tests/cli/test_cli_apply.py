"""``xpatch apply``: files in, files out, out of core and resumable."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import xarray as xr

from xpatch.cli import main
from xpatch.cli.apply import load_function

MODEL = textwrap.dedent(
    """
    import numpy as np

    def double(batch):
        return batch * 2

    def band_sum(batch):
        # (b, band, y, x) -> (b, 1, y, x)
        return batch.sum(axis=1, keepdims=True)

    def smooth_in_threes(batch):
        # a 3x3 mean filter, zero outside the patch; it only accepts batches of 3
        assert len(batch) == 3, len(batch)
        padded = np.pad(batch, [(0, 0), (0, 0), (1, 1), (1, 1)])
        out = np.zeros_like(batch)
        for dy in range(3):
            for dx in range(3):
                out += padded[..., dy : dy + batch.shape[-2], dx : dx + batch.shape[-1]]
        return out / 9

    def valid_box(batch):
        # an unpadded 3x3 box mean: one cell less on each side (a model that crops)
        h, w = batch.shape[-2] - 2, batch.shape[-1] - 2
        return sum(
            batch[..., dy : dy + h, dx : dx + w] for dy in range(3) for dx in range(3)
        ) / 9

    def five_class(batch):
        # (b, 2, y, x) -> (b, 5, y, x) class scores, differing from patch to patch
        k = np.arange(5, dtype=batch.dtype)[None, :, None, None]
        shift = batch.mean(axis=(1, 2, 3))[:, None, None, None]
        return np.sin(batch[:, :1] * 7 * (k + 1) - batch[:, 1:] * 3 + shift * k)
    """
)


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "toy_model_fns.py"
    path.write_text(MODEL)
    return path


@pytest.fixture
def raster():
    rng = np.random.default_rng(4)
    values = rng.random((2, 90, 120)).astype("float32")
    return xr.DataArray(
        values,
        dims=("band", "y", "x"),
        coords={
            "band": [1, 2],
            "y": 5000.0 - 10.0 * np.arange(90),
            "x": 300.0 + 10 * np.arange(120),
        },
        name="reflectance",
    )


def test_geotiff_in_geotiff_out_keeps_georeferencing(tmp_path, model_file, raster, capsys):
    rioxarray = pytest.importorskip("rioxarray")
    source = tmp_path / "in.tif"
    raster.rio.write_crs("EPSG:32633").rio.to_raster(source)
    target = tmp_path / "out.tif"
    argv = ["apply", str(source), str(target), "--fn", f"{model_file}:double"]
    assert main([*argv, "--size", "32", "--stride", "24", "--chunks", "64"]) == 0
    out = capsys.readouterr().out
    assert "Completed" in out  # progress bar by default
    assert "wrote 4 blocks" in out
    written = rioxarray.open_rasterio(target)
    original = rioxarray.open_rasterio(source)
    assert written.rio.crs == original.rio.crs
    assert written.rio.transform() == original.rio.transform()
    np.testing.assert_allclose(written.values, raster.values * 2, rtol=1e-6)


def test_argmax_writes_a_uint8_geotiff_of_class_labels(tmp_path, model_file, raster, capsys):
    rioxarray = pytest.importorskip("rioxarray")
    source = tmp_path / "in.tif"
    raster.rio.write_crs("EPSG:32633").rio.to_raster(source)
    target = tmp_path / "labels.tif"
    argv = ["apply", str(source), str(target), "--fn", f"{model_file}:five_class"]
    options = ["--size", "32", "--stride", "24", "--chunks", "64", "--no-progress"]
    assert main([*argv, *options, "--output-dims", "class=5", "--reduce", "argmax"]) == 0
    assert "uint8" in capsys.readouterr().out
    written = rioxarray.open_rasterio(target)
    original = rioxarray.open_rasterio(source)
    assert written.dtype == np.uint8 and written.sizes["band"] == 1
    assert written.rio.crs == original.rio.crs
    assert written.rio.transform() == original.rio.transform()
    # Brute force: blend the scores in memory with the same layout, then argmax.
    fn = load_function(f"{model_file}:five_class")
    scores = raster.patch(y=32, x=32, stride=24, window="hann").apply(
        fn, output_dims={"class": 5}, out_dtype="float64"
    )
    expected = np.argmax(scores.values, axis=0)
    assert len(np.unique(expected)) >= 3
    np.testing.assert_array_equal(written.values[0], expected)
    # --out-dtype stores the blended scores as asked.
    scaled = tmp_path / "scores.tif"
    argv = ["apply", str(source), str(scaled), "--fn", f"{model_file}:double", *options]
    assert main([*argv, "--out-dtype", "int16"]) == 0
    stored = rioxarray.open_rasterio(scaled)
    assert stored.dtype == np.int16
    np.testing.assert_array_equal(stored.values, np.rint(raster.values * 2.0))


def test_zarr_in_zarr_out_with_new_output_dims(tmp_path, model_file, raster, capsys):
    source = tmp_path / "in.zarr"
    raster.to_dataset().to_zarr(source)
    target = tmp_path / "out.zarr"
    argv = ["apply", str(source), str(target), "--fn", f"{model_file}:band_sum"]
    options = ["--size", "40", "--stride", "30", "--output-dims", "total=1", "--no-progress"]
    assert main([*argv, *options]) == 0
    assert "Completed" not in capsys.readouterr().out
    written = xr.open_zarr(target)["reflectance"]  # the input's name
    assert written.dims == ("total", "y", "x")
    np.testing.assert_allclose(written.isel(total=0), raster.sum("band"), rtol=1e-6)
    np.testing.assert_array_equal(written.x, raster.x)
    # A second run finds the output complete and refuses to touch it...
    assert main([*argv, *options]) == 2
    err = capsys.readouterr().err
    assert "already exists and is complete" in err and "--restart" in err, err
    # ...unless told to start again.
    assert main([*argv, *options, "--restart"]) == 0


def test_nodata_carries_over_unless_another_is_asked_for(tmp_path, model_file, raster, capsys):
    rioxarray = pytest.importorskip("rioxarray")
    values = raster.values.copy()
    values[:, :30, :30] = 0  # 8-bit style nodata 0
    source = tmp_path / "in.tif"
    raster.copy(data=values).rio.write_crs("EPSG:32633").rio.write_nodata(0).rio.to_raster(source)
    argv = ["apply", str(source), "--fn", f"{model_file}:double", "--size", "32", "--no-progress"]
    assert main([argv[0], argv[1], str(tmp_path / "a.tif"), *argv[2:]]) == 0
    kept = rioxarray.open_rasterio(tmp_path / "a.tif")
    assert kept.rio.nodata == 0 and (kept.values[:, :30, :30] == 0).all()
    assert main([argv[0], argv[1], str(tmp_path / "b.tif"), *argv[2:], "--nodata", "nan"]) == 0
    other = rioxarray.open_rasterio(tmp_path / "b.tif")
    assert np.isnan(other.rio.nodata) and np.isnan(other.values[:, :30, :30]).all()
    np.testing.assert_allclose(other.values[:, 30:, 30:], 2 * values[:, 30:, 30:], rtol=1e-6)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main([argv[0], argv[1], str(tmp_path / "c.tif"), *argv[2:], "--nodata", "zero"])
    assert stop.value.code == 2
    assert "'zero' is not 'input', 'none' or a number" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--fn", "no_such_module_xyz:f"], "cannot import 'no_such_module_xyz'"),
        (["--fn", "numpy"], "must be 'module:function'"),
        (["--fn", "numpy:no_such_function"], "has no function 'no_such_function'"),
        (["--fn", "numpy:negative", "--dims", "y,z"], "['z'] not in the input's dims"),
        (["--fn", "numpy:negative", "--output-dims", "class"], "must look like 'class=5'"),
        (["--fn", "numpy:negative", "--size", "500"], "larger than"),
        (["--fn", "numpy:negative", "--dtype", "flot32"], "--dtype flot32 is not a numpy dtype"),
    ],
)
def test_bad_options_exit_2_with_a_message(tmp_path, raster, extra, message, capsys):
    source = tmp_path / "in.zarr"
    raster.to_dataset().to_zarr(source)
    argv = ["apply", str(source), str(tmp_path / "o.zarr"), "--size", "32", *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_inputs_that_cannot_be_read_exit_2(tmp_path, raster, capsys):
    assert (
        main(
            [
                "apply",
                str(tmp_path / "nope.zarr"),
                "o.zarr",
                "--fn",
                "numpy:negative",
                "--size",
                "8",
            ]
        )
        == 2
    )
    assert "does not exist" in capsys.readouterr().err
    two = tmp_path / "two.zarr"
    xr.Dataset({"a": raster, "b": raster}).to_zarr(two)
    assert main(["apply", str(two), "o.zarr", "--fn", "numpy:negative", "--size", "8"]) == 2
    assert "pick one with --variable" in capsys.readouterr().err


def test_load_function_from_a_module_and_a_file(model_file):
    assert load_function("numpy:negative") is np.negative
    double = load_function(f"{model_file}:double")
    assert double(np.ones(2)).tolist() == [2.0, 2.0]


def test_netcdf_in_zarr_out(tmp_path, model_file, raster, capsys):
    source = tmp_path / "in.nc"
    raster.to_dataset().to_netcdf(source)  # scipy's netCDF3 writer: no extra dependency
    target = tmp_path / "out.zarr"
    argv = ["apply", str(source), str(target), "--fn", f"{model_file}:double"]
    assert main([*argv, "--size", "30", "--stride", "20", "--window", "triangular"]) == 0
    written = xr.open_zarr(target)["reflectance"]
    assert written.dims == ("band", "y", "x")
    np.testing.assert_allclose(written, raster * 2, rtol=1e-6)


def test_an_error_in_the_users_function_propagates(tmp_path, raster):
    source = tmp_path / "in.zarr"
    raster.to_dataset().to_zarr(source)
    broken = tmp_path / "broken_fn.py"
    broken.write_text("def predict(batch):\n    raise ValueError('model weights missing')\n")
    argv = ["apply", str(source), str(tmp_path / "o.zarr"), "--fn", f"{broken}:predict"]
    with pytest.raises(ValueError, match="model weights missing"):
        main([*argv, "--size", "32", "--no-progress"])


def test_pad_mode_and_pad_batch_reach_the_model(tmp_path, model_file, raster, capsys):
    """--boundary pad --pad-mode reflect --pad-batch: no NaN from the padding, batches of 3."""
    source = tmp_path / "in.zarr"
    raster.to_dataset().to_zarr(source)
    target = tmp_path / "out.zarr"
    argv = ["apply", str(source), str(target), "--fn", f"{model_file}:smooth_in_threes",
            "--size", "32", "--stride", "24", "--chunks", "64", "--boundary", "pad",
            "--pad-mode", "reflect", "--batch-size", "3", "--pad-batch",
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    written = xr.open_zarr(target)["reflectance"]
    assert not written.isnull().any()
    fn = load_function(f"{model_file}:smooth_in_threes")
    layout = dict(y=32, x=32, stride=24, window="hann", boundary="pad", pad_mode="reflect")
    expected = raster.patch(**layout).apply(fn, batch_size=3, pad_batch=True)
    np.testing.assert_allclose(written.values, expected.values, rtol=1e-6)
    # Without --pad-batch the short batches reach the model, which refuses them.
    refused = [a for a in argv if a != "--pad-batch"]
    refused[2] = str(tmp_path / "refused.zarr")
    with pytest.raises(AssertionError):
        main(refused)


# -- what a new user types first --------------------------------------------------------------

FIRST_TRY = textwrap.dedent(
    """
    import numpy as np

    def ndvi(batch):
        # (b, band, y, x) uint16 -> (b, y, x) float32: another dtype, the band dim dropped
        red, nir = batch[:, 0].astype("float32"), batch[:, 1].astype("float32")
        return (nir - red) / np.maximum(nir + red, 1)
    """
)


@pytest.fixture
def uint16_scene(tmp_path, raster):
    source = tmp_path / "in.zarr"
    (raster * 1000).astype("uint16").to_dataset().to_zarr(source)
    model = tmp_path / "first_try.py"
    model.write_text(FIRST_TRY)
    return source, model


def test_a_float_model_that_drops_a_dim_runs_without_declaring_them(tmp_path, uint16_scene, capsys):
    # Before: refused until --dtype float32, then until --output-dims '', each after a
    # failed run. Now one call of FN on a batch of zeros finds both.
    source, model = uint16_scene
    target = tmp_path / "ndvi.zarr"
    argv = ["apply", str(source), str(target), "--fn", f"{model}:ndvi", "--size", "32"]
    assert main([*argv, "--no-progress"]) == 0, capsys.readouterr().err
    written = xr.open_zarr(target)["reflectance"]  # the input's name, as before
    assert written.dims == ("y", "x") and written.dtype == np.float32
    values = xr.open_zarr(source)["reflectance"].values.astype("float32")
    want = (values[1] - values[0]) / np.maximum(values[1] + values[0], 1)
    np.testing.assert_allclose(written.values, want, rtol=1e-5, atol=1e-6)


def test_cli_errors_name_the_cli_flags(tmp_path, uint16_scene, capsys):
    source, model = uint16_scene
    argv = ["apply", str(source), str(tmp_path / "o.zarr"), "--fn", f"{model}:ndvi"]
    # A declared dtype that FN breaks: the fix is a flag, not a Python argument.
    assert main([*argv, "--size", "32", "--dtype", "uint16", "--output-dims", ""]) == 2
    err = capsys.readouterr().err
    assert "--dtype float32" in err and "dtype=" not in err, err
    # New dims FN returns must be named: the message says how, as a flag.
    assert main([*argv[:4], "numpy:atleast_1d", "--size", "32"]) == 0  # keeps the band dim
    capsys.readouterr()
    (tmp_path / "repeat.py").write_text(
        "import numpy as np\n\ndef five(b):\n    return np.repeat(b[:, :1], 5, axis=1)\n"
    )
    target = str(tmp_path / "five.zarr")
    assert main([*argv[:2], target, "--fn", f"{tmp_path / 'repeat.py'}:five", "--size", "32"]) == 2
    err = capsys.readouterr().err
    assert "--output-dims dim0=5" in err and "output_dims=" not in err, err


def test_rectangular_patches_a_default_overlap_and_the_header_before_the_progress_bar(
    tmp_path, model_file, raster, capsys
):
    source = tmp_path / "in.zarr"
    raster.to_dataset().to_zarr(source)
    target = tmp_path / "out.zarr"
    argv = ["apply", str(source), str(target), "--fn", f"{model_file}:double"]
    assert main([*argv, "--size", "y=32,x=16", "--chunks", "64"]) == 0
    out = capsys.readouterr().out
    header = "patches of y: 32, x: 16, stride y: 24, x: 12"  # a quarter overlap by default
    assert header in out and "Completed" in out, out
    assert out.index(header) < out.index("Completed"), out  # what runs, then the wait
    p = raster.patch(y=32, x=16, stride={"y": 24, "x": 12}, window="hann")
    want = p.apply(lambda b: b * 2)
    np.testing.assert_allclose(xr.open_zarr(target)["reflectance"], want, rtol=1e-6)
    # --size names the patched dims; naming others is refused, naming the flag.
    assert main([*argv[:2], str(tmp_path / "b.zarr"), *argv[3:], "--size", "y=32,t=4"]) == 2
    assert "--size's dims ['y', 't']: ['t'] not in the input's dims" in capsys.readouterr().err
    assert main([*argv, "--size", "y=32,x=16", "--stride", "8", "--dims", "y"]) == 2
    assert "--size y=32,x=16 names the dims ['y', 'x']" in capsys.readouterr().err


def test_every_option_has_help_and_says_its_default_once(capsys):
    with pytest.raises(SystemExit):
        main(["apply", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    from xpatch.cli.command import build_parser

    apply = build_parser()._subparsers._group_actions[0].choices["apply"]
    for action in apply._actions:
        assert action.help, action.option_strings or action.dest
    assert "(default: None)" not in text and "(default: False)" not in text
    for option in text.split(" --")[1:]:
        assert option.lower().count("default") <= 1, option


def test_task_memory_works_large_chunks_in_smaller_blocks_and_a_bad_one_names_the_flag(
    tmp_path, model_file, raster, capsys
):
    source = tmp_path / "in.zarr"
    raster.to_dataset().to_zarr(source)
    argv = ["apply", str(source), "--fn", f"{model_file}:double", "--no-progress"]
    options = ["--size", "16", "--stride", "12", "--chunks", "64"]
    budgeted, whole = tmp_path / "budgeted.zarr", tmp_path / "whole.zarr"
    assert main([*argv[:2], str(budgeted), *argv[2:], *options, "--task-memory", "64KiB"]) == 0
    assert main([*argv[:2], str(whole), *argv[2:], *options]) == 0
    small, large = (xr.open_zarr(p)["reflectance"] for p in (budgeted, whole))
    assert max(large.chunks[1]) == 64 and max(small.chunks[1]) * max(small.chunks[2]) < 64 * 64
    np.testing.assert_allclose(small.values, large.values, rtol=1e-6)
    np.testing.assert_allclose(large.values, raster.values * 2, rtol=1e-6)
    capsys.readouterr()
    target = str(tmp_path / "never.zarr")
    assert main([*argv[:2], target, *argv[2:], *options, "--task-memory", "lots"]) == 2
    err = capsys.readouterr().err
    assert "--task-memory lots is not a memory size" in err and "task_memory=" not in err


def test_halo_feeds_a_model_that_crops_and_equals_the_whole_image(tmp_path, model_file, raster):
    source = tmp_path / "in.zarr"
    raster.to_dataset().to_zarr(source)
    target = tmp_path / "out.zarr"
    argv = ["apply", str(source), str(target), "--fn", f"{model_file}:valid_box"]
    options = ["--size", "32", "--stride", "24", "--chunks", "40", "--no-progress"]
    assert main([*argv, *options, "--halo", "1", "--pad-mode", "edge"]) == 0
    written = xr.open_zarr(target)["reflectance"].values
    grown = np.pad(raster.values, [(0, 0), (1, 1), (1, 1)], mode="edge")
    h, w = raster.shape[1:]
    expected = sum(grown[:, dy : dy + h, dx : dx + w] for dy in range(3) for dx in range(3)) / 9
    np.testing.assert_allclose(written, expected, rtol=1e-5)
