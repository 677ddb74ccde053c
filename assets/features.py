"""The daily-partitioned ``user_features`` asset: per-user RFM features as of each day.

Partition D (a UTC day) validates the events ingested on D (malformed or duplicate
events go to ``quarantine`` under asset ``user_features``, partition D), then computes,
for every user who signed up by D, features over all accepted events up to the end of
D — recency_days, frequency, monetary (the LTV), purchases, interests (top 3
categories), tenure_days. The Delta table ``user_features`` holds one row per (day,
user) and is physically partitioned by ``day``: partition D replaces only day D's
rows, and only when they differ, so re-running a partition commits nothing and no
partition ever touches another day's rows.

These features change every day for every user (recency, tenure); the broadcast table
``user_segments`` (:mod:`assets.segments`) keeps only the record derived from them.
A run over a range of partitions (``BackfillPolicy.single_run``) reads the events once
and writes the days in order; each partition's materialization carries its own counts.
"""

import logging
import warnings
from dataclasses import dataclass
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
from assets.columns import COLUMN_SCHEMA, column_metadata, describe
from assets.common import table_pool, write_quarantine
from assets.datagen import DATA_START
from assets.tables import DIM_PRODUCTS, DIM_USERS, EVENTS, USER_FEATURES
from dagster_lakecast import LakecastSparkResource, LakeResource
from lakecast.config import Settings
from lakecast.delta import io as delta_io
from lakecast.spark import persisted_frames

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SEGMENTS_GROUP = "segments"
DAILY_PARTITIONS = DailyPartitionsDefinition(start_date=DATA_START.isoformat())
"""UTC days from the first generated day (``assets.datagen.DATA_START``)."""
FEATURES_PARTITION_BY = ("day",)

@dataclass(frozen=True)
class FeatureDay:
    """What one ``user_features`` partition day did."""

    day: str
    input_rows: int
    accepted_rows: int
    quarantined_rows: int
    users: int
    delta_version: int
    rewritten: bool


def _day_predicate(day: date) -> str:
    return f"day = DATE'{day.isoformat()}'"


def _write_day(
    spark: "SparkSession", settings: Settings, rows: "DataFrame", day: date
) -> tuple[int, bool]:
    """Replace day ``day``'s rows with ``rows`` unless they are equal; (version, written)."""
    path = settings.table_path(USER_FEATURES)
    if delta_io.table_exists(path, spark):
        current = delta_io.read(spark, path).filter(_day_predicate(day))
        same = (
            rows.exceptAll(current).limit(1).count() == 0
            and current.exceptAll(rows).limit(1).count() == 0
        )
        if same:
            version = delta_io.latest_version(path, spark)
            assert version is not None
            return version, False
    version = delta_io.replace_where(
        rows, path, _day_predicate(day), partition_by=FEATURES_PARTITION_BY
    )
    return version, True


def build_features(
    spark: "SparkSession",
    settings: Settings,
    days: list[date],
    run_id: str,
    log: logging.Logger | None = None,
) -> list[FeatureDay]:
    """Quarantine the bad events of ``days`` and write each day's features, in day order."""
    from pyspark.sql import functions as F

    days = sorted(days)
    keys = [d.isoformat() for d in days]
    events = delta_io.read(spark, settings.table_path(EVENTS)).filter(
        F.col("ingest_day") <= keys[-1]
    )
    # intermediate frames persisted (not locally checkpointed: see persisted_frames)
    with persisted_frames() as persist:
        users = persist(delta_io.read(spark, settings.table_path(DIM_USERS)))
        products = delta_io.read(spark, settings.table_path(DIM_PRODUCTS))
        classified = persist(transforms.classify_events(events, users, products))
        in_range = classified.filter(F.col("ingest_day").isin(keys))
        counts: dict[tuple[str, bool], int] = {
            (r["ingest_day"], r["ok"]): r["count"]
            for r in in_range.groupBy("ingest_day", F.col("_reason").isNull().alias("ok"))
            .count()
            .collect()
        }
        rejected = transforms.quarantine_frame(
            in_range, EVENTS, USER_FEATURES, F.col("ingest_day"), run_id, datetime.now(UTC)
        )
        write_quarantine(spark, settings, rejected, USER_FEATURES, keys)
        accepted = persist(
            classified.filter(F.col("_reason").isNull())
            .select("user_id", "event_type", "amount", "event_ts", "category")
        )
        outcomes = []
        for day, key in zip(days, keys, strict=True):
            with persisted_frames() as persist_day:
                rows = persist_day(transforms.user_features(accepted, users, day))
                version, written = delta_io.retry_on_conflict(
                    lambda day=day, rows=rows: _write_day(spark, settings, rows, day)
                )
                n_rows = rows.count()
            ok, bad = counts.get((key, True), 0), counts.get((key, False), 0)
            outcome = FeatureDay(key, ok + bad, ok, bad, n_rows, version, written)
            if log is not None:
                log.info(f"{USER_FEATURES} {key}: {outcome}")
            outcomes.append(outcome)
    return outcomes


# A range of days in one Spark run is deliberate (see the module docstring), although
# Dagster 1.13 still calls the asset's ``backfill_policy`` parameter beta: silence exactly that.
warnings.filterwarnings(
    "ignore", message="Parameter `backfill_policy` of function `asset`", category=BetaWarning
)


@asset(
    name=USER_FEATURES,
    metadata=column_metadata(USER_FEATURES),
    deps=[EVENTS, DIM_USERS, DIM_PRODUCTS],
    partitions_def=DAILY_PARTITIONS,
    backfill_policy=BackfillPolicy.single_run(),
    group_name=SEGMENTS_GROUP,
    kinds={"spark", "delta"},
    pool=table_pool(USER_FEATURES),
    description="Per user and day: RFM features and interests as of the end of the day.",
)
def user_features(
    context: AssetExecutionContext, pyspark: LakecastSparkResource, lake: LakeResource
) -> MaterializeResult:
    """Features for the run's partition day(s), in day order (see module docstring)."""
    spark = pyspark.spark_session
    settings = lake.settings()
    days = sorted(date.fromisoformat(k) for k in context.partition_keys)
    outcomes = build_features(spark, settings, days, context.run.run_id, context.log)
    path = settings.table_path(USER_FEATURES)
    schema = describe(delta_io.read(spark, path).schema, USER_FEATURES)
    for o in outcomes:  # each partition its own figures (not the range's totals)
        context.add_asset_metadata(
            {
                "dagster/row_count": o.users,
                "delta_version": o.delta_version,
                "rewritten": o.rewritten,
                "input_rows": o.input_rows,
                "accepted_rows": o.accepted_rows,
                "quarantined_rows": o.quarantined_rows,
            },
            partition_key=o.day,
        )
    uri = MetadataValue.path(path)
    return MaterializeResult(metadata={COLUMN_SCHEMA: schema, "dagster/uri": uri})
