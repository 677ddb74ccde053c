"""Issue 53, item 1 on a real cluster (nothing mocked): the JVM lookups' state chain on S3.

A loopback standalone cluster of its own (a master, two workers of one core, the Lakecast
Spark server as driver) whose lake, checkpoints and JVM state root are ``s3a://`` URIs
on moto's S3 server (127.0.0.1). The client (this process, a Spark Connect client) writes
the chain's Arrow files and manifests to S3 with pyarrow; the executors read them
through Hadoop's ``FileSystem`` (``StateStorage.java``) with the cluster's credentials —
no local ``_jvm-state`` / ``var/jvm-state`` folder exists for them to read.

One pure ``enrich(Lookup...)`` (an integer key with defaults, a composite string+integer
key whose misses go to ``unmatched``) walks several Delta versions of its dimensions
(updates, deletes, inserts), batch after batch: every output row equals a pandas model
of the dimensions, which applies the same changes itself. Then an executor JVM is killed
with -9 between batches; the master gives the application a new one, which rebuilds the
state from the chain on S3: the next batch still equals pandas and its accounting counts
exactly that JVM cold. The tutorial's shape (an ``Enrichment`` overriding ``transform``)
runs on the cluster too, and loses an executor JVM mid-run (killed while it runs a task):
the batch finishes on the survivor and the replacement, which rebuilds the state, equal to
pandas, every event counted once.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from lakecast import BroadcastRuntime
from lakecast.cluster import Cluster
from lakecast.config import Settings, get_settings
from lakecast.delta import io as delta_io
from lakecast.delta import objstore
from lakecast.spark import get_spark
from tests.lakecast import cluster_helpers as ch
from tests.lakecast.test_joins import _function as function
from tests.lakecast.test_jvm_transform import Priced, priced, priced_model
from tests.moto_s3 import moto_server, s3_conf

# a cluster of its own over Spark Connect (runs with the other connect tests, last), on
# an S3-compatible server
pytestmark = [pytest.mark.cluster, pytest.mark.connect, pytest.mark.slow,
              pytest.mark.objstore]

BUCKET = "lakecast-jvm53"
PREFIX = f"s3a://{BUCKET}/jvm-cluster"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
#: the whole test's bound (issue: < 5 min); waits below have their own timeouts
TEST_BUDGET_S = 300.0
EVENTS_PER_BATCH = 600
TASKS = 6


@pytest.fixture
def s3_cluster(monkeypatch) -> Iterator[tuple[Cluster, Settings, str]]:
    """moto on 127.0.0.1, then a two-worker cluster whose server has the s3a settings;
    the lake, checkpoints (and so the JVM state root) under ``s3a://``. Yields the
    cluster, the client's settings (Spark Connect to the cluster's server) and moto's
    URL; the cluster then moto stop in ``finally``."""
    with moto_server(BUCKET) as endpoint:
        monkeypatch.setenv("LAKECAST_LAKE_ROOT", f"{PREFIX}/lake")
        monkeypatch.setenv("LAKECAST_CHECKPOINT_ROOT", f"{PREFIX}/checkpoints")
        monkeypatch.setenv("LAKECAST_SPARK_CONF", s3_conf(endpoint))
        for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                  "LAKECAST_JVM_STATE_ROOT", "LAKECAST_SPARK_REMOTE"):
            monkeypatch.delenv(k, raising=False)
        cluster = Cluster(get_settings(), port=ch.free_port(span=6),
                          server_port=ch.free_port())
        try:
            # the server has the s3a settings from its Settings (keys in its core-site.xml);
            # the workers, and so the executors, do not get them in their environment
            monkeypatch.delenv("LAKECAST_SPARK_CONF")
            cluster.up(workers=2)
            monkeypatch.setenv("LAKECAST_SPARK_CONF", s3_conf(endpoint))
            monkeypatch.setenv("LAKECAST_SPARK_REMOTE", cluster.server.url)
            yield cluster, get_settings(), endpoint
        finally:
            cluster.down()
            assert cluster.processes() == []


# -- the dimensions, their versions, and the pandas model ---------------------------------
USERS_V0 = pd.DataFrame({
    "user_id": [1, 2, 3, 4, 5, 6],
    "segment": ["REGULAR", "VIP", "CHURNING", "REGULAR", "VIP", "NEW"],
    "ltv": [10.0, 250.0, None, 40.0, 900.0, 1.0],
})
PRODUCTS_V0 = pd.DataFrame({
    "shop": ["a", "a", "b", "b"], "sku": [1, 2, 1, 3],
    "title": ["tv", "radio", "book", "pen"], "price": [100.0, 20.0, 8.0, 1.5],
})


def users_at(version: int) -> pd.DataFrame:
    """dim_users as of ``version``, by pandas: v1 user 1 VIP, v2 user 6 deleted, v3 users
    7 and 9 inserted (9 with a null segment), v4 user 2's ltv updated and user 3 deleted."""
    u = USERS_V0.copy()
    if version >= 1:
        u.loc[u.user_id == 1, "segment"] = "VIP"
    if version >= 2:
        u = u[u.user_id != 6]
    if version >= 3:
        u = pd.concat([u, pd.DataFrame({"user_id": [7, 9], "segment": ["REGULAR", None],
                                        "ltv": [7.0, 9.5]})], ignore_index=True)
    if version >= 4:
        u.loc[u.user_id == 2, "ltv"] = 300.0
        u = u[u.user_id != 3]
    return u.reset_index(drop=True)


def products_at(version: int) -> pd.DataFrame:
    """dim_products as of ``version``: v1 (a, 1) costs 90, (b, 1) deleted, (a, 3) new."""
    p = PRODUCTS_V0.copy()
    if version >= 1:
        p.loc[(p.shop == "a") & (p.sku == 1), "price"] = 90.0
        p = p[~((p.shop == "b") & (p.sku == 1))]
        p = pd.concat([p, pd.DataFrame({"shop": ["a"], "sku": [3], "title": ["lamp"],
                                        "price": [30.0]})], ignore_index=True)
    return p.reset_index(drop=True)


def write_version(spark, paths: dict[str, str], table: str, version: int) -> None:
    """Make ``version`` of ``table`` on S3 with the Delta commands the model mirrors."""
    path = paths[table]
    sql = {
        ("dim_users", 1): [f"UPDATE delta.`{path}` SET segment = 'VIP' WHERE user_id = 1"],
        ("dim_users", 2): [f"DELETE FROM delta.`{path}` WHERE user_id = 6"],
        ("dim_users", 3): [f"INSERT INTO delta.`{path}` VALUES (7, 'REGULAR', 7.0), "
                           f"(9, NULL, 9.5)"],
        ("dim_users", 4): [f"MERGE INTO delta.`{path}` t USING (SELECT 2 AS id, 300.0D AS "
                           f"ltv UNION ALL SELECT 3, NULL) s ON t.user_id = s.id WHEN "
                           f"MATCHED AND s.ltv IS NULL THEN DELETE WHEN MATCHED THEN UPDATE "
                           f"SET ltv = s.ltv"],
        ("dim_products", 1): [
            f"MERGE INTO delta.`{path}` t USING (SELECT 'a' AS shop, 1L AS sku, 'tv' AS "
            f"title, 90.0D AS price, false AS gone UNION ALL SELECT 'b', 1L, 'book', 8.0D, "
            f"true UNION ALL SELECT 'a', 3L, 'lamp', 30.0D, false) s ON t.shop = s.shop AND "
            f"t.sku = s.sku WHEN MATCHED AND s.gone THEN DELETE WHEN MATCHED THEN UPDATE "
            f"SET price = s.price WHEN NOT MATCHED THEN INSERT (shop, sku, title, price) "
            f"VALUES (s.shop, s.sku, s.title, s.price)"],
    }[(table, version)]
    for statement in sql:
        spark.sql(statement).collect()
    assert delta_io.latest_version(path) == version  # read by deltalake, not Spark


def events(spark, batch: int, tasks: int = TASKS):
    """Batch ``batch``'s events, computed from ids in ``tasks`` partitions (a range has
    no preferred executor, so both executors take tasks)."""
    from pyspark.sql import functions as F

    start = batch * 10_000
    i = F.col("id")
    return spark.range(start, start + EVENTS_PER_BATCH, 1, tasks).select(
        i.alias("event_id"),
        F.when(i % 13 == 0, F.lit(None)).otherwise(i % 11).alias("user_id"),
        F.when(i % 5 == 4, "z").when(i % 2 == 0, "a").otherwise("b").alias("store"),
        F.when(i % 17 == 0, F.lit(None)).otherwise(i % 4).alias("item"))


def events_model(batch: int) -> pd.DataFrame:
    """:func:`events` in pandas."""
    ids = pd.Series(range(batch * 10_000, batch * 10_000 + EVENTS_PER_BATCH), dtype="int64")
    return pd.DataFrame({
        "event_id": ids,
        "user_id": (ids % 11).astype("Int64").mask(ids % 13 == 0),
        "store": ["z" if x % 5 == 4 else "a" if x % 2 == 0 else "b" for x in ids],
        "item": (ids % 4).astype("Int64").mask(ids % 17 == 0),
    })


def model(ev: pd.DataFrame, users: pd.DataFrame, products: pd.DataFrame
          ) -> tuple[pd.DataFrame, list[int]]:
    """pandas: left joins; the user defaults only where the key has no row (a matched
    null stays null); a product miss goes to ``unmatched``."""
    u = users.assign(_mu=True)
    p = products.rename(columns={"shop": "store", "sku": "item", "title": "product",
                                 "price": "product_price"}).assign(_mp=True)
    out = ev.merge(u, on="user_id", how="left").merge(p, on=["store", "item"], how="left")
    out.loc[out["_mu"].isna(), "segment"] = "NEW"
    out.loc[out["_mu"].isna(), "ltv"] = -1.0
    unmatched = sorted(out[out["_mp"].isna()]["event_id"])
    main = out[out["_mp"].notna()].drop(columns=["_mu", "_mp"])
    return main.sort_values("event_id").reset_index(drop=True), unmatched


def check_batch(runtime: BroadcastRuntime, spark, batch: int, versions: dict[str, int]
                ) -> list[dict]:
    """Run batch ``batch`` at ``versions``: its rows equal the model; returns its
    accounting rows (one per executor JVM that held the state)."""
    out = runtime.process(events(spark, batch), until=versions).collect()
    want_main, want_unmatched = model(events_model(batch), users_at(versions["dim_users"]),
                                      products_at(versions["dim_products"]))
    got = out.main.to_pandas().sort_values("event_id").reset_index(drop=True)
    lineage = json.dumps(versions, separators=(",", ":"), sort_keys=True)
    assert set(got["_state_version"]) == {lineage}
    assert len(want_main) > 0 and len(want_unmatched) > 0
    pd.testing.assert_frame_equal(got[list(want_main.columns)], want_main, check_dtype=False)
    assert sorted(out.sides["unmatched"].column("event_id").to_pylist()) == want_unmatched
    rows = out.task_rows
    assert sum(r["events_in"] for r in rows) == EVENTS_PER_BATCH
    return rows


class SlowPriced(Priced):
    """:class:`Priced` whose transform, in a task, first writes a marker
    ``<partition>-<attempt>-<pid>`` holding its Python worker's working directory (which
    names the Spark worker and executor) into ``markers``, then sleeps ``delay`` s (its
    lookups stay in the executor JVM: the tutorial's shape)."""

    markers = ""
    delay = 0.0

    def transform(self, batch: pa.RecordBatch, ctx) -> pa.RecordBatch:
        from pyspark import TaskContext

        tc = TaskContext.get()
        if tc is not None and self.markers:  # not the planning probe on the client
            name = f"{tc.partitionId()}-{tc.attemptNumber()}-{os.getpid()}"
            Path(self.markers, name).write_text(os.getcwd())
            time.sleep(self.delay)
        return super().transform(batch, ctx)


def check_priced(out, batch: int) -> None:
    """A :class:`Priced` batch at users v4 / products v1: its rows equal pandas and every
    event is counted once."""
    want_main, want_unmatched = model(events_model(batch), users_at(4), products_at(1))
    got = out.main.to_pandas().sort_values("event_id").reset_index(drop=True)
    want_main = priced_model(want_main)
    pd.testing.assert_frame_equal(got[list(want_main.columns)], want_main, check_dtype=False)
    assert sorted(out.sides["unmatched"].column("event_id").to_pylist()) == want_unmatched
    assert sum(r["events_in"] for r in out.task_rows) == EVENTS_PER_BATCH


# -- the cluster's processes ------------------------------------------------------------
def executors(cluster: Cluster) -> dict[int, str]:
    """pid -> working directory of every executor JVM of the cluster (the worker's work
    dir ``.../worker-<i>/app-<id>/<executor id>``)."""
    out = {}
    for pid in cluster.processes():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if EXECUTOR_CLASS.encode() in cmd:
            out[pid] = cwd
    return out


def wait_for(what: str, cond, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out ({timeout:.0f} s) waiting for {what}"
        time.sleep(0.2)


def s3_keys(settings: Settings, endpoint: str, prefix: str) -> list[str]:
    """The object keys under ``prefix`` of the bucket (boto3 against moto)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id="test-key", aws_secret_access_key="test-secret")
    keys, token = [], None
    while True:
        page = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix,
                                  **({"ContinuationToken": token} if token else {}))
        keys += [o["Key"] for o in page.get("Contents", [])]
        token = page.get("NextContinuationToken")
        if not token:
            return keys


def local_state_files(*roots: Path) -> dict[Path, float]:
    """Every local JVM state folder under ``roots`` (the default names) and every file in
    them, with its mtime (other tests of the run may have left some in the project's
    ``var/``: this test must add none)."""
    found: dict[Path, float] = {}
    for root in roots:
        if root.exists():
            for folder in root.rglob("*"):
                if folder.is_dir() and folder.name in ("_jvm-state", "jvm-state"):
                    found[folder] = 0.0
                    found.update({f: f.stat().st_mtime for f in folder.rglob("*")})
    return found


def test_jvm_lookups_on_a_cluster_read_their_state_from_s3_and_survive_an_executor_kill(
        s3_cluster, tmp_path):
    started = time.monotonic()
    cluster, settings, endpoint = s3_cluster
    local_before = local_state_files(settings.var_dir, tmp_path)
    assert settings.jvm_state_dir == f"{PREFIX}/checkpoints/_jvm-state"
    spark = get_spark(settings=settings)
    paths = {"dim_users": settings.table_path("dim_users"),
             "dim_products": settings.table_path("dim_products")}
    assert all(p.startswith("s3a://") for p in paths.values())
    delta_io.write(spark.createDataFrame(USERS_V0), paths["dim_users"], mode="overwrite")
    delta_io.write(spark.createDataFrame(PRODUCTS_V0), paths["dim_products"],
                   mode="overwrite")

    runtime = BroadcastRuntime(spark, function(), paths, function_id="jvm-s3-lookups")
    assert runtime.state_engine == "jvm", runtime.state_engine_reason
    assert runtime.jvm is not None
    assert runtime.jvm.root.startswith(f"{PREFIX}/checkpoints/_jvm-state/jvm-s3-lookups@")
    wait_for("two executors", lambda: len(executors(cluster)) == 2, timeout=60)
    try:
        # batches 0-3: users v0 -> v3 (update, delete, insert), products v0 -> v1 (a merge
        # that updates, deletes and inserts); each JVM is cold once, then warm
        seen: set[int] = set()
        schedule = [{"dim_users": 0, "dim_products": 0}, {"dim_users": 1, "dim_products": 0},
                    {"dim_users": 2, "dim_products": 1}, {"dim_users": 3, "dim_products": 1}]
        for batch, versions in enumerate(schedule):
            for table, v in versions.items():
                if v and delta_io.latest_version(paths[table]) < v:
                    write_version(spark, paths, table, v)
            rows = check_batch(runtime, spark, batch, versions)
            pids = {r["pid"] for r in rows}
            assert pids <= set(executors(cluster)), (rows, executors(cluster))
            for r in rows:
                assert r["cache"] == ("warm" if r["pid"] in seen else "cold"), (batch, rows)
                assert r["state_bytes"] > 0
            seen |= pids
        assert seen == set(executors(cluster)), "a batch ran on one executor only"

        # the executors fetched the S3A and AWS SDK JARs from the driver (spark.jars); no
        # credentials in their environment: they read the state with the driver's settings
        for pid, cwd in executors(cluster).items():
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert not [e for e in env if e.startswith((b"LAKECAST_SPARK_CONF=", b"AWS_ACCESS",
                                                        b"AWS_SECRET", b"HADOOP_CONF_DIR="))]
            fetched = {p.name for p in Path(cwd).glob("*.jar")}
            assert "hadoop-aws-3.5.0.jar" in fetched and "s3-2.35.4.jar" in fetched, fetched

        # kill -9 the executor JVM of worker-1: the master launches a new one for the app
        before = executors(cluster)
        (victim,) = [pid for pid, cwd in before.items() if "/worker-1/" in cwd]
        os.kill(victim, signal.SIGKILL)
        wait_for("the killed executor gone", lambda: victim not in executors(cluster), 30)
        wait_for("a replacement executor",
                 lambda: len(set(executors(cluster)) - set(before)) == 1
                 and len(executors(cluster)) == 2, timeout=90)
        (fresh,) = set(executors(cluster)) - set(before)
        # the driver knows it (a probe job runs on both executors)
        wait_for("two executors taking tasks", lambda: len(ch.executors_of(spark)) == 2, 90)

        # batch 4 at batch 3's versions: no Delta read runs before it (nothing new to
        # read), so the replacement's first task is a lookup: it rebuilds the state from
        # the chain on S3 (the bases and four changes files) with its own credentials
        rows = check_batch(runtime, spark, 4, schedule[-1])
        by_pid = {r["pid"]: r for r in rows}
        assert fresh in by_pid, (fresh, rows)
        cold = [r for r in rows if r["cache"] == "cold"]
        assert [r["pid"] for r in cold] == [fresh], rows  # the cold start is counted
        assert by_pid[fresh]["apply_seconds"] > 0 and by_pid[fresh]["state_bytes"] > 0
        assert all(r["cache"] == "warm" for r in rows if r["pid"] != fresh), rows

        # batch 5 at a new version (a merge that updates and deletes): both apply only
        # v4's changes
        write_version(spark, paths, "dim_users", 4)
        rows = check_batch(runtime, spark, 5, {"dim_users": 4, "dim_products": 1})
        assert all(r["cache"] == "warm" for r in rows), rows
        assert {r["pid"] for r in rows} <= set(executors(cluster)), rows

        # the tutorial's shape on the cluster: an Enrichment overriding transform, its
        # lookups in the executor JVMs (a runtime of its own: each JVM builds it cold from
        # S3), its transform after them; the same rows as pandas
        last = {"dim_users": 4, "dim_products": 1}
        transformed = BroadcastRuntime(spark, priced(), paths, function_id="jvm-s3-priced")
        try:
            assert transformed.state_engine == "jvm", transformed.state_engine_reason
            out = transformed.process(events(spark, 6), until=last).collect()
            check_priced(out, 6)
            assert {r["cache"] for r in out.task_rows} == {"cold"}
            assert {r["pid"] for r in out.task_rows} <= set(executors(cluster))
        finally:
            transformed.close()

        # a kill mid-run, the tutorial's shape: a batch warms both executors, then the
        # next one's transform takes 2.5 s a task (8 tasks) and the executor JVM of
        # worker-1 is killed -9 while it runs one: the lost task runs again, the master's
        # replacement JVM takes tasks and rebuilds the state from the chain on S3; the
        # rows still equal pandas, each event counted once, that JVM counted cold
        base = function()
        slow = SlowPriced(base.lookups, on_missing=base.on_missing)
        slowed = BroadcastRuntime(spark, slow, paths, function_id="jvm-s3-slow")

        try:
            assert slowed.state_engine == "jvm", slowed.state_engine_reason
            warm = slowed.process(events(spark, 7), until=last).collect()
            check_priced(warm, 7)
            assert {r["pid"] for r in warm.task_rows} == set(executors(cluster)), \
                warm.task_rows
            marks = tmp_path / "markers"
            marks.mkdir()
            slow.markers, slow.delay = str(marks), 2.5
            outcome: dict[str, object] = {}

            def run() -> None:
                try:
                    outcome["out"] = slowed.process(events(spark, 8, tasks=8),
                                                    until=last).collect()
                except BaseException as e:  # reported by the assertion below
                    outcome["error"] = e

            before = executors(cluster)
            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            wait_for("a task on worker-1", lambda: any(
                "/worker-1/" in cwd for cwd in ch.markers(str(marks)).values())
                or not thread.is_alive(), timeout=60)
            (victim,) = [pid for pid, cwd in before.items() if "/worker-1/" in cwd]
            os.kill(victim, signal.SIGKILL)
            thread.join(timeout=120)
            assert not thread.is_alive(), "the batch did not finish after the kill"
            assert "error" not in outcome, outcome.get("error")
            out = outcome["out"]
            check_priced(out, 8)
            attempts = ch.markers(str(marks))  # <partition>-<attempt>-<pid>: cwd
            assert any(n.split("-")[1] != "0" for n in attempts), \
                f"no lost task ran again: {attempts}"
            (fresh,) = set(executors(cluster)) - set(before)
            by_pid = {r["pid"]: r for r in out.task_rows}
            assert victim not in by_pid, out.task_rows  # its lost attempt is not counted
            assert fresh in by_pid, (fresh, out.task_rows)  # the replacement took tasks
            assert by_pid[fresh]["cache"] == "cold" and by_pid[fresh]["state_bytes"] > 0
            assert all(r["cache"] == "warm" for p, r in by_pid.items() if p != fresh), \
                out.task_rows
        finally:
            slowed.close()

        # the state chain is on S3, nowhere local: the bases of both tables and every
        # version's changes (no rebase happened in between)
        assert len(runtime.chain) == 5
        state_prefix = settings.jvm_state_dir.removeprefix(f"s3a://{BUCKET}/")
        keys = s3_keys(settings, endpoint, state_prefix)
        folder = f"{state_prefix}/{runtime.jvm.folder}/"
        assert sum(k.endswith(".full.arrow") for k in keys if k.startswith(folder)) == 2, keys
        assert sum(k.endswith(".changes.arrow") for k in keys if k.startswith(folder)) == 5
        assert any(k.endswith(".manifest") for k in keys if k.startswith(folder))
        assert objstore.is_object_store(settings.jvm_state_dir)
    finally:
        runtime.close()
    assert local_state_files(settings.var_dir, tmp_path) == local_before
    assert time.monotonic() - started < TEST_BUDGET_S
