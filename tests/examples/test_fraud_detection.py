"""Seed 004 (fraud rules with keyed state, timer and TTL): harness and Spark vs reference."""

from __future__ import annotations

from collections.abc import Sequence

from examples.common import HarnessDriver, Outputs, SparkDriver, Step, sorted_rows
from examples.fraud_detection import (
    MERCHANT_TTL_MS,
    MINUTE,
    REVIEW,
    RULES,
    SEEN_MERCHANTS,
    SMALL_TX,
    TABLE,
    FraudDetector,
    fraud_rule,
    generate,
    reference,
    spark_driver,
)
from lakecast.api.element import BroadcastElement
from tests.examples.helpers import run_stepwise

BLOCK_RULE = fraud_rule("card_test", 1.0, 500.0, MINUTE, "BLOCK")
REVIEW_RULE = fraud_rule("probe", 5.0, 200.0, 2 * MINUTE, "REVIEW")


def driver(function: FraudDetector | None = None) -> HarnessDriver:
    return HarnessDriver(function or FraudDetector(), table=TABLE, key="rule_id",
                         order_columns=("tx_id",))


def tx(tx_id: int, user: str, amount: float, merchant: str, ts: int) -> dict:
    return {"tx_id": tx_id, "user_id": user, "amount": amount, "merchant": merchant, "ts": ts}


def expected(steps: Sequence[Step]) -> tuple[list[dict], list[dict]]:
    ref = reference(steps)
    return sorted_rows(ref["block"]), sorted_rows(ref["review"])


def actual(out: Outputs) -> tuple[list[dict], list[dict]]:
    return sorted_rows(out.main), sorted_rows(out.side.get(REVIEW.name, []))


def alert(rule_id: str, user: str, small: int, large: dict) -> dict:
    return {"rule_id": rule_id, "user_id": user, "small_tx_id": small,
            "large_tx_id": large["tx_id"], "merchant": large["merchant"],
            "amount": large["amount"], "ts": large["ts"]}


class KeepsFlags(FraudDetector):
    """Without the keyed effect of a rule change: flags of removed rules stay."""

    def process_broadcast_element(self, value: BroadcastElement, ctx) -> None:
        ctx.get_broadcast_state(RULES).apply(value, key_columns="rule_id")


def test_generated_scenario_matches_reference_after_every_step() -> None:
    steps = generate()
    out = run_stepwise(driver(), steps, expected, actual)
    block, review = actual(out)
    assert block and review
    # the scenario's alerts depend on the merchant TTL: without expiry they would differ
    no_ttl = reference(steps, merchant_ttl_ms=10**12)
    assert (sorted_rows(no_ttl["block"]), sorted_rows(no_ttl["review"])) != (block, review)


def test_block_goes_to_main_output_and_review_to_side_output() -> None:
    large = tx(3, "u1", 650.0, "m2", 20_000)
    steps = [Step([BLOCK_RULE, REVIEW_RULE],
                  [tx(1, "u1", 0.5, "m1", 1_000), tx(2, "u2", 3.0, "m1", 2_000), large,
                   tx(4, "u2", 300.0, "m3", 30_000)], 0)]
    out = driver().run(steps)
    assert out.main == [alert("card_test", "u1", 1, large)]
    assert sorted_rows(out.side[REVIEW.name]) == sorted_rows([
        alert("probe", "u1", 1, large),
        alert("probe", "u2", 2, tx(4, "u2", 300.0, "m3", 30_000))])
    assert actual(out) == expected(steps)


def test_only_the_next_transaction_counts_and_only_at_a_new_merchant() -> None:
    steps = [Step([BLOCK_RULE],
                  [tx(1, "u1", 0.5, "m1", 1_000), tx(2, "u1", 50.0, "m2", 2_000),
                   tx(3, "u1", 900.0, "m3", 3_000),       # not right after the small one
                   tx(4, "u1", 0.2, "m4", 4_000), tx(5, "u1", 900.0, "m4", 5_000)],  # known
                  0)]
    out = driver().run(steps)
    assert out.main == [] and actual(out) == expected(steps)


def test_event_time_timer_clears_the_small_transaction_flag() -> None:
    d = driver()
    d.step(Step([BLOCK_RULE], [tx(1, "u1", 0.5, "m1", 1_000)], 0))
    h = d.harness
    assert h.keyed_state(SMALL_TX, "u1") == {
        "card_test": {"tx_id": 1, "amount": 0.5, "ts": 1_000, "deadline": 61_000}}
    assert h.timers("u1") == [("event_time", 61_000)]
    h.advance_watermark(60_999)
    assert h.keyed_state(SMALL_TX, "u1") is not None
    h.advance_watermark(61_000)
    assert h.keyed_state(SMALL_TX, "u1") is None and h.timers("u1") == []
    # a large transaction after the window alerts nothing
    d.step(Step(None, [tx(2, "u1", 900.0, "m2", 61_500)], 0))
    assert d.outputs.main == []


def test_large_transaction_within_the_window_but_in_a_later_batch_alerts() -> None:
    large = tx(2, "u1", 900.0, "m2", 60_999)
    steps = [Step([BLOCK_RULE], [tx(1, "u1", 0.5, "m1", 1_000)], 0),
             Step(None, [large], 1_000)]
    out = driver().run(steps)
    assert out.main == [alert("card_test", "u1", 1, large)] and actual(out) == expected(steps)


def test_seen_merchants_expire_after_the_ttl() -> None:
    def scenario(later: int) -> list[Step]:
        return [Step([BLOCK_RULE], [tx(1, "u1", 40.0, "m1", 1_000)], 0),
                Step(None, [tx(2, "u1", 0.5, "m9", 100_000), tx(3, "u1", 800.0, "m1", 110_000)],
                     later)]

    seen = scenario(MERCHANT_TTL_MS - 1)  # m1 is still known: no alert
    d = driver()
    d.step(seen[0])
    assert d.harness.keyed_state(SEEN_MERCHANTS, "u1") == {"m1": 1_000}
    d.step(seen[1])
    assert d.outputs.main == [] and actual(d.outputs) == expected(seen)

    gone = scenario(MERCHANT_TTL_MS)  # m1 expired: it is a new merchant again
    d = driver()
    d.step(gone[0])
    d.harness.set_processing_time(MERCHANT_TTL_MS)
    assert d.harness.expire() == 1
    assert d.harness.keyed_state(SEEN_MERCHANTS, "u1") == {}
    d = driver()
    out = d.run(gone)
    assert out.main == [alert("card_test", "u1", 2, gone[1].events[1])]
    assert actual(out) == expected(gone)


def test_removed_rule_drops_its_flags_for_every_user() -> None:
    steps = [Step([BLOCK_RULE, REVIEW_RULE],
                  [tx(1, "u1", 0.5, "m1", 1_000), tx(2, "u2", 0.5, "m1", 2_000)], 0),
             Step([REVIEW_RULE], [], 1_000),
             Step([BLOCK_RULE, REVIEW_RULE],
                  [tx(3, "u1", 700.0, "m2", 10_000), tx(4, "u2", 700.0, "m2", 11_000)], 2_000)]
    d = driver()
    d.step(steps[0])
    d.step(steps[1])
    assert set(d.harness.keyed_state(SMALL_TX, "u1")) == {"probe"}
    assert set(d.harness.keyed_state(SMALL_TX, "u2")) == {"probe"}
    d.step(steps[2])
    assert d.outputs.main == [] and len(d.outputs.side[REVIEW.name]) == 2
    assert actual(d.outputs) == expected(steps)
    # the steps depend on it: keeping the flags would alert on the re-added BLOCK rule
    assert actual(driver(KeepsFlags()).run(steps)) != expected(steps)


def test_spark_runtime_matches_reference(spark, lake) -> None:
    steps = generate()
    d: SparkDriver = spark_driver(spark, lake.lake_root)
    out = d.run(steps)
    block, review = actual(out)
    assert block and review
    assert (block, review) == expected(steps)
