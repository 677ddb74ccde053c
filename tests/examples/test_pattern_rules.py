"""Seed 001 (shape patterns per color): the harness and Spark against the plain reference."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from examples.common import HarnessDriver, Outputs, SparkDriver, Step, sorted_rows
from examples.pattern_rules import (
    ITEMS,
    RULES,
    TABLE,
    PatternMatcher,
    generate,
    reference,
    rule,
    spark_driver,
)
from lakecast.api.element import BroadcastElement
from tests.examples.helpers import run_stepwise


def driver(function: PatternMatcher | None = None) -> HarnessDriver:
    return HarnessDriver(function or PatternMatcher(), table=TABLE, key="name",
                         order_columns=("item_id",))


def item(item_id: int, color: str, shape: str, ts: int | None = None) -> dict:
    return {"item_id": item_id, "color": color, "shape": shape,
            "ts": item_id * 10 if ts is None else ts}


def expected(steps: Sequence[Step]) -> list[dict]:
    return sorted_rows(reference(steps))


def actual(out: Outputs) -> list[dict]:
    return sorted_rows(out.main)


class KeepsPending(PatternMatcher):
    """The seed without the removal step: a removed rule's pending items stay."""

    def process_broadcast_element(self, value: BroadcastElement, ctx) -> None:
        ctx.get_broadcast_state(RULES).apply(value, key_columns="name")


def test_generated_scenario_matches_reference_after_every_step() -> None:
    steps = generate()
    out = run_stepwise(driver(), steps, expected, actual)
    rules_matched = {m["rule"] for m in out.main}
    assert rules_matched == {"rect_tri", "circle_circle", "tri_square", "square_rect"}
    # the scenario adds AND removes rules while items flow
    tables = [s.table for s in steps if s.table is not None]
    names = [{r["name"] for r in t} for t in tables]
    assert any(a - b for a, b in pairwise(names))  # a removal
    assert any(b - a for a, b in pairwise(names))  # an addition


def test_scenario_depends_on_dropping_pending_items_of_removed_rules() -> None:
    """Without apply_to_keyed_state the outputs differ: the scenario tests the removal."""
    steps = generate()
    assert actual(driver(KeepsPending()).run(steps)) != expected(steps)


def test_removed_rule_drops_pending_items_of_every_color() -> None:
    d = driver()
    r = [rule("rect_tri", "rect", "tri")]
    d.step(Step(r, [item(1, "red", "rect"), item(2, "blue", "rect")], 0))
    h = d.harness
    assert h.keyed_state(ITEMS, "red") == {"rect_tri": [1]}
    assert h.keyed_state(ITEMS, "blue") == {"rect_tri": [2]}
    d.step(Step([], [item(3, "red", "tri")], 100))  # rule removed: nothing matches
    assert h.keys(ITEMS) == []
    steps = [Step(r, [item(1, "red", "rect"), item(2, "blue", "rect")], 0),
             Step([], [item(3, "red", "tri")], 100),
             Step(r, [item(4, "red", "tri"), item(5, "blue", "rect"), item(6, "blue", "tri")],
                  200)]
    d.step(steps[2])  # re-added: the items pending before the removal are gone
    assert d.outputs.main == [{"rule": "rect_tri", "color": "blue", "first_item": 5,
                               "second_item": 6}]
    assert actual(d.outputs) == expected(steps)


def test_redefined_rule_starts_afresh_and_same_shape_rule_pairs_consecutive_items() -> None:
    steps = [
        Step([rule("pair", "circle", "circle")],
             [item(1, "red", "circle"), item(2, "red", "circle"), item(3, "red", "circle")], 0),
        Step([rule("pair", "circle", "square")],
             [item(4, "red", "square"), item(5, "red", "circle"), item(6, "red", "square")],
             100),
    ]
    out = driver().run(steps)
    assert actual(out) == expected(steps) == sorted_rows([
        {"rule": "pair", "color": "red", "first_item": 1, "second_item": 2},
        {"rule": "pair", "color": "red", "first_item": 2, "second_item": 3},
        # item 3 waited as a "circle" of the old definition: dropped, so 4 matches nothing
        {"rule": "pair", "color": "red", "first_item": 5, "second_item": 6},
    ])


def test_items_before_a_rule_exists_are_not_pending() -> None:
    steps = [Step([rule("a", "rect", "tri")], [item(1, "green", "square")], 0),
             Step([rule("a", "rect", "tri"), rule("b", "square", "tri")],
                  [item(2, "green", "tri"), item(3, "green", "square"), item(4, "green", "tri")],
                  100)]
    out = driver().run(steps)
    assert actual(out) == expected(steps) == [
        {"rule": "b", "color": "green", "first_item": 3, "second_item": 4}]


def test_spark_runtime_matches_reference(spark, lake) -> None:
    steps = generate()
    d: SparkDriver = spark_driver(spark, lake.lake_root)
    out = d.run(steps)
    assert out.main, "the scenario produces matches"
    assert actual(out) == expected(steps)
