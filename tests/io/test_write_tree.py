"""xpatch.write of a DataTree result: one zarr store, a group per node, resumable."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import xarray as xr

import xpatch
import xpatch.tree  # registers dt.patch
from tests.io.writing import Affine
from xpatch.io import progress_record

X0, Y0 = 600_000.0, 5_000_000.0


def grid(n: int, cell: int, bands: tuple[str, ...], seed: int) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    centres = cell / 2 + cell * np.arange(n)
    return xr.Dataset(
        {b: (("y", "x"), rng.random((n, n))) for b in bands},
        coords={"y": Y0 - centres, "x": X0 + centres},
        attrs={"resolution": cell},
    )


def two_resolutions(chunks: dict | None = None) -> xr.DataTree:
    """48 x 48 cells at 10 m (two bands) and 24 x 24 at 20 m, lazy in 4 x 4 blocks each."""
    fine, coarse = grid(48, 10, ("b02", "b03"), 1), grid(24, 20, ("b05",), 2)
    fine = fine.chunk(chunks or {"y": 12, "x": 12})
    coarse = coarse.chunk({"y": 6, "x": 6} if chunks is None else {"y": 8, "x": 16})
    return xr.DataTree.from_dict(
        {"/": xr.Dataset(attrs={"product": "S2-like"}), "/10m": fine, "/20m": coarse}
    )


def read_tree(path) -> xr.DataTree:
    return xr.open_datatree(path, engine="zarr").compute()


@pytest.mark.parametrize("verb", ["apply", "reconstruct"])
def test_a_tree_result_round_trips_through_zarr_one_group_per_node(tmp_path, verb):
    tp = two_resolutions().patch(y=12, x=12, stride=8, window="hann")
    result = tp.apply(lambda b: b * 2) if verb == "apply" else tp.reconstruct(tp.patches())
    path = tmp_path / "t.zarr"

    written = xpatch.write(result, path, progress=False)

    assert written == 2 * 16 + 16  # two bands at 10 m, one at 20 m, 4 x 4 blocks each
    assert not progress_record(path).exists()
    back = read_tree(path)
    xr.testing.assert_identical(back, result.compute())
    assert set(back.children) == {"10m", "20m"}
    assert back.attrs == {"product": "S2-like"}


def test_an_eager_tree_with_ragged_blocks_and_an_empty_node_round_trips(tmp_path):
    tree = two_resolutions({"y": (20, 10, 18), "x": 48})
    tree["/meta"] = xr.DataTree(xr.Dataset(attrs={"note": "no grid"}))
    eager = tree.compute()
    path = tmp_path / "t.zarr"
    xpatch.write(eager, path, progress=False)
    xpatch.write(tree, tmp_path / "lazy.zarr", progress=False)
    xr.testing.assert_identical(read_tree(path), eager)
    xr.testing.assert_identical(read_tree(tmp_path / "lazy.zarr"), eager)


def test_an_interrupted_tree_write_resumes_the_blocks_it_had_not_written(tmp_path):
    tp = two_resolutions().patch(y=12, x=12, stride=8, window="hann")
    path = tmp_path / "t.zarr"
    with dask.config.set(scheduler="synchronous"):
        with pytest.raises(RuntimeError, match="simulated crash"):
            xpatch.write(tp.apply(Affine(fail_after=6), batch_size=4), path, progress=False)
    done = sorted(
        f"{m.parent.name}/{m.name}" for m in (progress_record(path) / "done").glob("v-*/*")
    )
    assert 0 < len(done) < 48, done
    assert all(m.startswith(("v-10m%2Fb0", "v-20m%2Fb05")) for m in done), done

    with dask.config.set(scheduler="synchronous"):
        written = xpatch.write(tp.apply(Affine(), batch_size=4), path, progress=False)

    assert written == 48 - len(done)
    assert not progress_record(path).exists()
    xr.testing.assert_identical(read_tree(path), tp.apply(Affine()).compute())


def test_a_tree_to_geotiff_is_refused_before_anything_is_written(tmp_path):
    tp = two_resolutions().patch(y=12, x=12, stride=8)
    path = tmp_path / "t.tif"
    with pytest.raises(xpatch.OptionError, match=r"DataTree .*\['10m', '20m'\].*one grid.*zarr"):
        xpatch.write(tp.apply(lambda b: b), path, progress=False)
    assert list(tmp_path.iterdir()) == []
