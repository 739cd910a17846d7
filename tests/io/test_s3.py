"""xpatch.write to S3: a real S3-compatible server on localhost (moto's server mode).

Written, interrupted, resumed, refused, locked, killed and read back through s3fs,
as a user would on a bucket.
"""

from __future__ import annotations

import signal
import uuid

import dask
import numpy as np
import pytest
import xarray as xr

import xpatch
from tests.io import crash_writer
from tests.io.writing import Affine, lazy_temperature
from tests.s3_server import moto_endpoint, storage_options
from xpatch.io.record import WriterLock

s3fs = pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

BUCKET = "bucket"
BLOCKS = 16


@pytest.fixture(scope="module")
def endpoint():
    """A moto S3 server on 127.0.0.1 (any free port) with one bucket."""
    with moto_endpoint(BUCKET) as url:
        yield url


@pytest.fixture
def options(endpoint) -> dict:
    return storage_options(endpoint)


@pytest.fixture
def fs(options):
    """A synchronous s3fs filesystem on the server, with no listing cached."""
    filesystem = s3fs.S3FileSystem(**options)
    filesystem.invalidate_cache()
    return filesystem


@pytest.fixture
def prefix() -> str:
    """A fresh key prefix per test: the server lives for the whole module."""
    return f"{BUCKET}/{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def lazy() -> xr.DataArray:
    return lazy_temperature(seed=5)


def applied(lazy: xr.DataArray, fn: Affine) -> xr.DataArray:
    return lazy.patch(y=8, x=8, stride=4, window="hann").apply(fn, batch_size=64)


def expected(lazy: xr.DataArray, k: int = 2) -> xr.DataArray:
    return applied(lazy, Affine(k)).compute(scheduler="synchronous")


def write(result, url, options, **kwargs) -> int:
    with dask.config.set(scheduler="synchronous"):
        return xpatch.write(result, url, progress=False, storage_options=options, **kwargs)


def interrupt(lazy, url, options, fail_after: int = 12) -> None:
    with pytest.raises(RuntimeError, match="simulated crash"):
        write(applied(lazy, Affine(fail_after=fail_after)), url, options)


def markers(fs, root: str) -> list[str]:
    fs.invalidate_cache()
    try:
        return sorted(fs.find(f"{root}/.xpatch/done"))
    except FileNotFoundError:
        return []


def assert_no_record(fs, root: str) -> None:
    fs.invalidate_cache()
    assert fs.find(f"{root}/.xpatch") == []


def assert_read_back(url, options, want: xr.DataArray) -> None:
    out = xr.open_zarr(url, storage_options=options)
    got = out[want.name].load()
    np.testing.assert_array_equal(got.values, want.values)
    for dim in want.dims:
        np.testing.assert_array_equal(out[dim].values, want[dim].values)
    assert got.dims == want.dims


def test_a_zarr_output_on_s3_is_written_and_read_back(lazy, options, fs, prefix):
    url = f"s3://{prefix}/o.zarr"
    assert write(applied(lazy, Affine()), url, options) == BLOCKS

    assert_read_back(url, options, expected(lazy))
    assert xr.open_zarr(url, storage_options=options)["temp"].attrs["units"] == "K"
    assert fs.exists(f"{prefix}/o.zarr/zarr.json")
    assert_no_record(fs, f"{prefix}/o.zarr")
    # Complete: a second write refuses, as locally.
    with pytest.raises(xpatch.OutputExistsError, match="overwrite=True"):
        write(applied(lazy, Affine(k=3)), url, options)
    assert_read_back(url, options, expected(lazy))


def test_an_interrupted_write_on_s3_resumes_only_the_missing_blocks(lazy, options, fs, prefix):
    url = f"s3://{prefix}/o.zarr"
    interrupt(lazy, url, options)
    done = markers(fs, f"{prefix}/o.zarr")
    assert 0 < len(done) < BLOCKS
    fs.invalidate_cache()
    record = fs.cat_file(f"{prefix}/o.zarr/.xpatch/record.json")
    assert b'"writing"' in record

    healthy = Affine()
    assert write(applied(lazy, healthy), url, options) == BLOCKS - len(done)

    # Only the patches of the missing blocks went through the model.
    assert 0 < healthy.patches < len(lazy.patch(y=8, x=8, stride=4))
    assert_read_back(url, options, expected(lazy))
    assert_no_record(fs, f"{prefix}/o.zarr")


def test_a_resume_on_s3_with_another_model_refuses(lazy, options, fs, prefix):
    url = f"s3://{prefix}/o.zarr"
    interrupt(lazy, url, options)
    done = markers(fs, f"{prefix}/o.zarr")

    other = Affine(k=3)
    with pytest.raises(xpatch.OutputError) as caught:
        write(applied(lazy, other), url, options)

    message = str(caught.value)
    assert "overwrite=True" in message and "resume='force'" in message, message
    assert other.calls == 0
    assert markers(fs, f"{prefix}/o.zarr") == done
    # The run is still the first model's, and resumes with it.
    assert write(applied(lazy, Affine()), url, options) == BLOCKS - len(done)
    assert_read_back(url, options, expected(lazy))


def test_a_second_writer_on_s3_refuses_while_the_first_holds_the_lock(lazy, options, fs, prefix):
    url = f"s3://{prefix}/o.zarr"
    first = WriterLock(fs, f"{prefix}/o.zarr/.xpatch", url)
    first.acquire()
    try:
        # The lock is exclusive on the store itself (a conditional PUT), not per process.
        other = WriterLock(
            s3fs.S3FileSystem(**options, skip_instance_cache=True), first.folder, url
        )
        with pytest.raises(xpatch.OutputLockedError, match="another writer"):
            other.acquire()
        for break_lock in (False, True):
            with pytest.raises(xpatch.OutputLockedError, match="another writer"):
                write(applied(lazy, Affine()), url, options, break_lock=break_lock)
        fs.invalidate_cache()
        assert not fs.exists(f"{prefix}/o.zarr/zarr.json")  # nothing was written
        first.check_held()
    finally:
        first.release()
    assert write(applied(lazy, Affine()), url, options) == BLOCKS
    assert_read_back(url, options, expected(lazy))


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")
def test_a_killed_writer_process_on_s3_is_taken_over_and_completed(
    options, endpoint, fs, prefix, tmp_path, monkeypatch
):
    monkeypatch.setattr(crash_writer, "SLEEP", 0.0)
    url = f"s3://{prefix}/o.zarr"
    writer = crash_writer.Writer(
        url,
        "zarr",
        "--kill",
        "block",
        "--at",
        "6",
        env={"XPATCH_TEST_S3_ENDPOINT": endpoint},
    )
    try:
        writer.go()
        code, _, err = writer.wait()
    finally:
        writer.stop()
    assert code == -signal.SIGKILL, err
    done = markers(fs, f"{prefix}/o.zarr")
    # Killed before the 6th marker; with 2 writer threads the 5th PUT may have been in
    # flight and died unwritten.
    assert 4 <= len(done) <= 5, done
    assert fs.exists(f"{prefix}/o.zarr/.xpatch/lock.json")  # the killed writer's

    with pytest.warns(UserWarning, match="took over the lock.*no longer runs"):
        written = write(crash_writer.result(), url, options)  # a plain rerun

    assert written == BLOCKS - len(done)
    reference = tmp_path / "reference.zarr"
    xpatch.write(crash_writer.result(), reference, progress=False)
    got = xr.open_zarr(url, storage_options=options).load()
    want = xr.open_zarr(reference).load()
    xr.testing.assert_identical(got, want)
    assert got["scene"].values.tobytes() == want["scene"].values.tobytes()
    assert_no_record(fs, f"{prefix}/o.zarr")


def test_a_zarr_fsspec_store_object_is_written_resumed_and_read_back(lazy, options, fs, prefix):
    from zarr.storage import FsspecStore

    url = f"s3://{prefix}/o.zarr"
    store = FsspecStore.from_url(url, storage_options=options)
    with pytest.raises(RuntimeError, match="simulated crash"):
        with dask.config.set(scheduler="synchronous"):
            xpatch.write(applied(lazy, Affine(fail_after=12)), store, progress=False)
    done = markers(fs, f"{prefix}/o.zarr")
    assert 0 < len(done) < BLOCKS  # the record is in the store, as for the URL

    # The same output, whether named by a store object or by its URL.
    again = FsspecStore.from_url(url, storage_options=options)
    with dask.config.set(scheduler="synchronous"):
        written = xpatch.write(applied(lazy, Affine()), again, progress=False)
    assert written == BLOCKS - len(done)
    assert_read_back(url, options, expected(lazy))
    assert_no_record(fs, f"{prefix}/o.zarr")
    with pytest.raises(xpatch.OutputExistsError):
        write(applied(lazy, Affine()), url, options)


def test_storage_options_with_a_store_object_are_refused(options, prefix, lazy):
    from zarr.storage import FsspecStore

    store = FsspecStore.from_url(f"s3://{prefix}/o.zarr", storage_options=options)
    with pytest.raises(xpatch.OptionError, match="storage_options"):
        xpatch.write(lazy, store, progress=False, storage_options=options)


def test_no_credentials_is_an_output_error_naming_the_url_and_the_fix(
    endpoint, prefix, lazy, monkeypatch, tmp_path
):
    # Before: botocore's NoCredentialsError from deep inside s3fs, naming no output.
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    url = f"s3://{prefix}/o.zarr"
    without = {"client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    with pytest.raises(xpatch.OutputError) as caught:
        xpatch.write(lazy, url, progress=False, storage_options=without)
    message = str(caught.value)
    assert f"cannot write {url!r}: the object store found no credentials" in message, message
    assert "AWS_ACCESS_KEY_ID" in message and "storage_options=" in message, message


def test_a_grain_epoch_over_a_zarr_on_s3_reads_each_chunk_once_past_zarrs_event_loop(
    options, prefix
):
    grain = pytest.importorskip("grain")
    from xpatch.grain.zarr_chunks import ZarrChunks

    values = np.random.default_rng(2).integers(0, 1000, (3, 64, 48)).astype("uint16")
    data = xr.Dataset({"image": (("band", "y", "x"), values)})
    url = f"s3://{prefix}/scene.zarr"
    encoding = {"image": {"chunks": (3, 16, 16)}}
    data.to_zarr(url, storage_options=options, encoding=encoding, zarr_format=3)
    image = xr.open_zarr(url, storage_options=options)["image"]
    src = image.patch(y=12, x=12, stride=10).to_grain(weights=False)
    assert isinstance(src.reader.plans[0].stored, ZarrChunks)
    seen = 0
    for item in grain.MapDataset.source(src).pipe(src.chunk_shuffle, seed=0):
        y, x = item["anchor"]
        np.testing.assert_array_equal(item["data"], values[:, y : y + 12, x : x + 12])
        seen += 1
    assert seen == len(src)
    assert src.cache_stats().loads == src.chunk_count
