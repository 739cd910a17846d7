"""Several outputs: ``fn`` returns a dict, ``apply`` a Dataset with a variable per key."""

from __future__ import annotations

import textwrap

import dask
import numpy as np
import pytest
import rasterio
import rioxarray  # noqa: F401 (the .rio accessor)
import xarray as xr

import xpatch
from tests.conftest import forbid_compute
from tests.io.writing import lazy_temperature
from xpatch.cli import main
from xpatch.io import progress_record

DIMS = {"seg": {"class": 3}, "unc": {}}


class TwoHeads:
    """``{"seg": (b, 3, y, x), "unc": (b, y, x)}`` float32; counts calls, may crash on cue."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.fail_after = fail_after
        self.calls = 0

    def __dask_tokenize__(self) -> str:
        return "two-heads"

    def __call__(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise RuntimeError("simulated crash in the middle of the run")
        self.calls += 1
        return {"seg": seg(batch), "unc": unc(batch)}


def seg(batch: np.ndarray) -> np.ndarray:
    k = np.arange(3, dtype=np.float32)[None, :, None, None]
    return (np.sin(batch[:, :1] * (k + 1)) + batch[:, 1:] * k).astype(np.float32)


def unc(batch: np.ndarray) -> np.ndarray:
    return np.abs(batch[:, 0] - batch[:, 1]).astype(np.float32)


class Counted:
    def __init__(self, fn) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, batch):
        self.calls += 1
        return self.fn(batch)


def patcher(lazy: bool) -> xpatch.Patcher:
    data = lazy_temperature(seed=3)
    return (data if lazy else data.compute()).patch(y=8, x=8, stride=4, window="hann")


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("reduce", ["mean", "max"])
def test_a_dict_equals_two_single_output_runs_with_one_call_per_batch(lazy, reduce):
    p = patcher(lazy)
    model = TwoHeads()
    with forbid_compute():
        ds = p.apply(model, batch_size=16, output_dims=DIMS, dtype="float32", reduce=reduce)
    assert isinstance(ds, xr.Dataset) and sorted(ds.data_vars) == ["seg", "unc"]
    assert ds["seg"].dims == ("class", "y", "x") and ds["unc"].dims == ("y", "x")
    one = Counted(seg)
    single_seg = p.apply(
        one, batch_size=16, output_dims={"class": 3}, dtype="float32", reduce=reduce
    )
    single_unc = p.apply(unc, batch_size=16, output_dims={}, dtype="float32", reduce=reduce)
    with dask.config.set(scheduler="synchronous"):
        ds = ds.compute()
        single_seg, single_unc = single_seg.compute(), single_unc.compute()
    xr.testing.assert_identical(ds["seg"], single_seg.rename("seg"))
    xr.testing.assert_identical(ds["unc"], single_unc.rename("unc"))
    assert model.calls == one.calls > 0


def test_the_lazy_graph_stays_a_few_tasks_per_chunk_per_output():
    p = patcher(True)
    ds = p.apply(TwoHeads(), output_dims=DIMS, dtype="float32")
    single = p.apply(seg, output_dims={"class": 3}, dtype="float32")
    both = dict(ds["seg"].data.__dask_graph__()) | dict(ds["unc"].data.__dask_graph__())
    own = [k for k in both if k not in dict(p.obj.data.__dask_graph__())]
    n_single = len(dict(single.data.__dask_graph__())) - len(dict(p.obj.data.__dask_graph__()))
    # One shared fn task per group, plus per output what a single output needs.
    assert len(own) <= 2 * n_single + len(p.plan.groups)


def test_plain_values_apply_to_every_output_and_missing_keys_take_the_default():
    p = patcher(False)
    ds = p.apply(
        lambda b: {"a": b * 2, "b": b.sum(axis=1, keepdims=True)},
        output_dims={"a": None, "b": {"s": 1}},
        dtype={"a": "float32"},
    )
    assert ds["a"].dims == ("band", "y", "x") and ds["a"].dtype == np.float32
    assert ds["b"].dtype == np.float64
    np.testing.assert_allclose(ds["a"], p.obj * 2, rtol=1e-6)
    # A dict dtype alone declares the outputs; output_dims then applies to all.
    ds = p.apply(lambda b: {"a": b, "b": -b}, dtype={"a": None, "b": "float64"})
    np.testing.assert_allclose(ds["b"], -p.obj)
    ds = p.apply(
        lambda b: {"a": b.astype("int16"), "b": b},
        dtype={"a": "int16", "b": "float64"},
        out_dtype={"a": "int32"},
        reduce="max",
    )
    assert ds["a"].dtype == np.int32


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda b: {"seg": seg(b), "unc": unc(b), "extra": unc(b)}, "not declared: \\['extra'\\]"),
        (lambda b: {"seg": seg(b)}, "missing: \\['unc'\\]"),
        (lambda b: seg(b), "returned a ndarray where apply was declared several outputs"),
        (lambda b: {"seg": seg(b), "unc": seg(b)}, "for output 'unc'"),
    ],
)
def test_outputs_that_break_their_declaration_raise(lazy, fn, message):
    p = patcher(lazy)
    with pytest.raises(xpatch.PredictionError, match=message):
        p.apply(fn, output_dims=DIMS, dtype="float32").compute(scheduler="synchronous")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"output_dims": {"a/b": {}}}, "not usable as variable names"),
        ({"output_dims": {"a": {}}, "dtype": {"b": "f4"}}, "does not declare"),
        ({"dtype": {}}, "declares no output"),
        ({"output_dims": {"a": {"c": 2}, "b": {"c": 3}}}, "sizes 2 and 3"),
        ({"output_dims": {"x": {}}}, "also a dim or coordinate"),
    ],
)
def test_bad_declarations_raise_before_any_work(options, message):
    with forbid_compute(), pytest.raises(xpatch.OptionError, match=message):
        patcher(True).apply(TwoHeads(), **options)


def test_written_to_zarr_and_read_back_with_fn_called_once_per_batch(tmp_path):
    p = patcher(True)
    writing, computing = TwoHeads(), TwoHeads()
    ds = p.apply(writing, output_dims=DIMS, dtype="float32")
    with dask.config.set(scheduler="synchronous"):
        xpatch.write(ds, tmp_path / "o.zarr", progress=False)
        expected = p.apply(computing, output_dims=DIMS, dtype="float32").compute()
    # The write runs both outputs' blocks of a region in one wave: fn once per batch.
    assert writing.calls == computing.calls > 0
    back = xr.open_zarr(tmp_path / "o.zarr").compute()
    for name in ("seg", "unc"):
        np.testing.assert_array_equal(back[name].values, expected[name].values)
        assert back[name].dtype == np.float32


def test_an_interrupted_dict_output_write_is_resumed(tmp_path):
    p = patcher(True)
    path = tmp_path / "o.zarr"
    crashing = TwoHeads(fail_after=6)
    with dask.config.set(scheduler="synchronous"):
        with pytest.raises(RuntimeError, match="simulated crash"):
            xpatch.write(p.apply(crashing, output_dims=DIMS, dtype="float32"), path, progress=False)
        assert progress_record(path).is_dir()
        healthy = TwoHeads()
        written = xpatch.write(
            p.apply(healthy, output_dims=DIMS, dtype="float32"), path, progress=False
        )
        full = TwoHeads()
        expected = p.apply(full, output_dims=DIMS, dtype="float32").compute()
    assert written > 0 and not progress_record(path).exists()
    assert 0 < healthy.calls < full.calls
    back = xr.open_zarr(path).compute()
    for name in ("seg", "unc"):
        np.testing.assert_array_equal(back[name].values, expected[name].values)


MODEL = textwrap.dedent(
    """
    import numpy as np

    def heads(batch):
        return {"total": batch.sum(axis=1, keepdims=True), "first": batch[:, 0]}
    """
)


def test_cli_writes_one_zarr_store_with_a_variable_per_key(tmp_path, capsys):
    model = tmp_path / "heads_model.py"
    model.write_text(MODEL)
    raster = lazy_temperature(seed=5).compute()
    raster.to_dataset().to_zarr(tmp_path / "in.zarr")
    target = tmp_path / "out.zarr"
    argv = ["apply", str(tmp_path / "in.zarr"), str(target), "--fn", f"{model}:heads"]
    options = ["--size", "16", "--stride", "8", "--output-dims", "total:s=1;first:"]
    assert main([*argv, *options, "--no-progress"]) == 0, capsys.readouterr().err
    written = xr.open_zarr(target)
    assert sorted(written.data_vars) == ["first", "total"]
    np.testing.assert_allclose(written["total"].isel(s=0), raster.sum("band"), rtol=1e-12)
    np.testing.assert_allclose(written["first"], raster.isel(band=0), rtol=1e-12)
    # A GeoTIFF holds them as bands: one per output (and per entry of its dim).
    tif = ["apply", str(tmp_path / "in.zarr"), str(tmp_path / "o.tif"), "--fn", f"{model}:heads"]
    assert main([*tif, *options, "--no-progress"]) == 0, capsys.readouterr().err
    with rasterio.open(tmp_path / "o.tif") as src:
        assert src.count == 2 and src.descriptions == ("total:s=0", "first")
        np.testing.assert_allclose(src.read(1), raster.sum("band"), rtol=1e-6)
        np.testing.assert_allclose(src.read(2), raster.isel(band=0), rtol=1e-6)


def test_written_to_one_geotiff_with_a_band_per_output_and_class(tmp_path):
    data = lazy_temperature(seed=3).rio.write_crs("EPSG:32633")
    p = data.patch(y=8, x=8, stride=4, window="hann")
    ds = p.apply(TwoHeads(), output_dims=DIMS, dtype="float32")
    expected = p.apply(TwoHeads(), output_dims=DIMS, dtype="float32").compute()
    xpatch.write(ds, tmp_path / "o.tif", progress=False)
    with rasterio.open(tmp_path / "o.tif") as src:
        assert src.count == 4 and src.dtypes == ("float32",) * 4
        assert src.descriptions == ("seg:class=0", "seg:class=1", "seg:class=2", "unc")
        assert src.crs == "EPSG:32633" and src.transform == ds.rio.transform()
        values = src.read()
    np.testing.assert_array_equal(values[:3], expected["seg"].values)
    np.testing.assert_array_equal(values[3], expected["unc"].values)


def test_geotiff_bands_keep_labels_exact_and_nodata_as_nodata(tmp_path):
    """uint8 labels beside float32 scores: float32 holds the labels; their nodata turns NaN."""
    labels = xr.DataArray(np.array([[0, 1], [255, 2]], "uint8"), dims=("y", "x"),
                          attrs={"_FillValue": 255})  # fmt: skip
    scores = xr.DataArray(np.array([[0.5, 1.5], [2.5, 3.5]], "float32"), dims=("y", "x"))
    xpatch.write(xr.Dataset({"label": labels, "score": scores}), tmp_path / "b.tif",
                 progress=False)  # fmt: skip
    with rasterio.open(tmp_path / "b.tif") as src:
        assert np.isnan(src.nodata) and src.descriptions == ("label", "score")
        np.testing.assert_array_equal(src.read(1), [[0, 1], [np.nan, 2]])
    ints = xr.Dataset({"a": labels, "b": labels.copy(data=labels.values.astype("uint16"))})
    xpatch.write(ints, tmp_path / "i.tif", progress=False)
    with rasterio.open(tmp_path / "i.tif") as src:
        assert src.dtypes == ("uint16", "uint16") and src.nodata == 255
    with pytest.raises(xpatch.OptionError, match=r"nodata values differ"):
        other = labels.assign_attrs(_FillValue=0)
        xpatch.write(xr.Dataset({"a": labels, "b": other}), tmp_path / "d.tif", progress=False)
    with pytest.raises(xpatch.OptionError, match=r"\['big'\] \(int64\) do not fit.*float64"):
        big = xr.DataArray(np.array([[2**60, 1], [2, 3]]), dims=("y", "x"))
        xpatch.write(xr.Dataset({"big": big, "s": scores}), tmp_path / "e.tif", progress=False)
    with pytest.raises(xpatch.OptionError, match=r"one GeoTIFF holds one grid"):
        small = scores.rename(x="lon").isel(lon=[0])
        xpatch.write(xr.Dataset({"s": scores, "t": small}), tmp_path / "f.tif", progress=False)
    assert not list(tmp_path.glob("[def].tif*"))


def test_geotiff_bands_do_not_take_one_variable_s_attributes():
    from xpatch.io.geotiff import stack_bands

    a = xr.DataArray(np.ones((2, 2), "uint8"), dims=("y", "x"),
                     attrs={"scale_factor": 0.5, "units": "class"})  # fmt: skip
    b = xr.DataArray(np.ones((2, 2), "float32"), dims=("y", "x"), attrs={"units": "m"})
    stacked = stack_bands(xr.Dataset({"a": a, "b": b}))
    assert set(stacked.attrs) == {"long_name", "_FillValue"}
    with pytest.raises(xpatch.OptionError, match=r"None: it has none"):
        stack_bands(xr.Dataset({"a": a.assign_attrs(_FillValue=255), "c": a}))
