"""Benchmark: a micro-batch of 50k events on a 2-worker standalone cluster vs ``local[2]``.

    .venv/bin/python -m benchmarks.cluster [--events 50000] [--batches 5] [--name NAME]

Both sides run the storefront enrichment pipeline (``jobs.storefront.pipeline``) on a
Lakecast Spark server (Spark Connect), one after the other, on lakes of their own:
``local[2]`` (driver and executor in one JVM, 2 cores) and the local cluster of
:mod:`lakecast.cluster` (a master, two workers of 1 core each, the server as driver;
every process on 127.0.0.1). Each side first runs a warm-up batch (executors, Python
workers and broadcast state start cold), then ``--batches`` batches of ``--events``
events, each appended to the events table before it (untimed), at 2 tasks per batch.
The figure is the median batch time; the target is cluster / local[2] <= 1.5.
Results go to ``benchmarks/results/<name>.json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from assets import flags
from assets.tables import DIM_PRODUCTS, EVENTS, USER_SEGMENTS
from benchmarks.targets import CLUSTER as BENCH
from jobs.instance import ensure_instance
from jobs.storefront.pipeline import build_pipeline
from lakecast.cluster import Cluster
from lakecast.config import Settings, get_settings
from lakecast.delta import io as delta_io
from lakecast.server import Server
from lakecast.spark import get_spark

RESULTS = Path(__file__).resolve().parent / "results"
TARGET = 1.5
USERS, PRODUCTS, PARALLELISM = 20_000, 2_000, 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _build(spark: Any, settings: Settings) -> None:
    """The broadcast tables: products, user segments, the vip_discount flag."""
    from pyspark.sql import functions as F

    categories = F.array(*[F.lit(c) for c in ("books", "toys", "home", "music")])
    delta_io.write(spark.range(PRODUCTS).select(
        F.col("id").alias("product_id"), F.concat(F.lit("p"), F.col("id")).alias("name"),
        F.element_at(categories, (F.col("id") % 4 + 1).cast("int")).alias("category"),
        (F.col("id") % 50 + 0.5).alias("price")), settings.table_path(DIM_PRODUCTS))
    segments = F.array(*[F.lit(s) for s in ("VIP", "REGULAR", "CHURNING")])
    delta_io.write(spark.range(USERS).select(
        F.col("id").alias("user_id"),
        F.element_at(segments, (F.col("id") % 3 + 1).cast("int")).alias("segment")),
        settings.table_path(USER_SEGMENTS))
    flags.set_flag(spark, settings.table_path("feature_flags"), "vip_discount", "10")


def _append_events(spark: Any, settings: Settings, first: int, n: int) -> None:
    """``n`` events from id ``first``: ~9% unknown users, ~2% unknown products."""
    from pyspark.sql import functions as F

    types = F.array(*[F.lit(t) for t in ("view", "add_to_cart", "purchase")])
    df = spark.range(first, first + n).select(
        F.col("id").alias("event_id"),
        (F.col("id") * 7919 % int(USERS * 1.1)).alias("user_id"),
        (F.col("id") * 31 % int(PRODUCTS * 1.02)).alias("product_id"),
        F.element_at(types, (F.col("id") % 3 + 1).cast("int")).alias("event_type"),
        (F.col("id") % 97 * 1.5).alias("amount"),
        F.format_string("2026-01-0%d 10:%02d:00", F.col("id") % 7 + 1,
                        F.col("id") % 60).alias("event_time"),
        F.lit("web").alias("device"), F.lit("2026-01-01").alias("ingest_day"))
    delta_io.write(df, settings.table_path(EVENTS))


def run_side(name: str, url: str, root: Path, events: int, batches: int) -> dict[str, Any]:
    """Warm-up batch, then ``batches`` timed batches of ``events`` on the server at
    ``url``; returns the batch times and counts."""
    env = {**os.environ, "LAKECAST_LAKE_ROOT": str(root / "lake"),
           "LAKECAST_CHECKPOINT_ROOT": str(root / "checkpoints"),
           "DAGSTER_HOME": str(root / "dagster_home"), "LAKECAST_SPARK_REMOTE": url}
    settings = get_settings(env)
    ensure_instance(settings)
    spark = get_spark(settings=settings)
    _build(spark, settings)
    pipeline = build_pipeline(get_spark(settings=settings, session="pipeline:enrichment"),
                              settings, parallelism=PARALLELISM, checkpoint_every=None)
    _append_events(spark, settings, 0, 2_000)
    (warm,) = pipeline.run()
    times, records = [], []
    for i in range(batches):
        _append_events(spark, settings, 1_000_000 * (i + 1), events)
        t0 = time.perf_counter()
        (r,) = pipeline.run()
        times.append(time.perf_counter() - t0)
        records.append({"batch_id": r.plan.batch_id, "seconds": round(times[-1], 3),
                        "counts": r.counts, "executors": r.executors,
                        "cold_tasks": r.cold_tasks})
        print(f"{name}: batch {r.plan.batch_id} {times[-1]:.2f}s {r.counts} "
              f"executors={r.executors}", flush=True)
    return {"warmup_seconds": round(warm.seconds, 3), "batches": records,
            "median_seconds": round(statistics.median(times), 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000, help="events per batch")
    parser.add_argument("--batches", type=int, default=5, help="timed batches per side")
    parser.add_argument("--name", default="cluster", help="results/<name>.json")
    args = parser.parse_args(argv)
    BENCH.start()
    base = get_settings()
    root = Path(tempfile.mkdtemp(prefix="lakecast-bench-cluster-"))
    result: dict[str, Any] = {"events": args.events, "parallelism": PARALLELISM}
    try:
        local = Server(replace(base, spark_master=f"local[{PARALLELISM}]"), "127.0.0.1",
                       _free_port())
        try:
            local.start()
            result["local"] = run_side("local[2]", local.url, root / "local", args.events,
                                       args.batches)
        finally:
            local.stop()
        cluster = Cluster(base, port=_free_port(), server_port=_free_port())
        try:
            cluster.up(workers=2)
            result["cluster"] = run_side("cluster", cluster.server.url, root / "cluster",
                                         args.events, args.batches)
        finally:
            cluster.down()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratio = result["cluster"]["median_seconds"] / result["local"]["median_seconds"]
    result["ratio"] = round(ratio, 3)
    result["target"] = TARGET
    BENCH.report(result, name=args.name, results_dir=RESULTS)
    print(f"\n{args.events} events per batch, {PARALLELISM} tasks, median of {args.batches}:")
    print(f"  local[2]          {result['local']['median_seconds']:8.2f} s")
    print(f"  2-worker cluster  {result['cluster']['median_seconds']:8.2f} s")
    print(f"  ratio {ratio:.2f}x (target <= {TARGET}x): {'met' if ratio <= TARGET else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
