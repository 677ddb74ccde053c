"""``enrichment_continuous`` as a real run-worker process on the Lakecast Spark server:
Dagster's interrupt (what the UI's Terminate sends) mid-batch lets the batch commit whole
and ends the run as canceled; ``kill -9`` mid-batch leaves the batch uncommitted and the
next run redoes it. Either way the outputs hold every event exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from dagster import DagsterInstance, DagsterRunStatus

from jobs.storefront.microbatch import ENRICHED_EVENTS, ENRICHMENT
from jobs.storefront.pipeline import CONTINUOUS_JOB
from lakecast.delta import io as delta_io
from lakecast.pipeline.progress import progress_path, read_log
from tests import ROOT as PROJECT_ROOT
from tests.jobs import microbatch_lake as ml

pytestmark = [pytest.mark.connect]

#: the run's INFO lines on its terminal (the job's default prints only warnings): the test
#: waits for the run's "watching" line
CONFIG = {"ops": {"enrichment_continuous_loop": {"config": {"max_seconds": 240,
                                                             "poll_seconds": 0.1}}},
          "loggers": {"console": {"config": {"log_level": "INFO"}}}}


def _start(env: dict[str, str], log_file, tmp_path) -> subprocess.Popen:
    config = tmp_path / "continuous.yaml"
    config.write_text(json.dumps(CONFIG))  # JSON is YAML
    return subprocess.Popen(
        [sys.executable, "-m", "dagster", "job", "execute", "-m", "jobs.definitions",
         "-j", CONTINUOUS_JOB, "--config", str(config)],
        cwd=PROJECT_ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)


def _log(lake):
    path = progress_path(lake.checkpoint_root, ENRICHMENT.name)
    return read_log(path) if delta_io.latest_version(path) is not None else ([], {})


def _wait(cond, what: str, proc: subprocess.Popen, out_path, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; run output:\n"
                         + out_path.read_text()[-4000:])


def _pending(lake):
    plans, commits = _log(lake)
    open_ = [p for p in plans if p.batch_id not in commits and not p.is_restore]
    return open_[-1] if open_ else None


def _committed_through(lake, version: int) -> bool:
    plans, commits = _log(lake)
    return any(p.events_end >= version and p.batch_id in commits for p in plans)


def test_terminate_and_kill_mid_batch_keep_outputs_exactly_once(
        connect_spark, connect_lake, spark_server, tmp_path):
    spark, lake = connect_spark, connect_lake
    os.makedirs(os.environ["DAGSTER_HOME"], exist_ok=True)
    env = {**os.environ, "LAKECAST_SPARK_REMOTE": spark_server.url}
    ml.build(spark, lake)
    frames = [ml.events(1000 * i, 30, seed=40 + i) for i in range(3)]
    ml.write_events(spark, lake, frames[0])
    events = lake.table_path("events")

    # 1. Terminate (SIGTERM to the run worker, as Dagster's termination does) mid-batch
    out1 = tmp_path / "run1.log"
    with open(out1, "w") as f:
        proc = _start(env, f, tmp_path)
        _wait(lambda: _committed_through(lake, 0), "the first batch", proc, out1)
        ml.write_events(spark, lake, frames[1])
        pending = _wait(lambda: _pending(lake), "the second batch to start", proc, out1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=180)
    _, commits = _log(lake)
    assert pending.batch_id in commits, out1.read_text()[-3000:]  # it committed whole
    assert _pending(lake) is None
    instance = DagsterInstance.get()
    (run1,) = instance.get_runs()
    assert run1.status in (DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE)
    ml.assert_exact(spark, lake, frames[:2])

    # 2. kill -9 mid-batch: the batch stays planned, uncommitted
    out2 = tmp_path / "run2.log"
    with open(out2, "w") as f:
        proc = _start(env, f, tmp_path)
        _wait(lambda: "watching" in out2.read_text(), "the second run to watch", proc, out2)
        ml.write_events(spark, lake, frames[2])
        killed = _wait(lambda: _pending(lake), "the third batch to start", proc, out2)
        proc.kill()
        proc.wait(timeout=60)
    assert killed.events_end == delta_io.latest_version(events)
    # what Dagster's code server does when a run worker dies: the run fails
    dead = [r for r in instance.get_runs() if r.status == DagsterRunStatus.STARTED]
    for run in dead:
        instance.report_run_failed(run, "run worker killed (kill -9) by the test")

    # 3. the next run redoes it with the same plan: every event once
    proc = subprocess.run([sys.executable, "-m", "jobs.storefront.microbatch"], cwd=PROJECT_ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plans, commits = _log(lake)
    assert killed.batch_id in commits
    redone = [p for p in plans if p.batch_id == killed.batch_id]
    assert {(p.events_start, p.events_end) for p in redone} == {
        (killed.events_start, killed.events_end)}
    got = delta_io.read(spark, lake.table_path(ENRICHED_EVENTS)).toPandas()
    assert got.event_id.is_unique
    ml.assert_exact(spark, lake, frames)


def test_an_idle_continuous_run_keeps_its_task_state_warm(
        connect_spark, connect_lake, spark_server, tmp_path):
    """Spark stops the Python workers an executor has left idle for a minute, and the
    task-local state they hold goes with them. A continuous run with nothing to do for
    longer than that still finds its tasks warm: the batch after the quiet spell reports
    no cold task in its materialization, and the outputs equal pandas."""
    from dagster import AssetKey

    spark, lake = connect_spark, connect_lake
    os.makedirs(os.environ["DAGSTER_HOME"], exist_ok=True)
    env = {**os.environ, "LAKECAST_SPARK_REMOTE": spark_server.url}
    ml.build(spark, lake)
    frames = [ml.events(5000 + 1000 * i, 30, seed=60 + i) for i in range(2)]
    first = ml.write_events(spark, lake, frames[0])
    out = tmp_path / "idle.log"
    with open(out, "w") as f:
        proc = _start(env, f, tmp_path)
        try:
            _wait(lambda: _committed_through(lake, first), "the first batch", proc, out)
            time.sleep(75)  # longer than Spark keeps an idle Python worker
            second = ml.write_events(spark, lake, frames[1])
            _wait(lambda: _committed_through(lake, second), "the batch after the idle spell",
                  proc, out)
            time.sleep(2)  # its materialization is recorded right after its commit
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=180)
    records = DagsterInstance.get().fetch_materializations(AssetKey(ENRICHED_EVENTS),
                                                            limit=10).records
    cold = [r.asset_materialization.metadata["cold_tasks"].value for r in records]
    assert len(cold) == 2 and cold[0] == 0, (cold, out.read_text()[-3000:])  # newest first
    ml.assert_exact(spark, lake, frames)

