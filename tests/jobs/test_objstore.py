"""A lake on object storage: the demo's enrichment pipeline with ``s3a://`` roots on an
S3-compatible server (moto, started here on 127.0.0.1), against the same inputs on a
local lake (written once by Spark through S3A, then the same files downloaded), and the
batch assets that build the broadcast tables, materialized by Dagster on the ``s3a://``
lake, against the pandas reference (:mod:`tests.assets.reference`).

The test run's Spark session started without the S3A settings: they come from
``LAKECAST_SPARK_CONF`` (``spark.hadoop.fs.s3a.*``), which ``get_spark`` puts in a
running session's Hadoop configuration, and the same values reach ``deltalake`` / pyarrow
as storage options (:mod:`lakecast.delta.objstore`). A Lakecast Spark server gets them
at start and keeps the secret ones off its sessions (a second client cannot read them).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from uuid import uuid4

import pandas as pd
import pytest
from dagster import AssetKey, DagsterInstance, SensorResult, build_sensor_context

from assets import datagen
from assets.datagen import GenSpec
from assets.raw import observe_events_table
from assets.tables import (
    DIM_PRODUCTS,
    DIM_USERS,
    EVENTS,
    RAW_PRODUCTS,
    RAW_USERS,
    USER_FEATURES,
    USER_SEGMENTS,
)
from jobs.storefront.microbatch import build_pipeline
from jobs.storefront.sensors import broadcast_versions_sensor
from lakecast.config import Settings, get_settings
from lakecast.delta import io as delta_io
from lakecast.delta import objstore
from lakecast.server import Server
from lakecast.spark import get_spark
from lakecast.tools import cli
from tests.assets import reference
from tests.assets.conftest import DIMS, SEGMENTS, run_assets
from tests.jobs.test_snapshot_pipeline import OUTPUTS, _assert_same, _inputs, _outputs
from tests.moto_s3 import free_port, moto_server, s3_conf

pytestmark = pytest.mark.objstore

BUCKET = "lakecast-test"
SEGMENT_COLUMNS = ["user_id", "segment", "lifetime_value", "interests", "updated_day"]



@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 with one bucket (:func:`tests.moto_s3.moto_server`)."""
    with moto_server(BUCKET) as url:
        yield url


@pytest.fixture
def s3_lake(spark, s3_endpoint, lake, monkeypatch, request) -> Iterator[Settings]:
    """Settings of a lake under ``s3a://BUCKET/<test>/`` (the ``lake`` fixture's Dagster
    home stays local); the ``fs.s3a.*`` settings get_spark put in the session's Hadoop
    configuration are removed afterwards."""
    prefix = f"s3a://{BUCKET}/{request.node.name}"
    monkeypatch.setenv("LAKECAST_LAKE_ROOT", f"{prefix}/lake")
    monkeypatch.setenv("LAKECAST_CHECKPOINT_ROOT", f"{prefix}/checkpoints")
    monkeypatch.setenv("LAKECAST_SPARK_CONF", s3_conf(s3_endpoint))
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k, raising=False)
    settings = get_settings()
    yield settings
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for k in objstore.s3a_hadoop_conf(settings):
        hadoop.unset(k)


INPUTS = (EVENTS, DIM_PRODUCTS, USER_SEGMENTS, "feature_flags")


def _download_inputs(s3: Settings, local: Settings) -> None:
    """Copy the input tables (data files and ``_delta_log``) of the object-store lake to
    the local lake with pyarrow's S3 filesystem: both lakes then hold the same Delta
    versions of the same files (the outputs are not copied)."""
    import pyarrow.fs as pafs

    opts = objstore.storage_options(s3)
    scheme, _, host = opts["AWS_ENDPOINT_URL"].partition("://")
    fs = pafs.S3FileSystem(access_key=opts["AWS_ACCESS_KEY_ID"],
                           secret_key=opts["AWS_SECRET_ACCESS_KEY"], region=opts["AWS_REGION"],
                           endpoint_override=host, scheme=scheme)
    for t in INPUTS:
        src = s3.table_path(t).removeprefix("s3a://")
        pafs.copy_files(src, local.table_path(t), source_filesystem=fs,
                        destination_filesystem=pafs.LocalFileSystem())


def test_object_store_lake_matches_the_local_lake(spark, s3_lake, tmp_path, capsys):
    started = time.monotonic()
    local = get_settings({**os.environ, "LAKECAST_LAKE_ROOT": str(tmp_path / "local_lake"),
                          "LAKECAST_CHECKPOINT_ROOT": str(tmp_path / "local_cp")})
    s3 = s3_lake
    s3_spark = get_spark(settings=s3)  # the running session, now with the fs.s3a.* settings
    assert s3_spark is spark
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    assert hadoop.get("fs.s3a.path.style.access") == "true"
    assert spark.conf.get("fs.s3a.secret.key", None) is None  # not a session setting
    opts = objstore.storage_options(s3)
    assert opts["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    assert opts["AWS_ACCESS_KEY_ID"] == "test-key" and opts["AWS_ALLOW_HTTP"] == "true"

    # batch layer: the broadcast tables and events, written by Spark through S3A, then the
    # same files downloaded to the local lake (the same inputs, written once)
    _inputs(spark, s3, 0)
    _download_inputs(s3, local)
    versions = {t: delta_io.latest_version(s3.table_path(t))  # deltalake, no Spark
                for t in INPUTS}
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
    _inputs(spark, s3, 1)
    _download_inputs(s3, local)
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
    dead = f"http://127.0.0.1:{free_port()}"
    for endpoint, root in ((dead, f"s3a://{BUCKET}/lake"),
                           (s3_endpoint, "s3a://no-such-bucket/lake")):
        monkeypatch.setenv("LAKECAST_LAKE_ROOT", root)
        monkeypatch.setenv("LAKECAST_SPARK_CONF", s3_conf(endpoint))
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
    assert objstore.s3a_hadoop_conf(s3a)["fs.s3a.endpoint"] == "minio.local:9000"
    assert "spark.sql.shuffle.partitions" not in objstore.s3a_hadoop_conf(s3a)
    assert "AWS_S3_ALLOW_UNSAFE_RENAME" not in opts  # only on the operator's opt-in
    optin = objstore.storage_options(s3a, {**env, "AWS_S3_ALLOW_UNSAFE_RENAME": "true"})
    assert optin["AWS_S3_ALLOW_UNSAFE_RENAME"] == "true"
    plain = get_settings(base)
    assert objstore.storage_options(plain, env)["AWS_ENDPOINT_URL"] == "https://s3.example"
    assert "AWS_ALLOW_HTTP" not in objstore.storage_options(plain, env)
    assert objstore.options_for(str(tmp_path / "t"), plain) is None
    assert objstore.options_for("s3a://b/lake/t", plain) is not None


def _table(spark, settings: Settings, name: str) -> pd.DataFrame:
    return delta_io.read(spark, settings.table_path(name)).toPandas()


def test_batch_assets_on_the_object_store_match_pandas(spark, s3_lake):
    """The demo's batch assets that build the broadcast tables (raw tables, dim_users,
    dim_products, then user_features and user_segments for one day), materialized by
    Dagster with the project's resources on an ``s3a://`` lake: their tables equal the
    independent pandas reference of the same raw rows, and their metadata the versions
    read from the object store."""
    s3 = s3_lake
    assert get_spark(settings=s3) is spark  # the session now reaches the object store
    spec = GenSpec(scale=0.01, seed=11, days=1)  # ~20 users, 10 products, ~500 events
    datagen.generate(spark, s3, spec)
    dims = run_assets(DIMS)  # the resources' settings come from LAKECAST_LAKE_ROOT (s3a)
    day = spec.day_keys[0]
    segs = run_assets(SEGMENTS, partition_key=day)
    assert set(objstore.table_names(s3.lake_root)) >= {
        RAW_USERS, RAW_PRODUCTS, EVENTS, DIM_USERS, DIM_PRODUCTS, USER_FEATURES, USER_SEGMENTS}
    for result, table in ((dims, DIM_PRODUCTS), (segs, USER_SEGMENTS)):
        (m,) = [e.materialization for e in result.get_asset_materialization_events()
                if e.materialization.asset_key == AssetKey(table)
                and "delta_version" in e.materialization.metadata]
        assert m.metadata["delta_version"].value == delta_io.latest_version(
            s3.table_path(table)) is not None

    # dim_products == the pandas cleaning of the raw rows
    pu = reference.users(_table(spark, s3, RAW_USERS))
    pp = reference.products(_table(spark, s3, RAW_PRODUCTS))
    exp_users = pu[pu["reason"].isna()]
    exp_products = pp[pp["reason"].isna()].sort_values("product_id").reset_index(drop=True)
    got = _table(spark, s3, DIM_PRODUCTS).sort_values("product_id").reset_index(drop=True)
    got["price"] = got["price"].astype(float)  # DECIMAL(10,2) in the table
    cols = ["product_id", "name", "category", "price"]
    assert len(got) == len(exp_products) > 0
    pd.testing.assert_frame_equal(got[cols], exp_products[cols], check_dtype=False)

    # user_segments (one day) == the pandas features and segment rules
    pe = reference.events(_table(spark, s3, EVENTS), exp_users, exp_products)
    ((_, expected, changed),) = reference.record_history(
        pe[pe["reason"].isna()], exp_users, [date.fromisoformat(day)])
    seg = _table(spark, s3, USER_SEGMENTS)[SEGMENT_COLUMNS].sort_values("user_id")
    seg["lifetime_value"] = seg["lifetime_value"].astype(float)
    seg["interests"] = seg["interests"].map(list)
    seg["updated_day"] = pd.to_datetime(seg["updated_day"]).dt.date
    assert changed == len(expected) > 0
    pd.testing.assert_frame_equal(seg.reset_index(drop=True), expected[SEGMENT_COLUMNS],
                                  check_dtype=False)


def test_two_writers_of_one_version_both_keep_their_rows_without_unsafe_rename(s3_endpoint,
                                                                              monkeypatch):
    """deltalake commits with a conditional put: two writers that read version 0 both
    append, the second retries as version 2, nothing is lost (no AWS_S3_ALLOW_UNSAFE_RENAME)."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    monkeypatch.delenv("AWS_S3_ALLOW_UNSAFE_RENAME", raising=False)
    monkeypatch.setenv("LAKECAST_SPARK_CONF", s3_conf(s3_endpoint))
    uri = f"s3://{BUCKET}/two-writers-{free_port()}"
    opts = objstore.storage_options(get_settings(), {})
    assert "AWS_S3_ALLOW_UNSAFE_RENAME" not in opts
    rows = pa.table({"x": [1, 2]})
    write_deltalake(uri, rows, storage_options=opts)
    first, second = DeltaTable(uri, storage_options=opts), DeltaTable(uri, storage_options=opts)
    write_deltalake(first, rows, mode="append")
    write_deltalake(second, rows, mode="append")  # both read version 0
    table = DeltaTable(uri, storage_options=opts)
    assert table.version() == 2 and table.to_pyarrow_table().num_rows == 6


@pytest.mark.connect
def test_a_second_client_of_the_server_cannot_read_the_s3_secret_key(s3_endpoint, lake,
                                                                      monkeypatch, request):
    """A Lakecast Spark server started with S3 credentials in its Spark conf reaches the
    store (a pipeline session writes and reads a Delta table there), yet neither a second
    client's session nor the pipeline's own reads the secret key back, and it is on
    neither the server's command line nor its log."""
    secret = f"s3-secret-{uuid4().hex}"
    prefix = f"s3a://{BUCKET}/{request.node.name}"
    monkeypatch.setenv("LAKECAST_LAKE_ROOT", f"{prefix}/lake")
    monkeypatch.setenv("LAKECAST_CHECKPOINT_ROOT", f"{prefix}/checkpoints")
    monkeypatch.setenv("LAKECAST_SPARK_CONF", s3_conf(s3_endpoint, secret))
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k, raising=False)
    server = Server(get_settings(), "127.0.0.1", free_port())
    try:
        server.start()
        monkeypatch.setenv("LAKECAST_SPARK_REMOTE", server.url)
        settings = get_settings()
        site = server.hadoop_conf_dir / "core-site.xml"
        assert secret in site.read_text() and oct(site.stat().st_mode & 0o777) == "0o600"
        pid = server.pid()
        assert secret.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()

        pipeline = get_spark(settings=settings, session="pipeline:s3-secret")
        path = settings.table_path("secret_probe")
        delta_io.write(pipeline.range(5).toDF("k"), path)  # the server's S3A credentials
        assert delta_io.read(pipeline, path).count() == 5
        other = get_spark(settings=settings)  # a second client, a session of its own
        assert other.session_id != pipeline.session_id
        for spark in (other, pipeline):
            for key in ("spark.hadoop.fs.s3a.secret.key", "fs.s3a.secret.key",
                        "spark.hadoop.fs.s3a.access.key", "fs.s3a.access.key"):
                assert spark.conf.get(key, None) is None, key
            listed = spark.sql("SET").collect() + spark.sql("SET -v").collect()
            assert not any(secret in str(row) for row in listed)
        assert secret not in server.log_file.read_text(errors="replace")
    finally:
        server.stop()
    assert not (server.hadoop_conf_dir / "core-site.xml").exists()
