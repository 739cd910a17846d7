"""xpatch.write: zarr and GeoTIFF output block by block, resume, overwrite, progress."""

from __future__ import annotations

import json
import os

import dask
import numpy as np
import pytest
import xarray as xr
import zarr

import xpatch
import xpatch.io.block_waves
from tests.io.writing import Affine, lazy_temperature
from xpatch.io import progress_record


@pytest.fixture
def lazy() -> xr.DataArray:
    return lazy_temperature(seed=7)


def patcher(da: xr.DataArray) -> xpatch.Patcher:
    return da.patch(y=8, x=8, stride=4, window="hann")


def markers(path) -> list[str]:
    """The block markers of the unfinished run at ``path``, as ``variable/block``."""
    done = progress_record(path) / "done"
    return sorted(f"{m.parent.name[2:]}/{m.name}" for m in done.glob("v-*/*"))


def interrupt(p: xpatch.Patcher, path, fail_after: int = 12) -> Affine:
    """Start writing ``p.apply(fn)`` to ``path`` and crash after ``fail_after`` fn calls."""
    crashing = Affine(fail_after=fail_after)
    with dask.config.set(scheduler="synchronous"):
        with pytest.raises(RuntimeError, match="simulated crash"):
            xpatch.write(p.apply(crashing, batch_size=64), path, progress=False)
    return crashing


# -- zarr round trip ----------------------------------------------------------------


def test_zarr_round_trip_equals_fn_on_the_whole_array(lazy, tmp_path):
    p = patcher(lazy)
    result = p.apply(Affine(), batch_size=16)
    assert isinstance(result.data, dask.array.Array)
    path = tmp_path / "o.zarr"

    written = xpatch.write(result, path, progress=False)

    assert written == result.data.npartitions == 16
    assert not progress_record(path).exists()
    out = xr.open_zarr(path)
    assert list(out.data_vars) == ["temp"]
    np.testing.assert_allclose(out["temp"].values, (lazy * 2 + 1).values, rtol=1e-12, atol=1e-12)
    xr.testing.assert_identical(out.coords.to_dataset(), lazy.coords.to_dataset())
    assert out["temp"].dims == lazy.dims
    assert out["temp"].attrs == lazy.attrs
    # The zarr chunks are the dask blocks.
    assert out["temp"].encoding["chunks"] == (2, 16, 16)


def test_zarr_name_of_an_unnamed_result_is_data(tmp_path):
    da = xr.DataArray(np.arange(12.0).reshape(3, 4), dims=("y", "x")).chunk(2)
    assert xpatch.write(da, tmp_path / "o.zarr", progress=False) == 4
    assert xpatch.write(da, tmp_path / "n.zarr", name="ndvi", progress=False) == 4
    np.testing.assert_array_equal(xr.open_zarr(tmp_path / "o.zarr")["data"].values, da.values)
    np.testing.assert_array_equal(xr.open_zarr(tmp_path / "n.zarr")["ndvi"].values, da.values)


# -- resume ---------------------------------------------------------------------------


def test_an_interrupted_run_is_resumed_block_by_block(lazy, tmp_path):
    p = patcher(lazy)
    path = tmp_path / "o.zarr"
    total = p.apply(Affine()).data.npartitions

    crashing = interrupt(p, path)

    record = progress_record(path)
    assert record.is_dir()
    saved = json.loads((record / "record.json").read_text())
    assert saved["state"] == "writing"
    assert saved["fingerprint"]["variables"]["temp"]["shape"] == [2, 64, 64]
    done = markers(path)
    assert 0 < len(done) < total, done
    assert crashing.calls == 12

    healthy = Affine()
    with dask.config.set(scheduler="synchronous"):
        written = xpatch.write(p.apply(healthy, batch_size=64), path, progress=False)

    assert written == total - len(done)
    assert not record.exists()
    out = xr.open_zarr(path)["temp"]
    np.testing.assert_allclose(out.values, (lazy * 2 + 1).values, rtol=1e-12, atol=1e-12)
    # A full run sends every patch through fn once; the resumed one skips the patches
    # that only the blocks already written need.
    full = Affine()
    p.apply(full, batch_size=64).compute(scheduler="synchronous")
    assert full.patches == len(p)
    assert 0 < healthy.patches < full.patches


def test_a_run_resumes_with_its_anchors_in_another_memory_layout(lazy, tmp_path):
    """pandas hands out columns in Fortran order: the same anchors, read again, resume."""
    import pandas as pd

    rng = np.random.default_rng(3)
    table = pd.DataFrame(rng.integers(0, 48, size=(40, 2)), columns=["y", "x"])
    in_c_order = table.to_numpy().copy(order="C")
    in_fortran_order = table.to_numpy()
    assert in_fortran_order.flags.f_contiguous and not in_fortran_order.flags.c_contiguous
    path = tmp_path / "o.zarr"
    interrupt(lazy.patch(y=16, x=16, sampler=xpatch.Anchors(in_c_order)), path, fail_after=3)
    assert progress_record(path).is_dir()
    p = lazy.patch(y=16, x=16, sampler=xpatch.Anchors(in_fortran_order))
    with dask.config.set(scheduler="synchronous"):
        xpatch.write(p.apply(Affine(), batch_size=64), path, progress=False)  # not refused
    assert not progress_record(path).exists()
    expected = p.apply(Affine()).compute(scheduler="synchronous")
    np.testing.assert_array_equal(xr.open_zarr(path)["temp"], expected)


def test_resume_does_not_rewrite_blocks_already_written(lazy, tmp_path):
    p = patcher(lazy)
    path = tmp_path / "o.zarr"
    interrupt(p, path)
    done = markers(path)
    # Scribble over one finished block: a resumed run must leave it alone.
    name, block = done[0].split("/")
    index = block.split(".")
    region = tuple(slice(16 * int(i), 16 * (int(i) + 1)) for i in index[1:])
    zarr.open_group(str(path), mode="r+")[name][(slice(None), *region)] = -1.0

    with dask.config.set(scheduler="synchronous"):
        xpatch.write(p.apply(Affine(), batch_size=64), path, progress=False)

    out = xr.open_zarr(path)["temp"].values
    expected = (lazy * 2 + 1).values
    assert (out[(slice(None), *region)] == -1.0).all()
    untouched = np.ones(out.shape, dtype=bool)
    untouched[(slice(None), *region)] = False
    np.testing.assert_allclose(out[untouched], expected[untouched], rtol=1e-12)


def test_overwrite_after_an_interrupted_run_starts_again(lazy, tmp_path):
    p = patcher(lazy)
    path = tmp_path / "o.zarr"
    interrupt(p, path)
    assert markers(path)

    fresh = Affine()
    written = xpatch.write(p.apply(fresh), path, overwrite=True, progress=False)

    assert written == 16
    assert fresh.patches == len(p)
    assert not progress_record(path).exists()
    np.testing.assert_allclose(xr.open_zarr(path)["temp"].values, (lazy * 2 + 1).values)


# -- errors -----------------------------------------------------------------------------


def test_existing_complete_output_needs_overwrite(lazy, tmp_path):
    path = tmp_path / "o.zarr"
    assert xpatch.write(lazy, path, progress=False) == 16

    with pytest.raises(FileExistsError, match=r"overwrite=True"):
        xpatch.write(lazy + 100, path, progress=False)
    np.testing.assert_array_equal(xr.open_zarr(path)["temp"].values, lazy.values)

    assert xpatch.write(lazy + 100, path, overwrite=True, progress=False) == 16
    np.testing.assert_array_equal(xr.open_zarr(path)["temp"].values, (lazy + 100).values)
    assert not progress_record(path).exists()


def test_resuming_a_different_result_raises(lazy, tmp_path):
    path = tmp_path / "o.zarr"
    interrupt(patcher(lazy), path)
    done = markers(path)

    other = lazy.isel(x=slice(0, 48))  # another shape
    with pytest.raises(xpatch.OptionError, match=r"overwrite=True"):
        xpatch.write(patcher(other).apply(Affine()), path, progress=False)
    # The interrupted run is left as it was, still resumable.
    assert markers(path) == done
    with dask.config.set(scheduler="synchronous"):
        written = xpatch.write(patcher(lazy).apply(Affine()), path, progress=False)
    assert written == 16 - len(done)


def test_resume_false_with_an_interrupted_run_does_not_deny_the_record(lazy, tmp_path):
    path = tmp_path / "o.zarr"
    interrupt(patcher(lazy), path)
    done = markers(path)

    with pytest.raises(FileExistsError, match=r"overwrite=True") as caught:
        xpatch.write(patcher(lazy).apply(Affine()), path, resume=False, progress=False)
    assert markers(path) == done
    # The record of the unfinished run is right there: the message must not say otherwise.
    assert "no progress record" not in str(caught.value), str(caught.value)


def test_a_write_that_fails_before_any_block_leaves_no_stale_record(tmp_path):
    # Zarr cannot create a variable of an encoded dtype that does not exist.
    data = np.random.default_rng(5).random((64, 64))
    bad = xr.DataArray(data, dims=("y", "x")).chunk(32)
    bad.encoding["dtype"] = "not-a-dtype"
    path = tmp_path / "o.zarr"
    with pytest.raises(TypeError, match=r"not-a-dtype"):
        xpatch.write(bad, path, progress=False)

    # Nothing was written, so nothing may be left that claims an interrupted run ...
    assert not progress_record(path).exists()
    # ... and the corrected result goes to the same path without overwrite=True.
    bad.encoding.pop("dtype")
    assert xpatch.write(bad, path, progress=False) == 4
    np.testing.assert_array_equal(xr.open_zarr(path)["data"].values, data)


def test_an_eager_result_counts_the_blocks_it_writes(tmp_path):
    # apply on numpy input returns a computed result; writing it writes data, so the
    # number of blocks written cannot be 0 ("0 if nothing was left to do").
    da = xr.DataArray(np.arange(48.0).reshape(6, 8), dims=("y", "x"), name="v")
    p = da.patch(y=4, x=4, stride=2, window="hann")
    result = p.apply(lambda b: b * 2 + 1)
    assert isinstance(result.data, np.ndarray)

    written = xpatch.write(result, tmp_path / "o.zarr", progress=False)

    np.testing.assert_allclose(xr.open_zarr(tmp_path / "o.zarr")["v"].values, da.values * 2 + 1)
    assert written > 0, "the whole array was written, but write reports 0 blocks"


def test_unknown_suffix_asks_for_format(lazy, tmp_path):
    path = tmp_path / "o.nc"
    with pytest.raises(xpatch.OptionError, match=r"format="):
        xpatch.write(lazy, path, progress=False)
    assert not path.exists()
    assert not progress_record(path).exists()


def test_an_explicit_format_overrides_the_suffix(lazy, tmp_path):
    path = tmp_path / "o.store"
    assert xpatch.write(lazy, path, format="zarr", progress=False) == 16
    np.testing.assert_array_equal(xr.open_zarr(path)["temp"].values, lazy.values)
    with pytest.raises(xpatch.OptionError):
        xpatch.write(lazy, tmp_path / "o.zarr", format="netcdf", progress=False)


# -- GeoTIFF ------------------------------------------------------------------------------


@pytest.fixture
def raster() -> xr.DataArray:
    rioxarray = pytest.importorskip("rioxarray")
    assert rioxarray
    values = np.random.default_rng(3).random((2, 200, 300)).astype("float32")
    values[0, 5:9, 7:20] = np.nan
    values[1, 150:, 290:] = np.nan
    da = xr.DataArray(
        values,
        dims=("band", "y", "x"),
        coords={
            "band": [1, 2],
            "y": 4_000_000.0 - 10.0 * np.arange(200) - 5.0,
            "x": 300_000.0 + 10.0 * np.arange(300) + 5.0,
        },
        name="reflectance",
    )
    return da.rio.write_crs("EPSG:32633").chunk({"band": 2, "y": 64, "x": 64})


def test_geotiff_round_trip_keeps_crs_transform_and_values(raster, tmp_path):
    import rioxarray

    path = tmp_path / "o.tif"
    written = xpatch.write(raster, path, progress=False)

    assert written == 4 * 5  # 2-D blocks; the band axis is whole
    assert not progress_record(path).exists()
    back = rioxarray.open_rasterio(path)
    assert back.rio.crs == raster.rio.crs
    assert back.rio.transform() == raster.rio.transform()
    assert back.dtype == np.float32
    assert back.shape == raster.shape
    assert np.isnan(back.rio.nodata)
    np.testing.assert_array_equal(back.values, raster.values)  # NaN where NaN


def test_geotiff_of_an_apply_result_writes_nan_as_nodata(raster, tmp_path):
    import rioxarray

    p = raster.patch(y=32, x=32, stride=24, window="hann")
    result = p.apply(lambda b: b * 2 + 1, batch_size=32)
    path = tmp_path / "o.tif"

    xpatch.write(result, path, nodata=-9999.0, progress=False)

    back = rioxarray.open_rasterio(path)
    assert back.rio.crs == raster.rio.crs
    assert back.rio.transform() == raster.rio.transform()
    assert back.rio.nodata == -9999.0
    expected = raster.values * 2 + 1
    holes = np.isnan(expected)
    assert holes.any()
    assert (back.values[holes] == -9999.0).all()
    assert not np.isnan(back.values).any()
    np.testing.assert_allclose(back.values[~holes], expected[~holes], rtol=1e-6)
    masked = rioxarray.open_rasterio(path, masked=True)
    np.testing.assert_allclose(masked.values, expected, rtol=1e-6)


def test_geotiff_is_resumed_too(raster, tmp_path):
    import rioxarray

    path = tmp_path / "o.tif"
    p = raster.patch(y=32, x=32, stride=24)
    crashing = Affine(fail_after=10)
    with dask.config.set(scheduler="synchronous"):
        with pytest.raises(RuntimeError, match="simulated crash"):
            xpatch.write(p.apply(crashing, batch_size=64), path, progress=False)
        done = markers(path)
        assert 0 < len(done) < 20
        written = xpatch.write(p.apply(Affine(), batch_size=64), path, progress=False)
    assert written == 20 - len(done)
    back = rioxarray.open_rasterio(path, masked=True)
    np.testing.assert_allclose(back.values, raster.values * 2 + 1, rtol=1e-6)


# -- progress ------------------------------------------------------------------------------


def test_progress_bar_is_shown_only_when_asked(lazy, tmp_path, capsys):
    xpatch.write(lazy, tmp_path / "quiet.zarr", progress=False)
    quiet = capsys.readouterr()
    assert quiet.out == ""
    assert quiet.err == ""

    xpatch.write(lazy, tmp_path / "loud.zarr", progress=True)
    loud = capsys.readouterr()
    assert "100%" in loud.out + loud.err


@pytest.mark.parametrize(("blocks_per_thread", "wave_count"), [(4, 4), (100, 1)])
def test_a_write_in_waves_runs_each_patch_through_fn_once(
    lazy, tmp_path, monkeypatch, blocks_per_thread, wave_count
):
    # One block row per wave (4 waves), or everything in one wave: the overhang
    # pieces carried from wave to wave spare recomputing any patch group.
    monkeypatch.setattr(xpatch.io.block_waves, "BLOCKS_PER_THREAD", blocks_per_thread)
    monkeypatch.setattr(xpatch.io.block_waves, "worker_count", lambda: 1)
    waves = []
    real = xpatch.io.block_waves.run_in_waves
    monkeypatch.setattr(
        xpatch.io.block_waves,
        "run_in_waves",
        lambda g, w, *a, **k: waves.append(len(w)) or real(g, w, *a, **k),
    )
    p = patcher(lazy)
    fn = Affine()
    with dask.config.set(scheduler="synchronous"):
        assert xpatch.write(p.apply(fn), tmp_path / "o.zarr", progress=False) == 16
    assert waves == [wave_count]
    assert fn.patches == len(p)
    np.testing.assert_allclose(xr.open_zarr(tmp_path / "o.zarr")["temp"], lazy * 2 + 1)


def test_waves_follow_the_output_layout_whatever_its_dim_order(lazy, tmp_path, monkeypatch):
    # Bands last: the result is transposed back to (y, x, band); 3 waves of 2
    # blocks per row of 4, so overhangs cross waves within a row and across rows.
    monkeypatch.setattr(xpatch.io.block_waves, "BLOCKS_PER_THREAD", 2)
    monkeypatch.setattr(xpatch.io.block_waves, "worker_count", lambda: 1)
    bands_last = lazy.transpose("y", "x", "band")
    p = patcher(bands_last)
    fn = Affine()
    with dask.config.set(scheduler="synchronous"):
        result = p.apply(fn)
        assert result.dims == ("y", "x", "band")
        assert xpatch.write(result, tmp_path / "o.zarr", progress=False) == 16
    assert fn.patches == len(p)
    written = xr.open_zarr(tmp_path / "o.zarr")["temp"]
    np.testing.assert_allclose(written, bands_last * 2 + 1)


def test_several_variables_are_written_in_waves(lazy, tmp_path, monkeypatch):
    monkeypatch.setattr(xpatch.io.block_waves, "BLOCKS_PER_THREAD", 1)
    monkeypatch.setattr(xpatch.io.block_waves, "worker_count", lambda: 1)
    p = patcher(lazy)
    both = xr.Dataset({"a": p.apply(Affine()), "b": p.reconstruct(p.patches(), reduce="max")})
    with dask.config.set(scheduler="synchronous"):
        assert xpatch.write(both, tmp_path / "o.zarr", progress=False) == 32
    stored = xr.open_zarr(tmp_path / "o.zarr")
    np.testing.assert_allclose(stored["a"], lazy * 2 + 1)
    np.testing.assert_allclose(stored["b"], lazy)


def test_a_result_that_mixes_distant_blocks_is_written_in_one_computation(
    lazy, tmp_path, monkeypatch
):
    # Every block of r / r.max() needs every block: waves would recompute it all.
    waves = []
    monkeypatch.setattr(xpatch.io.block_waves, "run_in_waves", lambda *a, **k: waves.append(1))
    p = patcher(lazy)
    fn = Affine()
    result = p.apply(fn)
    with dask.config.set(scheduler="synchronous"):
        assert xpatch.write(result / result.max(), tmp_path / "o.zarr", progress=False) == 16
    assert not waves
    assert fn.patches == len(p)
    expected = (lazy * 2 + 1) / (lazy * 2 + 1).max()
    np.testing.assert_allclose(xr.open_zarr(tmp_path / "o.zarr")["temp"], expected)


def test_apply_results_are_written_in_waves(lazy, tmp_path, monkeypatch):
    calls = []
    real = xpatch.io.block_waves.run_in_waves
    monkeypatch.setattr(
        xpatch.io.block_waves, "run_in_waves", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    xpatch.write(patcher(lazy).apply(Affine()), tmp_path / "o.zarr", progress=False)
    assert calls == [1]


def test_dask_backed_coordinates_are_written(tmp_path):
    lat = xr.DataArray(np.add.outer(np.arange(8.0), np.arange(8.0)), dims=("y", "x"))
    da = xr.DataArray(np.ones((8, 8)), dims=("y", "x"), coords={"lat": lat}).chunk(4)
    xpatch.write(da, tmp_path / "o.zarr", progress=False)
    stored = xr.open_zarr(tmp_path / "o.zarr")
    np.testing.assert_array_equal(stored["lat"], lat)


# -- overhangs spilled to disk --------------------------------------------------------


@pytest.fixture
def spill_watch(tmp_path, monkeypatch):
    """Spill every overhang (a budget of 0 bytes) into a folder under ``tmp_path``.

    Returns what was seen: the files written, and the files still there when the
    write ended (before the folder went), which must be none.
    """
    monkeypatch.setattr(xpatch.io.block_waves, "OVERHANG_BYTES", 0)
    monkeypatch.setattr(xpatch.io.block_waves, "BLOCKS_PER_THREAD", 1)
    monkeypatch.setattr(xpatch.io.block_waves, "worker_count", lambda: 1)
    spills = tmp_path / "spills"
    spills.mkdir()
    monkeypatch.setattr(xpatch.io.block_waves.tempfile, "tempdir", str(spills))
    seen = {"written": 0, "read": 0, "left": None, "folders": []}
    real_over, real_exit = (
        xpatch.io.block_waves.OverhangSpill.over,
        xpatch.io.block_waves.OverhangSpill.__exit__,
    )
    real_read = xpatch.io.block_waves._read_spilled

    def read(path):
        seen["read"] += 1
        return real_read(path)

    monkeypatch.setattr(xpatch.io.block_waves, "_read_spilled", read)

    def over(self, carried, graph, next_read):
        before = len(list(self))
        real_over(self, carried, graph, next_read)
        seen["written"] += len(list(self)) - before

    def exit_(self, *exc):
        if self._folder is not None:
            seen["folders"].append(self._folder.path)
            seen["left"] = sorted(os.listdir(self._folder.path))
        real_exit(self, *exc)

    monkeypatch.setattr(xpatch.io.block_waves.OverhangSpill, "over", over)
    monkeypatch.setattr(xpatch.io.block_waves.OverhangSpill, "__exit__", exit_)
    seen["root"] = spills
    return seen


def in_waves() -> xpatch.Patcher:
    """3 x 3 blocks whose patch groups overhang right and down: a write in 9 waves."""
    values = np.random.default_rng(5).normal(size=(2, 96, 96))
    da = xr.DataArray(values, dims=("band", "y", "x"), name="temp")
    return da.chunk({"band": 2, "y": 32, "x": 32}).patch(y=8, x=8, stride=6, window="hann")


def test_overhangs_spilled_to_disk_give_the_same_bits_and_leave_no_file(
    tmp_path, spill_watch, monkeypatch
):
    p = in_waves()
    with dask.config.set(scheduler="synchronous"):
        with monkeypatch.context() as m:
            m.setattr(xpatch.io.block_waves, "OVERHANG_BYTES", 2**40)
            xpatch.write(p.apply(Affine()), tmp_path / "kept.zarr", progress=False)
        assert spill_watch["written"] == 0
        fn = Affine()
        xpatch.write(p.apply(fn), tmp_path / "spilled.zarr", progress=False)
    assert spill_watch["written"] >= 4  # at least the pieces of a row of blocks
    assert spill_watch["read"] >= spill_watch["written"]  # each read back from its file
    assert fn.patches == len(p)  # read back from disk, not recomputed
    np.testing.assert_array_equal(
        xr.open_zarr(tmp_path / "spilled.zarr")["temp"],
        xr.open_zarr(tmp_path / "kept.zarr")["temp"],
    )
    assert spill_watch["left"] == []  # each file went once its last reader had run
    assert list(spill_watch["root"].iterdir()) == []  # and the folder with the write


def test_a_failed_write_removes_its_spilled_overhangs(tmp_path, spill_watch):
    interrupt(in_waves(), tmp_path / "o.zarr", fail_after=5)  # in the 6th of 9 waves
    assert spill_watch["written"] > 0 and spill_watch["folders"]
    assert list(spill_watch["root"].iterdir()) == []


def test_a_spill_folder_that_cannot_be_made_warns_and_keeps_the_pieces_in_memory(
    tmp_path, spill_watch, monkeypatch
):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    monkeypatch.setattr(xpatch.io.block_waves.tempfile, "tempdir", str(not_a_folder))
    p = in_waves()
    fn = Affine()
    with dask.config.set(scheduler="synchronous"):
        with pytest.warns(RuntimeWarning, match="could not spill .* TMPDIR"):
            xpatch.write(p.apply(fn), tmp_path / "o.zarr", progress=False)
    assert spill_watch["written"] == spill_watch["read"] == 0
    assert fn.patches == len(p)
    expected = p.apply(Affine()).compute(scheduler="sync")
    np.testing.assert_allclose(xr.open_zarr(tmp_path / "o.zarr")["temp"], expected)


def test_every_output_format_has_the_output_protocols_members():
    from xpatch.io.geotiff import GeoTiffOutput
    from xpatch.io.outputs import Output, ZarrOutput

    members = {
        name
        for name in vars(Output)
        if not name.startswith("_") and callable(getattr(Output, name, None))
    }
    assert {"create", "store_tasks", "finish", "tidy"} <= members
    for cls in (ZarrOutput, GeoTiffOutput):
        assert all(callable(getattr(cls, name, None)) for name in members), cls


def test_a_geotiff_of_an_irregular_grid_is_refused_before_any_work(tmp_path):
    # rioxarray would write the average pixel size: most cells in the wrong place.
    pytest.importorskip("rioxarray")
    x = np.array([0.0, 1.0, 2.0, 4.0, 8.0, 9.0])
    result = xr.DataArray(
        np.zeros((4, 6), "float32"), dims=("y", "x"), coords={"x": x, "y": 3.0 - np.arange(4)}
    )
    with pytest.raises(xpatch.OptionError, match=r"'x' labels are not regularly spaced.*zarr"):
        xpatch.write(result, tmp_path / "out.tif", progress=False)
    assert not (tmp_path / "out.tif").exists()
    assert xpatch.write(result, tmp_path / "out.zarr", progress=False) == 1  # zarr keeps them
