"""On a dask.distributed cluster: graphs ship to worker processes, results are exact."""

from __future__ import annotations

import os
import pickle
import time

import dask.array as dsa
import numpy as np
import pytest
import xarray as xr

import xpatch
from xpatch.io import progress_record

distributed = pytest.importorskip("distributed")
cloudpickle = pytest.importorskip("cloudpickle")

MEMORY_LIMIT = 2**30  # "1GiB"


def affine(batch: np.ndarray) -> np.ndarray:
    """Module level, so that workers import it by reference."""
    return batch * 2 + 1


def affine_on_a_worker(batch: np.ndarray) -> np.ndarray:
    """``affine`` that fails unless it runs in a worker of the cluster."""
    distributed.get_worker()  # raises ValueError outside a worker
    return affine(batch)


@pytest.fixture(scope="module")
def client():
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            memory_limit="1GiB",
            dashboard_address=":0",
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        c.wait_for_workers(2)
        yield c


def worker_pids(client) -> dict:
    return client.run(os.getpid)


@pytest.fixture
def lazy() -> xr.DataArray:
    rng = np.random.default_rng(11)
    return xr.DataArray(
        rng.normal(size=(2, 96, 80)),
        dims=("band", "y", "x"),
        coords={"band": [1, 2], "y": np.arange(96) * 0.5, "x": np.arange(80) * 0.25},
        attrs={"units": "m"},
        name="height",
    ).chunk({"band": 2, "y": 32, "x": 32})


def test_workers_have_the_memory_limit(client):
    workers = client.scheduler_info()["workers"]
    assert len(workers) == 2
    assert {w["memory_limit"] for w in workers.values()} == {MEMORY_LIMIT}
    assert {w["nthreads"] for w in workers.values()} == {1}
    # Real processes, not threads of this one.
    assert os.getpid() not in worker_pids(client).values()


def test_reconstruct_of_patches_computes_on_the_cluster(client, lazy):
    pids = worker_pids(client)
    p = lazy.patch(y=16, x=16, stride=12, window="hann")
    out = p.reconstruct(p.patches())
    assert isinstance(out.data, dsa.Array)

    future = client.compute(out)
    computed = future.result()

    np.testing.assert_allclose(computed.values, lazy.values, rtol=1e-12, atol=1e-12)
    xr.testing.assert_identical(computed.coords.to_dataset(), lazy.coords.to_dataset())
    assert worker_pids(client) == pids  # no worker died or restarted


@pytest.mark.parametrize(
    "fn",
    [affine, lambda b: b * 2 + 1],
    ids=["module-function", "lambda"],
)
def test_apply_computes_on_the_cluster(client, lazy, fn):
    pids = worker_pids(client)
    p = lazy.patch(y=16, x=16, stride=12, window="hann")
    result = p.apply(fn, batch_size=8)

    computed = client.compute(result).result()

    np.testing.assert_allclose(computed.values, (lazy * 2 + 1).values, rtol=1e-12, atol=1e-12)
    assert computed.attrs == lazy.attrs
    assert worker_pids(client) == pids


def test_apply_with_other_output_dims_on_the_cluster(client, lazy):
    p = lazy.patch(y=16, x=16, stride=12, window="triangular")
    scores = p.apply(
        lambda b: b.sum(axis=1, keepdims=True), output_dims={"score": 1}, batch_size=16
    )
    computed = client.compute(scores).result()
    assert computed.dims == ("score", "y", "x")
    np.testing.assert_allclose(computed.isel(score=0).values, lazy.sum("band").values, rtol=1e-12)


def test_write_to_zarr_uses_the_active_client(client, lazy, tmp_path, capsys, monkeypatch):
    assert xpatch.io.block_waves.active_client() is client
    pids = worker_pids(client)
    p = lazy.patch(y=16, x=16, stride=12, window="hann")
    path = tmp_path / "o.zarr"
    with pytest.raises(ValueError):
        affine_on_a_worker(np.zeros(1))  # not here

    # A fn that runs only on a worker declares its output: apply's call on a batch of
    # zeros, which finds them otherwise, runs here.
    on_workers = p.apply(
        affine_on_a_worker, batch_size=8, output_dims={"band": 2}, dtype=lazy.dtype
    )
    written = xpatch.write(on_workers, path, progress=False)

    assert written == 3 * 3
    assert not progress_record(path).exists()
    out = xr.open_zarr(path)["height"]
    np.testing.assert_allclose(out.values, (lazy * 2 + 1).values, rtol=1e-12, atol=1e-12)
    assert worker_pids(client) == pids

    # With progress, distributed's bar (not dask's local one) runs to the end.
    class LocalBar:
        def __init__(self, *args, **kwargs):
            raise AssertionError("dask's local ProgressBar used with a client active")

    monkeypatch.setattr("dask.diagnostics.ProgressBar", LocalBar)
    capsys.readouterr()
    written = xpatch.write(
        p.apply(affine_on_a_worker, batch_size=8, output_dims={"band": 2}, dtype=lazy.dtype),
        tmp_path / "p.zarr",
        progress=True,
    )
    assert written == 9
    shown = capsys.readouterr()
    assert "100%" in shown.out + shown.err


def test_write_on_the_cluster_runs_in_waves_with_overhangs_kept_on_the_workers(
    client, tmp_path, monkeypatch
):
    # 6 x 5 blocks: 30 blocks in waves of 8 (4 per worker thread), and patch groups
    # overhanging into blocks of the next wave.
    values = np.random.default_rng(3).normal(size=(2, 96, 80))
    data = xr.DataArray(values, dims=("band", "y", "x"), name="data").chunk({"y": 16, "x": 16})
    waves = []
    get = client.get

    def counting_get(dsk, keys, **kwargs):
        waves.append(
            sum(str(k[0]).startswith(xpatch.io.block_waves.STORE_TASK_PREFIX) for k in keys)
        )
        return get(dsk, keys, **kwargs)

    monkeypatch.setattr(client, "get", counting_get)
    p = data.patch(y=12, x=12, stride=8, window="hann")
    written = xpatch.write(p.apply(affine, batch_size=8), tmp_path / "w.zarr", progress=False)
    assert written == 30 and waves == [8, 8, 8, 6]
    out = xr.open_zarr(tmp_path / "w.zarr")["data"]
    np.testing.assert_allclose(out.values, values * 2 + 1, rtol=1e-12, atol=1e-12)


def fails_on_large_values(batch: np.ndarray) -> np.ndarray:
    """``affine``, but raises for a batch holding a value above 3 (a few of them do)."""
    if batch.max() > 3.0:
        raise RuntimeError("this batch fails")
    return affine(batch)


def test_a_failed_wave_leaves_nothing_on_the_cluster(client, tmp_path):
    values = np.random.default_rng(3).normal(size=(2, 96, 80))
    data = xr.DataArray(values, dims=("band", "y", "x"), name="data").chunk({"y": 16, "x": 16})
    p = data.patch(y=12, x=12, stride=8, window="hann")
    with pytest.raises(RuntimeError, match="this batch fails"):
        xpatch.write(p.apply(fails_on_large_values), tmp_path / "f.zarr", progress=False)

    def held() -> tuple[int, int]:
        tasks = client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
        return sum(client.refcount.values()), tasks

    deadline = time.monotonic() + 20
    while held() != (0, 0) and time.monotonic() < deadline:  # releases are asynchronous
        time.sleep(0.1)
    assert held() == (0, 0)  # no future held for the client's life, no task kept


def test_geotiff_write_uses_a_cluster_lock(client, tmp_path):
    rioxarray = pytest.importorskip("rioxarray")
    values = np.random.default_rng(2).random((1, 100, 130)).astype("float32")
    raster = xr.DataArray(
        values,
        dims=("band", "y", "x"),
        coords={"band": [1], "y": 50.0 - np.arange(100), "x": np.arange(130) + 0.5},
    ).rio.write_crs("EPSG:32633")
    path = tmp_path / "o.tif"
    written = xpatch.write(raster.chunk({"y": 32, "x": 32}), path, progress=False)
    assert written == 4 * 5
    back = rioxarray.open_rasterio(path)
    assert back.rio.crs == raster.rio.crs
    np.testing.assert_array_equal(back.values, values)


# -- graph size -----------------------------------------------------------------------------


def test_graph_pickles_small_with_the_window_once():
    # Input from a random generator (not from numpy) so that no data sits in the graph.
    data = dsa.random.default_rng(0).random((1, 256, 256), chunks=(1, 64, 64))
    da = xr.DataArray(data, dims=("band", "y", "x"))
    p = da.patch(y=64, x=64, stride=32, window="hann")
    out = p.reconstruct(p.patches())
    window_bytes = p.weights().values.nbytes
    assert window_bytes == 64 * 64 * 8
    n_blocks = out.data.npartitions
    assert n_blocks == 16

    graph = dict(out.__dask_graph__())
    size = len(cloudpickle.dumps(graph))
    assert len(pickle.dumps(graph)) == pytest.approx(size, rel=0.5)  # plain pickle too

    window_keys = [k for k in graph if isinstance(k, tuple) and k[0].startswith("xpatch-window")]
    assert len(window_keys) == 1
    # Several copies of the window would weigh n_blocks * window_bytes (512 KiB).
    assert size < 3 * window_bytes, (size, window_bytes)
    assert size < n_blocks * window_bytes / 4


def test_apply_graph_holds_fn_under_one_key(lazy):
    big = np.zeros(50_000)  # 400 kB that the function drags along

    class Heavy:
        def __init__(self, table):
            self.table = table

        def __call__(self, batch):
            return batch + self.table[0]

    fn = Heavy(big)
    p = lazy.patch(y=16, x=16, stride=12)
    result = p.apply(fn, batch_size=4)
    graph = dict(result.data.__dask_graph__())

    fn_keys = [k for k in graph if isinstance(k, tuple) and str(k[0]).startswith("xpatch-fn-")]
    assert len(fn_keys) == 1
    stored = graph[fn_keys[0]]
    assert getattr(stored, "value", stored) is fn
    apply_tasks = [
        k for k in graph if str(k[0]).startswith("xpatch-apply-") and str(k[0]).endswith("-partial")
    ]
    assert len(apply_tasks) == len(p.plan.groups) > 1
    # fn's table is pickled once, not once per task.
    assert len(cloudpickle.dumps(graph)) < 2 * big.nbytes
