"""A lake on object storage: the demo's enrichment pipeline with ``s3a://`` roots on an
S3-compatible server (moto, started here on 127.0.0.1), against the same inputs on a
local lake.

The test run's Spark session started without the S3A settings: they come from
``LAKECAST_SPARK_CONF`` (``spark.hadoop.fs.s3a.*``), which ``get_spark`` applies to a
running session, and the same values reach ``deltalake`` / pyarrow as storage options
(:mod:`lakecast.delta.objstore`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest
from dagster import DagsterInstance, SensorResult, build_sensor_context

from assets.raw import observe_events_table
from jobs.microbatch import build_pipeline
from jobs.sensors import broadcast_versions_sensor
from lakecast.config import Settings, get_settings
from lakecast.delta import io as delta_io
from lakecast.delta import objstore
from lakecast.spark import get_spark
from lakecast.tables import DIM_PRODUCTS, EVENTS, USER_SEGMENTS
from lakecast.tools import cli
from tests.jobs.test_snapshot_pipeline import OUTPUTS, _assert_same, _inputs, _outputs

pytestmark = pytest.mark.objstore

BUCKET = "lakecast-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1, in a process of its own (delta-rs calls hold the
    GIL while they wait for the server: a server thread in this process would deadlock),
    with one bucket."""
    port = _free_port()
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
        req = urllib.request.Request(f"{url}/{BUCKET}", method="PUT")
        urllib.request.urlopen(req, timeout=5).close()
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _s3_conf(endpoint: str, secret: str = "test-secret") -> str:
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


@pytest.fixture
def s3_lake(spark, s3_endpoint, lake, monkeypatch, request) -> Iterator[Settings]:
    """Settings of a lake under ``s3a://BUCKET/<test>/`` (the ``lake`` fixture's Dagster
    home stays local); the session's ``fs.s3a.*`` settings are removed afterwards."""
    prefix = f"s3a://{BUCKET}/{request.node.name}"
    monkeypatch.setenv("LAKECAST_LAKE_ROOT", f"{prefix}/lake")
    monkeypatch.setenv("LAKECAST_CHECKPOINT_ROOT", f"{prefix}/checkpoints")
    monkeypatch.setenv("LAKECAST_SPARK_CONF", _s3_conf(s3_endpoint))
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k, raising=False)
    settings = get_settings()
    yield settings
    for k in objstore.s3a_session_conf(settings):
        spark.conf.unset(k)


def test_object_store_lake_matches_the_local_lake(spark, s3_lake, tmp_path, capsys):
    started = time.monotonic()
    local = get_settings({**os.environ, "LAKECAST_LAKE_ROOT": str(tmp_path / "local_lake"),
                          "LAKECAST_CHECKPOINT_ROOT": str(tmp_path / "local_cp")})
    s3 = s3_lake
    s3_spark = get_spark(settings=s3)  # the running session, now with the fs.s3a.* settings
    assert s3_spark is spark and spark.conf.get("fs.s3a.path.style.access") == "true"
    opts = objstore.storage_options(s3)
    assert opts["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    assert opts["AWS_ACCESS_KEY_ID"] == "test-key" and opts["AWS_ALLOW_HTTP"] == "true"

    # batch layer: the broadcast tables and events, written by Spark through S3A
    _inputs(spark, local, 0)
    _inputs(spark, s3, 0)
    versions = {t: delta_io.latest_version(s3.table_path(t))  # deltalake, no Spark
                for t in (EVENTS, DIM_PRODUCTS, USER_SEGMENTS, "feature_flags")}
    assert versions == {t: delta_io.latest_version(local.table_path(t)) for t in versions}
    assert delta_io.commit_info(s3.table_path(EVENTS), 0).operation == "WRITE"
    data_version, meta = observe_events_table(s3)  # the events source asset's observation
    assert data_version.value == "0" and meta["delta_version"] == 0

    # the sensor: one run requested for the versions read from the object store
    with DagsterInstance.ephemeral() as instance:
        tick = broadcast_versions_sensor(build_sensor_context(instance=instance))
    assert isinstance(tick, SensorResult) and len(tick.run_requests) == 1
    assert json.loads(tick.cursor)[EVENTS] == 0

    # micro-batches: batch 0 with a checkpoint on the object store ...
    run_local = build_pipeline(spark, local, 1, parallelism=2, checkpoint_every=None,
                               function_id="objstore-local")
    assert [r.plan.batch_id for r in run_local.run()] == [0]
    first = build_pipeline(spark, s3, 1, parallelism=2, checkpoint_every=1,
                           function_id="objstore-s3")
    (r0,) = first.run()
    assert r0.plan.batch_id == 0 and r0.checkpoint["checkpoint_id"] == 0

    # ... then a second pipeline instance restores the state from that checkpoint
    _inputs(spark, local, 1)
    _inputs(spark, s3, 1)
    assert [r.plan.batch_id for r in run_local.run()] == [1]
    second = build_pipeline(spark, s3, 1, parallelism=2, checkpoint_every=1,
                            function_id="objstore-s3b")
    (r1,) = second.run()
    assert r1.plan.batch_id == 1
    assert second.runtime.restored is not None
    assert second.runtime.restored.header.checkpoint_id == 0

    out_s3, out_local = _outputs(spark, s3), _outputs(spark, local)
    _assert_same(out_s3, out_local)
    assert all(len(out_s3[t]) for t in OUTPUTS[:1])

    # `lakecast versions` lists the object-store lake's tables (deltalake, no Spark)
    capsys.readouterr()
    assert cli.main(["versions"]) == 0
    listed = capsys.readouterr().out
    for t in (EVENTS, DIM_PRODUCTS, USER_SEGMENTS, *OUTPUTS):
        assert t in listed, listed
    assert time.monotonic() - started < 240


def test_bad_object_store_settings_name_the_uri_and_the_setting(s3_endpoint, monkeypatch):
    """No server at the endpoint, or a missing bucket: an error naming the URI and the
    settings to fix, not a raw traceback (the CLI prints it and fails)."""
    dead = f"http://127.0.0.1:{_free_port()}"
    for endpoint, root in ((dead, f"s3a://{BUCKET}/lake"),
                           (s3_endpoint, "s3a://no-such-bucket/lake")):
        monkeypatch.setenv("LAKECAST_LAKE_ROOT", root)
        monkeypatch.setenv("LAKECAST_SPARK_CONF", _s3_conf(endpoint))
        settings = get_settings()
        with pytest.raises(objstore.ObjectStoreError) as e:
            delta_io.latest_version(settings.table_path(EVENTS))
        assert root in str(e.value) and "spark.hadoop.fs.s3a.endpoint" in str(e.value)
        assert cli.main(["versions"]) != 0


def test_storage_options_come_from_the_s3a_conf_else_the_aws_environment(tmp_path):
    base = {"LAKECAST_HOME": str(tmp_path), "LAKECAST_LAKE_ROOT": "s3a://b/lake"}
    s3a = get_settings({**base, "LAKECAST_SPARK_CONF": ";".join([
        "spark.hadoop.fs.s3a.endpoint=minio.local:9000",
        "spark.hadoop.fs.s3a.connection.ssl.enabled=false",
        "spark.hadoop.fs.s3a.path.style.access=true",
        "spark.hadoop.fs.s3a.access.key=ak", "spark.hadoop.fs.s3a.secret.key=sk",
        "spark.sql.shuffle.partitions=4"])})
    env = {"AWS_ENDPOINT_URL": "https://s3.example", "AWS_ACCESS_KEY_ID": "env-ak",
           "AWS_SECRET_ACCESS_KEY": "env-sk", "AWS_DEFAULT_REGION": "eu-west-1"}
    opts = objstore.storage_options(s3a, env)  # the Spark conf wins over the environment
    assert opts["AWS_ENDPOINT_URL"] == "http://minio.local:9000"
    assert (opts["AWS_ACCESS_KEY_ID"], opts["AWS_SECRET_ACCESS_KEY"]) == ("ak", "sk")
    assert opts["AWS_ALLOW_HTTP"] == "true" and opts["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] == "false"
    assert opts["AWS_REGION"] == "eu-west-1"
    assert objstore.s3a_session_conf(s3a)["fs.s3a.endpoint"] == "minio.local:9000"
    assert "spark.sql.shuffle.partitions" not in objstore.s3a_session_conf(s3a)
    plain = get_settings(base)
    assert objstore.storage_options(plain, env)["AWS_ENDPOINT_URL"] == "https://s3.example"
    assert "AWS_ALLOW_HTTP" not in objstore.storage_options(plain, env)
    assert objstore.options_for(str(tmp_path / "t"), plain) is None
    assert objstore.options_for("s3a://b/lake/t", plain) is not None
