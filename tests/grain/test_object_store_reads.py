"""A Grain epoch from a bucket (moto's S3 server on 127.0.0.1): chunk bytes through obstore.

The zarr is opened as a user opens it (``xr.open_zarr("s3://...", storage_options=...)``);
every patch equals the same patch of a local copy, each chunk's bytes come once through
obstore's synchronous calls, and without obstore s3fs reads the same values.
"""

from __future__ import annotations

import pickle
import sys
import uuid

import numpy as np
import pytest
import xarray as xr
import zarr

from tests.s3_server import moto_endpoint, storage_options
from xpatch.grain import object_store as object_store_module
from xpatch.grain.object_store import ObjectStoreReader, object_store_of
from xpatch.grain.zarr_chunks import ZarrChunks

pytest.importorskip("s3fs")
pytest.importorskip("obstore")
grain = pytest.importorskip("grain")
moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

BUCKET = "reads"


@pytest.fixture(scope="module")
def endpoint():
    """A moto S3 server on 127.0.0.1 (any free port) with one bucket."""
    with moto_endpoint(BUCKET) as url:
        yield url


@pytest.fixture
def options(endpoint) -> dict:
    return storage_options(endpoint)


@pytest.fixture
def fetches(monkeypatch) -> list[str]:
    """The keys fetched through obstore, in order."""
    keys: list[str] = []
    fetch = ObjectStoreReader.fetch

    def counted(self, key):
        keys.append(key)
        return fetch(self, key)

    monkeypatch.setattr(ObjectStoreReader, "fetch", counted)
    return keys


def temperature() -> xr.Dataset:
    values = np.random.default_rng(3).normal(size=(12, 10, 9)).astype("float32")
    values[0, 0, 0] = np.nan
    return xr.Dataset({"t": (("time", "lat", "lon"), values)}).chunk(time=4, lat=5, lon=9)


def written(tmp_path, options, zarr_format: int) -> tuple[xr.DataArray, xr.DataArray]:
    """The same zarr in the bucket and in a local folder, opened lazily."""
    url = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}/t.zarr"
    data = temperature()
    data.to_zarr(url, storage_options=options, zarr_format=zarr_format, consolidated=False)
    data.to_zarr(tmp_path / "t.zarr", zarr_format=zarr_format, consolidated=False)
    remote = xr.open_zarr(url, storage_options=options, consolidated=False)["t"]
    local = xr.open_zarr(tmp_path / "t.zarr", consolidated=False)["t"]
    return remote, local


def shuffled_epoch(remote: xr.DataArray):
    """The source and its items of one chunk-shuffled epoch, each with its patch index."""
    p = remote.patch(time=2, lat=5, lon=9, stride={"time": 1, "lat": 5, "lon": 9})
    src = p.to_grain()
    dataset = grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=1)
    return src, list(dataset)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_an_epoch_from_s3_reads_each_chunk_once_through_obstore(
    tmp_path, options, fetches, zarr_format
):
    remote, local = written(tmp_path, options, zarr_format)
    src, items = shuffled_epoch(remote)
    chunk_keys = {f"t/{key}" for key in fetches}
    assert len(fetches) == len(chunk_keys) == src.chunk_count == 6
    assert src.cache_stats().loads == src.chunk_count
    patches = local.patch(time=2, lat=5, lon=9, stride={"time": 1, "lat": 5, "lon": 9})
    assert sorted(int(item["index"]) for item in items) == list(range(len(patches)))
    for item in items:
        expected = patches[int(item["index"])].values
        np.testing.assert_array_equal(item["data"], expected)
        assert item["data"].dtype == expected.dtype


def test_without_obstore_s3fs_reads_the_same_values(tmp_path, options, fetches, monkeypatch):
    remote, local = written(tmp_path, options, 3)
    monkeypatch.setitem(sys.modules, "obstore", None)  # import obstore raises ImportError
    src, items = shuffled_epoch(remote)
    assert fetches == []
    assert src.cache_stats().loads == src.chunk_count
    patches = local.patch(time=2, lat=5, lon=9, stride={"time": 1, "lat": 5, "lon": 9})
    for item in items:
        np.testing.assert_array_equal(item["data"], patches[int(item["index"])].values)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_chunk_never_written_reads_as_the_fill_value(options, fetches, zarr_format):
    url = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}/a.zarr"
    store = zarr.storage.FsspecStore.from_url(url, storage_options=options, read_only=False)
    array = zarr.create_array(
        store, shape=(6, 4), chunks=(3, 2), dtype="int32", fill_value=7, zarr_format=zarr_format
    )
    array[:3, :] = np.arange(12).reshape(3, 4)  # the chunks of rows 3:6 are never written
    opened = zarr.open_array(
        zarr.storage.FsspecStore.from_url(url, storage_options=options), mode="r"
    )
    chunks = ZarrChunks.of(opened)
    assert chunks.object_store is not None
    expected = np.full((6, 4), 7, "int32")
    expected[:3] = np.arange(12).reshape(3, 4)
    np.testing.assert_array_equal(chunks[0:6, 0:4], expected)
    np.testing.assert_array_equal(chunks[3:6, 2:4], np.full((3, 2), 7))
    assert len(fetches) == 4 + 1  # every chunk once, the unwritten corner twice


def test_zarrs_object_store_and_a_pickled_reader_fetch_through_obstore(options, fetches):
    from obstore.store import S3Store

    prefix = uuid.uuid4().hex[:12]
    url = f"s3://{BUCKET}/{prefix}/b.zarr"
    values = np.arange(24, dtype="float64").reshape(4, 6)
    store = zarr.storage.FsspecStore.from_url(url, storage_options=options, read_only=False)
    zarr.create_array(store, shape=(4, 6), chunks=(2, 3), dtype="float64")[...] = values
    s3 = S3Store(
        BUCKET,
        config={
            "endpoint": options["client_kwargs"]["endpoint_url"],
            "region": "us-east-1",
            "access_key_id": "x",
            "secret_access_key": "y",
        },
        client_options={"allow_http": True},
    )
    on_object_store = zarr.open_array(zarr.storage.ObjectStore(s3), path=f"{prefix}/b.zarr")
    chunks = ZarrChunks.of(on_object_store)
    np.testing.assert_array_equal(chunks[0:4, 0:6], values)
    assert fetches == [f"c/{i}/{j}" for i in range(2) for j in range(2)]
    on_fsspec = ZarrChunks.of(
        zarr.open_array(zarr.storage.FsspecStore.from_url(url, storage_options=options))
    )
    clone = pickle.loads(pickle.dumps(on_fsspec))
    assert clone.object_store._store is None  # built again in the process that reads
    np.testing.assert_array_equal(clone[1:3, 2:5], values[1:3, 2:5])
    assert len(fetches) == 4 + 4


def test_s3fs_options_obstore_cannot_honour_keep_s3fs(options):
    import s3fs

    fs = s3fs.S3FileSystem(**options, requester_pays=True, asynchronous=True)
    store = zarr.storage.FsspecStore(fs, path=f"{BUCKET}/x.zarr", read_only=True)
    assert object_store_of(store, "t") is None
    plain = zarr.storage.FsspecStore(
        s3fs.S3FileSystem(anon=True, endpoint_url="http://127.0.0.1:1", asynchronous=True),
        path=f"{BUCKET}/x.zarr",
        read_only=True,
    )
    reader = object_store_of(plain, "t")
    assert (reader.prefix, reader.kwargs["config"]) == (
        "x.zarr/t",
        {"endpoint": "http://127.0.0.1:1", "skip_signature": True},
    )
    assert object_store_module.object_store_of(zarr.storage.MemoryStore(), "") is None


def test_a_failed_obstore_fetch_hands_the_array_to_zarrs_store_with_a_warning(options, monkeypatch):
    url = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}/c.zarr"
    values = np.arange(24, dtype="uint16").reshape(4, 6)
    store = zarr.storage.FsspecStore.from_url(url, storage_options=options, read_only=False)
    zarr.create_array(store, shape=(4, 6), chunks=(2, 3), dtype="uint16")[...] = values
    chunks = ZarrChunks.of(
        zarr.open_array(zarr.storage.FsspecStore.from_url(url, storage_options=options))
    )
    calls = []

    def refused(self, key):  # as for an AWS profile obstore does not read
        calls.append(key)
        raise PermissionError("403 Forbidden")

    monkeypatch.setattr(ObjectStoreReader, "fetch", refused)
    with pytest.warns(RuntimeWarning, match="obstore could not read s3://"):
        np.testing.assert_array_equal(chunks[0:2, 0:3], values[0:2, 0:3])
    np.testing.assert_array_equal(chunks[0:4, 0:6], values)
    assert chunks.object_store is None and calls == ["c/0/0"]


def test_an_http_zarr_opened_without_options_reads_through_obstore(tmp_path, fetches):
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    values = np.arange(30, dtype="float32").reshape(5, 6)
    array = zarr.create_array(
        tmp_path / "h.zarr", shape=(5, 6), chunks=(2, 3), dtype="float32", fill_value=-1
    )
    array[:4] = values[:4]  # the last row of chunks is never written
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=tmp_path))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/h.zarr"
        chunks = ZarrChunks.of(zarr.open_array(zarr.storage.FsspecStore.from_url(url)))
        expected = values.copy()
        expected[4] = -1
        np.testing.assert_array_equal(chunks[0:5, 0:6], expected)
    finally:
        server.shutdown()
        server.server_close()
    assert sorted(fetches) == [f"c/{i}/{j}" for i in range(3) for j in range(2)]
