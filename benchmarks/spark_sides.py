"""What the Spark-side benchmarks share: micro-batches of events as Delta versions, and the
stream-static join a Spark user runs against them (``broadcast_enrichment`` (b),
``sharded_state``)."""

from __future__ import annotations

import time
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakecast.delta import io as delta_io


def append_events(spark: SparkSession, path: str, batch: int, batch_events: int,
                  n_dim: int, partitions: int = 4) -> int:
    """Append micro-batch ``batch`` of ``batch_events`` events (their users spread over
    the dimension's ``n_dim`` and 5% beyond it) as one new version of ``path``."""
    ids = spark.range(batch * batch_events, (batch + 1) * batch_events,
                      numPartitions=partitions)
    return delta_io.write(ids.select(
        F.col("id").alias("event_id"), F.lit(batch).alias("batch_id"),
        (F.col("id") * 7919 % int(n_dim * 1.05)).alias("user_id"),
        (F.col("id") % 97 * 1.5).alias("amount")), path, mode="append")


def new_events(spark: SparkSession, path: str, version: int) -> DataFrame:
    """The rows appended by one events version (the CDF inserts, as the pipeline reads)."""
    return delta_io.read_changes(spark, path, version, version).drop(
        "_change_type", "_commit_version", "_commit_timestamp")


def stream_static(spark: SparkSession, events_path: str, dimension: DataFrame,
                  checkpoint: str, out: str, batch: int, batch_events: int
                  ) -> tuple[float, dict[str, Any]]:
    """Spark's stream-static join as users run it: a Delta streaming source joined to the
    static Delta ``dimension`` (re-read each micro-batch), into a Delta sink, one
    ``availableNow`` run per micro-batch. Timed by Spark's own ``triggerExecution`` of the
    micro-batch (query start and stop are not counted)."""
    t0 = time.perf_counter()
    query = (spark.readStream.format("delta").load(events_path)
             .join(dimension, "user_id", "left")
             .withColumn("segment", F.coalesce("segment", F.lit("NEW")))
             .writeStream.format("delta").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start(out))
    query.awaitTermination()
    wall = time.perf_counter() - t0
    data = [p for p in query.recentProgress if p["numInputRows"] > 0]
    rows = sum(p["numInputRows"] for p in data)
    if rows != batch_events:
        raise RuntimeError(f"stream-static batch {batch}: {rows} input rows, not {batch_events}")
    trigger = sum(p["durationMs"]["triggerExecution"] for p in data) / 1000
    return trigger, {"wall_s": round(wall, 3), "micro_batches": len(data),
                     "durations_ms": data[-1]["durationMs"]}
