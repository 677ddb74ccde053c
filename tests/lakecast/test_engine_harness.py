"""The engine without Spark: read-only rules, ordering, missing-state policies, the harness."""

from __future__ import annotations

import pickle
import random

import pyarrow as pa
import pytest

from lakecast import (
    UNMATCHED,
    BroadcastElement,
    BroadcastOrderError,
    BroadcastProcessFunction,
    BroadcastTestHarness,
    Lookup,
    MapStateDescriptor,
    OutputTag,
    ReadOnlyStateError,
    StateDeclarationError,
    enrich,
)
from lakecast.api.frozen import FrozenDict, FrozenList, freeze, thaw

RULES = MapStateDescriptor("rules", str, dict)
PRODUCTS = MapStateDescriptor("products", int, dict, key_columns=("product_id",))
REVIEW = OutputTag("review")


class RuleFunction(BroadcastProcessFunction):
    """Fraud rules (seed 002): a dict state of rules and a table-shaped product state."""

    def state_descriptors(self):
        return [RULES, PRODUCTS]

    def output_tags(self):
        return [REVIEW]

    def process_broadcast_element(self, value, ctx):
        if isinstance(value, BroadcastElement):
            ctx.get_broadcast_state(PRODUCTS).apply(value)
        else:  # a plain rule dict
            ctx.get_broadcast_state(RULES).put(value["rule_id"], value)

    def process_element(self, value, ctx):
        for rule_id, rule in sorted(ctx.get_broadcast_state(RULES).items()):
            if value["amount"] > rule["threshold"]:
                if rule["action"] == "REVIEW":
                    ctx.output(REVIEW, value)
                    return
                yield {**value, "status": "BLOCKED", "rule": rule_id}
                return
        yield {**value, "status": "ALLOWED", "rule": None}


class Writer(BroadcastProcessFunction):
    """Tries one forbidden operation in process_element."""

    def __init__(self, op):
        self.op = op

    def state_descriptors(self):
        return [RULES, PRODUCTS]

    def process_broadcast_element(self, value, ctx):
        if isinstance(value, BroadcastElement):
            ctx.get_broadcast_state(PRODUCTS).apply(value)
        else:
            ctx.get_broadcast_state(RULES).put("r1", {"tags": ["a"], "limits": {"x": 1}})

    def process_element(self, value, ctx):
        self.op(ctx.get_broadcast_state(RULES), ctx.get_broadcast_state(PRODUCTS), value)
        return []


def _products(version=0):
    return BroadcastElement.of(
        "products", version, [{"product_id": i, "name": f"p{i}", "price": float(i)} for i in (1, 2)]
    )


WRITES = {
    "put": lambda r, p, v: r.put("x", 1),
    "remove": lambda r, p, v: r.remove("r1"),
    "clear": lambda r, p, v: r.clear(),
    "put_all": lambda r, p, v: r.put_all({"x": 1}),
    "setitem": lambda r, p, v: r.__setitem__("x", 1),
    "apply": lambda r, p, v: p.apply(_products(5)),
    "table_put": lambda r, p, v: p.put(3, {"name": "p3", "price": 3.0}),
    "table_remove": lambda r, p, v: p.remove(1),
    "table_clear": lambda r, p, v: p.clear(),
    "table_put_table": lambda r, p, v: p.put_table(pa.table({"product_id": [9]})),
    "mutate_dict_value": lambda r, p, v: r.get("r1")["limits"].__setitem__("x", 2),
    "update_dict_value": lambda r, p, v: r.get("r1").update(y=1),
    "mutate_list_value": lambda r, p, v: r.get("r1")["tags"].append("b"),
    "mutate_row_value": lambda r, p, v: p.get(1).__setitem__("price", 0.0),
    "pop_row_value": lambda r, p, v: p.get(1).pop("price"),
    "setattr": lambda r, p, v: setattr(r, "_state", None),
}


@pytest.mark.parametrize("op", sorted(WRITES))
def test_every_write_path_through_read_only_context_raises(op):
    h = BroadcastTestHarness(Writer(WRITES[op]))
    h.process_broadcast_elements([{"rule": 1}, _products()])
    with pytest.raises(ReadOnlyStateError, match=r"read-only|immutable"):
        h.process_element({"amount": 1})
    # and nothing changed
    assert h.state(RULES) == {"r1": {"tags": ["a"], "limits": {"x": 1}}}
    assert sorted(h.state(PRODUCTS)) == [1, 2]


def test_read_only_rules_also_hold_in_vectorized_functions():
    class BatchWriter(Writer):
        def process_batch(self, batch, ctx):
            ctx.get_broadcast_state(PRODUCTS).put_table(pa.table({"product_id": [7]}))

    h = BroadcastTestHarness(BatchWriter(None))
    h.process_broadcast_element(_products())
    with pytest.raises(ReadOnlyStateError):
        h.process_elements([{"amount": 1}])


def test_context_is_read_write_and_read_only_context_is_its_supertype():
    seen = {}

    class Probe(BroadcastProcessFunction):
        def state_descriptors(self):
            return [RULES]

        def process_broadcast_element(self, value, ctx):
            seen["bc"] = ctx
            ctx.get_broadcast_state(RULES).put("k", [1, 2])
            seen["ts"] = ctx.timestamp()

        def process_element(self, value, ctx):
            seen["el"] = ctx
            yield {"k": ctx.get_broadcast_state(RULES).get("k"), "wm": ctx.current_watermark(),
                   "ts": ctx.timestamp()}

    h = BroadcastTestHarness(Probe(), watermark=123, timestamp_column="t")
    h.process_broadcast_element(BroadcastElement.of("rules", 4, [{"a": 1}], commit_timestamp=99))
    (out,) = h.process_element({"t": 5000})
    assert out == {"k": (1, 2), "wm": 123, "ts": 5000}
    assert isinstance(out["k"], FrozenList) and seen["ts"] == 99
    assert isinstance(seen["bc"], BroadcastProcessFunction.Context)
    assert isinstance(seen["el"], BroadcastProcessFunction.ReadOnlyContext)
    assert not isinstance(seen["el"], BroadcastProcessFunction.Context)
    assert issubclass(BroadcastProcessFunction.Context, BroadcastProcessFunction.ReadOnlyContext)


def test_undeclared_state_and_side_output_are_refused():
    other = MapStateDescriptor("other")

    class Bad(BroadcastProcessFunction):
        def process_element(self, value, ctx):
            ctx.get_broadcast_state(other)

    with pytest.raises(StateDeclarationError, match="not declared"):
        BroadcastTestHarness(Bad()).process_element({})

    class BadTag(BroadcastProcessFunction):
        def process_element(self, value, ctx):
            ctx.output(OutputTag("nope"), value)

    with pytest.raises(StateDeclarationError, match="side output"):
        BroadcastTestHarness(BadTag()).process_element({})


def test_frozen_values_pickle_compare_and_thaw():
    v = freeze({"a": [1, {"b": {2}}], "c": (1, 2)})
    assert isinstance(v, FrozenDict) and v == {"a": [1, {"b": {2}}], "c": (1, 2)}
    assert pickle.loads(pickle.dumps(v)) == v
    t = thaw(v)
    t["a"].append(3)
    assert t["a"] == [1, {"b": {2}}, 3]


def test_fraud_rules_and_side_output():
    h = BroadcastTestHarness(RuleFunction())
    h.process_broadcast_elements([
        {"rule_id": "R1", "threshold": 1000, "action": "BLOCK"},
        {"rule_id": "R2", "threshold": 500, "action": "REVIEW"},
    ])
    out = h.process_elements([{"amount": 100}, {"amount": 2000}, {"amount": 700}])
    assert [o["status"] for o in out] == ["ALLOWED", "BLOCKED"]
    assert h.side_output(REVIEW) == [{"amount": 700}]


def _user_elements():
    """Versions 0..3 of a user table: full load, then changes."""
    return [
        BroadcastElement.of("users", 0, [{"user_id": u, "segment": "REGULAR"} for u in range(5)],
                            commit_timestamp=1000),
        BroadcastElement.of("users", 1, [{"user_id": 1, "segment": "VIP"}], kind="changes",
                            change_type="update_postimage", commit_timestamp=2000),
        BroadcastElement.of("users", 2, [{"user_id": 2, "segment": "REGULAR"},
                                         {"user_id": 9, "segment": "NEW"}], kind="changes",
                            change_type=["delete", "insert"], commit_timestamp=3000),
        BroadcastElement.of("users", 3, [{"user_id": 9, "segment": "CHURNING"}], kind="changes",
                            change_type="update_postimage", commit_timestamp=2500),
        BroadcastElement.of("flags", 7, [{"name": "f", "on": True}], commit_timestamp=2000),
    ]


def test_shuffled_arrival_order_gives_the_same_state():
    fn = lambda: enrich(Lookup("users", key="user_id", columns=["segment"]),  # noqa: E731
                        Lookup("flags", key="name", columns=["on"]))
    ref = BroadcastTestHarness(fn())
    ref.process_broadcast_elements(_user_elements())
    expected = ref.state(ref.function.lookups[0].descriptor)
    assert {k: v["segment"] for k, v in expected.items()} == {
        0: "REGULAR", 1: "VIP", 3: "REGULAR", 4: "REGULAR", 9: "CHURNING"}
    assert ref.state_version == {"users": 3, "flags": 7}
    rng = random.Random(7)
    for _ in range(10):
        elements = _user_elements()
        rng.shuffle(elements)
        h = BroadcastTestHarness(fn())
        h.process_broadcast_elements(elements)
        assert h.state(h.function.lookups[0].descriptor) == expected
        assert h.state_version == ref.state_version


def test_redelivery_is_skipped_and_gaps_raise():
    els = _user_elements()
    h = BroadcastTestHarness(enrich(Lookup("users", key="user_id", columns=["segment"])))
    h.process_broadcast_elements(els[:2])
    n = h.elements_applied
    h.process_broadcast_elements(els[:2])  # delivered again: skipped
    assert h.elements_applied == n
    with pytest.raises(BroadcastOrderError, match="missing"):
        h.process_broadcast_element(els[3])  # version 3 while at 1


def test_missing_state_policies_of_a_generic_function():
    class Seg(BroadcastProcessFunction):
        def __init__(self, policy):
            self.missing_state = policy

        def state_descriptors(self):
            return [PRODUCTS]

        def process_broadcast_element(self, value, ctx):
            ctx.get_broadcast_state(PRODUCTS).apply(value)

        def process_element(self, value, ctx):
            p = ctx.get_broadcast_state(PRODUCTS).get(value["product_id"])
            if p is None:
                ctx.output(UNMATCHED, value)  # a key miss
                return
            yield {**value, "name": p["name"]}

    events = [{"product_id": 1}, {"product_id": 3}]
    for policy, main, unmatched, held in [
        ("default", 0, 2, 0), ("unmatched", 0, 2, 0), ("hold", 0, 0, 2)
    ]:
        h = BroadcastTestHarness(Seg(policy), tables=["products"])
        assert len(h.process_elements(events)) == main
        assert len(h.side_output(UNMATCHED)) == unmatched and len(h.held) == held
    # held events are retried once the state exists
    h = BroadcastTestHarness(Seg("hold"), tables=["products"])
    h.process_elements(events)
    h.process_broadcast_element(_products())
    assert h.process_elements(h.take_held()) == [{"product_id": 1, "name": "p1"}]
    assert h.side_output(UNMATCHED) == [{"product_id": 3}]


@pytest.mark.parametrize("policy", ["default", "unmatched", "hold"])
def test_enrichment_missing_key_policies_reconcile(policy):
    fn = enrich(Lookup("users", key="user_id", columns=["segment"], defaults={"segment": "NEW"}),
                on_missing=policy)
    h = BroadcastTestHarness(fn, event_schema=pa.schema([("user_id", pa.int64())]))
    events = [{"user_id": u} for u in (0, 1, 7, 8, None)]
    before = h.process_elements(events)  # no state at all yet
    h.process_broadcast_elements(_user_elements()[:2])
    after = h.process_elements(events)
    if policy == "default":
        assert [r["segment"] for r in before] == ["NEW"] * 5
        assert [r["segment"] for r in after] == ["REGULAR", "VIP", "NEW", "NEW", "NEW"]
    elif policy == "unmatched":
        assert before == [] and len(h.side_output(UNMATCHED)) == 5 + 3
        assert [r["segment"] for r in after] == ["REGULAR", "VIP"]
    else:
        assert before == [] and len(h.held) == 5 + 3
    total_out = len(h.outputs) + len(h.side_output(UNMATCHED)) + len(h.held)
    assert total_out == 2 * len(events)


def test_harness_runs_a_pandas_batch_function():
    class Doubler(BroadcastProcessFunction):
        batch_format = "pandas"

        def state_descriptors(self):
            return [RULES]

        def process_broadcast_element(self, value, ctx):
            ctx.get_broadcast_state(RULES).put("factor", value)

        def process_batch(self, batch, ctx):
            f = ctx.get_broadcast_state(RULES).get("factor", 1)
            return batch.assign(y=batch["x"] * f)

    h = BroadcastTestHarness(Doubler())
    assert h.process_elements([{"x": 1}, {"x": 2}]) == [{"x": 1, "y": 1}, {"x": 2, "y": 2}]
    h.process_broadcast_element(3)
    assert h.process_elements([{"x": 2}]) == [{"x": 2, "y": 6}]


def test_table_state_matches_a_dict_model_under_random_changes():
    """Base + overlay + compaction of TableMapState behave like a plain dict."""
    from lakecast.api.table_state import TableMapState

    rng = random.Random(3)
    state = TableMapState(MapStateDescriptor("t", key_columns=("k",)))
    state.compact_ratio = 0.3
    model: dict[int, float] = {}
    for version in range(60):
        if version % 25 == 0:
            rows = {k: float(rng.random()) for k in rng.sample(range(500), 200)}
            state.apply(BroadcastElement.of("t", version, [{"k": k, "v": v}
                                                           for k, v in rows.items()]))
            model = dict(rows)
        else:
            ups = {k: float(rng.random()) for k in rng.sample(range(500), 15)}
            dels = [k for k in rng.sample(range(500), 10) if k not in ups]
            rows = [{"k": k, "v": v} for k, v in ups.items()] + [{"k": k, "v": 0.0} for k in dels]
            kinds = ["update_postimage"] * len(ups) + ["delete"] * len(dels)
            state.apply(BroadcastElement.of("t", version, rows, kind="changes", change_type=kinds))
            model.update(ups)
            for k in dels:
                model.pop(k, None)
        if version % 7 == 3:  # single writes through the dict API
            state.put(1000 + version, {"v": -1.0})
            model[1000 + version] = -1.0
            victim = next(iter(model))
            state.remove(victim)
            model.pop(victim)
        assert len(state) == len(model)
        probe = list(range(0, 1100, 3))
        taken, found = state.lookup([pa.array(probe)], ["v"])
        got = {k: v for k, v, f in zip(probe, taken.column("v").to_pylist(), found, strict=True)
               if f}
        assert got == {k: model[k] for k in probe if k in model}
        assert state.get(probe[1], "x") == ({"k": probe[1], "v": model[probe[1]]}
                                            if probe[1] in model else "x")
    table = state.to_arrow()
    assert dict(zip(table.column("k").to_pylist(), table.column("v").to_pylist(),
                    strict=True)) == model
    assert sorted(state.keys()) == sorted(model)
