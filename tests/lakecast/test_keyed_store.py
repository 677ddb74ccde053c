"""Keyed state as a Delta changelog (:mod:`lakecast.runtime.keyed_store`): compaction keeps
the state and every version's state, time travel across compactions, a redo right after
a compaction appends nothing twice, rescaling across compactions, and a MERGE-era table
(no ``_batch`` column) carried on — all against the plain-Python reference of
``keyed_job`` and a plain-Python read of the table's rows."""

from __future__ import annotations

import json
import shutil

import pytest

from lakecast.delta import io as delta_io
from lakecast.runtime.keyed import KeyedBroadcastRuntime
from lakecast.runtime.keyed_backend import decode_key
from lakecast.runtime.keyed_store import TAG
from tests.lakecast import keyed_job as kj

BIG = 50.0
DESCRIPTORS = {d.name: d for d in (kj.COUNT, kj.TOTAL, kj.LAST_TS)}


def _runtime(spark, paths, parallelism, compact_every):
    return KeyedBroadcastRuntime(spark, kj.Sessions(), {"thresholds": paths["thresholds"]},
                                 paths["keyed_state"], timestamp_column="ts",
                                 order_columns=("event_id",), key_groups=32,
                                 parallelism=parallelism, compact_every=compact_every)


def _batch(spark, paths, b, parallelism=2, compact_every=2, spark_compaction=False):
    """Batch ``b`` with a new runtime (a new application); returns (outputs, version).
    Tables this small are compacted on the driver unless ``spark_compaction``."""
    rt = _runtime(spark, paths, parallelism, compact_every)
    if spark_compaction:
        rt.store.driver_compact_rows = 0
    events = spark.createDataFrame(kj.events_for(b), kj.EVENTS_SCHEMA)
    result = rt.process(events, batch_id=b, processing_time=b).persist()
    out = kj.rows(result.main.collect())
    version = rt.commit(result)
    result.unpersist()
    rt.close()
    return out, version


def _table_state(spark, path, version):
    """(batch id, {user: (count, total, last ts)}, rows) of a version, read in plain Python:
    per key the row with the largest ``_batch`` (none: oldest), a null state deleted."""
    rows = delta_io.read(spark, path, version=version).collect()
    newest = {}
    for r in rows:
        d = r.asDict()
        b = d.get("_batch")
        b = -1 if b is None else b
        k = (d["_key_group"], d["_key"])
        if k not in newest or b > newest[k][0]:
            newest[k] = (b, d["_state"])
    meta = json.loads(bytes(newest.pop((-1, "__meta__"))[1]).decode())
    state = {}
    for _, blob in newest.values():
        if blob is None:
            continue
        key, entry = decode_key(bytes(blob), DESCRIPTORS)
        if entry.states:
            s = entry.states
            state[key] = (s["count"][0], s["total"][0], s["last_ts"][0])
    return meta["batch_id"], state, len(rows)


def _ops(spark, path):
    return [json.loads(h["userMetadata"])[TAG]["op"] if h["userMetadata"] else h["operation"]
            for h in reversed(delta_io.history(spark, path))]


def test_compaction_keeps_the_state_of_every_version_across_rescaling(spark, tmp_path):
    paths = kj.table_paths(str(tmp_path))
    kj.write_thresholds(spark, paths["thresholds"], BIG, mode="overwrite")
    batches = 7
    states: list[dict] = []
    want = kj.reference(((kj.events_for(b), BIG) for b in range(batches)), states)
    got = []
    for b, p in zip(range(batches), [2, 3, 1, 2, 4, 2, 3], strict=True):
        out, version = _batch(spark, paths, b, parallelism=p, compact_every=2)
        got.extend(out)
        assert _table_state(spark, paths["keyed_state"], version)[:2] == (b, states[b])
    assert sorted(got, key=repr) == sorted(want, key=repr)
    path = paths["keyed_state"]
    ops = _ops(spark, path)
    assert ops == ["append", "append", "compact"] * 3 + ["append"]
    # every version — a changelog, a compaction, before or after later compactions —
    # reads as the state of the batch it holds
    sizes = {}
    for version, op in enumerate(ops):
        b, state, rows = _table_state(spark, path, version)
        assert state == states[b], (version, op)
        sizes[op] = max(sizes.get(op, 0), rows - len(state) - 1)
    assert sizes["compact"] == 0 < sizes["append"]  # one row per key after a compaction
    # sizes count newest rows only; a compaction changes no version's state
    rt = _runtime(spark, paths, 2, 2)
    assert rt.state_size()["keys"] == len(states[-1])
    assert rt.state_size(2)["keys"] == len(states[1]) == rt.state_size(1)["keys"]


@pytest.mark.parametrize("spark_compaction", [False, True], ids=["driver", "spark"])
def test_a_redo_right_after_a_compaction_appends_nothing_twice(spark, tmp_path,
                                                              spark_compaction):
    paths = kj.table_paths(str(tmp_path))
    kj.write_thresholds(spark, paths["thresholds"], BIG, mode="overwrite")
    states: list[dict] = []
    want = kj.reference(((kj.events_for(b), BIG) for b in range(3)), states)
    first, _ = _batch(spark, paths, 0)
    once, version = _batch(spark, paths, 1, spark_compaction=spark_compaction)  # + compaction
    assert _ops(spark, paths["keyed_state"]) == ["append", "append", "compact"]
    # the batch is redone (a crash after its state was written): it starts from batch
    # 0's version, computes the same outputs, and its commit writes nothing
    again, redone = _batch(spark, paths, 1, spark_compaction=spark_compaction)
    assert again == once and redone == version
    assert delta_io.latest_version(paths["keyed_state"], spark) == version
    last, version = _batch(spark, paths, 2)
    assert sorted(first + once + last, key=repr) == sorted(want, key=repr)
    assert _table_state(spark, paths["keyed_state"], version)[:2] == (2, states[2])


def test_a_table_without_batch_ids_is_carried_on(spark, tmp_path):
    """A state table written before the changelog (one row per key, no ``_batch``)."""
    paths = kj.table_paths(str(tmp_path))
    kj.write_thresholds(spark, paths["thresholds"], BIG, mode="overwrite")
    states: list[dict] = []
    want = kj.reference(((kj.events_for(b), BIG) for b in range(4)), states)
    got, _ = _batch(spark, paths, 0)
    path = paths["keyed_state"]
    # the table as the MERGE-era runtime created it: no _batch, deletion vectors on
    legacy = delta_io.read(spark, path).drop("_batch").localCheckpoint()
    shutil.rmtree(path)
    (legacy.writeTo(f"delta.`{path}`").using("delta")
     .tableProperty("delta.enableDeletionVectors", "true")
     .tableProperty("delta.enableChangeDataFeed", "false").create())
    assert "_batch" not in delta_io.read(spark, path).columns
    for b in (1, 2, 3):  # compacted by Spark, as a table with deletion vectors would be
        out, version = _batch(spark, paths, b, compact_every=2, spark_compaction=True)
        got.extend(out)
        assert _table_state(spark, path, version)[:2] == (b, states[b])
    assert sorted(got, key=repr) == sorted(want, key=repr)
    assert _ops(spark, path)[1:] == ["append", "append", "compact", "append"]


def test_newest_rows_keeps_each_keys_newest_row_and_drops_tombstones():
    """The driver-side compaction against a plain-Python fold of random changelogs."""
    import random

    import pyarrow as pa

    from lakecast.runtime.keyed_store import STORE_SCHEMA, newest_rows

    rng = random.Random(3)
    for _ in range(50):
        rows = []
        for b in [None, *range(rng.randrange(1, 6))]:
            for g, k in rng.sample([(g, f"k{i}") for g in range(3) for i in range(5)], 6):
                state = None if rng.random() < 0.3 else f"{g}{k}@{b}".encode()
                rows.append((g, k, state, None, None, None, b))
            rows.append((-1, "__meta__", f"meta@{b}".encode(), None, None, None, b))
        rng.shuffle(rows)
        want = {}
        for r in sorted(rows, key=lambda r: -1 if r[6] is None else r[6]):
            want[(r[0], r[1])] = r[2]
        want = {k: v for k, v in want.items() if v is not None}
        table = pa.Table.from_pylist([dict(zip(STORE_SCHEMA.names, r, strict=True))
                                      for r in rows], schema=STORE_SCHEMA)
        got = newest_rows(table).to_pylist()
        assert {(r["_key_group"], r["_key"]): r["_state"] for r in got} == want
        assert len(got) == len(want)


@pytest.mark.parametrize("spark_copy", [False, True], ids=["driver", "spark"])
def test_a_copy_of_a_version_carries_on_as_the_table_did(spark, tmp_path, spark_copy):
    """``copy_to`` (a replay's scratch state): one compacted commit holding a version's
    state and meta, from which a replica runtime redoes the later batches exactly; the
    source table is only read; a copy of no version is empty state."""
    paths = kj.table_paths(str(tmp_path))
    kj.write_thresholds(spark, paths["thresholds"], BIG, mode="overwrite")
    states: list[dict] = []
    kj.reference(((kj.events_for(b), BIG) for b in range(3)), states)
    outs = [_batch(spark, paths, b)[0] for b in range(3)]
    path, scratch = paths["keyed_state"], str(tmp_path / "scratch")
    source = delta_io.latest_version(path, spark)
    rt = _runtime(spark, paths, 2, 2)
    if spark_copy:
        rt.store.driver_compact_rows = 0
    rt.store.copy_to(scratch, 0)  # the version batch 0 wrote
    assert _ops(spark, scratch) == ["compact"]
    b, state, rows = _table_state(spark, scratch, 0)
    assert (b, state, rows) == (0, states[0], len(states[0]) + 1)  # one row per key + meta
    replica = rt.replica(scratch)
    assert replica.function_id != rt.function_id
    for b in (1, 2):
        events = spark.createDataFrame(kj.events_for(b), kj.EVENTS_SCHEMA)
        result = replica.process(events, batch_id=b, processing_time=b).persist()
        assert sorted(kj.rows(result.main.collect()), key=repr) == sorted(outs[b], key=repr)
        version = replica.commit(result)
        result.unpersist()
        assert _table_state(spark, scratch, version)[:2] == (b, states[b])
    replica.close()
    rt.store.copy_to(scratch, None)  # replaced: no state
    empty = delta_io.latest_version(scratch, spark)
    assert delta_io.read(spark, scratch, version=empty).count() == 0
    assert replica.store.state_before(0)[0] is None
    assert delta_io.latest_version(path, spark) == source
    rt.close()
