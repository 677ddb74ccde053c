"""The daily-partitioned ``user_segments`` asset: per-user RFM features and a segment.

Partition D (a UTC day) validates the events ingested on D (malformed or
duplicate events go to ``quarantine`` under partition D), then computes, for
every user who signed up by D, features over all accepted events up to the end
of D — recency_days, frequency, monetary (sum of purchase amounts, the LTV),
purchases, interests (top 3 categories), tenure_days — and a segment (rules in
:mod:`assets.transforms`). The result is MERGEd into one row per user; a row's
``updated_day`` is the partition day that last changed it. Re-running a
partition changes nothing, and re-running an older partition never overwrites
rows a newer partition already wrote.

A run over a range of partitions (``BackfillPolicy.single_run``) reads the
events once and processes the days in order inside one Spark run.
"""

import logging
import warnings
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING

from dagster import (
    AssetExecutionContext,
    BackfillPolicy,
    BetaWarning,
    DailyPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    asset,
)

from assets import transforms
from assets.columns import column_metadata
from assets.common import table_metadata, write_quarantine
from assets.resources import LakecastSparkResource, LakeResource
from lakecast.config import Settings
from lakecast.delta import io as delta_io
from lakecast.spark import local_checkpoint
from lakecast.tables import DIM_PRODUCTS, DIM_USERS, EVENTS, USER_SEGMENTS
from lakecast.tools.datagen import DATA_START

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SEGMENTS_GROUP = "segments"
DAILY_PARTITIONS = DailyPartitionsDefinition(start_date=DATA_START.isoformat())
"""UTC days from the first generated day (``lakecast.tools.datagen.DATA_START``)."""

FEATURE_COLUMNS = (
    "segment", "recency_days", "frequency", "monetary", "purchases", "interests",
    "last_event_at", "tenure_days",
)  # fmt: skip


@dataclass(frozen=True)
class DayOutcome:
    """What one partition day did."""

    day: str
    input_rows: int
    accepted_rows: int
    quarantined_rows: int
    delta_version: int
    rows_inserted: int
    rows_updated: int
    rows_deleted: int


def _merge_day(
    spark: "SparkSession", settings: Settings, accepted: "DataFrame", users: "DataFrame", day: date
) -> delta_io.MergeResult:
    """MERGE the features as of ``day``; rows a later day already wrote are kept as they are."""
    path = settings.table_path(USER_SEGMENTS)
    source = transforms.user_features(accepted, users, day)
    if delta_io.table_exists(path, spark):
        newer = delta_io.read(spark, path).filter(f"updated_day > DATE'{day.isoformat()}'")
        source = source.join(newer.select("user_id"), "user_id", "left_anti").unionByName(newer)
    return delta_io.merge_upsert(
        spark, source, path, keys=["user_id"], compare_columns=FEATURE_COLUMNS,
        delete_missing=True,
    )  # fmt: skip


def build_segments(
    spark: "SparkSession",
    settings: Settings,
    days: list[date],
    run_id: str,
    log: logging.Logger | None = None,
) -> list[DayOutcome]:
    """Quarantine the bad events of ``days`` and MERGE each day's segments, in day order."""
    from pyspark.sql import functions as F

    days = sorted(days)
    keys = [d.isoformat() for d in days]
    events = delta_io.read(spark, settings.table_path(EVENTS)).filter(
        F.col("ingest_day") <= keys[-1]
    )
    users = local_checkpoint(delta_io.read(spark, settings.table_path(DIM_USERS)))
    products = delta_io.read(spark, settings.table_path(DIM_PRODUCTS))
    classified = local_checkpoint(transforms.classify_events(events, users, products))
    in_range = classified.filter(F.col("ingest_day").isin(keys))
    counts: dict[tuple[str, bool], int] = {
        (r["ingest_day"], r["ok"]): r["count"]
        for r in in_range.groupBy("ingest_day", F.col("_reason").isNull().alias("ok"))
        .count()
        .collect()
    }
    rejected = transforms.quarantine_frame(
        in_range, EVENTS, USER_SEGMENTS, F.col("ingest_day"), run_id, datetime.now(UTC)
    )
    write_quarantine(spark, settings, rejected, USER_SEGMENTS, keys)
    accepted = local_checkpoint(
        classified.filter(F.col("_reason").isNull())
        .select("user_id", "event_type", "amount", "event_ts", "category")
    )
    outcomes = []
    for day, key in zip(days, keys, strict=True):
        res = delta_io.retry_on_conflict(
            lambda day=day: _merge_day(spark, settings, accepted, users, day)
        )
        ok, bad = counts.get((key, True), 0), counts.get((key, False), 0)
        outcome = DayOutcome(key, ok + bad, ok, bad, res.version, res.inserted, res.updated,
                             res.deleted)  # fmt: skip
        if log is not None:
            log.info(f"user_segments {key}: {outcome}")
        outcomes.append(outcome)
    return outcomes


def segment_counts(spark: "SparkSession", settings: Settings) -> dict[str, int]:
    """Rows per segment in ``user_segments`` (every segment present, 0 when empty)."""
    rows = delta_io.read(spark, settings.table_path(USER_SEGMENTS)).groupBy("segment").count()
    got = {r["segment"]: r["count"] for r in rows.collect()}
    return {s: int(got.get(s, 0)) for s in transforms.SEGMENTS}


# A range of days in one Spark run is deliberate (see the module docstring), although
# Dagster 1.13 still calls the asset's ``backfill_policy`` parameter beta: silence exactly that.
warnings.filterwarnings(
    "ignore", message="Parameter `backfill_policy` of function `asset`", category=BetaWarning
)


@asset(
    name=USER_SEGMENTS,
    metadata=column_metadata(USER_SEGMENTS),
    deps=[EVENTS, DIM_USERS, DIM_PRODUCTS],
    partitions_def=DAILY_PARTITIONS,
    backfill_policy=BackfillPolicy.single_run(),
    group_name=SEGMENTS_GROUP,
    kinds={"spark", "delta"},
    description="One row per user: RFM features, interests and segment as of the partition day.",
)
def user_segments(
    context: AssetExecutionContext, pyspark: LakecastSparkResource, lake: LakeResource
) -> MaterializeResult:
    """Segment users for the run's partition day(s), in day order (see module docstring)."""
    spark = pyspark.spark_session
    settings = lake.settings()
    days = sorted(date.fromisoformat(k) for k in context.partition_keys)
    outcomes = build_segments(spark, settings, days, context.run.run_id, context.log)
    sizes = segment_counts(spark, settings)
    last = outcomes[-1]
    return MaterializeResult(
        metadata=table_metadata(
            spark,
            settings,
            USER_SEGMENTS,
            {
                "delta_version": last.delta_version,
                "first_day": outcomes[0].day,
                "last_day": last.day,
                "partitions_processed": len(outcomes),
                "rows_inserted": sum(o.rows_inserted for o in outcomes),
                "rows_updated": sum(o.rows_updated for o in outcomes),
                "rows_deleted": sum(o.rows_deleted for o in outcomes),
                "input_rows": sum(o.input_rows for o in outcomes),
                "accepted_rows": sum(o.accepted_rows for o in outcomes),
                "quarantined_rows": sum(o.quarantined_rows for o in outcomes),
                **{f"segment_{s.lower()}": n for s, n in sizes.items()},
                "per_day": MetadataValue.json([asdict(o) for o in outcomes]),
            },
        )
    )
