"""Pure Spark transformations of the batch layer (no Dagster here).

Validation marks each raw row with a ``_reason`` (null when accepted) and its
raw record as JSON (``_raw``); accepted rows become the dimensions and the
events used for features, the others go to the ``quarantine`` table.

Segment rules, evaluated in this order as of the END of partition day D
(``recency_days`` = D minus the day of the user's last event)::

    VIP       monetary >= 750.00 (sum of purchase amounts to date) AND recency_days <= 2
    NEW       tenure_days < 7 (signed up within the 7 days ending on D)
    CHURNING  no event yet, OR recency_days >= 3
    REGULAR   everyone else (active within the last 3 days)

Only users who signed up on or before D are segmented.
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from typing import TYPE_CHECKING

from assets.datagen import EVENT_TYPES, TS_FORMAT

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

VIP_MIN_MONETARY = 750
VIP_MAX_RECENCY_DAYS = 2
NEW_MAX_TENURE_DAYS = 6
CHURNING_MIN_RECENCY_DAYS = 3
SEGMENTS = ("VIP", "NEW", "CHURNING", "REGULAR")
TOP_INTERESTS = 3
MONEY = "decimal(18,2)"

QUARANTINE_COLUMNS = (
    "source_table", "asset", "partition_key", "reason", "raw_record", "run_id", "quarantined_at",
)  # fmt: skip


def _with_raw(df: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    # ``struct("*")``: the columns resolve on the server with the plan, so building the
    # frame asks Spark Connect for no schema (a round trip per batch in continuous mode)
    return df.withColumn("_raw", F.to_json(F.struct("*")))


def _first_reason(checks: list[tuple[Column, str]]) -> Column:
    from pyspark.sql import functions as F

    expr = None
    for cond, reason in checks:
        expr = F.when(cond, F.lit(reason)) if expr is None else expr.when(cond, F.lit(reason))
    assert expr is not None
    return expr.otherwise(F.lit(None).cast("string"))


def _dedupe(df: DataFrame, key: str, reason: str, order: list[str]) -> DataFrame:
    """Mark all but the first accepted row per ``key`` (by ``order``) as ``reason``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy(F.col(key), F.col("_reason").isNull()).orderBy(*order)
    rn = F.row_number().over(w)
    return df.withColumn(
        "_reason",
        F.when(F.col("_reason").isNull() & (rn > 1), F.lit(reason)).otherwise(F.col("_reason")),
    )


def classify_users(raw: DataFrame) -> DataFrame:
    """Raw users plus ``signup_at`` (parsed), ``_raw`` and ``_reason``."""
    from pyspark.sql import functions as F

    df = _with_raw(raw).withColumn(
        "signup_at", F.try_to_timestamp(F.col("signup_ts"), F.lit(TS_FORMAT))
    )
    df = df.withColumn(
        "_reason",
        _first_reason(
            [
                (F.col("user_id").isNull(), "null_user_id"),
                (F.col("signup_at").isNull(), "unparsable_signup_ts"),
            ]
        ),
    )
    return _dedupe(df, "user_id", "duplicate_user_id", ["_raw"])


def dim_users_frame(classified: DataFrame) -> DataFrame:
    """Accepted users, one row per ``user_id``."""
    from pyspark.sql import functions as F

    return classified.filter(F.col("_reason").isNull()).select(
        "user_id",
        "name",
        "email",
        "country",
        F.col("signup_at").alias("signup_ts"),
        F.to_date("signup_at").alias("signup_date"),
    )


def classify_products(raw: DataFrame) -> DataFrame:
    """Raw products plus ``_raw`` and ``_reason``."""
    from pyspark.sql import functions as F

    df = _with_raw(raw)
    df = df.withColumn(
        "_reason",
        _first_reason(
            [
                (F.col("product_id").isNull(), "null_product_id"),
                (F.col("category").isNull(), "null_category"),
                (F.col("price").isNull(), "null_price"),
                (F.isnan("price"), "nan_price"),
                (F.col("price") < 0, "negative_price"),
            ]
        ),
    )
    return _dedupe(df, "product_id", "duplicate_product_id", ["_raw"])


def dim_products_frame(classified: DataFrame) -> DataFrame:
    """Accepted products, one row per ``product_id``."""
    from pyspark.sql import functions as F

    return classified.filter(F.col("_reason").isNull()).select(
        "product_id", "name", "category", F.col("price").cast("decimal(10,2)").alias("price")
    )


def parse_event_time(raw: DataFrame) -> DataFrame:
    """``raw`` plus ``event_ts``, parsed from the string ``event_time`` (null if unparsable)."""
    from pyspark.sql import functions as F

    return raw.withColumn("event_ts", F.try_to_timestamp(F.col("event_time"), F.lit(TS_FORMAT)))


def event_format_checks() -> list[tuple[Column, str]]:
    """The intrinsic checks of an event (no dimension look-ups), in order: the batch
    layer and the micro-batch validator share them. Needs ``event_ts``."""
    from pyspark.sql import functions as F

    return [
        (F.col("event_id").isNull(), "null_event_id"),
        (F.col("user_id").isNull(), "null_user_id"),
        (F.col("product_id").isNull(), "null_product_id"),
        (~F.col("event_type").isin(*EVENT_TYPES) | F.col("event_type").isNull(),
         "unknown_event_type"),
        (F.col("amount").isNull(), "null_amount"),
        (F.isnan("amount"), "nan_amount"),
        (F.col("amount") < 0, "negative_amount"),
        (F.col("event_ts").isNull(), "unparsable_event_time"),
    ]  # fmt: skip


def classify_events(raw: DataFrame, dim_users: DataFrame, dim_products: DataFrame) -> DataFrame:
    """Raw events plus ``event_ts``, ``category``, ``_raw`` and ``_reason``.

    Ids must exist in the dimensions; a repeated ``event_id`` keeps its first
    accepted occurrence (earliest ``ingest_day``, then raw record order).
    """
    from pyspark.sql import functions as F

    users = dim_users.select("user_id", F.lit(True).alias("_user_ok"))
    products = dim_products.select("product_id", "category")
    df = (
        parse_event_time(_with_raw(raw))
        .join(F.broadcast(users), "user_id", "left")
        .join(F.broadcast(products), "product_id", "left")
    )
    checks = [
        *event_format_checks(),
        (F.col("_user_ok").isNull(), "unknown_user_id"),
        (F.col("category").isNull(), "unknown_product_id"),
    ]
    df = df.withColumn("_reason", _first_reason(checks))
    return _dedupe(df, "event_id", "duplicate_event_id", ["ingest_day", "_raw"]).drop("_user_ok")


def classify_event_format(raw: DataFrame) -> DataFrame:
    """Raw events plus ``event_ts`` and ``_reason`` from the intrinsic checks only
    (unknown ids are the broadcast state's business); a repeated ``event_id`` keeps
    its first accepted occurrence by raw record."""

    df = _with_raw(parse_event_time(raw))
    df = df.withColumn("_reason", _first_reason(event_format_checks()))
    return _dedupe(df, "event_id", "duplicate_event_id", ["_raw"]).drop("_raw")


def quarantine_frame(
    classified: DataFrame, source_table: str, asset: str, partition_col: Column | None, run_id: str,
    quarantined_at: datetime,
) -> DataFrame:  # fmt: skip
    """Rejected rows of ``classified`` in the quarantine table's schema.

    ``partition_col`` gives each row's ``partition_key`` (None: null, unpartitioned asset).
    """
    from pyspark.sql import functions as F

    if partition_col is None:
        partition_col = F.lit(None)

    return classified.filter(F.col("_reason").isNotNull()).select(
        F.lit(source_table).alias("source_table"),
        F.lit(asset).alias("asset"),
        partition_col.cast("string").alias("partition_key"),
        F.col("_reason").alias("reason"),
        F.col("_raw").alias("raw_record"),
        F.lit(run_id).alias("run_id"),
        F.lit(quarantined_at).cast("timestamp").alias("quarantined_at"),
    )


def segment_column() -> Column:
    """The segment rule (see module docstring) over the feature columns."""
    from pyspark.sql import functions as F

    return (
        F.when(
            (F.col("monetary") >= VIP_MIN_MONETARY)
            & (F.col("recency_days") <= VIP_MAX_RECENCY_DAYS),
            "VIP",
        )
        .when(F.col("tenure_days") <= NEW_MAX_TENURE_DAYS, "NEW")
        .when(
            F.col("recency_days").isNull()
            | (F.col("recency_days") >= CHURNING_MIN_RECENCY_DAYS),
            "CHURNING",
        )
        .otherwise("REGULAR")
    )


def user_features(accepted_events: DataFrame, dim_users: DataFrame, day: date) -> DataFrame:
    """Per-user features as of the end of ``day`` (the ``user_features`` rows of ``day``).

    ``accepted_events`` are classified events with a null ``_reason``. Columns:
    day, user_id, recency_days, frequency, monetary, purchases, interests (top
    categories by event count, ties by name), last_event_at, tenure_days.
    """
    from pyspark.sql import functions as F

    end = datetime.combine(day + timedelta(days=1), time())
    ev = accepted_events.filter(F.col("event_ts") < F.lit(end))
    purchase = F.col("event_type") == "purchase"
    agg = ev.groupBy("user_id").agg(
        F.count(F.lit(1)).alias("frequency"),
        F.sum(F.when(purchase, F.col("amount").cast(MONEY))).alias("monetary"),
        F.count(F.when(purchase, F.lit(1))).alias("purchases"),
        F.max("event_ts").alias("last_event_at"),
    )
    ranked = F.sort_array(F.collect_list(F.struct((-F.col("n")).alias("k"), "category")))
    interests = (
        ev.groupBy("user_id", "category")
        .agg(F.count(F.lit(1)).alias("n"))
        .groupBy("user_id")
        .agg(
            F.transform(F.slice(ranked, 1, TOP_INTERESTS), lambda s: s["category"]).alias(
                "interests"
            )
        )
    )
    population = dim_users.filter(F.col("signup_date") <= F.lit(day)).select(
        "user_id", "signup_date"
    )
    return (
        population.join(agg, "user_id", "left")
        .join(interests, "user_id", "left")
        .select(
            F.lit(day).alias("day"),
            "user_id",
            F.datediff(F.lit(day), F.to_date("last_event_at")).alias("recency_days"),
            F.coalesce("frequency", F.lit(0)).cast("long").alias("frequency"),
            F.coalesce("monetary", F.lit(0)).cast(MONEY).alias("monetary"),
            F.coalesce("purchases", F.lit(0)).cast("long").alias("purchases"),
            F.coalesce("interests", F.array().cast("array<string>")).alias("interests"),
            "last_event_at",
            F.datediff(F.lit(day), F.col("signup_date")).alias("tenure_days"),
        )
    )


SEGMENT_RECORD = ("segment", "lifetime_value", "interests")
"""The broadcast record of a user besides its key (the seed's ``UserSegment``)."""


def segment_records(features: DataFrame) -> DataFrame:
    """``user_segments`` records from one day's ``user_features`` rows: user_id,
    segment (the rule above), lifetime_value (= monetary), interests."""
    from pyspark.sql import functions as F

    return features.select(
        "user_id",
        segment_column().alias("segment"),
        F.col("monetary").alias("lifetime_value"),
        "interests",
    )
