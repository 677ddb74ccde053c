"""moto's S3 server on 127.0.0.1 for the object-store tests (loopback only, stopped by its
context manager)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def moto_server(bucket: str) -> Iterator[str]:
    """moto's S3 server in a process of its own (delta-rs calls hold the GIL while they wait
    for the server: a server thread in this process would deadlock), with ``bucket``;
    yields its URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                             "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        urllib.request.urlopen(urllib.request.Request(f"{url}/{bucket}", method="PUT"),
                               timeout=5).close()
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def s3_conf(endpoint: str, secret: str = "test-secret") -> str:
    """The s3a settings of a lake on moto at ``endpoint``, as ``LAKECAST_SPARK_CONF``."""
    return ";".join([
        f"spark.hadoop.fs.s3a.endpoint={endpoint}",
        "spark.hadoop.fs.s3a.path.style.access=true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled=false",
        "spark.hadoop.fs.s3a.endpoint.region=us-east-1",
        "spark.hadoop.fs.s3a.access.key=test-key",
        f"spark.hadoop.fs.s3a.secret.key={secret}",
        "spark.hadoop.fs.s3a.aws.credentials.provider="
        "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "spark.hadoop.fs.s3a.attempts.maximum=2",
        "spark.hadoop.fs.s3a.retry.limit=2",
    ])
