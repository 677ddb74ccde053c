"""Broadcast state snapshots: canonical form, divergence, corrupt checkpoints, restore,
retention — on the runtime directly (real Spark + Delta, small tables); the Spark tests
run in-process and over Spark Connect (``any_spark``)."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from lakecast import BroadcastProcessFunction, MapStateDescriptor
from lakecast.api.element import BroadcastElement
from lakecast.api.state import DictMapState
from lakecast.api.table_state import TableMapState
from lakecast.delta import io as delta_io
from lakecast.snapshots.checkpointer import snapshot_path
from lakecast.snapshots.codec import deserialize_state, load_into, serialize_state
from lakecast.snapshots.errors import CheckpointDivergenceError
from lakecast.snapshots.runtime import SnapshottingRuntime
from lakecast.snapshots.store import SnapshotStore, rescale_assignment
from lakecast.tools import cli

RULES = MapStateDescriptor("rules", int, dict, key_columns=("rule_id",))
HISTORY = MapStateDescriptor("history", str, list)


class RulesWithHistory(BroadcastProcessFunction):
    """A table state mirroring ``rules`` plus a *derived* dict state (every version it
    applied), which a rebuild from the full table could not reproduce."""

    def state_descriptors(self):
        return [RULES, HISTORY]

    def output_schema(self, input_schema):
        return pa.schema([*input_schema, ("threshold", pa.float64()), ("seen", pa.string())])

    def process_broadcast_element(self, value: BroadcastElement, ctx):
        ctx.get_broadcast_state(RULES).apply(value)
        hist = ctx.get_broadcast_state(HISTORY)
        hist.put("versions", [*hist.get("versions", []), value.version])

    def process_element(self, value, ctx):
        rule = ctx.get_broadcast_state(RULES).get(value["rule_id"])
        seen = ctx.get_broadcast_state(HISTORY).get("versions", [])
        yield {**value, "threshold": rule["threshold"] if rule else None,
               "seen": ",".join(map(str, seen))}


class NonDeterministic(RulesWithHistory):
    """Puts a random nonce into the state: every worker ends with a different state."""

    def process_broadcast_element(self, value, ctx):
        super().process_broadcast_element(value, ctx)
        ctx.get_broadcast_state(HISTORY).put("nonce", uuid.uuid4().hex)


# --------------------------------------------------------------------------- no Spark
def test_canonical_form_is_order_independent_and_round_trips():
    a, b = DictMapState(HISTORY), DictMapState(HISTORY)
    a.put("x", {"k": 1, "j": {3, 1, 2}})
    a.put("y", [1, (2, 3)])
    b.put("y", [1, (2, 3)])
    b.put("x", {"j": {2, 3, 1}, "k": 1})
    sa, sb = serialize_state("history", a), serialize_state("history", b)
    assert sa.digest == sb.digest and sa.keys == ['"x"', '"y"']
    c = DictMapState(HISTORY)
    load_into(c, "dict", deserialize_state("dict", sa.values, None))
    assert c.get("x") == {"k": 1, "j": frozenset({1, 2, 3})} and c.get("y")[1] == (2, 3)
    assert serialize_state("history", c).digest == sa.digest

    rows = pa.table({"rule_id": [3, 1, 2], "threshold": [0.3, 0.1, 0.2]})
    t1, t2 = TableMapState(RULES), TableMapState(RULES)
    t1.put_table(rows, replace=True)  # one base
    t2.put_table(rows.slice(0, 1), replace=True)  # base + overlay, another row order
    t2.put_table(rows.slice(1))
    s1, s2 = serialize_state("rules", t1), serialize_state("rules", t2)
    assert s1.digest == s2.digest and s1.keys == ["[1, 3]"]  # one chunk: keys 1..3
    assert s1.n_entries == 3 and s1.n_rows == 1
    t3 = TableMapState(RULES)
    load_into(t3, "table", deserialize_state("table", s1.values, s1.schema_b64))
    assert t3.to_arrow().sort_by("rule_id").equals(rows.sort_by("rule_id"))
    t3.put(2, {"rule_id": 2, "threshold": 0.25})
    assert serialize_state("rules", t3).digest != s1.digest


def test_rescale_assignment_is_flinks_round_robin():
    assert rescale_assignment(2, 4) == {0: 0, 1: 1, 2: 0, 3: 1}
    assert rescale_assignment(4, 1) == {0: 0}
    assert rescale_assignment(3, 3) == {0: 0, 1: 1, 2: 2}
    assert rescale_assignment(3, 5) == {0: 0, 1: 1, 2: 2, 3: 0, 4: 1}


# --------------------------------------------------------------------------- Spark
def _rules(spark, path, rows):
    df = spark.createDataFrame(rows, "rule_id LONG, threshold DOUBLE")
    if delta_io.latest_version(path) is None:
        return delta_io.write(df, path)
    return delta_io.merge_upsert(spark, df, path, keys=["rule_id"]).version


def _events(spark, p):
    return spark.createDataFrame([(i, 1 + i % 3) for i in range(12)],
                                 "event_id LONG, rule_id LONG").repartition(p)


def test_non_deterministic_function_fails_the_checkpoint_naming_state_and_tasks(any_spark, lake):
    spark = any_spark
    path = lake.table_path("rules")
    _rules(spark, path, [(1, 0.1), (2, 0.2)])
    store = SnapshotStore(spark, snapshot_path(lake, "nd"), "nd")
    rt = SnapshottingRuntime(spark, NonDeterministic(), {"rules": path}, store, parallelism=4)
    assert rt.process(_events(spark, 4)).main.count() == 12
    with pytest.raises(CheckpointDivergenceError) as err:
        rt.checkpoint(0, batch_id=0, events_start=-1, events_end=0)
    msg = str(err.value)
    assert err.value.state == "history" and "'history' differs across tasks" in msg
    tasks = sorted(t for ts in err.value.by_hash.values() for t in ts)
    assert tasks == [0, 1, 2, 3] and len(err.value.by_hash) >= 2 and "tasks [" in msg
    assert not store.exists()  # nothing written


def test_corrupt_checkpoints_are_skipped_restore_is_exact_and_retention(any_spark, lake, capsys):
    spark = any_spark
    path = lake.table_path("rules")
    _rules(spark, path, [(1, 0.1), (2, 0.2), (3, 0.3)])
    store = SnapshotStore(spark, snapshot_path(lake, "rules"), "rules")
    rt = SnapshottingRuntime(spark, RulesWithHistory(), {"rules": path}, store,
                             parallelism=2, function_id=f"rules-{uuid.uuid4().hex[:6]}")
    rt.process(_events(spark, 2)).main.count()
    cp0 = rt.checkpoint(0, batch_id=0, events_start=-1, events_end=0)
    _rules(spark, path, [(2, 0.25), (4, 0.4)])  # v1
    rt.process(_events(spark, 2)).main.count()
    cp1 = rt.checkpoint(1, batch_id=1, events_start=0, events_end=1)
    cp2 = rt.checkpoint(2, batch_id=2, events_start=1, events_end=2)
    assert cp0.stored_bytes > 0 and cp1.distinct_contents == 2  # 2 states, stored once each
    # plain Delta types (no "string collate UTF8_BINARY" over Spark Connect): delta-rs,
    # which table maintenance uses, opens the snapshot table
    assert all(f.type.type == "string" for f in DeltaTable(store.path).schema().fields
               if f.name in ("kind", "state", "key", "content_hash", "meta"))
    assert cp2.header.state_version == cp1.header.state_version == {"rules": 1}
    assert [h.checkpoint_id for h in store.headers()] == [0, 1, 2]
    # restore by timestamp: the newest checkpoint created at or before it
    created = {h.checkpoint_id: h.created_at_ms for h in store.headers()}
    assert created[0] < created[1] < created[2]
    assert store.resolve(timestamp_ms=created[1]).header.checkpoint_id == 1
    assert store.resolve(timestamp_ms=created[1] - 1).header.checkpoint_id == 0
    assert store.resolve(timestamp_ms=created[0] - 1) is None

    # corrupt: checkpoint 2 loses task 1's manifest rows, checkpoint 1 a tampered value
    delta_io.delete(spark, store.path, "checkpoint_id = 2 AND kind = 'manifest' AND task = 1")
    spark.sql(f"UPDATE {delta_io.table_ref(store.path)} SET value = X'8004' WHERE "
              "checkpoint_id = 1 AND kind = 'entry' AND state = 'rules' AND seq = 0")
    got = store.resolve(parallelism=3)
    assert got is not None and got.header.checkpoint_id == 0
    assert "checkpoint 2 is incomplete: manifest rows missing for task(s) [1]" in got.skipped[0]
    assert "checkpoint 1 is corrupt: state 'rules' content hash mismatch" in got.skipped[1]
    assert cli.main(["snapshots", "--pipeline", "rules", "list"]) == 0
    out = capsys.readouterr().out
    assert "INCOMPLETE: manifest rows missing" in out and out.count(" complete") == 2

    # a cold runtime at p=3 restores checkpoint 0 (not the corrupt ones), then applies v1:
    # its state equals the running one, derived history included (no full-table rebuild)
    rt3 = SnapshottingRuntime(spark, RulesWithHistory(), {"rules": path}, store,
                              parallelism=3, function_id=f"rules-{uuid.uuid4().hex[:6]}")
    rows = rt3.process(_events(spark, 3)).main.collect()
    assert rt3.restored.header.checkpoint_id == 0
    assert rt3.restored.assignment == {0: 0, 1: 1, 2: 0}
    assert {r["seen"] for r in rows} == {"0,1"}
    assert {(r["rule_id"], r["threshold"]) for r in rows} == {(1, 0.1), (2, 0.25), (3, 0.3)}
    want = {m.state: m.content_hash for m in cp1.manifest if m.task == 0}
    assert {(m.task, m.state): m.content_hash for m in rt3.task_manifest(3)} == {
        (t, s): h for t in range(3) for s, h in want.items()}
    # pinned to checkpoint 0 at its own version: exactly checkpoint 0's state
    rt0 = SnapshottingRuntime(spark, RulesWithHistory(), {"rules": path}, store,
                              parallelism=2, function_id=f"rules-{uuid.uuid4().hex[:6]}")
    rt0.restore_checkpoint_id = 0
    rt0.refresh(until={"rules": 0})
    assert {(m.task, m.state): m.content_hash for m in rt0.task_manifest(2)} == {
        (m.task, m.state): m.content_hash for m in cp0.manifest}

    # retention: keep the newest one, never the one in use nor the newest complete (0)
    before = delta_io.latest_version(store.path)
    assert store.retain(1, in_use={0}) == [1]
    assert store.checkpoint_ids() == [0, 2]
    old = delta_io.read(spark, store.path, version=before).where("checkpoint_id = 1").count()
    assert old == cp1.header.parallelism * 2 + 1 + sum(
        m.stored_rows for m in cp1.manifest if m.task == 0)  # time travel still has it


def test_restore_timestamps_are_parsed_as_utc():
    from lakecast.snapshots.errors import SnapshotError
    from lakecast.tools.snapshot_cli import parse_timestamp

    assert parse_timestamp("2026-11-22 03:40:00") == 1795318800000
    assert parse_timestamp("2026-11-22T03:40:00") == parse_timestamp("2026-11-22 03:40")
    assert parse_timestamp("1795318800000") == 1795318800000
    with pytest.raises(SnapshotError, match="cannot read timestamp"):
        parse_timestamp("yesterday")


def test_divergence_fails_the_batch_before_any_output_is_written(any_spark, lake):
    spark = any_spark
    from lakecast.build import broadcast_pipeline
    from lakecast.pipeline.micro_batch import PipelineSpec

    _rules(spark, lake.table_path("rules"), [(1, 0.1), (2, 0.2), (3, 0.3)])
    delta_io.write(_events(spark, 4), lake.table_path("nd_events"))

    def pipeline(name, function):
        spec = PipelineSpec(name=name, events_table="nd_events", broadcast_tables=("rules",),
                            output_table=f"{name}_out")
        return broadcast_pipeline(spark, spec, function, table_path=lake.table_path,
                                  checkpoint_root=lake.checkpoint_root, parallelism=4)

    nd = pipeline("nd", NonDeterministic())
    with pytest.raises(CheckpointDivergenceError) as err:
        nd.run()
    msg = str(err.value)
    assert "pipeline 'nd' batch 0 failed before commit" in msg, msg
    assert "broadcast state 'history' differs across tasks" in msg and "tasks [" in msg
    assert (err.value.pipeline, err.value.batch_id, err.value.state) == ("nd", 0, "history")
    assert sorted(t for ts in err.value.by_hash.values() for t in ts) == [0, 1, 2, 3]
    assert delta_io.latest_version(lake.table_path("nd_out")) is None  # no row of it
    plans, commits = nd.log.state()
    assert [p.batch_id for p in plans] == [0] and commits == {}  # planned, never committed
    assert not nd.runtime.store.exists()  # no checkpoint either
    # the same pipeline with a deterministic function commits the batch
    ok = pipeline("det", RulesWithHistory())
    (r,) = ok.run()
    assert r.counts["output"] == 12 and r.state_check["state_tasks_verified"] == 4
    assert delta_io.read(spark, lake.table_path("det_out")).count() == 12
