"""The production Dagster stack for real (``python -m deploy.prod_stack``): PostgreSQL,
``dagster-daemon`` and ``dagster-webserver`` as separate processes on loopback, its runs
on the test run's local Spark standalone cluster (two workers; the cluster's Lakecast
Spark server as driver). The daemon's ``broadcast_versions_sensor`` triggers
``enrichment_microbatch``; the outputs equal the pandas reference; the batches' tasks ran
on both workers' executors; the run and its events are rows of PostgreSQL; every listener
of the stack and of the cluster is on 127.0.0.1; ``down`` leaves no process behind."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pytest
from dagster import DagsterEventType

from assets.tables import EVENTS
from deploy.procs import alive, descendants
from jobs.storefront.microbatch import ENRICHED_EVENTS, ENRICHMENT
from jobs.storefront.pipeline import MICROBATCH_JOB
from lakecast.config import get_settings
from lakecast.delta import io as delta_io
from lakecast.pipeline.progress import progress_path, read_log
from lakecast.spark import get_spark
from tests import ROOT as PROJECT_ROOT
from tests.jobs import microbatch_lake as ml
from tests.lakecast import cluster_helpers as ch

# its runs and this test are Spark Connect clients of the cluster: they run after the
# in-process Spark tests (tests/conftest.py)
pytestmark = [pytest.mark.prodstack, pytest.mark.cluster, pytest.mark.connect,
              pytest.mark.slow]

SENSOR = "broadcast_versions_sensor"
LOOPBACK = ("127.0.0.1", "[::ffff:127.0.0.1]")
FINISHED = ("SUCCESS", "FAILURE", "CANCELED")


@dataclass
class StackUnderTest:
    root: Path
    env: dict[str, str]
    status: dict

    @property
    def url(self) -> str:
        return self.status["url"]

    def pids(self) -> set[int]:
        """The stack's top processes (their descendants: code servers, runs, Spark)."""
        return {p for p in (self.status["postgres"]["pid"], self.status["daemon"]["pid"],
                            self.status["webserver"]["pid"]) if p}

    def query(self, sql: str, *params: object) -> list[tuple]:
        """Rows of ``sql`` in the instance's PostgreSQL database."""
        pg = self.status["postgres"]
        password = (self.root / "run" / "pg_password").read_text().strip()
        with closing(psycopg2.connect(host=pg["host"], port=pg["port"], user=pg["user"],
                                      password=password, dbname=pg["db"])) as conn, \
                conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall()


def _cli(env: dict[str, str], *args: str, check: bool = True) -> str:
    res = subprocess.run([sys.executable, "-m", "deploy.prod_stack", *args], cwd=PROJECT_ROOT,
                         env=env, capture_output=True, text=True, timeout=300, check=False)
    assert not check or res.returncode == 0, f"prod_stack {args}: {res.stderr}{res.stdout}"
    return res.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("problem", ["port in use", "no postgres"])
def test_up_names_what_failed_and_the_fix_and_leaves_nothing(tmp_path, problem):
    root = Path(tempfile.mkdtemp(prefix="lakecast-prodstack-"))
    root.chmod(0o755)
    env = {**os.environ, "LAKECAST_PROD_ROOT": str(root),
           "DAGSTER_PG_PORT": str(_free_port()), "LAKECAST_WEB_PORT": str(_free_port())}
    with socket.socket() as taken:
        if problem == "port in use":
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            env["DAGSTER_PG_PORT"] = str(taken.getsockname()[1])
        else:
            env["LAKECAST_PG_BIN"] = str(tmp_path)
        res = subprocess.run([sys.executable, "-m", "deploy.prod_stack", "up"],
                             cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                             timeout=120, check=False)
    try:
        assert res.returncode == 1, res.stdout
        if problem == "port in use":
            assert f"port {env['DAGSTER_PG_PORT']} on 127.0.0.1 is in use" in res.stderr
            assert "DAGSTER_PG_PORT" in res.stderr
        else:
            assert "PostgreSQL server not installed" in res.stderr
            assert "make postgres" in res.stderr
        status = json.loads(_cli(env, "status", "--json"))
        assert [status[k]["pid"] for k in ("postgres", "daemon", "webserver")] == [None] * 3
    finally:
        _cli(env, "down", "--purge", check=False)


@pytest.fixture(scope="module")
def stack(cluster) -> Iterator[StackUnderTest]:
    """The stack on free loopback ports, its lake and instance in a fresh folder; its runs
    attach to the cluster's Lakecast Spark server with a task per worker core and more
    (``LAKECAST_PARALLELISM``), as production runs attach to theirs."""
    # in the system's temp folder, not the clone's var/: the `postgres` OS user must be able
    # to enter every parent folder (a clone may live under a private one), and the Unix
    # socket's path must stay short
    root = Path(tempfile.mkdtemp(prefix="lakecast-prodstack-"))
    root.chmod(0o755)
    env = {**os.environ, "LAKECAST_PROD_ROOT": str(root),
           "DAGSTER_PG_PORT": str(_free_port()), "LAKECAST_WEB_PORT": str(_free_port()),
           "LAKECAST_LAKE_ROOT": str(root / "lake"),
           "LAKECAST_CHECKPOINT_ROOT": str(root / "checkpoints"),
           "LAKECAST_SENSOR_INTERVAL_SECONDS": "2", "LAKECAST_SPARK_REMOTE": cluster.server.url,
           "LAKECAST_PARALLELISM": "4"}
    t0 = time.monotonic()
    try:
        _cli(env, "up")
        print(f"stack up in {time.monotonic() - t0:.1f} s")
        yield StackUnderTest(root, env, json.loads(_cli(env, "status", "--json")))
    finally:
        _cli(env, "down", "--purge", check=False)


def _graphql(url: str, query: str, **variables: object) -> dict:
    body = json.dumps({"query": query, "variables": variables}).encode()
    req = urllib.request.Request(f"{url}/graphql", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        answer = json.loads(resp.read())
    assert "errors" not in answer, answer
    return answer["data"]


START_SENSOR = """mutation ($name: String!) { startSensor(sensorSelector: {
    repositoryLocationName: "jobs.definitions", repositoryName: "__repository__",
    sensorName: $name}) { __typename ... on Sensor { sensorState { status } }
    ... on PythonError { message } } }"""
RUNS = """query ($job: String!) { runsOrError(filter: {pipelineName: $job}) {
    ... on Runs { results { runId status } } } }"""


MATERIALIZATIONS = """query ($key: AssetKeyInput!) { assetOrError(assetKey: $key) {
    ... on Asset { assetMaterializations(limit: 100) { metadataEntries {
    label ... on JsonMetadataEntry { jsonString } ... on IntMetadataEntry { intRepr }
    } } } } }"""


def _batch_metadata(url: str, label: str) -> list:
    """The ``label`` metadata of every materialization of ``enriched_events`` (one per
    batch; the webserver reads them from PostgreSQL), as JSON values."""
    asset = _graphql(url, MATERIALIZATIONS, key={"path": [ENRICHED_EVENTS]})["assetOrError"]
    return [json.loads(entry.get("jsonString") or entry.get("intRepr") or "null")
            for m in asset["assetMaterializations"] for entry in m["metadataEntries"]
            if entry["label"] == label]


def _start_sensor(url: str) -> str:
    """Turn the sensor on through the webserver (the UI's toggle); its status."""
    data = _graphql(url, START_SENSOR, name=SENSOR)["startSensor"]
    assert data["__typename"] == "Sensor", data
    return data["sensorState"]["status"]


def _listeners(pids: set[int]) -> list[str]:
    """``ss -ltnp`` lines of TCP listeners owned by ``pids``."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines()
            if {int(p) for p in re.findall(r"pid=(\d+)", line)} & pids]


def _covered(lake, events_version: int) -> bool:
    plans, commits = read_log(progress_path(lake.checkpoint_root, ENRICHMENT.name))
    return any(p.events_end >= events_version and p.batch_id in commits for p in plans)


def _runs(stack: StackUnderTest) -> list[tuple[str, str]]:
    """(run id, status) of the micro-batch job's runs, as PostgreSQL holds them."""
    return stack.query("SELECT run_id, status FROM runs WHERE pipeline_name = %s",
                       MICROBATCH_JOB)


def test_the_daemons_sensor_runs_the_pipeline_on_postgres_and_the_cluster(
    stack, cluster, monkeypatch
):
    for var in ("LAKECAST_LAKE_ROOT", "LAKECAST_CHECKPOINT_ROOT", "LAKECAST_SPARK_REMOTE"):
        monkeypatch.setenv(var, stack.env[var])
    monkeypatch.setenv("DAGSTER_HOME", stack.status["dagster_home"])
    lake = get_settings()
    spark = get_spark(settings=lake)  # a session of its own on the cluster's server
    assert _start_sensor(stack.url) == "RUNNING"

    ml.build(spark, lake)
    frames = [ml.events(1000 * i, 40, seed=40 + i) for i in range(2)]
    for f in frames:
        ml.write_events(spark, lake, f)
    target = delta_io.latest_version(lake.table_path(EVENTS))

    # until the sensor's run(s) committed the last events version and ended; meanwhile,
    # every listener of the stack's processes (runs and their Spark JVMs included)
    t0, seen = time.monotonic(), set()
    deadline = t0 + 150
    while time.monotonic() < deadline:
        seen.update(_listeners(descendants(stack.pids())))
        runs = _runs(stack)
        if runs and all(s in FINISHED for _, s in runs) and _covered(lake, target):
            break
        time.sleep(1.0)
    print(f"sensor -> run -> committed in {time.monotonic() - t0:.1f} s: {runs}")
    assert runs and _covered(lake, target), (
        f"no committed batch for events v{target} after 150 s (runs {runs}); see "
        f"{stack.status['daemon']['log']}")
    assert {s for _, s in runs} == {"SUCCESS"}, runs

    ml.assert_exact(spark, lake, frames)
    # the batches' tasks ran on both workers' executors (per-task accounting, as each
    # batch's materialization of enriched_events records it; read through the webserver)
    executors = {e for batch in _batch_metadata(stack.url, "executors") for e in batch}
    print(f"executors of the batches' tasks: {sorted(executors)}")
    assert len(executors) == 2 and "driver" not in executors, executors
    # with LAKECAST_PARALLELISM's 4 tasks a batch (the sensor's runs set none themselves)
    assert set(_batch_metadata(stack.url, "parallelism")) == {4}

    # the runs, their tags and their events are rows of PostgreSQL
    for run_id, _ in runs:
        assert stack.query("SELECT value FROM run_tags WHERE run_id = %s AND key = %s",
                           run_id, "dagster/sensor_name") == [(SENSOR,)]
        events = dict(stack.query("SELECT dagster_event_type, count(*) FROM event_logs "
                                  "WHERE run_id = %s GROUP BY 1", run_id))
        assert events.get(DagsterEventType.RUN_SUCCESS.value) == 1, events  # PIPELINE_SUCCESS
        assert events.get(DagsterEventType.ASSET_MATERIALIZATION.value), events
    # ... and the webserver reads them from there
    ui = _graphql(stack.url, RUNS, job=MICROBATCH_JOB)["runsOrError"]["results"]
    assert sorted((r["runId"], r["status"]) for r in ui) == sorted(runs)

    # nothing of the stack listens on anything but 127.0.0.1
    print("listeners of the stack (ss -ltnp):\n" + "\n".join(sorted(seen)))
    local = {line.split()[3] for line in seen}
    assert all(addr.rsplit(":", 1)[0] in LOOPBACK for addr in local), sorted(seen)
    ports = {int(addr.rsplit(":", 1)[1]) for addr in local}
    assert {stack.status["postgres"]["port"], int(stack.url.rsplit(":", 1)[1])} <= ports
    # ... nor anything of the cluster: master, workers, its server and executors
    sockets = ch.listening(cluster.processes())
    print("listeners of the cluster (ss -ltnp):\n" + "\n".join(ln for _, ln in sockets))
    assert len(sockets) >= 7 and all(ch.is_loopback(addr) for addr, _ in sockets), sockets


def test_down_leaves_no_process_behind(stack):
    procs = descendants(stack.pids())
    assert len(procs) >= 5  # postgres and its workers, daemon, webserver, code servers
    _cli(stack.env, "down")
    assert [p for p in procs if alive(p)] == []
    assert _listeners(procs) == []
    status = json.loads(_cli(stack.env, "status", "--json"))
    assert [status[k]["pid"] for k in ("postgres", "daemon", "webserver")] == [None] * 3
