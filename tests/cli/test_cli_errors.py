"""``xpatch apply``: failures outside xpatch reported as one line naming what failed."""

from __future__ import annotations

import json
import socket
import textwrap

import numpy as np
import pytest
import xarray as xr

from xpatch.cli import main


def free_port() -> int:
    """A port on 127.0.0.1 that nobody listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_s3_endpoint_is_one_line_naming_it_and_exits_non_zero(
    tmp_path, capsys, monkeypatch
):
    s3fs = pytest.importorskip("s3fs")
    # s3fs retries a failed call with growing sleeps; once is enough to fail here.
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    source = tmp_path / "in.zarr"
    values = np.random.default_rng(0).random((2, 24, 24)).astype("float32")
    xr.Dataset({"r": (("band", "y", "x"), values)}).to_zarr(source)
    model = tmp_path / "toy_model_double.py"
    model.write_text(textwrap.dedent("def double(batch):\n    return batch * 2\n"))
    endpoint = f"http://127.0.0.1:{free_port()}"
    options = {
        "key": "x",
        "secret": "y",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        # One attempt, no retries: the test stays fast.
        "config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 1}},
    }
    argv = ["apply", str(source), "s3://bucket/out.zarr", "--fn", f"{model}:double"]
    argv += ["--size", "12", "--no-progress", "--storage-options", json.dumps(options)]

    status = main(argv)

    err = capsys.readouterr().err
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("xpatch apply: error: cannot write 's3://bucket/out.zarr'")
    assert endpoint in lines[0]
    assert "--storage-options" in lines[0]
