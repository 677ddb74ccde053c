"""Seed 004: fraud detection with keyed state, an event-time timer, a TTL and broadcast rules.

Transactions ``{tx_id, user_id, amount, merchant, ts}`` are keyed by ``user_id``; rules
``{rule_id, small_below, large_above, window_ms, action}`` come from the Delta table
``fraud_rules``. As in Flink's fraud-detection tutorial, a rule fires on a small
transaction (``amount < small_below``) immediately followed, within ``window_ms``, by a
large one (``amount > large_above``) — here only at a merchant the user has not used
recently. Keyed state per user:

* ``small_tx`` (ValueState): per rule, the last small transaction (the tutorial's flag);
  an event-time timer at ``ts + window_ms`` clears it (and any next transaction does);
* ``seen_merchants`` (MapState with a processing-time TTL): merchants used lately.

``BLOCK`` rules alert on the main output, ``REVIEW`` rules on the side output
``review``. A removed or redefined rule's flags are dropped for every user.

Run it on Spark: ``.venv/bin/python -m examples.fraud_detection``.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from examples.common import Row, SparkDriver, Step, run_on_spark, sorted_rows
from lakecast.api.descriptors import MapStateDescriptor, OutputTag
from lakecast.api.element import BroadcastElement
from lakecast.api.keyed import (
    KeyedBroadcastProcessFunction,
    KeyedContext,
    KeyedReadOnlyContext,
    OnTimerContext,
)
from lakecast.api.keyed_state import StateTtlConfig, ValueStateDescriptor

TABLE = "fraud_rules"
#: how long a merchant counts as "used before" (processing time since its last use)
MERCHANT_TTL = dt.timedelta(hours=1)
MERCHANT_TTL_MS = int(MERCHANT_TTL.total_seconds() * 1000)

RULES = MapStateDescriptor("fraud_rules", str, dict)
#: keyed: rule_id -> {tx_id, amount, ts, deadline} of the last small transaction
SMALL_TX = ValueStateDescriptor("small_tx", dict)
#: keyed: merchant -> ts of the user's last transaction there (expires after the TTL)
def seen_merchants(ttl: dt.timedelta) -> MapStateDescriptor:
    """The ``seen_merchants`` state with a merchant TTL of ``ttl``."""
    return MapStateDescriptor("seen_merchants", str, int).enable_time_to_live(
        StateTtlConfig.new_builder(ttl).build())


SEEN_MERCHANTS = seen_merchants(MERCHANT_TTL)

ALERT_SCHEMA = pa.schema([
    ("rule_id", pa.string()), ("user_id", pa.string()), ("small_tx_id", pa.int64()),
    ("large_tx_id", pa.int64()), ("merchant", pa.string()), ("amount", pa.float64()),
    ("ts", pa.int64()),
])
REVIEW = OutputTag("review", ALERT_SCHEMA)

TABLE_SCHEMA = ("rule_id string, small_below double, large_above double, window_ms long, "
                "action string")
EVENT_SCHEMA = "tx_id long, user_id string, amount double, merchant string, ts long"


class FraudDetector(KeyedBroadcastProcessFunction):
    """Small-then-large at a new merchant, per user and rule; BLOCK -> main, REVIEW -> side."""

    key_by = "user_id"
    #: how long a merchant counts as used before (a subclass may shorten it)
    merchant_ttl: dt.timedelta = MERCHANT_TTL

    def __init__(self, merchant_ttl: dt.timedelta | None = None) -> None:
        # an instance attribute travels with the pickled function to the Python workers; a
        # class attribute would be re-evaluated there, where the workers import this class
        # in the Spark server's environment, not the run's
        self.merchant_ttl = merchant_ttl or type(self).merchant_ttl

    def state_descriptors(self) -> list[MapStateDescriptor]:
        return [RULES]

    def keyed_state_descriptors(self) -> list[Any]:
        seen = SEEN_MERCHANTS if self.merchant_ttl == MERCHANT_TTL \
            else seen_merchants(self.merchant_ttl)
        return [SMALL_TX, seen]

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        return ALERT_SCHEMA

    def output_tags(self) -> list[OutputTag]:
        return [REVIEW]

    def process_broadcast_element(self, value: BroadcastElement, ctx: KeyedContext) -> None:
        rules = ctx.get_broadcast_state(RULES)
        before = dict(rules.items())
        rules.apply(value, key_columns="rule_id")
        gone = {rid for rid, r in before.items() if rules.get(rid) != r}
        if not gone:
            return

        def drop_flags(user: Any, state: Any) -> None:
            flags = {rid: f for rid, f in state.value().items() if rid not in gone}
            state.update(flags or None)

        ctx.apply_to_keyed_state(SMALL_TX, drop_flags)

    def process_element(self, value: Row, ctx: KeyedReadOnlyContext) -> Iterator[Row]:
        small = ctx.get_state(SMALL_TX)
        seen = ctx.get_map_state(SEEN_MERCHANTS)
        flags = dict(small.value() or {})
        ts, amount, merchant = ctx.timestamp(), value["amount"], value["merchant"]
        assert ts is not None
        new_merchant = not seen.contains(merchant)
        timers = ctx.timer_service()
        for rid, rule in sorted(ctx.get_broadcast_state(RULES).items()):
            flag = flags.pop(rid, None)
            if flag is not None:
                if ts < flag["deadline"] and amount > rule["large_above"] and new_merchant:
                    alert = {"rule_id": rid, "user_id": value["user_id"],
                             "small_tx_id": flag["tx_id"], "large_tx_id": value["tx_id"],
                             "merchant": merchant, "amount": amount, "ts": ts}
                    if rule["action"] == "REVIEW":
                        ctx.output(REVIEW, alert)
                    else:
                        yield alert
                if all(f["deadline"] != flag["deadline"] for f in flags.values()):
                    timers.delete_event_time_timer(flag["deadline"])
            if amount < rule["small_below"]:
                deadline = ts + rule["window_ms"]
                flags[rid] = {"tx_id": value["tx_id"], "amount": amount, "ts": ts,
                              "deadline": deadline}
                timers.register_event_time_timer(deadline)
        small.update(flags or None)
        seen.put(merchant, ts)

    def on_timer(self, timestamp: int, ctx: OnTimerContext) -> None:
        """The window of a small transaction is over: clear its flag."""
        small = ctx.get_state(SMALL_TX)
        flags = {rid: f for rid, f in (small.value() or {}).items()
                 if f["deadline"] > timestamp}
        small.update(flags or None)


# ------------------------------------------------------------------------------ data
def fraud_rule(rule_id: str, small_below: float, large_above: float, window_ms: int,
               action: str) -> Row:
    return {"rule_id": rule_id, "small_below": small_below, "large_above": large_above,
            "window_ms": window_ms, "action": action}


MINUTE = 60_000
#: the rules table over time (None: unchanged)
RULE_VERSIONS: tuple[list[Row] | None, ...] = (
    [fraud_rule("card_test", 1.0, 500.0, MINUTE, "BLOCK")],
    None,
    [fraud_rule("card_test", 1.0, 500.0, MINUTE, "BLOCK"),
     fraud_rule("probe", 5.0, 200.0, 2 * MINUTE, "REVIEW")],
    None,
    [fraud_rule("probe", 5.0, 200.0, 2 * MINUTE, "REVIEW")],
    [fraud_rule("probe", 5.0, 300.0, 2 * MINUTE, "REVIEW"),
     fraud_rule("card_test", 2.0, 400.0, MINUTE, "BLOCK")],
    None,
)
USERS = ("u1", "u2", "u3")
MERCHANTS = tuple(f"m{i}" for i in range(1, 17))
#: processing time between two batches: every second batch crosses the merchant TTL
BATCH_MS = MERCHANT_TTL_MS // 2 + 5 * MINUTE


def _amount(rnd: random.Random) -> float:
    roll = rnd.random()
    if roll < 0.2:
        return round(rnd.uniform(0.1, 0.99), 2)
    if roll < 0.35:
        return round(rnd.uniform(1.0, 4.99), 2)
    if roll < 0.7:
        return round(rnd.uniform(210.0, 900.0), 2)
    return round(rnd.uniform(10.0, 120.0), 2)


def generate(seed: int = 4, tx_per_step: int = 40) -> list[Step]:
    """A deterministic scenario: :data:`RULE_VERSIONS`, a few users, bursts of small and
    large transactions (event time: 10 minutes per batch, 1 to 15 s apart)."""
    rnd = random.Random(seed)
    steps, tx_id = [], 0
    for i, rules in enumerate(RULE_VERSIONS):
        events, ts = [], i * 10 * MINUTE
        for _ in range(tx_per_step):
            tx_id += 1
            ts += rnd.choice((1_000, 3_000, 5_000, 15_000))
            events.append({"tx_id": tx_id, "user_id": rnd.choice(USERS),
                           "amount": _amount(rnd), "merchant": rnd.choice(MERCHANTS),
                           "ts": ts})
        steps.append(Step(table=rules, events=events, processing_time=i * BATCH_MS))
    return steps


# ------------------------------------------------------------------------------ reference
def reference(steps: Sequence[Step], merchant_ttl_ms: int = MERCHANT_TTL_MS
              ) -> dict[str, list[Row]]:
    """The expected ``{"block": [...], "review": [...]}`` alerts, in plain Python."""
    rules: dict[str, Row] = {}
    flags: dict[str, dict[str, Row]] = {}      # user -> rule -> small tx (with deadline)
    used: dict[str, dict[str, int]] = {}       # user -> merchant -> processing time used
    watermark: int | None = None
    out: dict[str, list[Row]] = {"block": [], "review": []}
    for step in steps:
        now = step.processing_time
        if step.table is not None:
            new = {r["rule_id"]: dict(r) for r in step.table}
            changed = {rid for rid in rules if new.get(rid) != rules[rid]}
            for user_flags in flags.values():
                for rid in changed:
                    user_flags.pop(rid, None)
            rules = new
        for tx in sorted(step.events, key=lambda e: (e["ts"], e["tx_id"])):
            user, ts, amount = tx["user_id"], tx["ts"], tx["amount"]
            mine = flags.setdefault(user, {})
            last_used = used.setdefault(user, {}).get(tx["merchant"])
            is_new = last_used is None or last_used + merchant_ttl_ms <= now
            for rid in sorted(rules):
                rule = rules[rid]
                prev = mine.pop(rid, None)
                if (prev is not None and ts - prev["ts"] < rule["window_ms"]
                        and amount > rule["large_above"] and is_new):
                    out["review" if rule["action"] == "REVIEW" else "block"].append(
                        {"rule_id": rid, "user_id": user, "small_tx_id": prev["tx_id"],
                         "large_tx_id": tx["tx_id"], "merchant": tx["merchant"],
                         "amount": amount, "ts": ts})
                if amount < rule["small_below"]:
                    mine[rid] = {"tx_id": tx["tx_id"], "ts": ts, "window_ms": rule["window_ms"]}
            used[user][tx["merchant"]] = now
        if step.events:
            top = max(e["ts"] for e in step.events)
            watermark = top if watermark is None else max(watermark, top)
            for user_flags in flags.values():  # the timers: windows over by the watermark
                for rid in [r for r, f in user_flags.items()
                            if f["ts"] + f["window_ms"] <= watermark]:
                    del user_flags[rid]
    return out


# ------------------------------------------------------------------------------ Spark
def spark_driver(spark: Any, root: str) -> SparkDriver:
    return SparkDriver(spark, FraudDetector(), root=root, table=TABLE, key="rule_id",
                       table_schema=TABLE_SCHEMA, event_schema=EVENT_SCHEMA,
                       order_columns=("tx_id",), side_tags=(REVIEW.name,))


def main() -> None:
    """Run the scenario on Spark + Delta and print a summary."""
    steps = generate()
    out = run_on_spark(spark_driver, steps)
    review = out.side.get(REVIEW.name, [])
    expected = reference(steps)
    print(f"fraud_detection: {len(steps)} batches, {sum(len(s.events) for s in steps)} "
          f"transactions, {len(out.main)} BLOCK alerts, {len(review)} REVIEW alerts")
    for (rid, user), n in sorted(Counter((a["rule_id"], a["user_id"])
                                         for a in out.main + review).items()):
        print(f"  {rid:<10} {user:<4} {n}")
    same = (sorted_rows(out.main) == sorted_rows(expected["block"])
            and sorted_rows(review) == sorted_rows(expected["review"]))
    print(f"matches the plain-Python reference: {same}")


if __name__ == "__main__":
    main()
