"""The daily-partitioned ``user_segments`` asset: the broadcast record of each user.

``user_segments`` holds the seed's ``UserSegment`` record — user_id, segment,
lifetime_value, interests — plus ``updated_day``, the partition day that last changed
the record. Nothing in it depends on the day alone, so partition D MERGEs only the
users whose record differs from D's ``user_features`` rows (inserted, changed, or gone
from dim_users): a daily commit holds exactly the users whose record changed.

Re-running a partition changes nothing (the records are equal). An older partition
never overwrites a newer one: partition D is skipped (nothing committed) when the
table already holds a record a later day changed (``max(updated_day) > D``).
A ranged run processes its days in order, one MERGE per day, and each partition's
materialization carries that day's own counts.
"""

import logging
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING

from dagster import (
    AssetExecutionContext,
    BackfillPolicy,
    MaterializeResult,
    MetadataValue,
    asset,
)

from assets import transforms
from assets.columns import COLUMN_SCHEMA, column_metadata, describe
from assets.common import table_pool
from assets.features import DAILY_PARTITIONS, SEGMENTS_GROUP
from assets.tables import USER_FEATURES, USER_SEGMENTS
from dagster_lakecast import LakecastSparkResource, LakeResource
from lakecast.config import Settings
from lakecast.delta import io as delta_io
from lakecast.errors import LakecastError
from lakecast.spark import local_checkpoint

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DAILY_PARTITIONS", "DayOutcome", "build_segments", "segment_counts", "user_segments"]


@dataclass(frozen=True)
class DayOutcome:
    """What one ``user_segments`` partition day did."""

    day: str
    input_rows: int
    delta_version: int
    rows_inserted: int
    rows_updated: int
    rows_deleted: int
    skipped_for: str | None
    segments: dict[str, int]

    @property
    def changed_users(self) -> int:
        """Users whose record this day's commit inserted, changed or deleted."""
        return self.rows_inserted + self.rows_updated + self.rows_deleted


def _newest_day(spark: "SparkSession", path: str) -> date | None:
    from pyspark.sql import functions as F

    if not delta_io.table_exists(path, spark):
        return None
    return delta_io.read(spark, path).agg(F.max("updated_day")).first()[0]


def _segment_day(spark: "SparkSession", settings: Settings, day: date) -> DayOutcome:
    """MERGE day ``day``'s records (only the users whose record changed)."""
    from pyspark.sql import functions as F

    features = delta_io.read(spark, settings.table_path(USER_FEATURES)).filter(
        F.col("day") == F.lit(day)
    )
    records = local_checkpoint(
        transforms.segment_records(features).withColumn("updated_day", F.lit(day))
    )
    n_input = records.count()
    if n_input == 0:
        raise LakecastError(
            f"{USER_FEATURES} has no rows for day {day.isoformat()}: materialize "
            f"{USER_FEATURES} for partition {day.isoformat()} before {USER_SEGMENTS}"
        )
    sizes = {r["segment"]: int(r["count"]) for r in records.groupBy("segment").count().collect()}
    segments = {s: sizes.get(s, 0) for s in transforms.SEGMENTS}
    path = settings.table_path(USER_SEGMENTS)
    newest = _newest_day(spark, path)
    if newest is not None and newest > day:
        version = delta_io.latest_version(path, spark)
        assert version is not None
        return DayOutcome(day.isoformat(), n_input, version, 0, 0, 0, newest.isoformat(), segments)
    res = delta_io.merge_upsert(
        spark, records, path, keys=["user_id"], compare_columns=transforms.SEGMENT_RECORD,
        delete_missing=True,
    )  # fmt: skip
    return DayOutcome(day.isoformat(), n_input, res.version, res.inserted, res.updated, res.deleted,
                      None, segments)  # fmt: skip


def build_segments(
    spark: "SparkSession", settings: Settings, days: list[date], log: logging.Logger | None = None
) -> list[DayOutcome]:
    """MERGE each day's changed records into ``user_segments``, in day order."""
    outcomes = []
    for day in sorted(days):
        outcome = delta_io.retry_on_conflict(lambda day=day: _segment_day(spark, settings, day))
        if log is not None:
            log.info(f"{USER_SEGMENTS} {outcome.day}: {outcome}")
        outcomes.append(outcome)
    return outcomes


def segment_counts(spark: "SparkSession", settings: Settings) -> dict[str, int]:
    """Rows per segment in ``user_segments`` (every segment present, 0 when empty)."""
    rows = delta_io.read(spark, settings.table_path(USER_SEGMENTS)).groupBy("segment").count()
    got = {r["segment"]: r["count"] for r in rows.collect()}
    return {s: int(got.get(s, 0)) for s in transforms.SEGMENTS}


@asset(
    name=USER_SEGMENTS,
    metadata=column_metadata(USER_SEGMENTS),
    deps=[USER_FEATURES],
    partitions_def=DAILY_PARTITIONS,
    backfill_policy=BackfillPolicy.single_run(),
    group_name=SEGMENTS_GROUP,
    kinds={"spark", "delta"},
    pool=table_pool(USER_SEGMENTS),
    description="One row per user: segment, lifetime value and interests (the broadcast "
    "record); a day commits only the users whose record changed.",
)
def user_segments(
    context: AssetExecutionContext, pyspark: LakecastSparkResource, lake: LakeResource
) -> MaterializeResult:
    """Segment users for the run's partition day(s), in day order (see module docstring)."""
    spark = pyspark.spark_session
    settings = lake.settings()
    days = [date.fromisoformat(k) for k in context.partition_keys]
    outcomes = build_segments(spark, settings, days, context.log)
    path = settings.table_path(USER_SEGMENTS)
    schema = describe(delta_io.read(spark, path).schema, USER_SEGMENTS)
    for o in outcomes:  # each partition its own figures (not the range's totals)
        context.add_asset_metadata(
            {
                "dagster/row_count": o.input_rows,
                "delta_version": o.delta_version,
                "changed_users": o.changed_users,
                "rows_inserted": o.rows_inserted,
                "rows_updated": o.rows_updated,
                "rows_deleted": o.rows_deleted,
                "input_rows": o.input_rows,
                "skipped_for_newer_day": o.skipped_for or "",
                **{f"segment_{s.lower()}": n for s, n in o.segments.items()},
            },
            partition_key=o.day,
        )
    uri = MetadataValue.path(path)
    return MaterializeResult(metadata={COLUMN_SCHEMA: schema, "dagster/uri": uri})
