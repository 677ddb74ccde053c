"""Benchmark: the whole Lakecast micro-batch vs the Structured Streaming query a Spark user
writes instead (issue 15).

    python -m benchmarks.pipeline [--batches 20] [--sizes 2000,50000] [--scale 0.1]
                                  [--name pipeline]

One demo lake (``benchmarks.sensor_freshness.build_lake``) is built under a temp root and
both sides run in one in-process (classic) Spark session. For every size, ``--batches``
times: the producer appends SIZE events in one commit (untimed), then each side processes
exactly that events version, in alternating order:

- **L (Lakecast)**: ``jobs.storefront.pipeline.build_pipeline`` with its default checkpoint
  policy, caught up once (untimed); a batch is ``pipeline.run(max_batches=1)`` timed by the
  wall clock: plan -> read -> validate -> enrich -> three outputs -> commit -> checkpoint.
- **S (Structured Streaming)**: a Delta streaming source on ``events``
  (``startingVersion`` = the first appended version), ``foreachBatch`` doing the same
  validation (``assets.transforms.classify_event_format``, rejected rows with their reason
  and raw record), stream-static left joins with ``dim_products`` (missing product ->
  unmatched), ``user_segments`` (default ``NEW``) and ``feature_flags`` (``vip_discount``
  percent for VIP users) re-read each batch, and the three tables written idempotently
  (``txnAppId``/``txnVersion``). One ``availableNow`` run per batch on one checkpoint,
  timed by Spark's own ``triggerExecution`` (the wall clock with query start is reported
  too).

At the end the outputs of both over the benchmarked range are asserted equal (enriched:
event_id and the enrichment columns; unmatched: event_id; rejected: event_id and reason).
Per size: median and p90 of the warm batches (the first batch of each size is dropped) and
the ratio L/S against the issue's targets. JSON goes to ``benchmarks/results/<name>.json``
and a table is printed. Run it alone on the machine, through spark-lock.
"""

from __future__ import annotations

import argparse
import os
import platform as _stdlib_platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.targets import PIPELINE as BENCH

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_L_2K_S = 2.0
TARGET_RATIO = 0.5
SS_APP = "ss-pipeline-bench"
SS_TABLES = {"enriched": "ss_enriched_events", "unmatched": "ss_enrichment_unmatched",
             "rejected": "ss_enrichment_rejected"}
ENRICH_COLUMNS = ["product_category", "product_price", "segment", "vip_discount_pct"]


def _set_env(root: Path) -> None:
    """This process's lake under ``root``, Spark in-process (no Spark Connect)."""
    from benchmarks.common import dagster_home

    for key in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE"):
        os.environ.pop(key, None)
    os.environ.update({
        "LAKECAST_LAKE_ROOT": str(root / "lake"),
        "LAKECAST_CHECKPOINT_ROOT": str(root / "checkpoints"),
        "DAGSTER_HOME": str(root / "dagster_home"),
        "LAKECAST_SPARK_REMOTE": "",
    })  # fmt: skip
    dagster_home(root, clean=False)


def _stats(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"median_s": None, "p90_s": None}
    p90 = statistics.quantiles(xs, n=10, method="inclusive")[-1] if len(xs) > 1 else xs[0]
    return {"median_s": round(statistics.median(xs), 3), "p90_s": round(p90, 3)}


def _batch_record(r: Any) -> dict[str, Any]:
    """The fields of a ``BatchResult`` that explain a Lakecast batch's cost."""
    plan = r.plan
    out: dict[str, Any] = {"batch_id": plan.batch_id,
                           "events": [plan.events_start + 1, plan.events_end],
                           "seconds": round(r.seconds, 3), "counts": dict(r.counts)}
    # the rest by name, so a field the engine renames shows as missing, not as a crash
    for name in ("redone", "broadcast_elements", "broadcast_rows", "cold_tasks",
                 "parallelism", "state_bytes_per_task", "checkpoint", "state_check"):
        value = getattr(r, name, "<missing>")
        out[name] = dict(value) if hasattr(value, "keys") else value
    out["checkpoint_taken"] = out["checkpoint"] not in (None, "<missing>")
    return out


class StreamingSide:
    """What a Spark user writes instead: Delta source -> ``foreachBatch`` -> three tables."""

    def __init__(self, spark: Any, settings: Any, root: Path, starting_version: int) -> None:
        self.spark = spark
        self.settings = settings
        self.checkpoint = str(root / "ss_checkpoint")
        self.starting_version = starting_version
        self.out = {k: settings.table_path(t) for k, t in SS_TABLES.items()}

    def process(self, df: Any, batch_id: int) -> None:
        """One micro-batch: validate, stream-static joins, three idempotent Delta writes."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        from assets.tables import DIM_PRODUCTS, USER_SEGMENTS
        from assets.transforms import classify_event_format
        from jobs.storefront.enrichment import FEATURE_FLAGS, VIP_DISCOUNT_FLAG

        spark, path = df.sparkSession, self.settings.table_path
        checked = classify_event_format(df).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            rejected = checked.filter(F.col("_reason").isNotNull()).select(
                F.col("_reason").alias("reason"),
                F.to_json(F.struct(*[c for c in checked.columns if c != "_reason"])
                          ).alias("raw_record"),
                F.lit(batch_id).alias("batch_id"))
            valid = checked.filter(F.col("_reason").isNull()).drop("_reason")
            cols = valid.columns
            # static sides, re-read every micro-batch (as a stream-static join does)
            products = spark.read.format("delta").load(path(DIM_PRODUCTS)).select(
                "product_id", F.col("category").alias("product_category"),
                F.col("price").alias("product_price"), F.lit(True).alias("_product"))
            segments = spark.read.format("delta").load(path(USER_SEGMENTS)).select(
                "user_id", F.col("segment").alias("_segment"), F.lit(True).alias("_segmented"))
            flag = spark.read.format("delta").load(path(FEATURE_FLAGS)).filter(
                (F.col("flag") == VIP_DISCOUNT_FLAG) & F.col("enabled")).select(
                F.col("value").cast("double").alias("_vip_pct"))
            joined = valid.join(products, "product_id", "left")
            unmatched = joined.filter(F.col("_product").isNull()).select(*cols)
            enriched = (
                joined.filter(F.col("_product").isNotNull())
                .join(segments, "user_id", "left")
                .withColumn("segment", F.when(F.col("_segmented").isNull(), F.lit("NEW"))
                            .otherwise(F.col("_segment")))
                .join(F.broadcast(flag), F.lit(True), "left")
                .withColumn("vip_discount_pct",
                            F.when((F.col("segment") == "VIP") & F.col("_vip_pct").isNotNull(),
                                   F.col("_vip_pct")).otherwise(F.lit(0.0)))
                .select(*cols, *ENRICH_COLUMNS)
            )
            for name, frame in (("enriched", enriched), ("unmatched", unmatched),
                                ("rejected", rejected)):
                (frame.write.format("delta").mode("append")
                 .option("txnAppId", f"{SS_APP}:{name}").option("txnVersion", batch_id)
                 .option("mergeSchema", "true").save(self.out[name]))
        finally:
            checked.unpersist()

    def run(self, expected_rows: int) -> tuple[float, dict[str, Any]]:
        """One ``availableNow`` run; (Spark's triggerExecution seconds, details)."""
        from assets.tables import EVENTS

        t0 = time.perf_counter()
        query = (self.spark.readStream.format("delta")
                 .option("startingVersion", self.starting_version)
                 .load(self.settings.table_path(EVENTS))
                 .writeStream.foreachBatch(self.process)
                 .option("checkpointLocation", self.checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        wall = time.perf_counter() - t0
        data = [p for p in query.recentProgress if p["numInputRows"] > 0]
        rows = sum(p["numInputRows"] for p in data)
        if rows != expected_rows:
            raise RuntimeError(f"Structured Streaming read {rows} events in {len(data)} "
                               f"micro-batch(es), expected the {expected_rows} appended")
        trigger = sum(p["durationMs"]["triggerExecution"] for p in data) / 1000
        return trigger, {"wall_s": round(wall, 3), "micro_batches": len(data),
                         "batch_ids": [p["batchId"] for p in data],
                         "durations_ms": data[-1]["durationMs"]}


def lakecast_batch(pipeline: Any, res: Any) -> tuple[float, dict[str, Any]]:
    """One Lakecast batch, ``pipeline.run(max_batches=1)``, timed by the wall clock; it must
    process exactly the appended events version ``res``."""
    t = time.perf_counter()
    results = pipeline.run(max_batches=1)
    wall = time.perf_counter() - t
    if len(results) != 1 or results[0].plan.events_end != res.version:
        raise RuntimeError(f"the Lakecast batch did not process events v{res.version} alone: "
                           f"{[r.plan for r in results]}")
    if results[0].counts["events_in"] != res.rows:
        raise RuntimeError(f"the Lakecast batch read {results[0].counts['events_in']} events, "
                           f"{res.rows} were appended (events v{res.version})")
    return wall, {"wall_s": round(wall, 3), **_batch_record(results[0])}


def compare_outputs(spark: Any, settings: Any, first_event_id: int, first_batch_id: int
                    ) -> dict[str, dict[str, int]]:
    """Both sides' outputs over the benchmarked range, on the business columns; raises
    when they differ (as multisets) or are empty."""
    from pyspark.sql import functions as F

    from jobs.storefront.pipeline import ENRICHED_EVENTS, ENRICHMENT_REJECTED, ENRICHMENT_UNMATCHED

    def load(table: str) -> Any:
        return spark.read.format("delta").load(settings.table_path(table))

    rid = F.get_json_object("raw_record", "$.event_id").cast("long").alias("event_id")
    in_range = F.col("event_id") >= first_event_id
    pairs = {
        "enriched": (load(ENRICHED_EVENTS).filter(in_range).select("event_id", *ENRICH_COLUMNS),
                     load(SS_TABLES["enriched"]).select("event_id", *ENRICH_COLUMNS)),
        "unmatched": (load(ENRICHMENT_UNMATCHED).filter(in_range).select("event_id"),
                      load(SS_TABLES["unmatched"]).select("event_id")),
        "rejected": (load(ENRICHMENT_REJECTED).filter(F.col("batch_id") >= first_batch_id)
                     .select(rid, "reason"),
                     load(SS_TABLES["rejected"]).select(rid, "reason")),
    }  # fmt: skip
    out: dict[str, dict[str, int]] = {}
    for name, (lake, ss) in pairs.items():
        out[name] = {"lakecast_rows": lake.count(), "streaming_rows": ss.count(),
                     "only_lakecast": lake.exceptAll(ss).count(),
                     "only_streaming": ss.exceptAll(lake).count()}
    bad = {k: v for k, v in out.items() if v["only_lakecast"] or v["only_streaming"]}
    if bad or not out["enriched"]["lakecast_rows"]:
        raise RuntimeError(f"outputs differ between Lakecast and Structured Streaming over "
                           f"events >= {first_event_id}: {bad or out}")
    return out


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    _set_env(root)
    from assets.producer import append_events
    from benchmarks.sensor_freshness import build_lake
    from jobs.storefront.pipeline import build_pipeline
    from lakecast.config import get_settings
    from lakecast.spark import get_spark

    settings = get_settings()
    if settings.spark_remote:
        raise RuntimeError("benchmarks.pipeline runs Spark in-process: unset LAKECAST_SPARK_REMOTE")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    t0 = time.monotonic()
    build_lake(args.scale)
    spark = get_spark(settings=settings)
    pipeline = build_pipeline(spark, settings)
    catch_up = pipeline.run()
    print(f"lake built and caught up ({len(catch_up)} batch(es)) in "
          f"{time.monotonic() - t0:.0f} s", flush=True)
    first_batch_id = catch_up[-1].plan.batch_id + 1 if catch_up else 0
    streaming: StreamingSide | None = None
    first_event_id: int | None = None
    per_size: dict[str, Any] = {}
    step = 0
    for size in sizes:
        rec: dict[str, Any] = {"lakecast_s": [], "streaming_trigger_s": [],
                               "streaming_wall_s": [], "lakecast_batches": [],
                               "streaming_batches": []}
        for i in range(args.batches):
            res = append_events(spark, settings, n=size, seed=7000 + step)
            if first_event_id is None:
                first_event_id = res.first_event_id
                streaming = StreamingSide(spark, settings, root, res.version)
            assert streaming is not None

            order = ("lakecast", "streaming") if step % 2 == 0 else ("streaming", "lakecast")
            for side in order:
                if side == "lakecast":
                    wall, info = lakecast_batch(pipeline, res)
                    rec["lakecast_s"].append(wall)
                    rec["lakecast_batches"].append(info)
                else:
                    trig, info = streaming.run(res.rows)
                    rec["streaming_trigger_s"].append(trig)
                    rec["streaming_wall_s"].append(info["wall_s"])
                    rec["streaming_batches"].append({"trigger_s": round(trig, 3), **info})
            step += 1
            print(f"[{size}] batch {i + 1}/{args.batches} (events v{res.version}, "
                  f"{res.rows} rows, {order[0]} first): "
                  f"L {rec['lakecast_s'][-1]:.2f} s, S {rec['streaming_trigger_s'][-1]:.2f} s "
                  f"(wall {rec['streaming_wall_s'][-1]:.2f} s)", flush=True)
        warm = {k: rec[k][1:] for k in ("lakecast_s", "streaming_trigger_s", "streaming_wall_s")}
        lake, ss, ss_wall = (_stats(warm["lakecast_s"]), _stats(warm["streaming_trigger_s"]),
                             _stats(warm["streaming_wall_s"]))
        ratio = (round(lake["median_s"] / ss["median_s"], 3)
                 if lake["median_s"] is not None and ss["median_s"] else None)
        per_size[str(size)] = {
            "lakecast": lake, "streaming": ss, "streaming_wall": ss_wall,
            "ratio_l_over_s": ratio,
            "ratio_l_over_s_wall": (round(lake["median_s"] / ss_wall["median_s"], 3)
                                    if lake["median_s"] is not None and ss_wall["median_s"]
                                    else None),
            "warm_batches": len(warm["lakecast_s"]),
            **{k: [round(x, 3) for x in v] if k.endswith("_s") else v for k, v in rec.items()},
        }  # fmt: skip
    assert first_event_id is not None
    equal = compare_outputs(spark, settings, first_event_id, first_batch_id)
    targets: dict[str, Any] = {}
    if "2000" in per_size:
        med = per_size["2000"]["lakecast"]["median_s"]
        targets["lakecast_median_2k_le_2.0s"] = {"value": med, "met": med is not None
                                                  and med <= TARGET_L_2K_S}
    for size, r in per_size.items():
        targets[f"ratio_{size}_le_0.5"] = {"value": r["ratio_l_over_s"],
                                           "met": r["ratio_l_over_s"] is not None
                                           and r["ratio_l_over_s"] <= TARGET_RATIO}
    return {
        "batches": args.batches, "sizes": sizes, "scale": args.scale,
        "checkpoint_policy": "build_pipeline defaults",
        "machine": {"python": sys.version.split()[0], "spark": spark.version,
                    "cores": os.cpu_count(), "platform": _stdlib_platform.platform()},
        "per_size": per_size, "outputs_equal": equal, "targets": targets,
    }  # fmt: skip


def _print_table(result: dict[str, Any]) -> None:
    print(f"\n{'size':>7} {'L med':>7} {'L p90':>7} {'S med':>7} {'S p90':>7} "
          f"{'S wall':>7} {'L/S':>6}  (warm batches, seconds)")
    for size, r in result["per_size"].items():
        def f(x: float | None) -> str:
            return "-" if x is None else f"{x:.3f}"
        print(f"{size:>7} {f(r['lakecast']['median_s']):>7} {f(r['lakecast']['p90_s']):>7} "
              f"{f(r['streaming']['median_s']):>7} {f(r['streaming']['p90_s']):>7} "
              f"{f(r['streaming_wall']['median_s']):>7} {f(r['ratio_l_over_s']):>6}")
    print("outputs equal:", {k: v["lakecast_rows"] for k, v in result["outputs_equal"].items()})
    for name, t in result["targets"].items():
        print(f"target {name}: {t['value']} -> {'met' if t['met'] else 'NOT met'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--sizes", default="2000,50000", help="events per batch, comma-separated")
    parser.add_argument("--scale", type=float, default=0.1, help="demo lake scale")
    parser.add_argument("--name", default="pipeline", help="results/<name>.json")
    parser.add_argument("--root", help="lake root (default: a temp dir, removed after)")
    args = parser.parse_args(argv)
    BENCH.start()
    if args.batches < 2:
        parser.error("--batches must be >= 2 (the first batch of each size is warm-up)")
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="lakecast-bench-"))
    if args.root:
        shutil.rmtree(root, ignore_errors=True)
    try:
        result = run(args, root)
    except BaseException:
        print(f"benchmark failed; its lake is kept under {root}", file=sys.stderr)
        raise
    out = RESULTS / f"{args.name}.json"
    BENCH.report(result, name=args.name, results_dir=RESULTS)
    _print_table(result)
    print(f"wrote {out}")
    if not args.root:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
