"""Benchmark: Lakecast's task-local broadcast state vs Spark joins, both writing Delta.

    .venv/bin/python -m benchmarks.broadcast_enrichment [--scale 0.1] [--name NAME]

(a) one batch of 2M events enriched with a 200k-user segment state and a 10k-product
    state: Lakecast (cold start included: base read, broadcast, state build) vs Spark's
    broadcast hash join (``F.broadcast``).
(b) 20 micro-batches of 50k events against a 1M-row user dimension, 1% of whose rows
    change (Delta MERGE, untimed) between batches: Lakecast (one runtime: warm
    task-local state, CDF increments) vs the stream-static join pattern, which re-reads
    the whole Delta dimension every micro-batch and joins (run here as the equivalent
    batch job per micro-batch).

All data is generated with ``spark.range``; results go to
``benchmarks/results/<name>.json`` (git-ignored) and a table is printed.
"""

from __future__ import annotations

import argparse
import json
import platform as _stdlib_platform
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakecast import BroadcastRuntime, Lookup, delta_io, enrich
from lakecast.config import get_settings
from lakecast.spark import get_spark

RESULTS = Path(__file__).resolve().parent / "results"
SEGMENTS = ["VIP", "REGULAR", "NEW", "CHURNING"]
TARGET_A = 1.3
TARGET_B = 0.33


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _segment(col: str) -> Any:
    return F.element_at(F.array(*[F.lit(s) for s in SEGMENTS]), (F.col(col) % 4 + 1).cast("int"))


# ----------------------------------------------------------------------------- scenario (a)
def scenario_a(spark: SparkSession, root: Path, n_events: int, n_users: int, n_products: int,
               repeats: int, lineage: bool = True) -> dict[str, Any]:
    users, products, events = (str(root / n) for n in ("a_users", "a_products", "a_events"))
    delta_io.write(spark.range(n_users).select(
        F.col("id").alias("user_id"), _segment("id").alias("segment"),
        (F.col("id") % 1000 * 1.25).alias("ltv")), users, mode="overwrite")
    delta_io.write(spark.range(n_products).select(
        F.col("id").alias("product_id"), F.concat(F.lit("product-"), F.col("id")).alias("name"),
        F.element_at(F.array(*[F.lit(c) for c in ("tv", "phone", "book", "toy", "food")]),
                     (F.col("id") % 5 + 1).cast("int")).alias("category"),
        (F.col("id") % 500 + 0.99).alias("price")), products, mode="overwrite")
    # 10% of events have an unknown user (default NEW), 2% an unknown product (nulls)
    delta_io.write(spark.range(n_events).select(
        F.col("id").alias("event_id"),
        (F.col("id") * 7919 % int(n_users * 1.1)).alias("user_id"),
        (F.col("id") * 31 % int(n_products * 1.02)).alias("product_id"),
        (F.col("id") % 97 * 1.5).alias("amount")), events, mode="overwrite")
    tables = {"dim_users": users, "dim_products": products}
    fn = enrich(
        Lookup("dim_users", key="user_id", columns=["segment", "ltv"], defaults={"segment": "NEW"}),
        Lookup("dim_products", key="product_id", columns=["name", "category", "price"]),
    )
    out_l, out_b = str(root / "a_out_lakecast"), str(root / "a_out_bhj")

    def lakecast() -> dict[str, Any]:
        # a fresh runtime: cold start included
        runtime = BroadcastRuntime(spark, fn, tables, lineage=lineage)
        result = runtime.process(delta_io.read(spark, events))
        delta_io.write(result.main, out_l, mode="overwrite")
        m = result.metrics().summary()
        runtime.close()
        return m

    def bhj() -> None:
        u = delta_io.read(spark, users).select("user_id", "segment", "ltv")
        p = delta_io.read(spark, products).select("product_id", "name", "category", "price")
        df = (delta_io.read(spark, events)
              .join(F.broadcast(u), "user_id", "left")
              .join(F.broadcast(p), "product_id", "left")
              .withColumn("segment", F.coalesce("segment", F.lit("NEW"))))
        delta_io.write(df, out_b, mode="overwrite")

    lakecast()  # warm-up (JIT, Python workers, file cache) — not timed
    bhj()
    t_l, t_b, metrics = [], [], {}
    for _ in range(repeats):
        dt, metrics = _timed(lakecast)
        t_l.append(dt)
        t_b.append(_timed(bhj)[0])
    check = [
        delta_io.read(spark, p).groupBy("segment").agg(F.count("*").alias("n"),
                                                        F.sum("price").alias("p"))
        .orderBy("segment").collect()
        for p in (out_l, out_b)
    ]
    same = [tuple(r) for r in check[0]] == [tuple(r) for r in check[1]]
    lc, bh = statistics.median(t_l), statistics.median(t_b)
    return {
        "events": n_events, "users": n_users, "products": n_products, "repeats": repeats,
        "lakecast_seconds": t_l, "bhj_seconds": t_b,
        "lakecast_median_s": round(lc, 3), "bhj_median_s": round(bh, 3),
        "ratio": round(lc / bh, 3), "target": TARGET_A, "met": lc / bh <= TARGET_A,
        "results_identical": same, "lakecast_metrics": metrics,
    }


# ----------------------------------------------------------------------------- scenario (b)
def scenario_b(spark: SparkSession, root: Path, n_dim: int, n_batches: int, batch_events: int,
               change_frac: float, lineage: bool = True) -> dict[str, Any]:
    dim = str(root / "b_dim_users")
    delta_io.write(spark.range(n_dim).select(
        F.col("id").alias("user_id"), _segment("id").alias("segment"),
        (F.col("id") % 1000 * 1.25).alias("ltv"),
        F.concat(F.lit("region-"), F.col("id") % 50).alias("region")), dim, mode="overwrite")
    fn = enrich(Lookup("dim_users", key="user_id", columns=["segment", "ltv", "region"],
                       defaults={"segment": "NEW"}))
    # a 1M-row dimension x 4 tasks is over the seeds' 100 MB budget: warned once, by design
    runtime = BroadcastRuntime(spark, fn, {"dim_users": dim}, lineage=lineage)
    out_l, out_s = str(root / "b_out_lakecast"), str(root / "b_out_stream_static"
                                                    )
    modulus = round(1 / change_frac)

    def events(i: int) -> DataFrame:
        ids = spark.range(i * batch_events, (i + 1) * batch_events, numPartitions=4)
        return ids.select(
            F.col("id").alias("event_id"), F.lit(i).alias("batch_id"),
            (F.col("id") * 7919 % int(n_dim * 1.05)).alias("user_id"),
            (F.col("id") % 97 * 1.5).alias("amount"))

    def lakecast(i: int) -> dict[str, Any]:
        result = runtime.process(events(i))
        delta_io.write(result.main, out_l, mode="append")
        return result.metrics().summary()

    def stream_static(i: int) -> None:
        d = delta_io.read(spark, dim).select("user_id", "segment", "ltv", "region")
        df = events(i).join(d, "user_id", "left").withColumn(
            "segment", F.coalesce("segment", F.lit("NEW")))
        delta_io.write(df, out_s, mode="append")

    t_l, t_s, t_update, per_batch = [], [], [], []
    for i in range(n_batches):
        if i > 0:  # 1% of the dimension changes (untimed, identical for both)
            changed = spark.range(n_dim).where(F.col("id") % modulus == i % modulus).select(
                F.col("id").alias("user_id"), F.lit(f"WAVE{i}").alias("segment"),
                (F.col("id") % 1000 * 1.25 + i).alias("ltv"),
                F.concat(F.lit("region-"), F.col("id") % 50).alias("region"))
            t_update.append(_timed(lambda c=changed: delta_io.merge_upsert(
                spark, c, dim, keys=["user_id"]))[0])
        dl, m = _timed(lambda i=i: lakecast(i))
        ds, _ = _timed(lambda i=i: stream_static(i))
        t_l.append(dl)
        t_s.append(ds)
        per_batch.append({"batch": i, "lakecast_s": round(dl, 3), "stream_static_s": round(ds, 3),
                          "cold_tasks": m["cold_tasks"], "new_element_rows": m["new_element_rows"],
                          "updates_applied": m["broadcast_updates_applied"],
                          "state_version": m["state_version"],
                          "state_bytes_per_task": m["state_bytes_per_task"]})
    check = [
        delta_io.read(spark, p).groupBy("batch_id", "segment").agg(
            F.count("*").alias("n"), F.sum("ltv").alias("ltv")).orderBy("batch_id", "segment")
        .collect()
        for p in (out_l, out_s)
    ]
    same = [tuple(r) for r in check[0]] == [tuple(r) for r in check[1]]
    runtime.close()
    total_l, total_s = sum(t_l), sum(t_s)
    steady_l, steady_s = sum(t_l[1:]), sum(t_s[1:])
    return {
        "dim_rows": n_dim, "batches": n_batches, "batch_events": batch_events,
        "change_fraction": change_frac,
        "lakecast_total_s": round(total_l, 3), "stream_static_total_s": round(total_s, 3),
        "ratio": round(total_l / total_s, 3),
        "steady_state_ratio_batches_1_on": round(steady_l / steady_s, 3) if n_batches > 1 else None,
        "target": TARGET_B, "met": total_l / total_s <= TARGET_B,
        "results_identical": same, "merge_update_s_untimed": [round(t, 3) for t in t_update],
        "per_batch": per_batch,
    }


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--name", default="broadcast_enrichment")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every data size")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--only", choices=["a", "b"], default=None)
    ap.add_argument("--no-lineage", action="store_true", help="drop the _state_version column")
    ap.add_argument("--arrow-batch", type=int, default=None,
                    help="spark.sql.execution.arrow.maxRecordsPerBatch (Spark default 10000)")
    args = ap.parse_args(argv)
    s = args.scale
    spark = get_spark(app_name="lakecast-bench")
    if args.arrow_batch:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(args.arrow_batch))
    lineage = not args.no_lineage
    settings = get_settings()
    root = settings.project_root / "var" / "bench" / args.name
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    out: dict[str, Any] = {
        "name": args.name, "scale": s, "lineage": lineage,
        "arrow_max_records_per_batch": spark.conf.get(
            "spark.sql.execution.arrow.maxRecordsPerBatch"),
        "env": {"spark": spark.version, "master": spark.sparkContext.master,
                "python": _stdlib_platform.python_version(),
                "default_parallelism": spark.sparkContext.defaultParallelism},
    }
    t0 = time.perf_counter()
    if args.only in (None, "a"):
        out["a"] = scenario_a(spark, root, int(2_000_000 * s), int(200_000 * s),
                              max(int(10_000 * s), 10), args.repeats, lineage)
    if args.only in (None, "b"):
        out["b"] = scenario_b(spark, root, int(1_000_000 * s), args.batches,
                              int(50_000 * s), 0.01, lineage)
    out["wall_seconds"] = round(time.perf_counter() - t0, 1)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{args.name}.json"
    path.write_text(json.dumps(out, indent=2, default=str))
    _print(out, path)
    shutil.rmtree(root, ignore_errors=True)
    return out


def _print(out: dict[str, Any], path: Path) -> None:
    rows = []
    if "a" in out:
        a = out["a"]
        rows.append(("(a) 2M events x 200k users + 10k products, one batch",
                     f"{a['lakecast_median_s']:.2f}s", f"{a['bhj_median_s']:.2f}s (F.broadcast)",
                     f"{a['ratio']:.2f}", f"<= {a['target']}", "yes" if a["met"] else "NO",
                     a["results_identical"]))
    if "b" in out:
        b = out["b"]
        rows.append((f"(b) {b['batches']} x 50k events vs 1M-row dim, 1%/batch",
                     f"{b['lakecast_total_s']:.2f}s", f"{b['stream_static_total_s']:.2f}s "
                     "(stream-static)", f"{b['ratio']:.2f}", f"<= {b['target']}",
                     "yes" if b["met"] else "NO", b["results_identical"]))
    head = ("scenario", "lakecast", "spark", "ratio", "target", "met", "same results")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)))
    if "b" in out and out["b"]["steady_state_ratio_batches_1_on"] is not None:
        steady = out["b"]["steady_state_ratio_batches_1_on"]
        print(f"(b) steady state (batches 1..): ratio {steady}")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
