"""Seed 001: Flink's broadcast-state example — shape patterns matched per color.

Items ``{item_id, color, shape, ts}`` are keyed by ``color``; rules ``{name, first,
second}`` come from the Delta table ``pattern_rules``. A rule matches "an item of shape
``first`` followed by an item of shape ``second``" of the same color: each key keeps,
per rule, the list of ``first`` items waiting for their ``second`` (a keyed MapState,
as in the seed). When a rule is removed or redefined, its waiting items are dropped for
every key with ``apply_to_keyed_state``, so a rule added back later starts afresh.

Run it on Spark: ``.venv/bin/python -m examples.pattern_rules``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from examples.common import Row, SparkDriver, Step, run_on_spark, sorted_rows
from lakecast.api.descriptors import MapStateDescriptor
from lakecast.api.element import BroadcastElement
from lakecast.api.keyed import KeyedBroadcastProcessFunction, KeyedContext, KeyedReadOnlyContext

TABLE = "pattern_rules"
RULES = MapStateDescriptor("rules", str, dict)
#: keyed: rule name -> ids of the items waiting for the rule's second shape
ITEMS = MapStateDescriptor("items", str, list)

TABLE_SCHEMA = "name string, first string, second string"
EVENT_SCHEMA = "item_id long, color string, shape string, ts long"
OUTPUT_SCHEMA = pa.schema([("rule", pa.string()), ("color", pa.string()),
                           ("first_item", pa.int64()), ("second_item", pa.int64())])


class PatternMatcher(KeyedBroadcastProcessFunction):
    """The seed's ``KeyedBroadcastProcessFunction<Color, Item, Rule, String>``."""

    key_by = "color"

    def state_descriptors(self) -> list[MapStateDescriptor]:
        return [RULES]

    def keyed_state_descriptors(self) -> list[MapStateDescriptor]:
        return [ITEMS]

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        return OUTPUT_SCHEMA

    def process_broadcast_element(self, value: BroadcastElement, ctx: KeyedContext) -> None:
        rules = ctx.get_broadcast_state(RULES)
        before = dict(rules.items())
        rules.apply(value, key_columns="name")
        gone = {name for name, rule in before.items() if rules.get(name) != rule}
        if not gone:
            return

        def drop_pending(color: Any, pending: Any) -> None:
            for name in gone:
                pending.remove(name)

        ctx.apply_to_keyed_state(ITEMS, drop_pending)

    def process_element(self, value: Row, ctx: KeyedReadOnlyContext) -> Iterator[Row]:
        pending = ctx.get_map_state(ITEMS)
        shape = value["shape"]
        for name, rule in ctx.get_broadcast_state(RULES).items():
            stored = list(pending.get(name) or [])
            if shape == rule["second"] and stored:
                for first in stored:
                    yield {"rule": name, "color": value["color"], "first_item": first,
                           "second_item": value["item_id"]}
                stored.clear()
            # no else: a rule may have first == second
            if shape == rule["first"]:
                stored.append(value["item_id"])
            if stored:
                pending.put(name, stored)
            else:
                pending.remove(name)


# ------------------------------------------------------------------------------ data
COLORS = ("red", "green", "blue")
SHAPES = ("rect", "tri", "circle", "square")


def rule(name: str, first: str, second: str) -> Row:
    return {"name": name, "first": first, "second": second}


#: the rules table over time (None: unchanged): added, removed, redefined, re-added
RULE_VERSIONS: tuple[list[Row] | None, ...] = (
    [rule("rect_tri", "rect", "tri"), rule("circle_circle", "circle", "circle")],
    None,
    [rule("rect_tri", "rect", "tri"), rule("circle_circle", "circle", "circle"),
     rule("tri_square", "tri", "square")],
    [rule("circle_circle", "circle", "circle"), rule("tri_square", "tri", "square"),
     rule("square_rect", "square", "rect")],
    None,
    [rule("rect_tri", "rect", "tri"), rule("circle_circle", "circle", "rect"),
     rule("square_rect", "square", "rect")],
    [],
    [rule("rect_tri", "rect", "tri")],
)


def generate(seed: int = 1, items_per_step: int = 12) -> list[Step]:
    """A deterministic scenario: :data:`RULE_VERSIONS` while random items flow."""
    rnd = random.Random(seed)
    steps, item_id = [], 0
    for i, rules in enumerate(RULE_VERSIONS):
        events = []
        for j in range(items_per_step):
            item_id += 1
            events.append({"item_id": item_id, "color": rnd.choice(COLORS),
                           "shape": rnd.choice(SHAPES), "ts": i * 1_000 + j * 10})
        steps.append(Step(table=rules, events=events, processing_time=i * 1_000))
    return steps


# ------------------------------------------------------------------------------ reference
def reference(steps: Sequence[Step]) -> list[Row]:
    """The expected matches, from the seed's rules in plain Python (no Lakecast)."""
    rules: dict[str, tuple[str, str]] = {}
    waiting: dict[tuple[str, str], list[int]] = {}  # (color, rule) -> first item ids
    out: list[Row] = []
    for step in steps:
        if step.table is not None:
            new = {r["name"]: (r["first"], r["second"]) for r in step.table}
            for name in [n for n in rules if new.get(n) != rules[n]]:
                for k in [k for k in waiting if k[1] == name]:
                    del waiting[k]
            rules = new
        for item in sorted(step.events, key=lambda e: (e["ts"], e["item_id"])):
            color, shape = item["color"], item["shape"]
            for name, (first, second) in rules.items():
                queue = waiting.setdefault((color, name), [])
                if shape == second:
                    out.extend({"rule": name, "color": color, "first_item": f,
                                "second_item": item["item_id"]} for f in queue)
                    queue.clear()
                if shape == first:
                    queue.append(item["item_id"])
    return out


# ------------------------------------------------------------------------------ Spark
def spark_driver(spark: Any, root: str) -> SparkDriver:
    return SparkDriver(spark, PatternMatcher(), root=root, table=TABLE, key="name",
                       table_schema=TABLE_SCHEMA, event_schema=EVENT_SCHEMA,
                       order_columns=("item_id",))


def main() -> None:
    """Run the scenario on Spark + Delta and print a summary."""
    steps = generate()
    out = run_on_spark(spark_driver, steps)
    expected = reference(steps)
    print(f"pattern_rules: {len(steps)} batches, {sum(len(s.events) for s in steps)} items, "
          f"{len(out.main)} matches")
    for (name, color), n in sorted(Counter((m["rule"], m["color"]) for m in out.main).items()):
        print(f"  {name:<14} {color:<6} {n}")
    same = sorted_rows(out.main) == sorted_rows(expected)
    print(f"matches the plain-Python reference: {same}")


if __name__ == "__main__":
    main()
