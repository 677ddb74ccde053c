"""Benchmark: a sharded broadcast state vs Spark's joins, for a dimension beyond one task.

    .venv/bin/python -m benchmarks.sharded_state [--dim-rows 10000000] [--shards 8]
    [--batches 10] [--batch-events 50000] [--name NAME]

A dimension of ``--dim-rows`` users (key, segment, lifetime value, region and a
40-character description: a catalogue-like row) written to Delta with Spark; then
``--batches`` micro-batches of ``--batch-events`` events, each a new version of a Delta
events table, and between two batches a MERGE changing 0.01% of the dimension's rows (at
most 1,000; untimed, the same for every side). Each side reads the batch's new events version and
appends its enriched rows to a Delta table of its own; the order of the sides rotates
every batch:

* **lakecast**: ``enrich(Lookup("dim_users", key="user_id", shards=--shards))`` on a
  :class:`~lakecast.BroadcastRuntime` (its events routed to the tasks of their keys'
  shards, each task reading its memory-mapped shard; the dimension's changes applied as
  they come);
* **shuffle_join**: what a Spark user writes for a table this size: the events joined
  (left) with the dimension read at its current version (too large to broadcast, so Spark
  shuffles both sides), appended to Delta;
* **stream_static**: the same join as an always-available Structured Streaming query, a
  Delta source of the events and a Delta sink, one ``availableNow`` run per batch, timed
  by Spark's own ``triggerExecution`` (query start and stop are not counted).

Measured: the median warm batch (every batch after the first) of each side, their ratios,
the first batch (the shards' cold build), the state bytes per task against the table's
share (its Arrow bytes over the shards), the shards each task read, and the events routed
(shuffled) per batch. Then a checkpoint of the sharded state (a
:class:`~lakecast.snapshots.SnapshottingRuntime` over the same function, after one batch)
against a plain Delta write of the dimension at the same version. The outputs of the
three sides are compared row for row (counts and sums per batch and segment).

Everything runs on one local Spark application (``--dim-rows`` is the largest this
machine's run was set for: the result says what ran). Results go to
``benchmarks/results/<name>.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from benchmarks import spark_sides
from benchmarks.targets import SHARDED_STATE as BENCH
from lakecast import BroadcastRuntime, Lookup, enrich
from lakecast.delta import io as delta_io
from lakecast.spark import get_spark

RESULTS = Path(__file__).resolve().parent / "results"
SEGMENTS = ["VIP", "REGULAR", "NEW", "CHURNING"]
SIDES = ("lakecast", "shuffle_join", "stream_static")
#: the dimension's rows changed between two batches: 0.01% of them, at most 1,000
CHANGED_ROWS = 1000


def changed_rows(n_dim: int) -> int:
    """Rows of an ``n_dim``-row dimension a batch changes (1,000 at 10M rows)."""
    return max(1, min(CHANGED_ROWS, n_dim // 10_000))


def _segment(col: str) -> Any:
    return F.element_at(F.array(*[F.lit(s) for s in SEGMENTS]), (F.col(col) % 4 + 1).cast("int"))


def _dimension_rows(spark: SparkSession, ids: DataFrame, wave: int) -> DataFrame:
    return ids.select(
        F.col("id").alias("user_id"),
        (_segment("id") if wave == 0 else F.lit(f"WAVE{wave}")).alias("segment"),
        (F.col("id") % 1000 * 1.25 + wave).alias("ltv"),
        F.concat(F.lit("region-"), F.col("id") % 50).alias("region"),
        F.lpad(F.concat(F.lit("catalogue entry "), F.col("id")), 40, "*").alias("description"))


def run(spark: SparkSession, root: Path, n_dim: int, shards: int, n_batches: int,
        batch_events: int) -> dict[str, Any]:
    """The benchmark proper (see the module doc)."""
    dim, events_path = str(root / "dim_users"), str(root / "events")
    t0 = time.perf_counter()
    delta_io.write(_dimension_rows(spark, spark.range(n_dim), 0), dim, mode="overwrite")
    dim_write_s = time.perf_counter() - t0
    columns = ["segment", "ltv", "region", "description"]
    fn = enrich(Lookup("dim_users", key="user_id", columns=columns,
                       defaults={"segment": "NEW"}, shards=shards))
    runtime = BroadcastRuntime(spark, fn, {"dim_users": dim}, lineage=True)
    out = {side: str(root / f"out_{side}") for side in SIDES}
    checkpoint = str(root / "stream_checkpoint")

    def append_events(i: int) -> int:
        return spark_sides.append_events(spark, events_path, i, batch_events, n_dim)

    def new_events(version: int) -> DataFrame:
        return spark_sides.new_events(spark, events_path, version)

    def dimension() -> DataFrame:
        return delta_io.read(spark, dim).select("user_id", *columns)

    def lakecast(i: int, version: int) -> tuple[float, dict[str, Any]]:
        t = time.perf_counter()
        result = runtime.process(new_events(version)).observe()
        delta_io.write(result.main, out["lakecast"], mode="append")
        m = result.metrics()
        dt = time.perf_counter() - t
        return dt, {"summary": {k: m.summary()[k] for k in ("cold_tasks", "state_version",
                                                             "new_element_rows")},
                    "tasks": [{"task": t.partition, "shards": t.shards, "rows_in": t.rows_in,
                               "state_bytes": t.state_bytes, "cache": t.cache,
                               "apply_s": round(t.apply_seconds, 3)} for t in m.tasks]}

    def shuffle_join(i: int, version: int) -> tuple[float, dict[str, Any]]:
        t = time.perf_counter()
        df = new_events(version).join(dimension(), "user_id", "left").withColumn(
            "segment", F.coalesce("segment", F.lit("NEW")))
        delta_io.write(df, out["shuffle_join"], mode="append")
        return time.perf_counter() - t, {}

    def stream_static(i: int, version: int) -> tuple[float, dict[str, Any]]:
        return spark_sides.stream_static(spark, events_path, dimension(), checkpoint,
                                         out["stream_static"], i, batch_events)

    sides = {"lakecast": lakecast, "shuffle_join": shuffle_join, "stream_static": stream_static}
    times: dict[str, list[float]] = {s: [] for s in SIDES}
    per_batch = []
    for i in range(n_batches):
        if i > 0:  # 1,000 rows of the dimension change (untimed, the same for every side)
            n = changed_rows(n_dim)
            changed = _dimension_rows(spark, spark.range(i, n_dim, max(1, n_dim // n)).limit(n),
                                      i)
            delta_io.merge_upsert(spark, changed, dim, keys=["user_id"])
        version = append_events(i)
        order = SIDES[i % len(SIDES):] + SIDES[:i % len(SIDES)]
        row: dict[str, Any] = {"batch": i, "order": list(order)}
        for side in order:
            dt, info = sides[side](i, version)
            times[side].append(dt)
            row[f"{side}_s"] = round(dt, 3)
            if info:
                row[side] = info
        per_batch.append(row)
        print(f"  batch {i:2d}: " + "  ".join(f"{s} {row[s + '_s']:.2f}s" for s in SIDES),
              flush=True)

    table_bytes = _arrow_bytes(dim, columns)
    checks = {side: [tuple(r) for r in delta_io.read(spark, path).groupBy(
        "batch_id", "segment").agg(F.count("*").alias("n"), F.sum("ltv").alias("ltv"))
        .orderBy("batch_id", "segment").collect()] for side, path in out.items()}
    same = all(c == checks["lakecast"] for c in checks.values())
    warm = {s: statistics.median(t[1:]) for s, t in times.items()} if n_batches > 1 else {}
    tasks = [t for row in per_batch[1:] for t in row["lakecast"]["tasks"] if t["rows_in"]]
    runtime.close()
    cp = _checkpoint(spark, root, fn, dim, columns)
    return {
        "dim_rows": n_dim, "shards": shards, "batches": n_batches,
        "batch_events": batch_events, "changed_rows_per_batch": changed_rows(n_dim),
        "dim_write_s": round(dim_write_s, 3),
        "median_warm_batch_s": {s: round(v, 3) for s, v in warm.items()},
        "first_batch_s": {s: round(t[0], 3) for s, t in times.items()},
        "ratio_over_shuffle_join": round(warm["lakecast"] / warm["shuffle_join"], 3)
        if warm else None,
        "ratio_over_stream_static": round(warm["lakecast"] / warm["stream_static"], 3)
        if warm else None,
        "table_arrow_bytes": table_bytes,
        "state_bytes_per_task_max": max((t["state_bytes"] for t in tasks), default=None),
        "state_bytes_per_task_over_share": round(
            max(t["state_bytes"] for t in tasks) / (table_bytes / shards), 3) if tasks else None,
        "shards_per_task_max": max((len(t["shards"]) for t in tasks), default=None),
        "events_routed_per_batch": batch_events,
        "checkpoint": cp,
        "checkpoint_over_delta_write": cp["ratio"],
        "results_identical": same,
        "per_batch": per_batch,
    }


def _arrow_bytes(path: str, columns: list[str]) -> int:
    """The dimension's Arrow size (key and looked-up columns), from its files."""
    files = delta_io.table_files(path, delta_io.latest_version(path) or 0)
    return int(sum(p.select(["user_id", *columns]).nbytes for p in files.parts()))


def _checkpoint(spark: SparkSession, root: Path, fn: Any, dim: str,
                columns: list[str]) -> dict[str, Any]:
    """One checkpoint of the sharded state (after one batch builds it) vs a plain Delta
    write of the dimension at the same version (Spark reading it and writing it anew)."""
    from lakecast.snapshots import SnapshotStore
    from lakecast.snapshots.runtime import SnapshottingRuntime

    store = SnapshotStore(spark, str(root / "snapshots"), "sharded-bench")
    rt = SnapshottingRuntime(spark, fn, {"dim_users": dim}, store, restore=False)
    events = spark.range(1000).select(F.col("id").alias("user_id"))
    rt.process(events).main.count()
    t = time.perf_counter()
    cp = rt.checkpoint(1, batch_id=0, events_start=0, events_end=0)
    checkpoint_s = time.perf_counter() - t
    rt.close()
    t = time.perf_counter()
    delta_io.write(delta_io.read(spark, dim).select("user_id", *columns),
                   str(root / "plain_copy"), mode="overwrite")
    plain_s = time.perf_counter() - t
    return {"checkpoint_s": round(checkpoint_s, 3), "plain_delta_write_s": round(plain_s, 3),
            "ratio": round(checkpoint_s / plain_s, 3),
            "stored_bytes": cp.stored_bytes, "distinct_contents": cp.distinct_contents,
            "parallelism": cp.header.parallelism}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim-rows", type=int, default=10_000_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--batch-events", type=int, default=50_000)
    parser.add_argument("--root", default=None, help="scratch folder (default: var/bench)")
    parser.add_argument("--name", default=BENCH.name)
    args = parser.parse_args(argv)
    BENCH.start()
    root = Path(args.root or Path(__file__).resolve().parents[1] / "var" / "bench" /
                "sharded_state")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    spark = get_spark(app_name="lakecast-bench-sharded")
    result = run(spark, root, args.dim_rows, args.shards, args.batches, args.batch_events)
    out = BENCH.report(result, name=args.name, results_dir=RESULTS)
    print(json.dumps({k: v for k, v in out.items() if k != "per_batch"}, indent=2,
                     default=str))
    return out


if __name__ == "__main__":
    main()
