"""The runtime on real Spark + Delta: seed tutorial examples, parallelism, warm task-local
cache, missing-state policies, lineage, metrics and budget."""

from __future__ import annotations

import datetime as dt
import json
import warnings

import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from lakecast import (
    UNMATCHED,
    BroadcastElement,
    BroadcastProcessFunction,
    BroadcastRuntime,
    Lookup,
    MapStateDescriptor,
    StateBudgetWarning,
    enrich,
)
from lakecast.delta import io as delta_io
from lakecast.errors import LakecastError
from lakecast.runtime.metrics import reset_budget_warnings

SEGMENTS = ["VIP", "REGULAR", "NEW", "CHURNING"]
PRODUCTS = MapStateDescriptor("dim_products", int, dict, key_columns=("product_id",))
USERS = MapStateDescriptor("dim_users", int, str)
FLAGS = MapStateDescriptor("feature_flags", str, dict)


class PersonalizedPricing(BroadcastProcessFunction):
    """Seed 002 in one function: product catalog enrichment, user segments (default NEW)
    and a feature flag (VIP discount) — per-element form, three broadcast states."""

    def state_descriptors(self):
        return [PRODUCTS, USERS, FLAGS]

    def output_schema(self, input_schema):
        return pa.schema([*input_schema, ("product_name", pa.string()),
                          ("category", pa.string()), ("segment", pa.string()),
                          ("price", pa.float64())])

    def process_broadcast_element(self, value: BroadcastElement, ctx):
        if value.table == "dim_products":
            ctx.get_broadcast_state(PRODUCTS).apply(value)
        elif value.table == "dim_users":
            ctx.get_broadcast_state(USERS).apply(value, "user_id", "segment")
        else:
            ctx.get_broadcast_state(FLAGS).apply(value, "flag_name")

    def process_element(self, value, ctx):
        product = ctx.get_broadcast_state(PRODUCTS).get(value["product_id"])
        if product is None:
            ctx.output(UNMATCHED, value)
            return
        segment = ctx.get_broadcast_state(USERS).get(value["user_id"], "NEW")
        flag = ctx.get_broadcast_state(FLAGS).get("vip_discount")
        price = product["price"]
        if flag is not None and flag["enabled"] and segment == "VIP":
            price = round(price * (1 - flag["pct"] / 100), 6)
        yield {**value, "product_name": product["name"], "category": product["category"],
               "segment": segment, "price": price}


def _write(spark, frame: pd.DataFrame, path: str) -> None:
    delta_io.write(spark.createDataFrame(frame), path, mode="overwrite")


@pytest.fixture
def seed_lake(spark, lake):
    products = pd.DataFrame({
        "product_id": list(range(1, 21)),
        "name": [f"product-{i}" for i in range(1, 21)],
        "category": [["tv", "phone", "book", "toy"][i % 4] for i in range(1, 21)],
        "price": [10.0 * i for i in range(1, 21)],
    })
    users = pd.DataFrame({"user_id": list(range(1, 41)),
                          "segment": [SEGMENTS[i % 4] for i in range(1, 41)]})
    flags = pd.DataFrame({"flag_name": ["vip_discount", "new_algo"], "enabled": [True, False],
                          "pct": [20.0, 0.0]})
    tables = {n: lake.table_path(n) for n in ("dim_products", "dim_users", "feature_flags")}
    _write(spark, products, tables["dim_products"])
    _write(spark, users, tables["dim_users"])
    _write(spark, flags, tables["feature_flags"])
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    events = pd.DataFrame({
        "event_id": list(range(400)),
        "user_id": [(i * 7) % 50 + 1 for i in range(400)],  # 41..50 have no segment -> NEW
        "product_id": [(i * 3) % 22 + 1 for i in range(400)],  # 21, 22 are unknown
        "ts": [start + dt.timedelta(seconds=i) for i in range(400)],
    })
    return tables, products, users, flags, events


def _expected(products, users, flags, events):
    """Independent pandas computation of the seed example."""
    df = events.merge(products.rename(columns={"name": "product_name"}), on="product_id",
                      how="inner")
    df = df.merge(users, on="user_id", how="left")
    df["segment"] = df["segment"].fillna("NEW")
    vip = flags.set_index("flag_name").loc["vip_discount"]
    if vip["enabled"]:
        m = df["segment"] == "VIP"
        df.loc[m, "price"] = (df.loc[m, "price"] * (1 - vip["pct"] / 100)).round(6)
    unmatched = events[~events.product_id.isin(products.product_id)]
    return df.sort_values("event_id").reset_index(drop=True), unmatched


def _collect(result, cols):
    main = result.main.toPandas().sort_values("event_id").reset_index(drop=True)
    return main[cols], main


def test_seed_example_per_element_equals_pandas_at_parallelism_1_2_4(spark, seed_lake):
    tables, products, users, flags, events = seed_lake
    expected, unmatched = _expected(products, users, flags, events)
    cols = ["event_id", "user_id", "product_id", "product_name", "category", "segment", "price"]
    runtime = BroadcastRuntime(spark, PersonalizedPricing(), tables)
    frame = spark.createDataFrame(events)
    seen = []
    for p in (1, 2, 4):
        result = runtime.process(frame.repartition(p)).persist()
        got, raw = _collect(result, cols)
        pd.testing.assert_frame_equal(got, expected[cols], check_dtype=False)
        assert sorted(result.unmatched.toPandas().event_id) == sorted(unmatched.event_id)
        versions = set(raw["_state_version"])
        assert [json.loads(v) for v in versions] == [runtime.version]
        m = result.metrics()
        assert m.parallelism == p and m.rows_in == 400
        assert m.rows_in == m.rows_main + m.rows_side("unmatched")  # counts reconcile
        seen.append(got)
        result.unpersist()
    assert all(s.equals(seen[0]) for s in seen)
    assert runtime.version == {"dim_products": 0, "dim_users": 0, "feature_flags": 0}


def test_seed_example_vectorized_enrichment_equals_pandas(spark, seed_lake):
    tables, products, users, flags, events = seed_lake
    expected, unmatched = _expected(products, users, flags.assign(enabled=False), events)
    fn = enrich(
        Lookup("dim_products", key="product_id",
               columns={"name": "product_name", "category": "category", "price": "price"},
               on_missing="unmatched"),
        Lookup("dim_users", key="user_id", columns=["segment"], defaults={"segment": "NEW"}),
    )
    tables = {k: v for k, v in tables.items() if k != "feature_flags"}
    runtime = BroadcastRuntime(spark, fn, tables)
    cols = ["event_id", "user_id", "product_id", "ts", "product_name", "category", "price",
            "segment"]
    outs = []
    for p in (1, 2, 4):
        result = runtime.process(spark.createDataFrame(events).repartition(p)).persist()
        got, _ = _collect(result, cols)
        exp = expected[cols].copy()
        pd.testing.assert_frame_equal(got, exp, check_dtype=False)
        assert len(result.unmatched.toPandas()) == len(unmatched)
        assert result.held is None  # no hold policy: no held output at all
        outs.append(got)
        result.unpersist()
    assert all(o.equals(outs[0]) for o in outs)


def test_outputs_written_to_delta_once_and_state_follows_updates(spark, seed_lake, lake):
    tables, products, users, flags, events = seed_lake
    runtime = BroadcastRuntime(spark, PersonalizedPricing(), tables)
    frame = spark.createDataFrame(events).repartition(2)
    out_main, out_unmatched = lake.table_path("priced"), lake.table_path("priced_unmatched")
    for batch_id in (0, 0):  # the second is a retry: Delta's txn skips it
        result = runtime.process(frame).persist()
        delta_io.write(result.main, out_main, txn=("pricing:main", batch_id))
        delta_io.write(result.unmatched, out_unmatched, txn=("pricing:unmatched", batch_id))
        result.unpersist()
    n_main = delta_io.read(spark, out_main).count()
    n_unmatched = delta_io.read(spark, out_unmatched).count()
    assert n_main + n_unmatched == len(events)

    # the flag is switched off and user 4 (VIP) becomes REGULAR: next run sees both
    delta_io.merge_upsert(spark, spark.createDataFrame(flags.assign(enabled=False)),
                          tables["feature_flags"], keys=["flag_name"])
    delta_io.merge_upsert(spark, spark.createDataFrame(users.assign(
        segment=users.segment.where(users.user_id != 4, "REGULAR"))), tables["dim_users"],
        keys=["user_id"])
    result = runtime.process(frame).persist()
    assert [e.kind for e in result.new_elements] == ["changes", "changes"]
    assert sum(e.num_rows for e in result.new_elements) == 2
    users2 = users.assign(segment=users.segment.where(users.user_id != 4, "REGULAR"))
    expected, _ = _expected(products, users2, flags.assign(enabled=False), events)
    cols = ["event_id", "segment", "price"]
    got, raw = _collect(result, cols)
    pd.testing.assert_frame_equal(got, expected[cols], check_dtype=False)
    assert json.loads(raw["_state_version"][0]) == {
        "dim_products": 0, "dim_users": 1, "feature_flags": 1}
    result.unpersist()


def test_observed_result_counts_its_tasks_during_one_write_without_a_cache(
        spark, seed_lake, lake):
    """``observe()``: the accounting rows come from the write of ``main`` itself (one
    action, no cache), and equal the ones of a persisted computation of the same batch."""
    tables, products, users, flags, events = seed_lake
    expected, unmatched = _expected(products, users, flags, events)
    runtime = BroadcastRuntime(spark, PersonalizedPricing(), tables)
    frame = spark.createDataFrame(events).repartition(3)
    observed = runtime.process(frame).observe()
    with pytest.raises(LakecastError, match="no action has consumed"):
        observed.metrics()  # nothing ran yet: a clear error, not a wait forever
    out = lake.table_path("priced_observed")
    delta_io.write(observed.main, out)
    m = observed.metrics()
    assert not observed.frame.storageLevel.useMemory  # nothing was cached
    assert delta_io.read(spark, out).count() == len(expected)
    assert m.parallelism == 3 and m.rows_in == len(events)
    assert m.rows_main == len(expected) and m.rows_side("unmatched") == len(unmatched)
    persisted = runtime.process(frame).persist()
    ref = persisted.metrics()
    persisted.unpersist()
    assert ([(t.partition, t.rows_in, t.rows_main) for t in m.tasks]
            == [(t.partition, t.rows_in, t.rows_main) for t in ref.tasks])


def _check_tasks(tasks: list, held: dict[int, int], version: int,
                 cold: tuple[int, int] | None = None) -> None:
    """Every task's state is at ``version``. A Python worker that ran a task of this runtime
    before (``held``: pid -> version of its cached state) reuses its state and applies only
    the links after it; any other worker builds the state from the whole chain (base +
    ``version`` increments of 10 rows, or ``cold`` = (elements, rows)). Which workers
    Spark hands out is Spark's business: this holds whatever it does. ``held`` is
    updated."""
    by_pid: dict[int, list] = {}
    for t in tasks:
        assert t.state_version == {"dim_users": version}, t
        by_pid.setdefault(t.pid, []).append(t)
    for pid, ts in by_pid.items():
        first, *again = sorted(ts, key=lambda t: -t.elements_applied)
        got = (first.cache, first.elements_applied, first.rows_applied)
        if pid in held:
            n = version - held[pid]
            assert got == ("warm", n, 10 * n), first
        else:
            assert got == ("cold", *(cold or (1 + version, 1000 + 10 * version))), first
        for t in again:  # the same worker again in this job: nothing left to apply
            assert (t.cache, t.elements_applied, t.rows_applied) == ("warm", 0, 0), t
        held[pid] = version


def test_warm_cache_across_jobs_applies_only_new_elements(spark, lake):
    from lakecast.runtime import tasks as task_side

    path = lake.table_path("dim_users")
    delta_io.write(spark.range(1000).select(F.col("id").alias("user_id"),
                                            F.lit("REGULAR").alias("segment")), path,
                   mode="overwrite")
    fn = enrich(Lookup("dim_users", key="user_id", columns=["segment"],
                       defaults={"segment": "NEW"}))
    # the Python workers' task cache (a pure lookup's state lives in the executor JVM by
    # default: tests/lakecast/test_jvm_lookups.py)
    runtime = BroadcastRuntime(spark, fn, {"dim_users": path}, jvm_lookups=False)
    events = spark.range(200).select(F.col("id").alias("user_id")).repartition(2)
    schema = pa.schema([("user_id", pa.int64())])

    def acquire_here() -> tuple[str, int, int]:
        """The task side's cache, run in this process on the runtime's current plan:
        (cache, elements applied, rows applied) — deterministic, no worker reuse needed."""
        _, status, n_elements, n_rows = task_side.acquire(runtime.plan(schema))
        return status, n_elements, n_rows

    first = runtime.process(events).persist()  # metrics come from the same computation
    assert first.main.count() == 200
    held: dict[int, int] = {}  # Python worker pid -> version of its cached state
    _check_tasks(first.metrics().tasks, held, 0)
    assert "cold" in {t.cache for t in first.metrics().tasks}
    assert acquire_here() == ("cold", 1, 1000)
    assert acquire_here() == ("warm", 0, 0)

    for version in (1, 2):  # two increments of 10 rows each
        delta_io.merge_upsert(
            spark, spark.range(version * 10, version * 10 + 10).select(
                F.col("id").alias("user_id"), F.lit(f"VIP{version}").alias("segment")),
            path, keys=["user_id"])
        result = runtime.process(events).persist()
        rows = {r.user_id: r.segment for r in result.main.collect()}
        assert rows[version * 10] == f"VIP{version}" and rows[199] == "REGULAR"
        m = result.metrics()
        _check_tasks(m.tasks, held, version)
        assert m.state_version == {"dim_users": version}
        assert len(runtime.chain) == 1 + version
        assert acquire_here() == ("warm", 1, 10)  # only the increment
        result.unpersist()
    first.unpersist()

    # replaying an older planned batch (until=) rebuilds the state as of that version
    old = runtime.process(events, until={"dim_users": 1})
    rows = {r.user_id: (r.segment, r._state_version) for r in old.main.collect()}
    assert rows[10] == ("VIP1", '{"dim_users":1}') and rows[20] == ("REGULAR", '{"dim_users":1}')

    # a new runtime (as a new application would) starts cold from a base
    fresh = BroadcastRuntime(spark, fn, {"dim_users": path}, jvm_lookups=False)
    r = fresh.process(events).persist()
    r.main.count()
    _check_tasks(r.metrics().tasks, {}, 2, cold=(1, 1000))  # one base at version 2
    r.unpersist()


class Tagger(BroadcastProcessFunction):
    """A generic function whose events need the user table to exist."""

    missing_state = "hold"

    def state_descriptors(self):
        return [USERS]

    def output_schema(self, input_schema):
        return pa.schema([*input_schema, ("segment", pa.string())])

    def process_broadcast_element(self, value, ctx):
        ctx.get_broadcast_state(USERS).apply(value, "user_id", "segment")

    def process_element(self, value, ctx):
        segment = ctx.get_broadcast_state(USERS).get(value["user_id"])
        if segment is None:
            ctx.output(UNMATCHED, value)
        else:
            yield {**value, "segment": segment}


def test_hold_policy_returns_events_and_retries_them(spark, lake):
    path = lake.table_path("dim_users")
    runtime = BroadcastRuntime(spark, Tagger(), {"dim_users": path})
    events = spark.createDataFrame(pd.DataFrame({"user_id": [1, 2, 3]}))
    r1 = runtime.process(events).persist()
    held = r1.held_events().toPandas()
    assert sorted(held.user_id) == [1, 2, 3] and r1.main.count() == 0
    m = r1.metrics()
    assert m.rows_in == 3 and m.rows_held == 3 and runtime.version == {}
    retry = spark.createDataFrame(held)
    r1.unpersist()

    _write(spark, pd.DataFrame({"user_id": [1, 2], "segment": ["VIP", "NEW"]}), path)
    r2 = runtime.process(retry).persist()
    assert sorted(map(tuple, r2.main.select("user_id", "segment").collect())) == [
        (1, "VIP"), (2, "NEW")]
    assert [r.user_id for r in r2.unmatched.collect()] == [3]
    assert r2.held.count() == 0
    m2 = r2.metrics()
    assert m2.rows_in == m2.rows_main + m2.rows_side("unmatched") + m2.rows_held
    r2.unpersist()


@pytest.mark.parametrize("policy", ["default", "unmatched", "hold"])
def test_enrichment_policies_on_spark_reconcile(spark, lake, policy):
    path = lake.table_path("dim_users")
    _write(spark, pd.DataFrame({"user_id": [1, 2], "segment": ["VIP", "NEW"]}), path)
    fn = enrich(Lookup("dim_users", key="user_id", columns=["segment"],
                       defaults={"segment": "NEW"}), on_missing=policy)
    runtime = BroadcastRuntime(spark, fn, {"dim_users": path})
    result = runtime.process(spark.range(1, 6).select(F.col("id").alias("user_id"))).persist()
    main = result.main.count()
    side = result.unmatched.count() if result.unmatched is not None else 0
    held = result.held.count() if result.held is not None else 0
    assert main + side + held == 5
    assert (main, side, held) == {"default": (5, 0, 0), "unmatched": (2, 3, 0),
                                  "hold": (2, 0, 3)}[policy]
    result.unpersist()


def test_state_budget_warns_and_flags(spark, lake):
    reset_budget_warnings()
    path = lake.table_path("dim_users")
    _write(spark, pd.DataFrame({"user_id": range(100), "segment": ["VIP"] * 100}), path)
    fn = enrich(Lookup("dim_users", key="user_id", columns=["segment"]))
    # one copy per Python task (the JVM's one copy per executor: test_jvm_lookups.py)
    runtime = BroadcastRuntime(spark, fn, {"dim_users": path}, state_budget_bytes=100,
                               jvm_lookups=False)
    with pytest.warns(StateBudgetWarning, match="exceeds the budget"):
        result = runtime.process(spark.range(10).select(F.col("id").alias("user_id"))).persist()
    result.main.count()
    with pytest.warns(StateBudgetWarning):
        m = result.metrics()
    assert m.over_budget and m.state_bytes_total == m.state_bytes_per_task * m.parallelism
    assert m.state_bytes_per_task > 100 and m.summary()["over_budget"] is True
    # once per process: the next batch over budget is flagged, not warned again
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = result.metrics()
    assert again.over_budget
    assert not [w for w in caught if issubclass(w.category, StateBudgetWarning)]
