"""``xpatch apply`` from an ``s3://`` INPUT (moto's S3 server on 127.0.0.1) to a local OUTPUT."""

from __future__ import annotations

import json
import textwrap
import uuid

import numpy as np
import pytest
import xarray as xr

from tests.s3_server import moto_endpoint, storage_options
from xpatch.cli import main

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

BUCKET = "inputs"


@pytest.fixture(scope="module")
def endpoint():
    """A moto S3 server on 127.0.0.1 (any free port) with one bucket."""
    with moto_endpoint(BUCKET) as url:
        yield url


@pytest.fixture
def options(endpoint) -> dict:
    return storage_options(endpoint)


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "toy_model_s3.py"
    path.write_text(textwrap.dedent("def double(batch):\n    return batch * 2\n"))
    return f"{path}:double"


def raster() -> xr.Dataset:
    values = np.random.default_rng(2).random((2, 40, 48)).astype("float32")
    return xr.Dataset({"r": (("band", "y", "x"), values)})


@pytest.mark.parametrize("flag", ["--storage-options", "--input-storage-options"])
def test_an_s3_input_gives_what_the_same_local_input_gives(tmp_path, options, model, flag, capsys):
    url = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}/in.zarr"
    raster().to_zarr(url, storage_options=options)
    raster().to_zarr(tmp_path / "in.zarr")
    layout = ["--fn", model, "--size", "16", "--stride", "12", "--chunks", "24", "--no-progress"]

    assert main(["apply", str(tmp_path / "in.zarr"), str(tmp_path / "local.zarr"), *layout]) == 0
    argv = ["apply", url, str(tmp_path / "remote.zarr"), *layout, flag, json.dumps(options)]
    assert main(argv) == 0, capsys.readouterr().err

    local = xr.open_zarr(tmp_path / "local.zarr")["r"].values
    remote = xr.open_zarr(tmp_path / "remote.zarr")["r"].values
    np.testing.assert_array_equal(remote, local)
    np.testing.assert_allclose(local, raster()["r"].values * 2, rtol=1e-6)


def test_a_missing_s3_input_is_one_line_naming_the_url_and_what_to_check(
    tmp_path, options, model, capsys
):
    url = f"s3://{BUCKET}/nothing-here/in.zarr"
    argv = ["apply", url, str(tmp_path / "o.zarr"), "--fn", model, "--size", "16"]
    status = main([*argv, "--no-progress", "--storage-options", json.dumps(options)])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1, err
    assert f"INPUT {url!r} cannot be opened as a zarr store" in err
    assert "s3:/inputs" not in err  # the URL is not mangled into a path
    assert "endpoint_url, credentials" in err


def test_input_storage_options_with_a_local_input_are_refused(tmp_path, model, capsys):
    raster().to_zarr(tmp_path / "in.zarr")
    argv = ["apply", str(tmp_path / "in.zarr"), str(tmp_path / "o.zarr"), "--fn", model]
    status = main([*argv, "--size", "16", "--input-storage-options", '{"anon": true}'])
    err = capsys.readouterr().err
    assert status == 2
    assert "--input-storage-options" in err and "local INPUT" in err
    assert not (tmp_path / "o.zarr").exists()
