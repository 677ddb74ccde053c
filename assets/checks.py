"""Asset checks of the batch layer, computed from the Delta tables themselves.

* ``unique_non_null_keys``  on dim_users, dim_products, user_segments
* ``segment_domain``        on user_segments: every segment is VIP/REGULAR/NEW/CHURNING
* ``counts_reconcile``      input rows = accepted + quarantined, on every asset with a
  quarantine (dims: raw table = dimension + its quarantine rows; user_segments: the
  events of the last run's days = its accepted count + its quarantine rows)
"""

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetKey,
    asset_check,
)

from assets.common import quarantine_count
from assets.resources import LakecastSparkResource, LakeResource
from assets.transforms import SEGMENTS
from lakecast.delta import io as delta_io
from lakecast.tables import (
    DIM_PRODUCTS,
    DIM_USERS,
    EVENTS,
    RAW_PRODUCTS,
    RAW_USERS,
    USER_SEGMENTS,
)


def _unique_keys_check(table: str, key: str) -> AssetChecksDefinition:
    @asset_check(
        asset=table,
        name="unique_non_null_keys",
        description=f"Every {key} is non-null and appears once.",
    )
    def _check(pyspark: LakecastSparkResource, lake: LakeResource) -> AssetCheckResult:
        from pyspark.sql import functions as F

        df = delta_io.read(pyspark.spark_session, lake.table_path(table))
        row = df.agg(
            F.count(F.lit(1)).alias("rows"),
            F.count_distinct(key).alias("distinct"),
            F.count(F.when(F.col(key).isNull(), 1)).alias("nulls"),
        ).first()
        rows, distinct, nulls = int(row["rows"]), int(row["distinct"]), int(row["nulls"])
        return AssetCheckResult(
            passed=nulls == 0 and distinct == rows,
            metadata={"rows": rows, "distinct_keys": distinct, "null_keys": nulls},
        )

    return _check


def _dimension_reconcile_check(table: str, source: str) -> AssetChecksDefinition:
    @asset_check(
        asset=table,
        name="counts_reconcile",
        description=f"Rows of {source} = rows of {table} + its quarantined rows.",
    )
    def _check(pyspark: LakecastSparkResource, lake: LakeResource) -> AssetCheckResult:
        spark = pyspark.spark_session
        settings = lake.settings()
        n_input = delta_io.read(spark, settings.table_path(source)).count()
        n_accepted = delta_io.read(spark, settings.table_path(table)).count()
        n_quarantined = quarantine_count(spark, settings, table, None)
        return AssetCheckResult(
            passed=n_input == n_accepted + n_quarantined,
            metadata={
                "input_rows": n_input,
                "accepted_rows": n_accepted,
                "quarantined_rows": n_quarantined,
            },
        )

    return _check


@asset_check(
    asset=USER_SEGMENTS,
    name="segment_domain",
    description=f"Every segment is one of {', '.join(SEGMENTS)}.",
)
def segment_domain(pyspark: LakecastSparkResource, lake: LakeResource) -> AssetCheckResult:
    """No null or unknown segment."""
    from pyspark.sql import functions as F

    df = delta_io.read(pyspark.spark_session, lake.table_path(USER_SEGMENTS))
    bad = df.filter(F.col("segment").isNull() | ~F.col("segment").isin(*SEGMENTS)).count()
    return AssetCheckResult(passed=bad == 0, metadata={"rows_outside_domain": bad})


@asset_check(
    asset=USER_SEGMENTS,
    name="counts_reconcile",
    description=(
        "For the days of the latest materialization: events ingested on those days = "
        "accepted rows reported + quarantine rows for those partitions."
    ),
)
def segments_counts_reconcile(
    context: AssetCheckExecutionContext, pyspark: LakecastSparkResource, lake: LakeResource
) -> AssetCheckResult:
    """Recount the input and the quarantine and compare with the reported accepted count."""
    from datetime import date, timedelta

    from pyspark.sql import functions as F

    event = context.instance.get_latest_materialization_event(AssetKey(USER_SEGMENTS))
    if event is None or event.asset_materialization is None:
        return AssetCheckResult(passed=False, metadata={"error": "no materialization yet"})
    meta = event.asset_materialization.metadata
    first = date.fromisoformat(str(meta["first_day"].value))
    last = date.fromisoformat(str(meta["last_day"].value))
    keys = [(first + timedelta(days=i)).isoformat() for i in range((last - first).days + 1)]
    spark = pyspark.spark_session
    settings = lake.settings()
    n_input = (
        delta_io.read(spark, settings.table_path(EVENTS))
        .filter(F.col("ingest_day").isin(keys))
        .count()
    )
    n_quarantined = quarantine_count(spark, settings, USER_SEGMENTS, keys)
    reported_accepted = int(meta["accepted_rows"].value)
    reported_quarantined = int(meta["quarantined_rows"].value)
    return AssetCheckResult(
        passed=n_input == reported_accepted + n_quarantined
        and reported_quarantined == n_quarantined,
        metadata={
            "first_day": first.isoformat(),
            "last_day": last.isoformat(),
            "input_rows": n_input,
            "accepted_rows": reported_accepted,
            "quarantined_rows": n_quarantined,
        },
    )


BATCH_CHECKS: list[AssetChecksDefinition] = [
    _unique_keys_check(DIM_USERS, "user_id"),
    _unique_keys_check(DIM_PRODUCTS, "product_id"),
    _unique_keys_check(USER_SEGMENTS, "user_id"),
    _dimension_reconcile_check(DIM_USERS, RAW_USERS),
    _dimension_reconcile_check(DIM_PRODUCTS, RAW_PRODUCTS),
    segment_domain,
    segments_counts_reconcile,
]
