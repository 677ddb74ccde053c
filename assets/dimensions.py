"""Dimension assets: dim_users and dim_products, refreshed by Delta MERGE.

Each refresh validates every raw row: malformed rows (null ids, unparsable
timestamps, NaN or negative prices, duplicate keys) go to ``quarantine``; the
accepted rows are MERGEd into the dimension by key, updating only rows whose
values changed and deleting rows gone from the source. So a raw refresh that
touches 1% of rows commits a Delta version (and Change Data Feed) with just those.
"""

from collections.abc import Callable
from datetime import UTC, datetime

from dagster import AssetExecutionContext, MaterializeResult, asset

from assets import transforms
from assets.columns import column_metadata
from assets.common import table_metadata, table_pool, write_quarantine
from assets.tables import DIM_PRODUCTS, DIM_USERS, RAW_PRODUCTS, RAW_USERS
from dagster_lakecast import LakecastSparkResource, LakeResource
from lakecast.delta import io as delta_io
from lakecast.spark import local_checkpoint

DIM_GROUP = "dimensions"


def refresh_dimension(
    context: AssetExecutionContext,
    pyspark: LakecastSparkResource,
    lake: LakeResource,
    *,
    source: str,
    target: str,
    key: str,
    classify: Callable,
    accepted: Callable,
) -> MaterializeResult:
    """Validate ``source``, quarantine rejects, MERGE accepted rows into ``target``."""
    spark = pyspark.spark_session
    settings = lake.settings()
    classified = local_checkpoint(classify(delta_io.read(spark, settings.table_path(source))))
    counts = {r["_reason"]: r["count"] for r in classified.groupBy("_reason").count().collect()}
    n_input = sum(counts.values())
    n_accepted = counts.get(None, 0)
    rejected = transforms.quarantine_frame(
        classified, source, target, None, context.run.run_id, datetime.now(UTC)
    )
    write_quarantine(spark, settings, rejected, target, None)
    n_quarantined = n_input - n_accepted
    path = settings.table_path(target)
    result = delta_io.retry_on_conflict(
        lambda: delta_io.merge_upsert(
            spark, accepted(classified), path, keys=[key], delete_missing=True
        )
    )
    reasons = {f"quarantined_{r}": n for r, n in sorted(counts.items(), key=str) if r}
    context.log.info(
        f"{target}: input {n_input} = accepted {n_accepted} + quarantined {n_quarantined}; "
        f"MERGE v{result.version} +{result.inserted} ~{result.updated} -{result.deleted}"
    )
    return MaterializeResult(
        metadata=table_metadata(
            spark,
            settings,
            target,
            {
                "delta_version": result.version,
                "rows_inserted": result.inserted,
                "rows_updated": result.updated,
                "rows_deleted": result.deleted,
                "table_created": result.created,
                "input_rows": n_input,
                "accepted_rows": n_accepted,
                "quarantined_rows": n_quarantined,
                **reasons,
            },
        )
    )


@asset(
    name=DIM_USERS,
    pool=table_pool(DIM_USERS),
    metadata=column_metadata(DIM_USERS),
    deps=[RAW_USERS],
    group_name=DIM_GROUP,
    kinds={"spark", "delta"},
    description="Clean users, one row per user_id (MERGE-refreshed from raw_users).",
)
def dim_users(
    context: AssetExecutionContext, pyspark: LakecastSparkResource, lake: LakeResource
) -> MaterializeResult:
    """Users keyed by ``user_id``: user_id, name, email, country, signup_ts, signup_date."""
    return refresh_dimension(
        context, pyspark, lake, source=RAW_USERS, target=DIM_USERS, key="user_id",
        classify=transforms.classify_users, accepted=transforms.dim_users_frame,
    )  # fmt: skip


@asset(
    name=DIM_PRODUCTS,
    pool=table_pool(DIM_PRODUCTS),
    metadata=column_metadata(DIM_PRODUCTS),
    deps=[RAW_PRODUCTS],
    group_name=DIM_GROUP,
    kinds={"spark", "delta"},
    description="Clean products, one row per product_id (MERGE-refreshed from raw_products).",
)
def dim_products(
    context: AssetExecutionContext, pyspark: LakecastSparkResource, lake: LakeResource
) -> MaterializeResult:
    """Products keyed by ``product_id``: product_id, name, category, price (decimal)."""
    return refresh_dimension(
        context, pyspark, lake, source=RAW_PRODUCTS, target=DIM_PRODUCTS, key="product_id",
        classify=transforms.classify_products, accepted=transforms.dim_products_frame,
    )  # fmt: skip
