"""The enrichment that the ``enrichment_microbatch`` job runs (the seeds' tutorial, 002).

Events are enriched with three broadcast states built from Delta tables:

* ``dim_products`` → ``product_category``, ``product_price`` (unknown product:
  the event goes to the ``unmatched`` side output, with its reason);
* ``user_segments`` → ``segment`` (VIP / REGULAR / NEW / CHURNING; unknown or
  not yet segmented user: ``NEW``);
* ``feature_flags`` → ``vip_discount_pct``: the flag ``vip_discount`` (value =
  percent) applies to VIP users while it is enabled, else 0.

Plus intrinsic validation of raw events (the same reasons the batch layer uses):
rows failing it go to ``enrichment_rejected`` with their reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from lakecast.api import Context, MapStateDescriptor, ReadOnlyContext
from lakecast.datagen import EVENT_TYPES, TS_FORMAT
from lakecast.enrich import Enrichment, Lookup
from lakecast.source import BroadcastElement
from lakecast.tables import DIM_PRODUCTS, USER_SEGMENTS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

FEATURE_FLAGS = "feature_flags"
VIP_DISCOUNT_FLAG = "vip_discount"
FLAGS = MapStateDescriptor(FEATURE_FLAGS, str, dict, key_columns=("flag",))


class StorefrontEnrichment(Enrichment):
    """Product + segment lookups, and a feature flag applied per event (vectorized)."""

    def __init__(self) -> None:
        super().__init__(
            [
                Lookup(DIM_PRODUCTS, key="product_id",
                       columns={"category": "product_category", "price": "product_price"},
                       on_missing="unmatched"),
                Lookup(USER_SEGMENTS, key="user_id", columns=["segment"],
                       defaults={"segment": "NEW"}),
            ]
        )  # fmt: skip

    def state_descriptors(self) -> Sequence[MapStateDescriptor]:
        return [*super().state_descriptors(), FLAGS]

    def process_broadcast_element(self, value: Any, ctx: Context) -> None:
        if isinstance(value, BroadcastElement) and value.table == FEATURE_FLAGS:
            ctx.get_broadcast_state(FLAGS).apply(value, "flag")
        else:
            super().process_broadcast_element(value, ctx)

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        base = super().output_schema(input_schema)
        return base.append(pa.field("vip_discount_pct", pa.float64()))

    def transform(self, batch: pa.RecordBatch, ctx: ReadOnlyContext) -> pa.RecordBatch:
        flag = ctx.get_broadcast_state(FLAGS).get(VIP_DISCOUNT_FLAG)
        pct = 0.0
        if flag is not None and flag["enabled"]:
            try:
                pct = float(flag["value"])
            except (TypeError, ValueError):
                pct = 0.0  # a malformed flag value disables the discount
        is_vip = pc.fill_null(pc.equal(batch.column("segment"), "VIP"), False)
        discount = pc.if_else(is_vip, pa.scalar(pct), pa.scalar(0.0))
        return batch.append_column("vip_discount_pct", discount)


def validate_events(events: DataFrame) -> DataFrame:
    """Add ``_reason`` (null = valid) and the parsed ``event_ts`` to raw events.

    Only intrinsic checks: whether a user or product is known is the broadcast
    state's business (missing-state policy), not the validator's. Duplicate
    ``event_id`` s within a batch keep their first occurrence (by raw record).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    df = events.withColumn("event_ts", F.try_to_timestamp(F.col("event_time"), F.lit(TS_FORMAT)))
    checks = [
        (F.col("event_id").isNull(), "null_event_id"),
        (F.col("user_id").isNull(), "null_user_id"),
        (F.col("product_id").isNull(), "null_product_id"),
        (F.col("event_type").isNull() | ~F.col("event_type").isin(*EVENT_TYPES),
         "unknown_event_type"),
        (F.col("amount").isNull(), "null_amount"),
        (F.isnan("amount"), "nan_amount"),
        (F.col("amount") < 0, "negative_amount"),
        (F.col("event_ts").isNull(), "unparsable_event_time"),
    ]  # fmt: skip
    reason = F.when(checks[0][0], F.lit(checks[0][1]))
    for cond, why in checks[1:]:
        reason = reason.when(cond, F.lit(why))
    df = df.withColumn("_reason", reason.otherwise(F.lit(None).cast("string")))
    order = F.to_json(F.struct(*[F.col(c) for c in events.columns]))
    w = Window.partitionBy("event_id", F.col("_reason").isNull()).orderBy(order)
    return df.withColumn(
        "_reason",
        F.when(F.col("_reason").isNull() & (F.row_number().over(w) > 1),
               F.lit("duplicate_event_id")).otherwise(F.col("_reason")),
    )  # fmt: skip
