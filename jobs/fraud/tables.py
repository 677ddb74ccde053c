"""The fraud pipeline's input tables for the demo, as Dagster assets (group ``fraud``):

* ``fraud_rules`` (the broadcast table): the demo rules, written as a new Delta version
  only where they changed (one MERGE of new/changed rules, one DELETE of removed ones);
  config ``disabled`` lists rule ids to write with ``enabled = false``;
* ``transactions`` (the events table): each materialization appends ``count`` generated
  transactions (deterministic from ``seed``) after the newest ``tx_id`` and ``ts``.

:func:`write_rules` and :func:`append_transactions` are the same writes without Dagster.
"""

import random
from collections.abc import Sequence
from typing import Any

from dagster import AssetExecutionContext, Config, MaterializeResult, asset
from pydantic import Field

from assets.columns import COLUMN_SCHEMA, column_metadata, describe
from dagster_lakecast import LakecastSparkResource, LakeResource
from examples.common import write_table_version
from examples.fraud_detection import MINUTE
from jobs.fraud.defs import FRAUD_RULES, TRANSACTIONS
from lakecast.delta import io as delta_io

__all__ = [
    "DEMO_RULES", "RULES_SCHEMA", "TX_SCHEMA", "append_transactions", "demo_transactions",
    "fraud_rules", "rule", "transactions", "write_rules",
]  # fmt: skip

RULES_SCHEMA = (
    "rule_id string, small_below double, large_above double, window_ms long, "
    "action string, enabled boolean"
)
TX_SCHEMA = "tx_id long, user_id string, amount double, merchant string, ts long"
Row = dict[str, Any]


def rule(
    rule_id: str,
    small_below: float,
    large_above: float,
    window_ms: int,
    action: str,
    enabled: bool = True,
) -> Row:
    """One row of ``fraud_rules``."""
    return {
        "rule_id": rule_id,
        "small_below": small_below,
        "large_above": large_above,
        "window_ms": window_ms,
        "action": action,
        "enabled": enabled,
    }


DEMO_RULES = (
    rule("card_test", 1.0, 500.0, MINUTE, "BLOCK"),
    rule("probe", 5.0, 200.0, 2 * MINUTE, "REVIEW"),
)


def write_rules(spark: Any, path: str, rules: Sequence[Row]) -> int | None:
    """Make ``rules`` the table's contents (a first full write, then only the changed and
    removed rules); returns the newest version."""
    old = None
    if delta_io.latest_version(path) is not None:
        old = [r.asDict() for r in delta_io.read(spark, path).collect()]
    write_table_version(spark, path, old, rules, "rule_id", RULES_SCHEMA)
    return delta_io.latest_version(path)


def demo_transactions(
    seed: int, count: int, first_tx_id: int, start_ts: int, users: int = 4, merchants: int = 40
) -> list[Row]:
    """``count`` transactions: a third small, two fifths large, 1 to 15 s apart."""
    rnd = random.Random(seed)
    rows, ts = [], start_ts
    for i in range(count):
        ts += rnd.choice((1_000, 2_000, 5_000, 15_000))
        roll = rnd.random()
        amount = (
            rnd.uniform(0.1, 4.9)
            if roll < 0.35
            else rnd.uniform(210.0, 900.0)
            if roll < 0.75
            else rnd.uniform(10.0, 150.0)
        )
        rows.append(
            {
                "tx_id": first_tx_id + i,
                "user_id": f"u{rnd.randint(1, users)}",
                "amount": round(amount, 2),
                "merchant": f"m{rnd.randint(1, merchants)}",
                "ts": ts,
            }
        )
    return rows


def append_transactions(spark: Any, path: str, rows: Sequence[Row]) -> int | None:
    """Append ``rows`` (dicts with the :data:`TX_SCHEMA` columns) as one commit."""
    cols = [c.split()[0] for c in TX_SCHEMA.split(", ")]
    frame = spark.createDataFrame([tuple(r.get(c) for c in cols) for r in rows], TX_SCHEMA)
    delta_io.write(frame, path, mode="append")
    return delta_io.latest_version(path)


class FraudRulesConfig(Config):
    """Which demo rules are disabled in the version written."""

    disabled: list[str] = Field(
        default_factory=list, description="rule ids written with enabled = false"
    )


class TransactionsConfig(Config):
    """How many demo transactions one materialization appends."""

    count: int = Field(default=200, description="transactions appended (one commit)")
    seed: int = Field(default=17, description="generator seed (plus the table version)")


@asset(
    name=FRAUD_RULES,
    group_name="fraud",
    kinds={"spark", "delta"},
    description="Broadcast table of the fraud pipeline: rule_id, small_below, "
    "large_above, window_ms, action (BLOCK/REVIEW), enabled.",
    metadata=column_metadata(FRAUD_RULES),
)
def fraud_rules(
    context: AssetExecutionContext,
    config: FraudRulesConfig,
    pyspark: LakecastSparkResource,
    lake: LakeResource,
) -> MaterializeResult:
    """Write the demo rules (only what changed becomes the new version)."""
    unknown = set(config.disabled) - {r["rule_id"] for r in DEMO_RULES}
    if unknown:
        raise ValueError(
            f"{FRAUD_RULES}: no demo rule(s) {sorted(unknown)}; known: "
            f"{[r['rule_id'] for r in DEMO_RULES]}"
        )
    rows = [{**r, "enabled": r["rule_id"] not in config.disabled} for r in DEMO_RULES]
    spark, path = pyspark.spark_session, lake.table_path(FRAUD_RULES)
    version = write_rules(spark, path, rows)
    return MaterializeResult(
        metadata={
            "delta_version": version,
            "dagster/row_count": len(rows),
            "enabled": sum(r["enabled"] for r in rows),
            COLUMN_SCHEMA: describe(delta_io.read(spark, path).schema, FRAUD_RULES),
        }
    )


@asset(
    name=TRANSACTIONS,
    group_name="fraud",
    kinds={"spark", "delta"},
    description="Events table of the fraud pipeline (append-only): tx_id, user_id, "
    "amount, merchant, ts (epoch ms). The demo asset appends generated rows.",
    metadata=column_metadata(TRANSACTIONS),
)
def transactions(
    context: AssetExecutionContext,
    config: TransactionsConfig,
    pyspark: LakecastSparkResource,
    lake: LakeResource,
) -> MaterializeResult:
    """Append ``count`` demo transactions after the newest ``tx_id`` and ``ts``."""
    from pyspark.sql import functions as F

    spark, path = pyspark.spark_session, lake.table_path(TRANSACTIONS)
    version = delta_io.latest_version(path)
    first, start = 0, 0
    if version is not None:
        top = delta_io.read(spark, path).agg(F.max("tx_id"), F.max("ts")).collect()[0]
        first, start = (top[0] or -1) + 1, top[1] or 0
    rows = demo_transactions(config.seed + (version or 0), config.count, first, start)
    new = append_transactions(spark, path, rows)
    schema = describe(delta_io.read(spark, path).schema, TRANSACTIONS)
    return MaterializeResult(
        metadata={"delta_version": new, "appended": len(rows), COLUMN_SCHEMA: schema}
    )
