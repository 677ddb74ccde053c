"""The soak's other moving parts (:mod:`benchmarks.soak`): broadcast changes, the keyed
fraud pipeline beside the enrichment, per-minute samples, and the checks at the end.

* :class:`BroadcastChanges`: one broadcast-table change per call, cycling through a
  ``feature_flags`` version (``assets.flags``), a ``dim_products`` version (raw
  products changed by ``datagen.refresh_dimensions``, then ``dimension_refresh_job`` run
  through Dagster: ``dagster job execute``) and a ``user_segments`` version (the next
  partition day of ``user_features,user_segments``: ``dagster asset materialize``);
* :class:`FraudFeed`: the fraud pipeline's rules and a transactions producer (its
  ``fraud_sensor`` in ``dagster dev`` starts the ``fraud_microbatch`` runs);
* :func:`minute_sample`: keyed state (live keys, bytes), snapshot table and checkpoint
  root bytes, the Spark server's JVM and its Python workers' RSS;
* :func:`check_lineage`: every enriched row's category, price, segment and discount equal
  the broadcast tables at the row's ``_state_version`` (Delta time travel, pandas);
* :func:`check_restore`: restore the newest checkpoint, redo the abandoned batches as
  planned and catch up, compare the outputs with before, row for row;
* :func:`maintenance_runs`: the scheduled ``lake_maintenance_job`` and
  ``fraud_maintenance_job`` runs.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from lakecast.config import Settings

#: the repository root (this example project's folder)
PROJECT_ROOT = Path(__file__).resolve().parents[1]

PYSPARK_WORKER = ("pyspark.daemon", "pyspark.worker")
DAGSTER = str(Path(sys.executable).with_name("dagster"))


def dir_bytes(path: str) -> int:
    """Bytes of the files under ``path`` (0 when it does not exist)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):  # removed meanwhile (VACUUM)
                total += os.path.getsize(os.path.join(dirpath, f))
    return total


def slope_per_min(ts: list[float], xs: list[float]) -> float | None:
    """Least-squares slope of ``xs`` over ``ts`` (seconds), per minute."""
    n = len(xs)
    if n < 2:
        return None
    mt, mx = sum(ts) / n, sum(xs) / n
    var = sum((t - mt) ** 2 for t in ts)
    if var == 0:
        return None
    return round(60 * sum((t - mt) * (x - mx) for t, x in zip(ts, xs, strict=True)) / var, 3)


def series(samples: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Max, first, last and slope per minute of one sampled figure."""
    pts = [(s["t_s"], s[key]) for s in samples if s.get(key) is not None]
    xs = [x for _, x in pts]
    return {"n": len(xs), "first": xs[0] if xs else None, "last": xs[-1] if xs else None,
            "max": max(xs, default=None),
            "slope_per_min": slope_per_min([t for t, _ in pts], xs)}


def _dagster(args: list[str], env: dict[str, str], what: str) -> None:
    """Run a ``dagster`` CLI command against the soak's instance and code; raise on failure."""
    out = subprocess.run([DAGSTER, *args, "-m", "jobs.definitions"], cwd=PROJECT_ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {out.returncode}): {out.stderr[-2000:]}")


class BroadcastChanges:
    """A broadcast change per :meth:`step`: flag, dim_products, user_segments, in turn."""

    def __init__(self, spark: Any, settings: Settings, env: dict[str, str],
                 last_day: str) -> None:
        self.spark, self.settings, self.env = spark, settings, env
        self.day = date.fromisoformat(last_day)
        self.done: list[dict[str, Any]] = []

    def _version(self, table: str) -> int | None:
        from lakecast.delta import io as delta_io

        return delta_io.latest_version(self.settings.table_path(table))

    def flag(self, n: int) -> dict[str, Any]:
        from assets import flags

        value = str(10 + n % 10)
        m = flags.set_flag(self.spark, self.settings.table_path("feature_flags"),
                           "vip_discount", value)
        return {"table": "feature_flags", "value": value, "version": m.version}

    def products(self, n: int) -> dict[str, Any]:
        """Prices of ~8% of raw products change (a few are replaced), then the Dagster job
        MERGEs them into dim_products."""
        from assets import datagen
        from assets.tables import DIM_PRODUCTS

        before = self._version(DIM_PRODUCTS)
        res = datagen.refresh_dimensions(self.spark, self.settings, seed=500 + n, fraction=0.1)
        _dagster(["job", "execute", "-j", "dimension_refresh_job"], self.env,
                 "dimension_refresh_job")
        return {"table": DIM_PRODUCTS, "raw_products_changed": list(res.products),
                "version_before": before, "version": self._version(DIM_PRODUCTS)}

    def segments(self, n: int) -> dict[str, Any]:
        """The next partition day of user_features and user_segments, through Dagster."""
        from assets.tables import USER_SEGMENTS

        del n
        before = self._version(USER_SEGMENTS)
        self.day += timedelta(days=1)
        _dagster(["asset", "materialize", "--select", "user_features,user_segments",
                  "--partition", self.day.isoformat()], self.env,
                 f"user_segments partition {self.day}")
        return {"table": USER_SEGMENTS, "partition": self.day.isoformat(),
                "version_before": before, "version": self._version(USER_SEGMENTS)}

    def step(self) -> dict[str, Any]:
        n = len(self.done)
        kind = (self.flag, self.products, self.segments)[n % 3]
        t0 = time.monotonic()
        rec = {**kind(n // 3 + 1), "seconds": round(time.monotonic() - t0, 1)}
        self.done.append(rec)
        return rec


class FraudFeed:
    """The fraud pipeline's input: its demo rules once, then transactions commits."""

    def __init__(self, spark: Any, settings: Settings, users: int = 200,
                 merchants: int = 100) -> None:
        from jobs.fraud.defs import FRAUD_RULES, TRANSACTIONS
        from jobs.fraud.tables import DEMO_RULES, write_rules

        self.spark, self.users, self.merchants = spark, users, merchants
        self.path = settings.table_path(TRANSACTIONS)
        write_rules(spark, settings.table_path(FRAUD_RULES), DEMO_RULES)
        self.next_id, self.ts = 0, int(time.time() * 1000)
        self.commits: list[dict[str, int | None]] = []

    def commit(self, count: int) -> dict[str, int | None]:
        from jobs.fraud.tables import append_transactions, demo_transactions

        rows = demo_transactions(len(self.commits) + 1, count, self.next_id, self.ts,
                                 users=self.users, merchants=self.merchants)
        version = append_transactions(self.spark, self.path, rows)
        self.next_id, self.ts = self.next_id + count, max(self.ts, rows[-1]["ts"])
        rec = {"version": version, "rows": count}
        self.commits.append(rec)
        return rec


def keyed_state(path: str) -> dict[str, int | None]:
    """Keys of the keyed state table now (newest row per key, no tombstones), those whose
    TTL has not expired, and their state bytes; the table's bytes on disk. Read from the
    Delta log and Parquet files (no Spark)."""
    import pyarrow.compute as pc

    from lakecast.delta import io as delta_io
    from lakecast.runtime.keyed_store import newest_rows
    from lakecast.runtime.keyed_tasks import EXPIRES, GROUP, STATE

    version = delta_io.latest_version(path)
    if version is None:
        return {"keys": None, "live_keys": None, "state_bytes": None, "disk_bytes": 0,
                "log_bytes": 0}
    rows = newest_rows(delta_io.table_files(path, version).read())
    rows = rows.filter(pc.greater_equal(rows.column(GROUP), 0))
    now = int(time.time() * 1000)
    expires = rows.column(EXPIRES)
    live = pc.or_(pc.is_null(expires), pc.greater(pc.fill_null(expires, 0), now))
    sizes = pc.binary_length(rows.column(STATE))
    return {"version": version, "keys": rows.num_rows,
            "live_keys": int(pc.sum(pc.cast(live, "int64")).as_py() or 0),
            "state_bytes": int(pc.sum(sizes).as_py() or 0), "disk_bytes": dir_bytes(path),
            "log_bytes": dir_bytes(os.path.join(path, "_delta_log"))}


def live_heap(pid: int) -> dict[str, Any]:
    """The JVM's live heap: ``jcmd GC.run`` (a full GC), then ``GC.heap_info``'s used and
    committed heap (MiB). RSS alone cannot tell a leak from a heap G1 grows and shrinks."""
    import re

    try:
        subprocess.run(["jcmd", str(pid), "GC.run"], capture_output=True, timeout=120,
                       check=True)
        info = subprocess.run(["jcmd", str(pid), "GC.heap_info"], capture_output=True,
                              text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return {"driver_heap_error": f"{type(e).__name__}: {e}"[:300]}
    m = re.search(r"heap\s+total (\d+)K, used (\d+)K", info)
    if m is None:
        return {"driver_heap_error": f"no heap line in: {info[:300]}"}
    return {"driver_live_heap_mib": round(int(m[2]) / 1024, 1),
            "driver_heap_committed_mib": round(int(m[1]) / 1024, 1)}


def minute_sample(settings: Settings, procs: dict[int, tuple[int, int, str]],
                  spark_tree: set[int], spark_pid: int | None) -> dict[str, Any]:
    """One per-minute sample (MiB for memory, bytes for storage)."""
    from jobs.fraud.defs import FRAUD
    from lakecast.snapshots.checkpointer import snapshot_path

    workers = [p for p in spark_tree if any(w in procs[p][2] for w in PYSPARK_WORKER)]
    out: dict[str, Any] = {
        "driver_jvm_mib": round(procs[spark_pid][1] / 2**20, 1) if spark_pid in procs else None,
        **(live_heap(spark_pid) if spark_pid in procs else {}),
        "python_workers": len(workers),
        "python_workers_mib": round(sum(procs[p][1] for p in workers) / 2**20, 1),
        "snapshot_bytes": dir_bytes(snapshot_path(settings, "enrichment")),
        "snapshot_log_bytes": dir_bytes(os.path.join(snapshot_path(settings, "enrichment"),
                                                     "_delta_log")),
        "checkpoint_root_bytes": dir_bytes(settings.checkpoint_root),
    }
    try:
        fraud = keyed_state(settings.table_path(FRAUD.state_table or ""))
    except Exception as e:  # a sample must not end the soak: record why
        fraud = {"error": f"{type(e).__name__}: {e}"[:300]}
    out.update({f"fraud_state_{k}": v for k, v in fraud.items()})
    return out


def check_lineage(spark: Any, settings: Settings) -> dict[str, Any]:
    """Every enriched row against the broadcast tables at its ``_state_version``."""
    import pandas as pd

    from assets.tables import DIM_PRODUCTS, USER_SEGMENTS
    from jobs.storefront.enrichment import vip_discount_pct

    rows = (spark.read.format("delta").load(settings.table_path("enriched_events"))
            .select("event_id", "user_id", "product_id", "product_category", "product_price",
                    "segment", "vip_discount_pct", "_state_version").toPandas())
    sv = rows["_state_version"].map(json.loads)
    for t in (DIM_PRODUCTS, USER_SEGMENTS, "feature_flags"):
        rows[f"v_{t}"] = sv.map(lambda d, t=t: d.get(t))
    cache: dict[tuple[str, int], pd.DataFrame] = {}

    def at(table: str, version: int) -> pd.DataFrame:
        if (table, version) not in cache:
            cache[(table, version)] = (spark.read.format("delta")
                                       .option("versionAsOf", int(version))
                                       .load(settings.table_path(table)).toPandas())
        return cache[(table, version)]

    bad: dict[str, int] = {"category": 0, "price": 0, "segment": 0, "vip_discount_pct": 0,
                           "unchecked": 0}
    checked = 0
    examples: list[dict[str, Any]] = []
    for (vp, vs, vf), g in rows.groupby(
            [f"v_{DIM_PRODUCTS}", f"v_{USER_SEGMENTS}", "v_feature_flags"]):
        prods = at(DIM_PRODUCTS, vp).set_index("product_id")
        segs = at(USER_SEGMENTS, vs).set_index("user_id")["segment"]
        flags = at("feature_flags", vf).set_index("flag")
        flag = flags.loc["vip_discount"] if "vip_discount" in flags.index else None
        pct = vip_discount_pct(flag["value"]) if flag is not None and flag["enabled"] else 0.0
        checked += len(g)
        cat = g["product_id"].map(prods["category"])
        price = g["product_id"].map(prods["price"].astype(float))
        seg = g["user_id"].map(segs).fillna("NEW")
        disc = (seg == "VIP").map({True: pct, False: 0.0})
        checks = {"category": cat != g["product_category"],
                  "price": (price - g["product_price"].astype(float)).abs() > 1e-6,
                  "segment": seg != g["segment"],
                  "vip_discount_pct": (disc - g["vip_discount_pct"]).abs() > 1e-9}
        for k, miss in checks.items():
            bad[k] += int(miss.sum())
            if miss.any() and len(examples) < 5:
                row = g[miss].iloc[0]
                examples.append({"check": k, "versions": [int(vp), int(vs), int(vf)],
                                 **{c: int(row[c]) for c in ("event_id", "product_id",
                                                             "user_id")}})
    bad["unchecked"] = len(rows) - checked  # a version missing from _state_version
    seen = {t: sorted({int(v) for v in rows[f"v_{t}"].dropna()})
            for t in (DIM_PRODUCTS, USER_SEGMENTS, "feature_flags")}
    return {"rows": len(rows), "mismatches": bad, "examples": examples,
            "versions_seen": seen, "ok": len(rows) > 0 and not any(bad.values())}


RESTORE_SKIPPED_COLUMNS = ("batch_id",)  # a redone batch has a fresh batch id


def _content(df: Any) -> Any:
    """``df``'s rows as compared by :func:`check_restore`: every column but
    :data:`RESTORE_SKIPPED_COLUMNS`, sorted by name (map columns as JSON: ``exceptAll``
    cannot compare maps)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import MapType

    cols = sorted(c for c in df.columns if c not in RESTORE_SKIPPED_COLUMNS)
    return df.select(*(F.to_json(c).alias(c) if isinstance(df.schema[c].dataType, MapType)
                       else F.col(c) for c in cols))


def _example(row: Any) -> dict[str, Any]:
    d = row.asDict()
    if "event_id" in d:
        return {"event_id": d["event_id"], "_state_version": d.get("_state_version")}
    return {k: str(v)[:160] for k, v in d.items() if k in ("raw_record", "reason")}


def compare_content(spark: Any, path: str, before_version: int) -> dict[str, Any]:
    """The table at ``path`` now against its version ``before_version``, row for row as
    multisets (``exceptAll`` both ways): ``missing`` rows of before that are not in it now
    (as often), ``extra`` rows now that were not before."""
    before = _content(spark.read.format("delta").option("versionAsOf", int(before_version))
                      .load(path))
    after = _content(spark.read.format("delta").load(path))
    if before.columns != after.columns:
        return {"columns_before": before.columns, "columns_after": after.columns,
                "same": False}
    missing, extra = before.exceptAll(after), after.exceptAll(before)
    n_missing, n_extra = missing.count(), extra.count()
    return {"rows_before": before.count(), "rows_after": after.count(),
            "missing": n_missing, "extra": n_extra,
            "examples_missing": [_example(r) for r in missing.limit(3).collect()]
            if n_missing else [],
            "examples_extra": [_example(r) for r in extra.limit(3).collect()]
            if n_extra else [],
            "same": n_missing == 0 and n_extra == 0}


def catch_up_as_planned() -> dict[str, Any]:
    """After a rewind: redo each batch the rewind abandoned with its original plan's bounds
    (events up to its ``events_end``, the broadcast tables at its versions; what the
    sensor's runs do with the versions they were requested for), then catch up with the
    tables. Run in its own process (``python -m benchmarks.soak_parts
    --catch-up-as-planned``), on the pipeline's server-side session as the CLI does."""
    from jobs.storefront.pipeline import ENRICHMENT, build_pipeline
    from lakecast.config import get_settings
    from lakecast.pipeline.progress import progress_path, read_log
    from lakecast.spark import get_spark

    settings = get_settings()
    plans, commits = read_log(progress_path(settings.checkpoint_root, ENRICHMENT.name))
    rewind = [p for p in plans if p.is_restore][-1]
    assert rewind.restore_of is not None
    original = [p for p in plans if rewind.restore_of < p.batch_id < rewind.batch_id
                and p.batch_id in commits and not p.is_restore]
    spark = get_spark(app_name="lakecast-microbatch", session=f"pipeline:{ENRICHMENT.name}")
    pipeline = build_pipeline(spark, settings)

    def plan(p: Any) -> dict[str, Any]:
        return {"events": [p.events_start, p.events_end],
                "broadcast_versions": dict(sorted(p.broadcast_versions.items()))}

    redone, mismatched = [], []
    for p in original:
        for r in pipeline.run(until={ENRICHMENT.events_table: p.events_end,
                                     **p.broadcast_versions}):
            redone.append({"batch_id": r.plan.batch_id, "redoes": p.batch_id})
            if plan(r.plan) != plan(p):
                mismatched.append({"batch_id": r.plan.batch_id, "planned": plan(r.plan),
                                   "redoes": p.batch_id, "original": plan(p)})
    rest = [r.plan.batch_id for r in pipeline.run()]
    return {"rewind_batch": rewind.batch_id, "restore_of": rewind.restore_of,
            "original_batches": [p.batch_id for p in original], "redone": redone,
            "plans_mismatched": mismatched, "caught_up_after": rest}


def check_restore(spark: Any, settings: Settings, env: dict[str, str]) -> dict[str, Any]:
    """Restore the enrichment pipeline's newest checkpoint (``lakecast snapshots restore``'s
    path), redo the abandoned batches as planned and catch up (:func:`catch_up_as_planned`,
    its own process), then compare each output with its version before the restore, row
    for row (:func:`compare_content`; every column but the batch id).

    ``ok``: the catch-up exited 0, redid every abandoned batch with its original plan, and
    every output holds exactly the rows it held before (as multisets)."""
    from jobs.storefront.pipeline import OUTPUTS
    from lakecast.delta import io as delta_io
    from lakecast.snapshots.checkpointer import restore_checkpoint

    paths = {t: settings.table_path(t) for t, _ in OUTPUTS}
    before = {t: delta_io.latest_version(p) for t, p in paths.items()}
    plan, restored = restore_checkpoint(spark, settings, "enrichment")
    rolled = {t: spark.read.format("delta").load(p).count() for t, p in paths.items()}
    run = subprocess.run([sys.executable, "-m", "benchmarks.soak_parts",
                          "--catch-up-as-planned"], cwd=PROJECT_ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    try:
        catch_up = json.loads(run.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        catch_up = None
    content = {t: compare_content(spark, p, before[t]) if before[t] is not None
               else {"same": False, "error": "no table before the restore"}
               for t, p in paths.items()}
    as_planned = (catch_up is not None and not catch_up["plans_mismatched"]
                  and len(catch_up["redone"]) == len(catch_up["original_batches"]))
    same_rows = all(c["same"] for c in content.values())
    return {"checkpoint_id": restored.header.checkpoint_id,
            "batch_id": restored.header.batch_id, "skipped": list(restored.skipped),
            "rollback_to": plan.rollback_to, "versions_before": before,
            "rows_after_rollback": rolled, "catch_up": catch_up,
            "catch_up_exit": run.returncode,
            "catch_up_stderr": run.stderr[-1500:] if run.returncode else "",
            "content": content, "redone_as_planned": as_planned, "same_rows": same_rows,
            "ok": run.returncode == 0 and as_planned and same_rows}


def maintenance_runs(instance: Any, excused: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The ``lake_maintenance_job`` and ``fraud_maintenance_job`` runs (started by their
    schedules), their statuses and the tables each maintained. A run in ``excused`` (run
    ids: the Spark server was killed under it) is reported, its failure not counted."""
    from dagster import DagsterEventType, RunsFilter

    from jobs.fraud.defs import FRAUD_PIPELINE
    from jobs.storefront.pipeline import MAINTENANCE_JOB

    def maintained(run_id: str) -> list[str]:  # the tables it observed (maintained)
        return sorted(e.dagster_event.asset_key.to_user_string() for e in instance.all_logs(
            run_id, of_type=DagsterEventType.ASSET_OBSERVATION)
            if e.dagster_event and e.dagster_event.asset_key)

    def failure(run_id: str) -> str | None:
        errs = [e.dagster_event.event_specific_data.error.message for e in instance.all_logs(
            run_id, of_type=DagsterEventType.STEP_FAILURE)
            if e.dagster_event and getattr(e.dagster_event.event_specific_data, "error", None)]
        return errs[0].split("\n")[0][:300] if errs else None

    jobs = (MAINTENANCE_JOB, FRAUD_PIPELINE.handle.maintenance_job_name)
    recs = [r for job in jobs for r in instance.get_run_records(RunsFilter(job_name=job))]
    runs = [{"run_id": r.dagster_run.run_id[:8], "job": r.dagster_run.job_name,
             "status": r.dagster_run.status.value,
             "scheduled": r.dagster_run.tags.get("dagster/schedule_name"),
             "seconds": round(r.end_time - r.start_time, 1)
             if r.start_time and r.end_time else None, "end_time": r.end_time,
             "maintained": maintained(r.dagster_run.run_id),
             "failure": failure(r.dagster_run.run_id),
             "server_killed": r.dagster_run.run_id in excused} for r in recs]
    succeeded = {job: sum(r["status"] == "SUCCESS" and r["job"] == job for r in runs)
                 for job in jobs}
    return {"runs": runs, "succeeded": succeeded,
            "ok": all(succeeded.values()) and not any(
                r["status"] == "FAILURE" and not r["server_killed"] for r in runs)}


def storage_bounded(minute: list[dict[str, Any]], disk: str, log: str, cuts: Sequence[float],
                    state: str | None = None) -> dict[str, Any]:
    """Whether storage under periodic maintenance stays bounded.

    Between two maintenance runs the data files grow (each batch appends; VACUUM removes
    what no version needs only when it runs), so the per-minute bytes are a sawtooth. What
    must not grow is what survives maintenance: the data bytes (``disk`` minus the Delta
    ``log``) at their minimum in each window between two maintenance runs (``cuts``: the
    seconds, on the samples' ``t_s`` clock, at which the runs ended; the window after the
    last run counts too). Bounded: the last window's minimum <= 1.25 x the previous
    window's, and, with ``state`` (live state bytes), the last third's median <= 1.25 x
    the middle third's. The Delta log is reported apart: Delta deletes log files older than
    ``delta.logRetentionDuration`` only (cut to whole days), so within a soak it grows by
    one commit per batch."""
    data = [(m["t_s"], None if m.get(disk) is None else m[disk] - (m.get(log) or 0))
            for m in minute]
    edges = [*sorted(cuts), float("inf")]
    windows = [[b for t, b in data if lo <= t < hi and b is not None]
               for lo, hi in itertools.pairwise(edges)]
    floors = [min(w) for w in windows if w]
    out: dict[str, Any] = {"maintenance_ended_s": [round(c, 1) for c in sorted(cuts)],
                           "data_floor_bytes": floors,
                           "data_max_bytes": max((b for _, b in data if b is not None),
                                                 default=None),
                           "log_bytes_last": minute[-1].get(log) if minute else None}
    ok = len(floors) >= 2 and floors[-1] <= 1.25 * floors[-2]
    if state is not None:
        xs = [m[state] for m in minute if m.get(state) is not None]
        n = len(xs)
        mid, last = (statistics.median(xs[n // 3:2 * n // 3]),
                     statistics.median(xs[2 * n // 3:])) if n >= 3 else (None, None)
        out["state_bytes_mid"], out["state_bytes_last"] = mid, last
        ok = ok and mid is not None and last <= 1.25 * mid
    out["bounded"] = ok
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["--catch-up-as-planned"]:
        print(json.dumps(catch_up_as_planned()), flush=True)
    else:
        sys.exit("usage: python -m benchmarks.soak_parts --catch-up-as-planned")
