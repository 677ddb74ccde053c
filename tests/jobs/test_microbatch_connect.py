"""The enrichment job over the Lakecast Spark server (Spark Connect): the Dagster job, warm
task-local state across separate runs, a server killed between runs, and a clear error
when no server answers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pandas as pd
import pytest
from dagster import materialize

from assets import flags
from assets.tables import USER_SEGMENTS
from dagster_lakecast.resources import LakecastSparkResource, LakeResource
from jobs.storefront.microbatch import (
    ENRICHED_EVENTS,
    ENRICHMENT_REJECTED,
    ENRICHMENT_UNMATCHED,
    build_pipeline,
    enrichment_microbatch_assets,
)
from lakecast.delta import io as delta_io
from lakecast.spark import get_spark, is_connect
from tests import ROOT as PROJECT_ROOT
from tests.jobs import microbatch_lake as ml

pytestmark = [pytest.mark.connect]

OUTPUTS = (ENRICHED_EVENTS, ENRICHMENT_UNMATCHED, ENRICHMENT_REJECTED)


def _outputs(spark, lake) -> dict[str, pd.DataFrame]:
    return {t: delta_io.read(spark, lake.table_path(t)).toPandas() for t in OUTPUTS}


def _assert_exact(got: dict[str, pd.DataFrame], want: dict[str, pd.DataFrame]) -> None:
    """Every output row equals the pandas reference; no event twice."""
    cols = ["event_id", "user_id", "product_category", "product_price", "segment",
            "vip_discount_pct"]
    g = got[ENRICHED_EVENTS][cols].sort_values("event_id").reset_index(drop=True)
    w = want["enriched"][cols].sort_values("event_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(g, w, check_dtype=False)
    assert sorted(got[ENRICHMENT_UNMATCHED].event_id) == sorted(want["unmatched"].event_id)
    assert sorted(got[ENRICHMENT_REJECTED].reason) == sorted(want["rejected"].reason)


def _segments_v2(spark, lake) -> pd.DataFrame:
    """user 1 VIP -> CHURNING, user 5 appears as VIP; returns the whole new table."""
    change = pd.DataFrame({"user_id": [1, 5], "segment": ["CHURNING", "VIP"]})
    delta_io.merge_upsert(spark, spark.createDataFrame(change), lake.table_path(USER_SEGMENTS),
                          keys=["user_id"])
    return pd.concat([ml.segments_v1()[lambda d: d.user_id != 1], change])


def test_dagster_job_and_pipeline_run_over_spark_connect(connect_spark, connect_lake):
    spark, lake = connect_spark, connect_lake
    assert is_connect(spark)
    ml.build(spark, lake)
    batch1 = ml.events(0, 60, seed=1)
    ml.write_events(spark, lake, batch1)

    res = materialize([enrichment_microbatch_assets],
                      resources={"pyspark": LakecastSparkResource(), "lake": LakeResource()})
    assert res.success
    meta = {m.asset_key.to_user_string(): m.materialization.metadata
            for m in res.get_asset_materialization_events()}
    assert meta[ENRICHED_EVENTS]["events_in"].value == len(batch1)
    _assert_exact(_outputs(spark, lake), ml.expected(batch1, ml.segments_v1(), 10.0))

    segs = _segments_v2(spark, lake)
    flags.set_flag(spark, lake.table_path("feature_flags"), "vip_discount", "25")
    batch2 = ml.events(1000, 50, seed=2)
    ml.write_events(spark, lake, batch2)
    pipeline = build_pipeline(get_spark(settings=lake, session="pipeline:enrichment"), lake)
    results = pipeline.run()
    assert [r.plan.batch_id for r in results] == [1]
    assert results[0].state_version == {"dim_products": 0, "user_segments": 1,
                                        "feature_flags": 1}
    got = _outputs(spark, lake)
    want1 = ml.expected(batch1, ml.segments_v1(), 10.0)
    want2 = ml.expected(batch2, segs, 25.0)
    _assert_exact(got, {k: pd.concat([want1[k], want2[k]]) for k in want1})
    versions = got[ENRICHED_EVENTS].set_index("event_id")["_state_version"].map(json.loads)
    assert {v["user_segments"] for v in versions[versions.index >= 1000]} == {1}
    assert {v["user_segments"] for v in versions[versions.index < 1000]} == {0}


def test_a_warm_batch_asks_the_server_for_no_schema(connect_spark, connect_lake, monkeypatch):
    """Over Spark Connect a schema request is a round trip in which the server analyzes the
    plan again: time on a continuous batch's path. Once a pipeline has seen its events'
    schema, a batch of small appends asks for none (the events' schema is known from the
    read, the validated events' is reused while the events' schema is the same, the
    rejected rows' is declared, the results' is the tasks' declared one, so PySpark's
    ``toArrow`` asks none either), and its outputs still equal the pandas reference."""
    from pyspark.sql.connect.client.core import SparkConnectClient

    spark, lake = connect_spark, connect_lake
    ml.build(spark, lake)
    pipeline = build_pipeline(get_spark(settings=lake, session="pipeline:enrichment"), lake)
    asked: list[str] = []
    analyze = SparkConnectClient._analyze

    def counted(self, method, **kwargs):
        asked.append(method)
        return analyze(self, method, **kwargs)

    monkeypatch.setattr(SparkConnectClient, "_analyze", counted)
    frames, schema_requests = [], []
    for i in range(4):
        frames.append(ml.events(3000 + 100 * i, 40, seed=20 + i))
        ml.write_events(spark, lake, frames[-1])
        asked.clear()
        (r,) = pipeline.run()
        assert r.plan.batch_id == i
        schema_requests.append(asked.count("schema"))
    # the first batch reads the whole table through Delta, the second is the first of the
    # appends read on the driver; from the third on, nothing asks
    assert schema_requests[0] > 1 and schema_requests[2:] == [0, 0], schema_requests
    want = [ml.expected(f, ml.segments_v1(), 10.0) for f in frames]
    _assert_exact(_outputs(spark, lake), {k: pd.concat([w[k] for w in want]) for k in want[0]})


def _job(env: dict[str, str]) -> tuple[int, str, dict]:
    """``python -m jobs.storefront.microbatch`` in its own process; (return code, output,
    summary)."""
    proc = subprocess.run([sys.executable, "-m", "jobs.storefront.microbatch"], cwd=PROJECT_ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    summary = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            summary = json.loads(line)
    return proc.returncode, out, summary


def test_runs_share_warm_state_and_a_killed_server_restores_exactly_once(
        connect_spark, connect_lake, spark_server):
    spark, lake = connect_spark, connect_lake
    env = {**os.environ, "LAKECAST_SPARK_REMOTE": spark_server.url}
    ml.build(spark, lake)
    frames = [ml.events(0, 40, seed=11)]
    ml.write_events(spark, lake, frames[0])

    rc, out, first = _job(env)
    assert rc == 0, out
    assert first["batches"] == 1 and first["first_batch_cold_tasks"] > 0  # a new session

    frames.append(ml.events(1000, 40, seed=12))
    ml.write_events(spark, lake, frames[1])
    rc, out, second = _job(env)  # a new process, seconds later, on the same session
    assert rc == 0, out
    assert second["batches"] == 1
    assert second["first_batch_cold_tasks"] == 0, out  # the state stayed warm

    # kill -9 the server JVM between two runs, start it again
    pid = spark_server.pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while spark_server.pid() is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert spark_server.pid() is None
    spark_server.start()

    spark = get_spark(settings=lake)  # the old session died with the server
    segs = _segments_v2(spark, lake)
    frames.append(ml.events(2000, 40, seed=13))
    ml.write_events(spark, lake, frames[2])
    rc, out, third = _job(env)
    assert rc == 0, out
    assert third["batches"] == 1 and third["first_batch_cold_tasks"] > 0  # restored

    want = [ml.expected(frames[0], ml.segments_v1(), 10.0),
            ml.expected(frames[1], ml.segments_v1(), 10.0),
            ml.expected(frames[2], segs, 10.0)]
    got = _outputs(spark, lake)
    assert got[ENRICHED_EVENTS].event_id.is_unique
    _assert_exact(got, {k: pd.concat([w[k] for w in want]) for k in want[0]})


def test_an_unreachable_server_is_a_clear_error_and_nothing_is_written(lake, monkeypatch):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"sc://127.0.0.1:{port}"
    env = {**os.environ, "LAKECAST_SPARK_REMOTE": url}
    proc = subprocess.run([sys.executable, "-m", "jobs.storefront.microbatch"], cwd=PROJECT_ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert url in proc.stderr and "lakecast server start" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not os.path.exists(lake.checkpoint_root) or not os.listdir(lake.checkpoint_root)
    assert not os.path.exists(lake.lake_root) or not os.listdir(lake.lake_root)
