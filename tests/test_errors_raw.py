"""Inputs that used to raise numpy's, pandas' or rasterio's own errors raise XPatchErrors.

Object, string, datetime and duration values; duplicate coordinate labels for
``AtLabels``; and ``xpatch apply`` inputs a GeoTIFF output cannot hold or that
cannot be read. Each refusal names what is wrong and the fix, before anything is
computed, and what works with such values (cutting patches, feeding Grain, ``apply``
with a numeric output) keeps working.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import xpatch
from tests.conftest import forbid_compute
from xpatch.cli import main
from xpatch.io.geotiff import geotiff_layout

NAT = np.datetime64("NaT")

#: (values of a 4 x 6 grid, the words every refusal of them names)
NON_NUMERIC = {
    "object": (np.arange(24, dtype=float).astype(object).reshape(4, 6), "x.astype('float64')"),
    "str": (np.array([list("abcdef")] * 4), "the strings to numbers"),
    "bytes": (np.array([list("abcdef")] * 4).astype("S1"), "the strings to numbers"),
    "datetime64": (
        np.datetime64("2000-01-01", "ns") + np.arange(24).reshape(4, 6) * np.timedelta64(1, "h"),
        "np.timedelta64(1, 's')",
    ),
    "timedelta64": (np.arange(24).reshape(4, 6) * np.timedelta64(1, "s"), "astype('int64')"),
}


def grid(kind: str, lazy: bool) -> xr.DataArray:
    values, _ = NON_NUMERIC[kind]
    da = xr.DataArray(values, dims=("y", "x"), name="field")
    return da.chunk({"y": 2, "x": 3}) if lazy else da


# -- object, string, datetime and duration values ----------------------------------------------


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
@pytest.mark.parametrize("kind", list(NON_NUMERIC))
def test_reconstruct_refuses_values_it_cannot_blend(kind, lazy):
    da = grid(kind, lazy)
    p = da.patch(y=2, x=3, stride=1)
    pred = p.patches()
    for reduce in ("mean", "max"):
        with forbid_compute(), pytest.raises(xpatch.PredictionError) as info:
            p.reconstruct(pred, reduce=reduce)
        message = str(info.value)
        assert f"pred ('field') has dtype {pred.dtype}" in message
        assert "needs numbers (bool, int, float or complex)" in message
        assert NON_NUMERIC[kind][1] in message


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
@pytest.mark.parametrize("kind", list(NON_NUMERIC))
def test_apply_refuses_a_non_numeric_output_and_runs_a_numeric_one(kind, lazy):
    da = grid(kind, lazy)
    p = da.patch(y=2, x=3, stride=1, window="hann")
    with forbid_compute(), pytest.raises(xpatch.OptionError) as info:
        p.apply(lambda batch: batch)
    message = str(info.value)
    assert f"fn's output for a batch of zeros of the input's dtype ({da.dtype})" in message
    assert "return numbers from fn and declare their dtype= (e.g. dtype='float32')" in message
    assert NON_NUMERIC[kind][1] in message
    with forbid_compute(), pytest.raises(xpatch.OptionError, match=r"dtype='U8' \(fn's declared"):
        p.apply(lambda batch: batch, dtype="U8")
    # A model that takes these values and returns numbers is fine.
    out = p.apply(lambda batch: np.ones(batch.shape, "float32"), dtype="float32")
    np.testing.assert_allclose(out.values, np.ones((4, 6)), rtol=1e-6)


def test_apply_refuses_a_declared_datetime_output_of_numeric_input():
    p = xr.DataArray(np.zeros((4, 6)), dims=("y", "x")).patch(y=2, x=3)
    with pytest.raises(xpatch.OptionError, match=r"dtype='datetime64\[ns\]'.*needs numbers"):
        p.apply(lambda batch: batch, dtype="datetime64[ns]")


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
@pytest.mark.parametrize("kind", list(NON_NUMERIC))
def test_patches_of_non_numeric_values_keep_working(kind, lazy):
    da = grid(kind, lazy)
    p = da.patch(y=2, x=3)
    patches = p.patches()
    assert patches.dtype == da.dtype and patches.sizes["patch"] == 4
    np.testing.assert_array_equal(p[3].values, np.asarray(da.values)[2:, 3:])
    # Weights, Grain items and the validity filter do not mind the dtype either.
    assert p.weights().dtype == np.float64
    np.testing.assert_array_equal(p.to_grain()[1]["data"], np.asarray(da.values)[:2, 3:])
    assert len(da.patch(y=2, x=3, min_valid=1.0)) == 4


@pytest.mark.parametrize("lazy", [False, True], ids=["numpy", "dask"])
@pytest.mark.parametrize(
    ("values", "pad_value", "fill"),
    [
        (np.array([list("abcdef")] * 4), "", ""),
        (np.array([list("abcdef")] * 4).astype("S1"), b"", b""),
        (np.array([list("abcdef")] * 4, dtype=object), "-", "-"),
        (
            np.datetime64("2000-01-01", "ns")
            + np.arange(24).reshape(4, 6) * np.timedelta64(1, "h"),
            NAT,
            NAT,
        ),
    ],
    ids=["str", "bytes", "object", "datetime64"],
)
def test_padded_patches_of_non_numeric_values(values, pad_value, fill, lazy):
    da = xr.DataArray(values, dims=("y", "x"))
    da = da.chunk(2) if lazy else da
    p = da.patch(y=3, x=4, boundary="pad", pad_value=pad_value)
    last = p.patches().isel(patch=-1).values  # anchored at (3, 4): one row, two columns inside
    np.testing.assert_array_equal(last[:1, :2], values[3:, 4:])
    padded = last[1:].ravel().tolist() + last[:, 2:].ravel().tolist()
    if isinstance(fill, np.datetime64):
        assert np.isnat(np.array(padded, dtype="datetime64[ns]")).all()
    else:
        assert padded == [fill] * len(padded)
    np.testing.assert_array_equal(p[-1].values, last)


@pytest.mark.parametrize(
    ("values", "pad_value", "match"),
    [
        (np.array([list("abcdef")] * 4), "long", r"pad_value='long' cannot be stored unchanged"),
        (np.array([list("abcdef")] * 4), 0, r"pad_value=0 .* dtype <U1 of the variable 'field'"),
        (np.array([list("abcdef")] * 4).astype("S1"), "", r"e\.g\. pad_value=b''"),
    ],
)
def test_pad_values_a_string_variable_cannot_hold_are_refused(values, pad_value, match):
    da = xr.DataArray(values, dims=("y", "x"), name="field").chunk(2)
    with forbid_compute(), pytest.raises(xpatch.OptionError, match=match):
        da.patch(y=3, x=4, boundary="pad", pad_value=pad_value)


def test_a_dataset_names_the_variable_to_convert_or_leave_out():
    ds = xr.Dataset(
        {
            "t2m": (("y", "x"), np.ones((4, 6))),
            "station": (("y", "x"), np.array([list("abcdef")] * 4)),
        }
    ).chunk(2)
    p = ds.patch(y=2, x=3)
    pred = p.patches()
    with forbid_compute(), pytest.raises(xpatch.PredictionError) as info:
        p.reconstruct(pred)
    assert "pred['station'] has dtype <U1" in str(info.value)
    assert "leave it out: pred.drop_vars('station')" in str(info.value)
    out = p.reconstruct(pred.drop_vars("station"))
    np.testing.assert_array_equal(out["t2m"].values, np.ones((4, 6)))


def test_min_valid_counts_missing_objects_and_datetimes_in_memory_and_lazily():
    objects = np.ones((4, 6), dtype=object)
    objects[:2, :3] = None
    times = np.full((4, 6), np.datetime64("2000-01-01", "ns"))
    times[:2, :3] = NAT
    for values in (objects, times):
        for da in (
            xr.DataArray(values, dims=("y", "x")),
            xr.DataArray(values, dims=("y", "x")).chunk(2),
        ):
            kept = da.patch(y=2, x=3, min_valid=0.5).anchors().values.tolist()
            assert kept == [[0, 3], [2, 0], [2, 3]]


def test_numeric_dtypes_still_blend():
    for dtype in ("bool", "int16", "float32", "complex64"):
        da = xr.DataArray(np.ones((4, 6), dtype), dims=("y", "x"))
        p = da.patch(y=2, x=3, stride=1)
        np.testing.assert_allclose(p.reconstruct(p.patches()).values, np.ones((4, 6)))


# -- AtLabels on a coordinate with repeated labels ----------------------------------------------


@pytest.mark.parametrize("method", [None, "nearest"])
def test_at_labels_refuses_repeated_coordinate_labels(method):
    time = pd.to_datetime(["2000-01-01", "2000-01-02", "2000-01-02", "2000-01-03", "2000-01-04"])
    da = xr.DataArray(np.zeros((5, 4)), dims=("time", "x"), coords={"time": time}).chunk(2)
    sampler = xpatch.AtLabels({"time": [time[3]]}, method=method)
    with forbid_compute(), pytest.raises(xpatch.GeometryError) as info:
        da.patch(time=2, sampler=sampler)
    message = str(info.value)
    assert "the coordinate 'time' repeats label(s) 2000-01-02 00:00:00" in message
    assert "obj.drop_duplicates('time')" in message and "xpatch.Anchors" in message
    # The fix it names works.
    fixed = da.drop_duplicates("time").patch(time=2, sampler=sampler)
    assert fixed.anchors().values.tolist() == [[2]]


def test_at_labels_nearest_needs_a_sorted_coordinate_of_the_labels_type():
    da = xr.DataArray(np.zeros(5), dims="x", coords={"x": [4.0, 0.0, 3.0, 1.0, 2.0]})
    with pytest.raises(xpatch.GeometryError, match=r"sorted; sort it first \(obj.sortby\('x'\)\)"):
        da.patch(x=2, sampler=xpatch.AtLabels({"x": [2.2]}, method="nearest"))
    ordered = da.sortby("x")
    assert ordered.patch(
        x=2, sampler=xpatch.AtLabels({"x": [2.2]}, method="nearest")
    ).anchors().values.tolist() == [[2]]
    with pytest.raises(xpatch.GeometryError, match=r"\['a'\].*cannot be compared.*float64"):
        ordered.patch(x=2, sampler=xpatch.AtLabels({"x": ["a"]}, method="nearest"))


# -- geotiff_layout -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dims", "layout"),
    [
        (("y", "x"), ("y", "x", [])),
        (("band", "y", "x"), ("y", "x", ["band"])),
        (("lat", "lon", "class"), ("lat", "lon", ["class"])),
        (("Latitude", "Longitude"), ("Latitude", "Longitude", [])),
        (("northing", "easting"), ("northing", "easting", [])),
        (("lat", "y", "x"), ("y", "x", ["lat"])),  # y and x come first
    ],
)
def test_geotiff_layout_finds_rows_columns_and_bands(dims, layout):
    da = xr.DataArray(np.zeros((2, 3, 4)[: len(dims)], "float32"), dims=dims)
    with forbid_compute():
        assert geotiff_layout(da.chunk()) == layout


@pytest.mark.parametrize(
    ("da", "match"),
    [
        (xr.DataArray(np.zeros((0, 3, 4)), dims=("band", "y", "x")), r"empty along \['band'\]"),
        (xr.DataArray(np.zeros((3, 0)), dims=("y", "x")), r"empty along \['x'\].*at least one"),
        (
            xr.DataArray(np.zeros((2, 2, 3, 4)), dims=("t", "band", "y", "x")),
            r"4 dim\(s\) \(t: 2, band: 2, y: 3, x: 4\).*isel\(\{'t': 0\}\).*write zarr",
        ),
        (xr.DataArray(np.zeros(4), dims="x"), r"1 dim\(s\) \(x: 4\)\. Write it to zarr"),
        (
            xr.DataArray(np.zeros((3, 4)), dims=("row", "col")),
            r"no recognisable pair.*result\.rename\(\{'row': 'y', 'col': 'x'\}\)",
        ),
        (xr.DataArray(np.zeros((3, 4), bool), dims=("y", "x")), r"dtype bool.*astype\('uint8'\)"),
        (xr.DataArray(np.zeros((3, 4), "f2"), dims=("y", "x")), r"float16.*astype\('float32'\)"),
        (xr.Dataset({"a": (("y", "x"), np.zeros((3, 4)))}), r"got a Dataset.*ds\['name'\]"),
    ],
)
def test_geotiff_layout_refuses_what_a_geotiff_cannot_hold(da, match):
    with forbid_compute(), pytest.raises(xpatch.OptionError, match=match):
        geotiff_layout(da.chunk())


# -- xpatch apply ---------------------------------------------------------------------------


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "raw_error_model_fns.py"
    path.write_text(
        textwrap.dedent(
            """
            def double(batch):
                return batch * 2
            """
        )
    )
    return path


def run_apply(source, target, model_file, *extra):
    return main(
        ["apply", str(source), str(target), "--fn", f"{model_file}:double", "--size", "8",
         "--no-progress", *extra]
    )  # fmt: skip


def to_zarr(tmp_path, name, dims, shape, coords=None):
    path = tmp_path / name
    values = np.random.default_rng(0).random(shape).astype("float32")
    xr.Dataset({"v": (dims, values)}, coords=coords).to_zarr(path)
    return path


@pytest.mark.parametrize(
    ("dims", "shape", "match"),
    [
        (("a", "b"), (20, 30), r"dims \['a', 'b'\].*no recognisable pair"),
        (("t", "a", "b"), (2, 20, 30), r"dims \['t', 'a', 'b'\].*no recognisable pair"),
        (("t", "band", "y", "x"), (2, 2, 20, 30), r"4 dim\(s\)"),
        (("band", "y", "x"), (0, 20, 30), r"empty along \['band'\]"),
    ],
)
def test_apply_refuses_a_geotiff_output_it_cannot_write(
    tmp_path, model_file, capsys, dims, shape, match
):
    source = to_zarr(tmp_path, "in.zarr", dims, shape)
    target = tmp_path / "out.tif"
    assert run_apply(source, target, model_file) == 2
    err = capsys.readouterr().err
    assert err.startswith("xpatch apply: error: ")
    assert f"OUTPUT {str(target)!r} is a GeoTIFF" in err and f"INPUT {str(source)!r}" in err
    assert "A .zarr OUTPUT holds any result" in err
    assert "Traceback" not in err
    assert re.search(match, err), err
    assert not target.exists()
    assert not list(tmp_path.glob("out.tif*"))  # no record, no partial file


def test_apply_refuses_an_empty_input(tmp_path, model_file, capsys):
    source = to_zarr(tmp_path, "empty.zarr", ("y", "x"), (0, 30))
    assert run_apply(source, tmp_path / "out.tif", model_file) == 2
    err = capsys.readouterr().err
    assert f"xpatch apply: error: INPUT {str(source)!r} is empty along ['y'] (y: 0, x: 30)" in err


def test_apply_writes_lat_lon_input_to_a_georeferenced_geotiff(tmp_path, model_file):
    rioxarray = pytest.importorskip("rioxarray")
    coords = {"lat": 50.0 - 0.5 * np.arange(20), "lon": 5.0 + 0.25 * np.arange(30)}
    source = to_zarr(tmp_path, "latlon.zarr", ("lat", "lon"), (20, 30), coords)
    target = tmp_path / "out.tif"
    assert run_apply(source, target, model_file, "--stride", "6") == 0
    written = rioxarray.open_rasterio(target)
    original = xr.open_zarr(source)["v"]
    assert written.rio.transform()[:6] == (0.25, 0.0, 4.875, 0.0, -0.5, 50.25)
    np.testing.assert_allclose(written.values[0], original.values * 2, rtol=1e-6)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"", r"is an empty file \(0 bytes\).*copy or re-create it"),
        (b"II*\x00" + b"garbage" * 20, r"cannot be opened as a GeoTIFF \(RasterioIOError: .*\)"),
        (b"not a tiff at all", r"cannot be opened as a GeoTIFF .*damaged, incomplete"),
    ],
    ids=["0-byte", "corrupt", "not-a-tiff"],
)
def test_apply_refuses_an_unreadable_geotiff_input(tmp_path, model_file, capsys, content, match):
    pytest.importorskip("rioxarray")
    source = tmp_path / "in.tif"
    source.write_bytes(content)
    assert run_apply(source, tmp_path / "out.zarr", model_file) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"xpatch apply: error: INPUT {str(source)!r} ")
    assert "Traceback" not in err
    assert re.search(match, err), err


@pytest.mark.parametrize(
    ("name", "make", "kind"),
    [
        ("in.nc", lambda p: p.write_bytes(b"\x89HDF junk" * 5), "netCDF"),
        (
            "in.zarr",
            lambda p: (p.mkdir(), (p / "zarr.json").write_text("{garbage")),
            "a zarr store",
        ),
        ("in.zarr", lambda p: p.mkdir(), "a zarr store"),
    ],
    ids=["netcdf", "zarr-json", "zarr-empty-folder"],
)
def test_apply_refuses_other_unreadable_inputs(tmp_path, model_file, capsys, name, make, kind):
    source = tmp_path / name
    make(source)
    assert run_apply(source, tmp_path / "out.zarr", model_file) == 2
    err = capsys.readouterr().err
    assert f"xpatch apply: error: INPUT {str(source)!r} cannot be opened as {kind} (" in err
    assert err.count("\n") == 1  # one line, no traceback


def test_apply_in_a_subprocess_exits_2_without_a_traceback(tmp_path, model_file):
    source = tmp_path / "in.tif"
    source.write_bytes(b"")
    result = subprocess.run(
        [sys.executable, "-m", "xpatch", "apply", str(source), str(tmp_path / "o.tif"),
         "--fn", f"{model_file}:double", "--size", "8"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert (
        result.stderr.startswith("xpatch apply: error: INPUT") and "Traceback" not in result.stderr
    )
