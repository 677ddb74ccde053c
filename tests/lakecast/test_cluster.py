"""The enrichment pipeline on a local Spark standalone cluster (a master, two workers, the
Lakecast Spark server as driver, all on 127.0.0.1; the test run's ``cluster`` fixture): a
worker killed with -9 in the middle of a batch costs retries, never a duplicate or a
missing row; a restarted and a third worker take tasks at a higher parallelism. The
enrichment job started by the production stack's daemon on this cluster (outputs equal
the pandas reference, tasks on both executors, every listener on loopback) is
``tests/deploy/test_prod_stack.py``."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace

import pandas as pd
import pytest

from jobs.storefront.enrichment import validate_events
from jobs.storefront.microbatch import (
    ENRICHED_EVENTS,
    ENRICHMENT,
    ENRICHMENT_REJECTED,
    ENRICHMENT_UNMATCHED,
)
from lakecast.build import broadcast_pipeline
from lakecast.config import get_settings
from lakecast.delta import io as delta_io
from lakecast.spark import get_spark
from tests.jobs import microbatch_lake as ml
from tests.lakecast import cluster_helpers as ch

# Spark Connect clients: they run after the in-process Spark tests (tests/conftest.py)
pytestmark = [pytest.mark.cluster, pytest.mark.connect, pytest.mark.slow]

OUTPUTS = (ENRICHED_EVENTS, ENRICHMENT_UNMATCHED, ENRICHMENT_REJECTED)
COLS = ["event_id", "user_id", "product_category", "product_price", "segment",
        "vip_discount_pct"]


@pytest.fixture
def cluster_lake(lake, cluster, monkeypatch):
    monkeypatch.setenv("LAKECAST_SPARK_REMOTE", cluster.server.url)
    return get_settings()


def _assert_exact(spark, lake, frames: list[pd.DataFrame]) -> None:
    """The outputs equal the pandas reference of all ``frames``; no event twice."""
    want = ml.expected(pd.concat(frames, ignore_index=True), ml.segments_v1(), 10.0)
    got = {t: delta_io.read(spark, lake.table_path(t)).toPandas() for t in OUTPUTS}
    assert got[ENRICHED_EVENTS].event_id.is_unique
    g = got[ENRICHED_EVENTS][COLS].sort_values("event_id").reset_index(drop=True)
    w = want["enriched"][COLS].sort_values("event_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(g, w, check_dtype=False)
    assert sorted(got[ENRICHMENT_UNMATCHED].event_id) == sorted(want["unmatched"].event_id)
    assert sorted(got[ENRICHMENT_REJECTED].reason) == sorted(want["rejected"].reason)
    assert sum(len(t) for t in got.values()) == sum(len(f) for f in frames)


def _pipeline(lake, markers: str, delay: float, parallelism: int):
    spark = get_spark(settings=lake, session="pipeline:enrichment")
    return broadcast_pipeline(
        spark, replace(ENRICHMENT), ch.SlowEnrichment(markers, delay),
        table_path=lake.table_path, checkpoint_root=lake.checkpoint_root,
        validator=validate_events, parallelism=parallelism, checkpoint_every=1,
        timestamp_column="event_ts", function_id="storefront-enrichment")


def _wait(what: str, cond, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_worker_killed_mid_batch_then_restarted_and_a_third_worker(
        cluster, cluster_lake, tmp_path):
    lake = cluster_lake
    spark = get_spark(settings=lake)
    ml.build(spark, lake)
    frames = [ml.events(i * 1000, 100, seed=40 + i) for i in range(4)]
    for f in frames:
        ml.write_events(spark, lake, f)
    marks = str(tmp_path / "markers")
    os.makedirs(marks)
    # 2 s a task: the kill below follows the first marker on worker-1 by ~0.1 s (its poll),
    # so it still lands mid-task; the surviving executor then runs the other tasks and the
    # retry one after another, 2 s each (4 s each took ~8 s longer)
    pipeline = _pipeline(lake, marks, delay=2.0, parallelism=4)
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["results"] = pipeline.run()
        except BaseException as e:  # reported by the assertion below
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    # a task runs on worker-1's executor: kill -9 the worker JVM (its executor follows)
    _wait("a task on worker-1", lambda: any(
        "/worker-1/" in cwd for cwd in ch.markers(marks).values()) or not thread.is_alive())
    victim = cluster.pid("worker-1")
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    thread.join(timeout=240)
    assert not thread.is_alive(), "the batch did not finish after the worker was killed"
    assert "error" not in outcome, outcome.get("error")
    results = outcome["results"]
    assert [r.plan.batch_id for r in results] == [0]  # one batch, committed once
    assert results[0].counts["events_in"] == sum(len(f) for f in frames)
    _assert_exact(spark, lake, frames)
    workers: dict[str, set[bool]] = {}  # partition -> ran on worker-1?
    for name, cwd in ch.markers(marks).items():
        workers.setdefault(name.split("-")[0], set()).add("/worker-1/" in cwd)
    retried = [p for p, on in workers.items() if on == {True, False}]
    assert retried, f"no lost task ran again elsewhere: {workers}"
    assert cluster.alive_workers() == 1

    # restart the worker, add a third, then a batch at a higher parallelism
    cluster.start_worker(1)
    cluster.wait_workers(2)
    assert cluster.add_worker() == 3
    _wait("3 executors for the server", lambda: cluster.app_cores() == 3, timeout=90)
    _wait("3 executors taking tasks", lambda: len(ch.executors_of(spark)) == 3, timeout=90)
    frames.append(ml.events(9000, 120, seed=49))
    ml.write_events(spark, lake, frames[-1])
    (result,) = _pipeline(lake, marks, delay=0.5, parallelism=6).run()
    assert result.plan.batch_id == 1 and result.parallelism == 6
    assert len(set(result.executors)) == 3, result.executors  # the state rescaled to 3
    _assert_exact(spark, lake, frames)

    # the test run's cluster back to the fixture's two workers, whatever runs next (the
    # prod stack test counts two executors)
    assert cluster.stop_process("worker-3")
    _wait("2 workers", lambda: cluster.alive_workers() == 2, timeout=90)
    _wait("2 executors for the server", lambda: cluster.app_cores() == 2, timeout=90)


def test_a_taken_port_is_a_clear_error(tmp_path, monkeypatch):
    import socket

    from lakecast.cluster import Cluster, ClusterError

    monkeypatch.setenv("LAKECAST_HOME", str(tmp_path))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        c = Cluster(get_settings(), port=port, server_port=ch.free_port())
        with pytest.raises(ClusterError, match=f"port {port} .*LAKECAST_CLUSTER_PORT"):
            c.up(workers=2)
    assert c.status().startswith("not running") and c.processes() == []
