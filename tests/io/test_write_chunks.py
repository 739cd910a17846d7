"""xpatch.write to zarr of results whose dask blocks are ragged: regular zarr chunks, exact."""

from __future__ import annotations

import pathlib
import tempfile

import dask
import dask.array
import numpy as np
import pytest
import xarray as xr
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xpatch
from tests.io.writing import Affine, lazy_temperature
from xpatch.io import progress_record


def chunking(n: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Any split of ``n`` cells into blocks (ragged ones most of the time)."""
    cuts = st.sets(st.integers(1, n - 1), max_size=4).map(sorted)
    return cuts.map(lambda c: tuple(np.diff([0, *c, n]).tolist()))


def ragged(values: np.ndarray, y: tuple[int, ...], x: tuple[int, ...]) -> xr.DataArray:
    return xr.DataArray(values, dims=("band", "y", "x"), name="v").chunk({"y": y, "x": x})


def zarr_chunks(path, name: str) -> tuple[int, ...]:
    return zarr.open_array(str(path), path=name, mode="r").chunks


def regular(chunks: tuple[int, ...], size: int) -> bool:
    """Whether ``chunks`` (of one dim) are zarr's: one size, a shorter last one."""
    return all(c == size for c in chunks[:-1]) and chunks[-1] <= size


VALUES = np.random.default_rng(11).normal(size=(2, 20, 17))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(y=chunking(20), x=chunking(17), reconstruct=st.booleans())
def test_any_chunking_round_trips_exactly_through_zarr(y, x, reconstruct):
    p = ragged(VALUES, y, x).patch(y=6, x=6, stride=4)
    result = p.reconstruct(p.patches()) if reconstruct else p.apply(lambda b: b * 2)
    assert result.chunks == ((2,), y, x)  # the result keeps the input's blocks
    expected = result.values
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "o.zarr"
        written = xpatch.write(result, path, progress=False)
        out = xr.open_zarr(path)["v"]
        np.testing.assert_array_equal(out.values, expected)
        stored = zarr_chunks(path, "v")
        # Each dask block went to whole zarr chunks: as many blocks as chunks written.
        assert written == np.prod([-(-n // c) for n, c in zip(VALUES.shape, stored)])
        assert not progress_record(path).exists()


def test_the_examples_of_ragged_blocks_write_and_match_their_geotiff(tmp_path):
    pytest.importorskip("rioxarray")
    values = np.random.default_rng(2).normal(size=(3, 30, 30))
    da = xr.DataArray(values, dims=("band", "y", "x")).chunk({"y": (10, 7, 13), "x": (11, 8, 11)})
    p = da.patch(y=8, x=8, stride=6)
    for i, result in enumerate([p.apply(lambda b: b * 2), p.reconstruct(p.patches())]):
        xpatch.write(result, tmp_path / f"{i}.zarr", progress=False)
        xpatch.write(result, tmp_path / f"{i}.tif", progress=False)
        stored = xr.open_zarr(tmp_path / f"{i}.zarr")["data"]
        np.testing.assert_array_equal(stored.values, result.values)
        # The largest block of each ragged dim is its zarr chunk: no more blocks than before.
        assert zarr_chunks(tmp_path / f"{i}.zarr", "data") == (3, 13, 11)
        import rioxarray

        np.testing.assert_array_equal(
            rioxarray.open_rasterio(tmp_path / f"{i}.tif").values, stored.values
        )
    # The caller's result keeps its own blocks.
    assert result.chunks == ((3,), (10, 7, 13), (11, 8, 11))


def test_variables_and_coordinates_chunked_apart_each_get_regular_chunks(tmp_path):
    rng = np.random.default_rng(5)
    ds = xr.Dataset(
        {
            "a": (("t", "x"), dask.array.from_array(rng.random((9, 12)), chunks=((4, 5), (5, 7)))),
            "b": ("x", dask.array.from_array(rng.random(12), chunks=((3, 3, 6),))),
        },
        coords={"lon": ("x", dask.array.from_array(np.arange(12.0), chunks=((2, 10),)))},
    )
    xpatch.write(ds, tmp_path / "o.zarr", progress=False)
    out = xr.open_zarr(tmp_path / "o.zarr")
    xr.testing.assert_identical(out.compute(), ds.compute())
    assert zarr_chunks(tmp_path / "o.zarr", "a") == (5, 7)
    assert zarr_chunks(tmp_path / "o.zarr", "b") == (6,)
    assert zarr_chunks(tmp_path / "o.zarr", "lon") == (10,)


def test_ragged_blocks_meet_the_zarr_chunks_a_variable_asks_for(tmp_path):
    data = dask.array.from_array(np.arange(12.0), chunks=((6, 6),))
    da = xr.DataArray(data, dims="x", name="v")
    da.encoding["chunks"] = (4,)  # as xr.open_zarr leaves it: 6-cell blocks straddle chunks
    xpatch.write(da, tmp_path / "o.zarr", progress=False)
    np.testing.assert_array_equal(xr.open_zarr(tmp_path / "o.zarr")["v"].values, np.arange(12.0))
    assert zarr_chunks(tmp_path / "o.zarr", "v") == (4,)


def markers(path) -> list[str]:
    done = progress_record(path) / "done"
    return sorted(f"{m.parent.name[2:]}/{m.name}" for m in done.glob("v-*/*"))


@pytest.mark.parametrize("scheduler", ["synchronous", "threads"])
def test_an_interrupted_write_of_ragged_blocks_resumes_exactly(tmp_path, scheduler):
    lazy = lazy_temperature(seed=3).chunk({"y": (20, 12, 32), "x": (16, 30, 18)})
    p = lazy.patch(y=8, x=8, stride=4, window="hann")
    path = tmp_path / "o.zarr"
    with dask.config.set(scheduler="synchronous"):
        with pytest.raises(RuntimeError, match="simulated crash"):
            xpatch.write(p.apply(Affine(fail_after=20), batch_size=8), path, progress=False)
    done = markers(path)
    total = 2 * 3  # y and x in blocks of 32 and 30, the largest of each
    assert 0 < len(done) < total, done

    with dask.config.set(scheduler=scheduler):
        written = xpatch.write(p.apply(Affine(), batch_size=8), path, progress=False)

    assert written == total - len(done)
    assert not progress_record(path).exists()
    out = xr.open_zarr(path)["temp"]
    assert out.encoding["chunks"] == (2, 32, 30)
    np.testing.assert_allclose(out.values, (lazy * 2 + 1).values, rtol=1e-12, atol=1e-12)


def test_a_refused_resume_of_ragged_blocks_still_names_what_changed(tmp_path):
    lazy = lazy_temperature(seed=3).chunk({"y": (20, 12, 32), "x": (16, 30, 18)})
    path = tmp_path / "o.zarr"
    with dask.config.set(scheduler="synchronous"):
        with pytest.raises(RuntimeError, match="simulated crash"):
            xpatch.write(
                lazy.patch(y=8, x=8, stride=4).apply(Affine(fail_after=20), batch_size=8),
                path,
                progress=False,
            )
    other = lazy.patch(y=8, x=8, stride=6).apply(Affine())
    with pytest.raises(xpatch.OutputError, match=r"stride \(then \{'y': 4"):
        xpatch.write(other, path, progress=False)
