"""moto's S3 server on 127.0.0.1 for the tests that read or write a bucket.

Only loopback traffic: the server listens on 127.0.0.1 at a free port and stops
with the module that started it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def moto_endpoint(bucket: str) -> Iterator[str]:
    """Run a moto S3 server on 127.0.0.1 (any free port) with ``bucket``; yield its URL."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        boto3.client(
            "s3",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="x",
            aws_secret_access_key="y",
        ).create_bucket(Bucket=bucket)
        yield url
    finally:
        server.stop()


def storage_options(endpoint: str) -> dict:
    """s3fs's options for the server at ``endpoint`` (moto takes any credentials)."""
    return {
        "key": "x",
        "secret": "y",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }
