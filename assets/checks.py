"""Asset checks of the batch layer, computed from the Delta tables themselves.

* ``unique_non_null_keys``  on dim_users, dim_products, user_segments
* ``segment_domain``        on user_segments: every segment is VIP/REGULAR/NEW/CHURNING
* ``counts_reconcile``      input rows = accepted + quarantined, on every asset with a
  quarantine (dims: raw table = dimension + its quarantine rows; user_features: per
  day of the last run, the events of that day = its accepted count + its quarantine rows)
"""

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetKey,
    DagsterEventType,
    asset_check,
)

from assets.common import quarantine_count
from assets.tables import (
    DIM_PRODUCTS,
    DIM_USERS,
    EVENTS,
    RAW_PRODUCTS,
    RAW_USERS,
    USER_FEATURES,
    USER_SEGMENTS,
)
from assets.transforms import SEGMENTS
from dagster_lakecast import LakecastSparkResource, LakeResource
from lakecast.delta import io as delta_io


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
    asset=USER_FEATURES,
    name="counts_reconcile",
    description=(
        "For each day of the latest run: events ingested that day = accepted rows "
        "reported for its partition + quarantine rows of that partition."
    ),
)
def features_counts_reconcile(
    context: AssetCheckExecutionContext, pyspark: LakecastSparkResource, lake: LakeResource
) -> AssetCheckResult:
    """Recount the input and the quarantine per day and compare with the reported counts."""
    from pyspark.sql import functions as F

    key = AssetKey(USER_FEATURES)
    materialization = DagsterEventType.ASSET_MATERIALIZATION
    latest = context.instance.get_latest_materialization_event(key)
    if latest is None:
        return AssetCheckResult(passed=False, metadata={"error": "no materialization yet"})
    reported = {
        e.dagster_event.partition: e.asset_materialization.metadata
        for e in context.instance.all_logs(latest.run_id, of_type=materialization)
        if e.asset_materialization is not None and e.asset_materialization.asset_key == key
    }
    keys = sorted(k for k in reported if k is not None)
    spark = pyspark.spark_session
    settings = lake.settings()
    inputs = {
        r["ingest_day"]: int(r["count"])
        for r in delta_io.read(spark, settings.table_path(EVENTS))
        .filter(F.col("ingest_day").isin(keys))
        .groupBy("ingest_day")
        .count()
        .collect()
    }
    bad = []
    for day in keys:
        n_input = inputs.get(day, 0)
        n_quarantined = quarantine_count(spark, settings, USER_FEATURES, [day])
        accepted = int(reported[day]["accepted_rows"].value)
        quarantined = int(reported[day]["quarantined_rows"].value)
        if n_input != accepted + n_quarantined or quarantined != n_quarantined:
            bad.append(f"{day}: input {n_input} != accepted {accepted} + quarantined "
                       f"{n_quarantined} (reported {quarantined})")  # fmt: skip
    return AssetCheckResult(
        passed=bool(keys) and not bad,
        metadata={"days": ", ".join(keys), "input_rows": sum(inputs.values()),
                  "mismatches": "; ".join(bad) or "none"},
    )  # fmt: skip


BATCH_CHECKS: list[AssetChecksDefinition] = [
    _unique_keys_check(DIM_USERS, "user_id"),
    _unique_keys_check(DIM_PRODUCTS, "product_id"),
    _unique_keys_check(USER_SEGMENTS, "user_id"),
    _dimension_reconcile_check(DIM_USERS, RAW_USERS),
    _dimension_reconcile_check(DIM_PRODUCTS, RAW_PRODUCTS),
    segment_domain,
    features_counts_reconcile,
]
