"""Keyed state without Spark: primitives, TTL, timers, apply_to_keyed_state, evolution."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from lakecast import BroadcastElement, MapStateDescriptor, ReadOnlyStateError
from lakecast.api.descriptors import StateDeclarationError
from lakecast.api.keyed import KeyedBroadcastProcessFunction, TimeDomain, TimerRegistrationError
from lakecast.api.keyed_state import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    ReducingStateDescriptor,
    StateSchemaError,
    StateTtlConfig,
    StateVisibility,
    UpdateType,
    ValueStateDescriptor,
)
from lakecast.runtime.keyed_harness import KeyedBroadcastTestHarness

FLAGS = MapStateDescriptor("flags", str, object)


class Mean(AggregateFunction):
    def create_accumulator(self) -> tuple[float, int]:
        return (0.0, 0)

    def add(self, value: float, acc: tuple[float, int]) -> tuple[float, int]:
        return (acc[0] + value, acc[1] + 1)

    def get_result(self, acc: tuple[float, int]) -> float:
        return acc[0] / acc[1]


COUNT = ValueStateDescriptor("count", int)
HISTORY = ListStateDescriptor("history", float)
BY_MERCHANT = MapStateDescriptor("by_merchant", str, int)
TOTAL = ReducingStateDescriptor("total", float, reduce_function=lambda a, b: a + b)
MEAN = AggregatingStateDescriptor("mean", tuple, aggregate_function=Mean())


class AllPrimitives(KeyedBroadcastProcessFunction):
    key_by = "user"

    def keyed_state_descriptors(self):
        return [COUNT, HISTORY, BY_MERCHANT, TOTAL, MEAN]

    def process_element(self, value, ctx):
        count = ctx.get_state(COUNT)
        count.update((count.value() or 0) + 1)
        ctx.get_list_state(HISTORY).add(value["amount"])
        m = ctx.get_map_state(BY_MERCHANT)
        m.put(value["merchant"], m.get(value["merchant"], 0) + 1)
        ctx.get_reducing_state(TOTAL).add(value["amount"])
        ctx.get_aggregating_state(MEAN).add(value["amount"])
        yield {"user": ctx.get_current_key(), "count": count.value(),
               "total": ctx.get_reducing_state(TOTAL).get(),
               "mean": ctx.get_aggregating_state(MEAN).get()}


EVENTS = [
    {"user": "a", "amount": 10.0, "merchant": "m1"},
    {"user": "b", "amount": 5.0, "merchant": "m1"},
    {"user": "a", "amount": 20.0, "merchant": "m2"},
    {"user": "a", "amount": 30.0, "merchant": "m1"},
]


def test_every_primitive_keeps_per_key_state_like_an_independent_fold():
    h = KeyedBroadcastTestHarness(AllPrimitives())
    out = h.process_elements(EVENTS)
    # independent fold over the events, per key
    seen: dict[str, list[dict]] = {}
    want = []
    for e in EVENTS:
        seen.setdefault(e["user"], []).append(e)
        amounts = [x["amount"] for x in seen[e["user"]]]
        want.append({"user": e["user"], "count": len(amounts), "total": sum(amounts),
                     "mean": sum(amounts) / len(amounts)})
    assert out == want
    assert h.keyed_state(HISTORY, "a") == [10.0, 20.0, 30.0]
    assert h.keyed_state(BY_MERCHANT, "a") == dict(Counter(e["merchant"] for e in EVENTS
                                                           if e["user"] == "a"))
    assert h.keyed_state(MEAN, "b") == 5.0
    assert h.keys() == ["a", "b"]


class ClearsOnFlag(KeyedBroadcastProcessFunction):
    """Broadcast flag 'reset' clears every key's count through apply_to_keyed_state."""

    key_by = "user"

    def state_descriptors(self):
        return [FLAGS]

    def keyed_state_descriptors(self):
        return [COUNT]

    def process_broadcast_element(self, value, ctx):
        ctx.get_broadcast_state(FLAGS).apply(value, key_columns="name", value_columns="on")
        if ctx.get_broadcast_state(FLAGS).get("reset"):
            seen = []
            ctx.apply_to_keyed_state(COUNT, lambda key, state: (seen.append(key), state.clear()))
            yield {"reset_keys": seen}

    def process_element(self, value, ctx):
        c = ctx.get_state(COUNT)
        c.update((c.value() or 0) + 1)
        if value.get("write_flag"):
            ctx.get_broadcast_state(FLAGS).put("x", True)  # must raise: read-only here
        return ()


def test_apply_to_keyed_state_visits_every_key_in_order_and_may_clear():
    h = KeyedBroadcastTestHarness(ClearsOnFlag())
    h.process_elements([{"user": u} for u in "cabca"])
    assert h.keys() == ["a", "b", "c"]
    assert [h.keyed_state(COUNT, k) for k in "abc"] == [2, 1, 2]
    out = h.process_broadcast_element(BroadcastElement.of("flags", 0, [{"name": "reset",
                                                                        "on": True}]))
    assert out == [{"reset_keys": ["a", "b", "c"]}]
    assert h.keys() == []
    assert h.state_size()["keys"] == 0


def test_broadcast_state_is_read_only_for_keyed_elements():
    h = KeyedBroadcastTestHarness(ClearsOnFlag())
    with pytest.raises(ReadOnlyStateError):
        h.process_element({"user": "a", "write_flag": True})


class Timers(KeyedBroadcastProcessFunction):
    key_by = "user"

    def keyed_state_descriptors(self):
        return [COUNT]

    def process_broadcast_element(self, value, ctx):
        ctx.timer_service().register_event_time_timer(5)  # raises, as in Flink

    def process_element(self, value, ctx):
        c = ctx.get_state(COUNT)
        c.update((c.value() or 0) + 1)
        ts = ctx.timestamp()
        ctx.timer_service().register_event_time_timer(ts + 10)
        ctx.timer_service().register_processing_time_timer(1_000)
        if value.get("cancel"):
            ctx.timer_service().delete_event_time_timer(value["cancel"])
        return ()

    def on_timer(self, timestamp, ctx):
        yield {"user": ctx.get_current_key(), "at": timestamp, "domain": ctx.time_domain().value,
               "count": ctx.get_state(COUNT).value(), "watermark": ctx.current_watermark()}
        if ctx.time_domain() is TimeDomain.PROCESSING_TIME:
            ctx.get_state(COUNT).clear()


def test_timers_fire_in_time_then_key_order_once_the_watermark_or_clock_passes():
    h = KeyedBroadcastTestHarness(Timers(), timestamp_column="ts")
    h.process_elements([{"user": "b", "ts": 1}, {"user": "a", "ts": 1}, {"user": "a", "ts": 3},
                        {"user": "c", "ts": 2, "cancel": 12}])
    assert h.advance_watermark(10) == []  # nothing due yet (11, 11, 13; c's 12 deleted)
    fired = h.advance_watermark(12)
    assert [(o["user"], o["at"], o["domain"]) for o in fired] == [
        ("a", 11, "event_time"), ("b", 11, "event_time")]
    assert h.advance_watermark(11) == []  # the watermark never goes back
    assert [(o["user"], o["at"]) for o in h.advance_watermark(20)] == [("a", 13)]
    proc = h.set_processing_time(1_000)
    assert [(o["user"], o["domain"]) for o in proc] == [
        ("a", "processing_time"), ("b", "processing_time"), ("c", "processing_time")]
    assert h.keys() == []  # counts cleared by the processing-time timers, no timers left


def test_registering_a_timer_on_the_broadcast_side_raises():
    h = KeyedBroadcastTestHarness(Timers())
    with pytest.raises(TimerRegistrationError, match="no key"):
        h.process_broadcast_element(BroadcastElement.of("flags", 0, [{"name": "x"}]))


def _ttl(update=UpdateType.ON_CREATE_AND_WRITE,
         vis=StateVisibility.NEVER_RETURN_EXPIRED) -> StateTtlConfig:
    return (StateTtlConfig.new_builder(100).set_update_type(update)
            .set_state_visibility(vis).build())


def _ttl_function(ttl: StateTtlConfig) -> KeyedBroadcastProcessFunction:
    last = ValueStateDescriptor("last", int).enable_time_to_live(ttl)
    seen = MapStateDescriptor("seen", str, bool).enable_time_to_live(ttl)

    class Ttl(KeyedBroadcastProcessFunction):
        key_by = "user"
        LAST, SEEN = last, seen

        def keyed_state_descriptors(self):
            return [last, seen]

        def process_element(self, value, ctx):
            state = ctx.get_state(last)
            before = state.value()
            if value.get("write"):
                state.update(value["write"])
                ctx.get_map_state(seen).put(value["write_key"], True)
            yield {"user": value["user"], "before": before}

    return Ttl()


def test_ttl_on_create_and_write_expires_unbounded_keys_and_shrinks_state():
    fn = _ttl_function(_ttl())
    h = KeyedBroadcastTestHarness(fn)
    h.process_elements([{"user": f"u{i}", "write": i, "write_key": "m"} for i in range(1, 51)])
    before = h.state_size()
    h.set_processing_time(60)
    h.process_element({"user": "u1", "write": 99, "write_key": "m2"})  # rewrite: TTL restarts
    h.set_processing_time(99)
    # reads don't refresh the TTL
    assert h.process_element({"user": "u2"}) == [{"user": "u2", "before": 2}]
    h.set_processing_time(100)
    assert h.process_element({"user": "u2"}) == [{"user": "u2", "before": None}]
    removed = h.expire()
    after = h.state_size()
    assert before["keys"] == 50 and before["entries"] == 100
    # u1 keeps "last" and "m2" (written at 60); its "m" (written at 0) expired per entry
    assert after["keys"] == 1 and after["entries"] == 2
    assert h.keyed_state(fn.SEEN, "u1") == {"m2": True}
    assert removed == 49 * 2 + 1
    assert after["bytes"] < before["bytes"]
    h.set_processing_time(160)
    assert h.expire() == 2 and h.keys() == []


def test_ttl_on_read_and_write_refreshes_on_read():
    h = KeyedBroadcastTestHarness(_ttl_function(_ttl(UpdateType.ON_READ_AND_WRITE)))
    h.process_element({"user": "u", "write": 1, "write_key": "m"})
    h.set_processing_time(90)
    h.process_element({"user": "u"})  # read at 90: expires at 190 now
    h.set_processing_time(150)
    assert h.process_element({"user": "u"}) == [{"user": "u", "before": 1}]


def test_ttl_visibility_return_expired_if_not_cleaned_up():
    h = KeyedBroadcastTestHarness(_ttl_function(
        _ttl(vis=StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP)))
    h.process_element({"user": "u", "write": 7, "write_key": "m"})
    h.set_processing_time(500)
    assert h.process_element({"user": "u"}) == [{"user": "u", "before": 7}]
    h.expire()
    assert h.process_element({"user": "u"}) == [{"user": "u", "before": None}]


def test_undeclared_keyed_state_is_refused():
    class Bad(KeyedBroadcastProcessFunction):
        key_by = "user"

        def process_element(self, value, ctx):
            ctx.get_state(COUNT).update(1)

    with pytest.raises(StateDeclarationError, match="not declared"):
        KeyedBroadcastTestHarness(Bad()).process_element({"user": "u"})


# --------------------------------------------------------------------------- schema evolution
@dataclasses.dataclass
class ProfileV1:
    name: str
    visits: int
    legacy: str = ""


@dataclasses.dataclass
class ProfileV2:  # "legacy" removed, "score" added with a default
    name: str
    visits: int
    score: float = 0.5


@dataclasses.dataclass
class ProfileBadType:  # visits changed type
    name: str
    visits: str


@dataclasses.dataclass
class ProfileNoDefault:  # a new field without a default
    name: str
    visits: int
    tier: str


def _profile_function(cls: type) -> KeyedBroadcastProcessFunction:
    desc = ValueStateDescriptor("profile", cls)

    class Profiles(KeyedBroadcastProcessFunction):
        key_by = "user"

        def keyed_state_descriptors(self):
            return [desc]

        def output_schema(self, input_schema):
            import pyarrow as pa

            types = {"int": pa.int64(), "float": pa.float64(), "str": pa.string()}
            fields = [(f.name, types[str(f.type)]) for f in dataclasses.fields(cls)]
            return pa.schema([("user", pa.string()), ("profile", pa.struct(fields))])

        def process_element(self, value, ctx):
            state = ctx.get_state(desc)
            p = state.value()
            p = cls(name=value["user"], visits=1) if p is None else dataclasses.replace(
                p, visits=p.visits + 1)
            state.update(p)
            yield {"user": value["user"], "profile": dataclasses.asdict(p)}

    return Profiles()


def test_adding_and_removing_a_field_keeps_restored_state_usable():
    h1 = KeyedBroadcastTestHarness(_profile_function(ProfileV1))
    h1.process_elements([{"user": "a"}, {"user": "a"}, {"user": "b"}])
    snap = h1.snapshot()
    h2 = KeyedBroadcastTestHarness.restore(_profile_function(ProfileV2), snap)
    assert h2.process_element({"user": "a"}) == [
        {"user": "a", "profile": {"name": "a", "visits": 3, "score": 0.5}}]


@pytest.mark.parametrize("cls,match", [(ProfileBadType, r"visits: int -> str"),
                                       (ProfileNoDefault, r"\['tier'\] have no default")])
def test_a_breaking_state_type_change_fails_before_processing(cls, match):
    h1 = KeyedBroadcastTestHarness(_profile_function(ProfileV1))
    h1.process_element({"user": "a"})
    with pytest.raises(StateSchemaError, match=match):
        KeyedBroadcastTestHarness.restore(_profile_function(cls), h1.snapshot())
