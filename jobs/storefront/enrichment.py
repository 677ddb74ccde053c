"""The enrichment that the ``enrichment_microbatch`` job runs (the seeds' tutorial, 002).

Events are enriched with three broadcast states built from Delta tables:

* ``dim_products`` → ``product_category``, ``product_price`` (unknown product: the event
  is held, and the pipeline offers it again to each following batch until a version of
  ``dim_products`` has the product, or the hold timeout sends it to the ``unmatched``
  side output with its reason: :mod:`lakecast.pipeline.held`);
* ``user_segments`` → ``segment`` (VIP / REGULAR / NEW / CHURNING; unknown or
  not yet segmented user: ``NEW``);
* ``feature_flags`` → ``vip_discount_pct``: the flag ``vip_discount`` (value =
  percent) applies to VIP users while it is enabled, else 0.

Each table declares its contract (:mod:`lakecast.api.contracts`): one row per key, no
null key, the used columns present, and for ``feature_flags`` a ``vip_discount`` value
that is a number from 0 to 100 (:func:`check_vip_discount`). A version that breaks it is
refused: the state keeps the last good version and the refusal is reported.

Plus intrinsic validation of raw events (the same reasons the batch layer uses):
rows failing it go to ``enrichment_rejected`` with their reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from assets.tables import DIM_PRODUCTS, USER_SEGMENTS
from assets.transforms import classify_event_format
from lakecast.api.contracts import TableContract
from lakecast.api.descriptors import UNMATCHED, MapStateDescriptor, OutputTag
from lakecast.api.element import BroadcastElement
from lakecast.api.enrich import Enrichment, Lookup
from lakecast.api.functions import Context, ReadOnlyContext
from lakecast.errors import LakecastError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

FEATURE_FLAGS = "feature_flags"
VIP_DISCOUNT_FLAG = "vip_discount"
FLAGS = MapStateDescriptor(FEATURE_FLAGS, str, dict, key_columns=("flag",))


def vip_discount_pct(value: object) -> float | None:
    """The ``vip_discount`` flag's value as a percent, ``None`` when it is not a number
    from 0 to 100."""
    try:
        pct = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return pct if 0.0 <= pct <= 100.0 else None


def check_vip_discount(rows: pa.Table, table: str, version: int) -> list[str]:
    """Row check of ``feature_flags``: an enabled ``vip_discount`` has a usable value."""
    flags = rows.filter(pc.equal(rows.column("flag"), VIP_DISCOUNT_FLAG)).to_pylist()
    return [
        f"{table}@v{version}: flag={VIP_DISCOUNT_FLAG!r} has value={r['value']!r}, not a "
        f"percent from 0 to 100; write a version of {table} whose {VIP_DISCOUNT_FLAG} value "
        f"is a number (e.g. `lakecast flag set {VIP_DISCOUNT_FLAG} 10`)"
        for r in flags if r["enabled"] and vip_discount_pct(r["value"]) is None
    ]


FLAGS_CONTRACT = TableContract(FEATURE_FLAGS, ("flag",), ("enabled", "value"),
                               checks=(check_vip_discount,))


class StorefrontEnrichment(Enrichment):
    """Product + segment lookups, and a feature flag applied per event (vectorized)."""

    def __init__(self) -> None:
        super().__init__(
            [
                Lookup(DIM_PRODUCTS, key="product_id",
                       columns={"category": "product_category", "price": "product_price"},
                       on_missing="hold"),
                Lookup(USER_SEGMENTS, key="user_id", columns=["segment"],
                       defaults={"segment": "NEW"}),
            ]
        )  # fmt: skip

    def state_descriptors(self) -> Sequence[MapStateDescriptor]:
        return [*super().state_descriptors(), FLAGS]

    def output_tags(self) -> Sequence[OutputTag]:
        # the pipeline's unmatched table gets a (possibly empty) write every batch
        return [UNMATCHED]

    def table_contracts(self) -> Sequence[TableContract]:
        return [*super().table_contracts(), FLAGS_CONTRACT]

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
            parsed = vip_discount_pct(flag["value"])
            if parsed is None:  # the pipeline refuses such versions: never a silent default
                version = ctx.state_version().get(FEATURE_FLAGS)
                raise LakecastError(
                    f"{FEATURE_FLAGS}@v{version}: flag={VIP_DISCOUNT_FLAG!r} has "
                    f"value={flag['value']!r}, not a percent from 0 to 100; write a version "
                    f"of {FEATURE_FLAGS} whose {VIP_DISCOUNT_FLAG} value is a number")
            pct = parsed
        is_vip = pc.fill_null(pc.equal(batch.column("segment"), "VIP"), False)
        discount = pc.if_else(is_vip, pa.scalar(pct), pa.scalar(0.0))
        return batch.append_column("vip_discount_pct", discount)


def validate_events(events: DataFrame) -> DataFrame:
    """Add ``_reason`` (null = valid) and the parsed ``event_ts`` to raw events.

    The batch layer's intrinsic checks (:func:`assets.transforms.event_format_checks`);
    whether a user or product is known is the broadcast state's business (missing-state
    policy), not the validator's. Duplicate ``event_id`` s within a batch keep their
    first occurrence (by raw record).
    """
    return classify_event_format(events)
