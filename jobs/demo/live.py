"""The live half of ``make demo``: sensor-triggered micro-batches across two segment versions.

After the batch half has built ``dim_products`` and ``user_segments`` (v1):

1. (``reset_demo_lake``, called before the batch half: every demo starts from a
   clean lake, so the story is the same each time);
2. set the feature flag ``vip_discount`` (a broadcast table of its own);
3. loop: the producer appends events, ``broadcast_versions_sensor`` is ticked, and
   each run it requests executes ``enrichment_microbatch`` in-process;
4. midway, ``daily_segment_refresh_job`` segments the next day: a new Delta
   version of ``user_segments`` (v2) that the next batch picks up;
5. summarize: enriched events per segments version (lineage), counts that
   reconcile, and the delay from the v2 commit to the first event enriched with it.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dagster import DagsterInstance, SensorResult, build_sensor_context

from assets import flags, producer
from assets.tables import ALL_TABLES, EVENTS, USER_SEGMENTS
from jobs.storefront.microbatch import (
    ENRICHED_EVENTS,
    ENRICHMENT,
    ENRICHMENT_REJECTED,
    ENRICHMENT_UNMATCHED,
)
from lakecast.config import Settings
from lakecast.delta import io as delta_io

QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
OUTPUTS = (ENRICHED_EVENTS, ENRICHMENT_UNMATCHED, ENRICHMENT_REJECTED)


@dataclass
class LiveOutcome:
    runs: int
    segments_v1: int
    segments_v2: int
    delay_seconds: float | None
    summary: str


def remove_tables(settings: Settings, names: Iterable[str], checkpoints: str) -> list[str]:
    """Remove the tables ``names`` of the lake and the checkpoint folder ``checkpoints``
    (progress log, snapshots); returns the tables that were there."""
    removed = []
    for name in names:
        path = Path(settings.table_path(name))
        if path.exists():
            shutil.rmtree(path)
            removed.append(name)
    shutil.rmtree(settings.checkpoint_path(checkpoints), ignore_errors=True)
    return removed


def reset_demo_lake(settings: Settings) -> list[str]:
    """Remove every table the demo writes, and the micro-batch's checkpoints, so each
    ``make demo`` tells the same story from scratch. Returns the tables removed."""
    return remove_tables(settings, (*ALL_TABLES, *OUTPUTS, "feature_flags"), ENRICHMENT.name)


class SensorLoop:
    """Ticks ``broadcast_versions_sensor`` like the daemon does and runs what it requests."""

    def __init__(self, instance: DagsterInstance) -> None:
        from jobs.definitions import defs
        from jobs.storefront.sensors import broadcast_versions_sensor

        self.instance = instance
        self.sensor = broadcast_versions_sensor
        self.job = defs.resolve_job_def("enrichment_microbatch")
        self.cursor: str | None = None
        self.runs = 0

    def tick(self) -> bool:
        ctx = build_sensor_context(instance=self.instance, cursor=self.cursor)
        result = self.sensor(ctx)
        if not isinstance(result, SensorResult) or not result.run_requests:
            return False
        self.cursor = result.cursor
        (request,) = result.run_requests
        t0 = time.monotonic()
        out = self.job.execute_in_process(
            instance=self.instance, tags=request.tags, run_config=QUIET
        )
        if not out.success:
            raise RuntimeError("enrichment_microbatch failed; see the run in the Dagster UI")
        self.runs += 1
        mats = [e.materialization for e in out.get_asset_materialization_events()
                if e.asset_key.to_user_string() == ENRICHED_EVENTS]  # fmt: skip
        if mats:  # one materialization per batch: add them up
            n = {k: sum(m.metadata[k].value for m in mats)
                 for k in ("events_in", "enriched", "unmatched", "rejected")}
            print(f"    run {self.runs}: {len(mats)} batch(es), {n['events_in']} events in -> "
                  f"{n['enriched']} enriched, {n['unmatched']} unmatched, "
                  f"{n['rejected']} rejected; state {mats[-1].metadata['state_version'].value} "
                  f"({time.monotonic() - t0:.1f}s)", flush=True)  # fmt: skip
        else:
            print(f"    run {self.runs}: nothing new ({time.monotonic() - t0:.1f}s)", flush=True)
        return True


def first_enrichment_delay(spark, settings: Settings, segments_version: int) -> float | None:
    """Seconds from the commit of ``user_segments`` v``segments_version`` to the commit of
    the first ``enriched_events`` version holding rows enriched with it."""
    seg_path = settings.table_path(USER_SEGMENTS)
    t_seg = delta_io.commit_info(seg_path, segments_version).timestamp_ms
    out_path = settings.table_path(ENRICHED_EVENTS)
    latest = delta_io.latest_version(out_path)
    for v in range(latest + 1 if latest is not None else 0):
        info = delta_io.commit_info(out_path, v)
        if info.timestamp_ms < t_seg:
            continue
        rows = delta_io.read_changes(spark, out_path, v, v).select("_state_version").distinct()
        if any(json.loads(r[0]).get(USER_SEGMENTS) == segments_version for r in rows.collect()):
            return (info.timestamp_ms - t_seg) / 1000
    return None


def lineage_summary(spark, settings: Settings) -> str:
    from pyspark.sql import functions as F

    enriched = delta_io.read(spark, settings.table_path(ENRICHED_EVENTS))
    by_version = (
        enriched.withColumn("segments_version",
                            F.get_json_object("_state_version", f"$.{USER_SEGMENTS}"))
        .groupBy("segments_version")
        .agg(F.count("*").alias("events"),
             *[F.sum((F.col("segment") == s).cast("int")).alias(s)
               for s in ("VIP", "REGULAR", "NEW", "CHURNING")],
             F.sum((F.col("vip_discount_pct") > 0).cast("int")).alias("discounted"))
        .orderBy("segments_version")
        .collect()
    )  # fmt: skip
    lines = [f"{'user_segments v':>15}{'events':>9}{'VIP':>7}{'REGULAR':>9}{'NEW':>7}"
             f"{'CHURNING':>10}{'discounted':>12}", "-" * 69]  # fmt: skip
    for r in by_version:
        lines.append(f"{r['segments_version']:>15}{r['events']:>9,}{r['VIP']:>7,}"
                     f"{r['REGULAR']:>9,}{r['NEW']:>7,}{r['CHURNING']:>10,}"
                     f"{r['discounted']:>12,}")  # fmt: skip
    counts = {t: delta_io.read(spark, settings.table_path(t)).count() for t in OUTPUTS}
    produced = sum(counts.values())
    lines += ["", "outputs: " + ", ".join(f"{t} {n:,}" for t, n in counts.items())
              + f" = {produced:,} rows"]  # fmt: skip
    return "\n".join(lines)


def run_live(
    settings: Settings,
    instance: DagsterInstance,
    refresh_segments,
    next_day: str,
    rounds: int = 2,
    events_per_round: int = 3_000,
) -> LiveOutcome:
    """The live half of the demo (see the module docstring)."""
    from lakecast.spark import get_spark

    spark = get_spark(settings=settings)
    flags.set_flag(spark, settings.table_path("feature_flags"), "vip_discount", "10")
    seg_path = settings.table_path(USER_SEGMENTS)
    v1 = delta_io.latest_version(seg_path)
    loop = SensorLoop(instance)
    print(f"==> micro-batches with user_segments v{v1} (sensor-triggered, in-process)")
    loop.tick()  # the events generated by the batch half
    seed = 9_000
    for _ in range(rounds):
        res = producer.append_events(spark, settings, events_per_round, seed=seed)
        seed += 1
        print(f"    producer: +{res.rows:,} events -> {EVENTS} v{res.version}", flush=True)
        loop.tick()
    print(f"==> daily_segment_refresh_job for {next_day}: a new version of {USER_SEGMENTS}")
    refresh_segments(next_day)
    v2 = delta_io.latest_version(seg_path)
    if v2 == v1:
        raise RuntimeError(f"the daily job for {next_day} committed no new {USER_SEGMENTS} version")
    changes = delta_io.commit_info(seg_path, v2).metrics
    print(f"    {USER_SEGMENTS} v{v2}: {changes.get('numTargetRowsUpdated', '?')} users updated, "
          f"{changes.get('numTargetRowsInserted', '?')} inserted")  # fmt: skip
    for _ in range(rounds):
        res = producer.append_events(spark, settings, events_per_round, seed=seed)
        seed += 1
        print(f"    producer: +{res.rows:,} events -> {EVENTS} v{res.version}", flush=True)
        loop.tick()
    delay = first_enrichment_delay(spark, settings, v2)
    assert v1 is not None and v2 is not None
    return LiveOutcome(loop.runs, v1, v2, delay, lineage_summary(spark, settings))

