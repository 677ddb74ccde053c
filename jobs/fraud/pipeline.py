"""The fraud-rules pipeline (seeds 002 and 004): its function and declaration, without
Dagster (:mod:`jobs.fraud.defs` declares it through the factory; :mod:`jobs.registry` builds
it for the ``lakecast`` CLI).

Transactions (``transactions``: tx_id, user_id, amount, merchant, ts in epoch ms) are
keyed by user and checked against the rules of the broadcast table ``fraud_rules``
(rule_id, small_below, large_above, window_ms, action BLOCK|REVIEW, enabled) by
:class:`examples.fraud_detection.FraudDetector`: a small transaction followed, within the
rule's window, by a large one at a merchant the user has not used lately. BLOCK alerts go
to ``fraud_alerts`` (main output), REVIEW alerts to ``fraud_review`` (side output
``review``). A disabled (or deleted) rule stops firing from its Delta version on: it
leaves the broadcast state and its pending flags are dropped for every user.

Every rules version must pass :data:`RULES_CONTRACT` (one row per non-null rule_id, the
used columns present, an action BLOCK or REVIEW, thresholds and window set): a version
that breaks it fails the run before anything is written, naming table, version and key.
Invalid transactions go to ``fraud_rejected`` with their reason.
"""

import os
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from assets.columns import COLUMNS, schemas
from dagster_lakecast import CheckpointPolicy, DagsterNames, PipelineDeclaration
from examples.fraud_detection import MERCHANT_TTL, RULES, FraudDetector
from lakecast.api.contracts import TableContract
from lakecast.api.keyed import KeyedContext
from lakecast.config import parse_duration
from lakecast.pipeline.micro_batch import REASON_COLUMN

__all__ = [
    "FRAUD", "FRAUD_ALERTS", "FRAUD_REJECTED", "FRAUD_REVIEW", "FRAUD_RULES",
    "RULES_CONTRACT", "RULE_COLUMNS", "TRANSACTIONS", "FraudRules", "validate_transactions",
]  # fmt: skip

FRAUD_RULES = "fraud_rules"
TRANSACTIONS = "transactions"
FRAUD_ALERTS = "fraud_alerts"
FRAUD_REVIEW = "fraud_review"
FRAUD_REJECTED = "fraud_rejected"
ACTIONS = ("BLOCK", "REVIEW")
#: the rules table's columns besides rule_id (all read by the function)
RULE_COLUMNS = ("small_below", "large_above", "window_ms", "action", "enabled")


def check_rules(rows: pa.Table, table: str, version: int) -> list[str]:
    """Row check of ``fraud_rules``: known actions, every used value set, windows > 0."""
    reasons = []
    for r in rows.to_pylist():
        bad = [c for c in RULE_COLUMNS if r[c] is None]
        if r["action"] is not None and r["action"] not in ACTIONS:
            bad.append(f"action={r['action']!r} (not one of {', '.join(ACTIONS)})")
        if r["window_ms"] is not None and r["window_ms"] <= 0:
            bad.append(f"window_ms={r['window_ms']} (must be > 0)")
        if bad:
            reasons.append(
                f"{table}@v{version}: rule_id={r['rule_id']!r} has bad or null "
                f"{', '.join(bad)}; write a version of {table} that fixes it"
            )
    return reasons


#: a keyed pipeline applies every version's changes, so a bad version fails the run
RULES_CONTRACT = TableContract(
    FRAUD_RULES, ("rule_id",), RULE_COLUMNS, checks=(check_rules,), on_invalid="fail"
)


#: ``FRAUD_MERCHANT_TTL`` (this example project's own variable, e.g. ``10m``; default
#: 1 h): how long a merchant counts
#: as used before; a shorter TTL bounds the keyed state sooner (the soak sets it)
FRAUD_MERCHANT_TTL = (parse_duration(os.environ["FRAUD_MERCHANT_TTL"],
                                     "FRAUD_MERCHANT_TTL")
                      if os.environ.get("FRAUD_MERCHANT_TTL") else MERCHANT_TTL)


class FraudRules(FraudDetector):
    """:class:`~examples.fraud_detection.FraudDetector` over a rules table with an
    ``enabled`` column and a contract: a disabled rule leaves the state (its flags are
    dropped, as for a changed rule) until a version enables it again."""

    merchant_ttl = FRAUD_MERCHANT_TTL

    def table_contracts(self) -> list[TableContract]:
        return [RULES_CONTRACT]

    def process_broadcast_element(self, value: Any, ctx: KeyedContext) -> None:
        super().process_broadcast_element(value, ctx)
        rules = ctx.get_broadcast_state(RULES)
        for rule_id, rule in list(rules.items()):
            if not rule["enabled"]:
                rules.remove(rule_id)


def validate_transactions(events: DataFrame) -> DataFrame:
    """Add ``_reason`` (null = valid): null ids, user, merchant or ts; a NaN, null or
    negative amount; a second copy of a ``tx_id`` within the batch."""
    reason = (
        F.when(F.col("tx_id").isNull(), "null_tx_id")
        .when(F.col("user_id").isNull(), "null_user_id")
        .when(F.col("merchant").isNull(), "null_merchant")
        .when(F.col("ts").isNull(), "null_ts")
        .when(F.col("amount").isNull() | F.isnan("amount"), "nan_amount")
        .when(F.col("amount") < 0, "negative_amount")
    )
    first = Window.partitionBy("tx_id").orderBy(F.to_json(F.struct(*events.columns)))
    copy = F.col("tx_id").isNotNull() & (F.row_number().over(first) > 1)
    return events.withColumn(
        REASON_COLUMN, F.coalesce(reason, F.when(copy, F.lit("duplicate_tx_id"))).cast("string")
    )


# The declaration: about 20 lines (README, "Declare a pipeline").
FRAUD = PipelineDeclaration(
    name="fraud",
    function=FraudRules,
    events_table=TRANSACTIONS,
    broadcast_tables=(FRAUD_RULES,),
    output_table=FRAUD_ALERTS,
    side_outputs={"review": FRAUD_REVIEW},
    rejected_table=FRAUD_REJECTED,
    validator=validate_transactions,
    timestamp_column="ts",
    order_columns=("tx_id",),
    parallelism=2,
    checkpoint=CheckpointPolicy(every=10),
    dagster=DagsterNames(
        columns=schemas(*COLUMNS),  # each table's declared columns (assets/columns.py)
        description="Fraud rules per user: BLOCK alerts, REVIEW alerts (side output).",
        descriptions={
            FRAUD_ALERTS: "BLOCK alerts: small-then-large transactions at a new "
            "merchant, per enabled BLOCK rule.",
            FRAUD_REVIEW: "Side output: alerts of enabled REVIEW rules.",
        },
    ),
)
