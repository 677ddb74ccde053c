"""Sharded broadcast state (``Lookup(shards=N)``): each task keeps only its shard.

Without Spark: the hash against Spark's own known values, and a sharded enrichment in the
test harness over versions that update, delete and add keys, equal to a pandas model.
With Spark (marked by the fixtures they use): the hash and the routing equal to Spark's
``hash`` and ``repartition``, and a sharded enrichment over Delta versions whose tasks each
hold one shard (state bytes per task near the table's over the tasks).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from lakecast.api import BroadcastElement, BroadcastProcessFunction, MapStateDescriptor
from lakecast.api.enrich import Lookup, enrich
from lakecast.runtime.harness import BroadcastTestHarness
from lakecast.runtime.sharded_state import ShardedTableState
from lakecast.runtime.shards import _hash_long, shard_of, spark_hash


def test_the_hash_is_spark_murmur3_on_its_known_values():
    # Spark's Murmur3_x86_32Suite (seed 0): hashLong of these values
    known = {0: 1669671676, -42: -846261623, 42: 1871679806,
             -(2**63): 1366273829, 2**63 - 1: -2106506049}
    got = _hash_long(np.array(list(known), dtype=np.int64),
                     np.zeros(len(known), dtype=np.uint32)).view(np.int32)
    assert got.tolist() == list(known.values())
    # integer widths hash alike (routed as bigint); a null column leaves the seed (42)
    assert spark_hash([pa.array([7], pa.int8())]) == spark_hash([pa.array([7], pa.int64())])
    assert spark_hash([pa.array([None], pa.int64())]).tolist() == [42]


def _dimension(n: int, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"k": np.arange(n, dtype=np.int64) * 7 - 50,
                         "name": [f"n{i}-é" * (i % 3 + 1) for i in range(n)],
                         "score": rng.integers(0, 1000, n).astype(np.int64)})


def _versions() -> list[tuple[str, pd.DataFrame]]:
    """A dimension's versions as changes: updates, deletes, adds, a key deleted and
    added back."""
    return [
        ("update_postimage", pd.DataFrame({"k": [-50, 20, 650], "name": ["a", "b", "c"],
                                            "score": [1, 2, 3]})),
        ("delete", pd.DataFrame({"k": [-43, 650, 13], "name": [None] * 3,
                                 "score": [None] * 3})),
        ("insert", pd.DataFrame({"k": [100_000, 100_007], "name": ["x", "y"],
                                 "score": [5, 6]})),
        ("insert", pd.DataFrame({"k": [650], "name": ["back"], "score": [9]})),
    ]


def _model(dim: pd.DataFrame, upto: int) -> dict[int, tuple[str, int]]:
    state = {int(r.k): (r.name, int(r.score)) for r in dim.itertuples()}
    for kind, rows in _versions()[:upto]:
        for r in rows.itertuples():
            if kind == "delete":
                state.pop(int(r.k), None)
            else:
                state[int(r.k)] = (r.name, int(r.score))
    return state


def test_a_sharded_enrichment_equals_a_pandas_model_over_versions(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    dim = _dimension(400)
    fn = enrich(Lookup("dim", key="k", shards=4, defaults={"score": -1}))
    schema = pa.Schema.from_pandas(dim, preserve_index=False)
    h = BroadcastTestHarness(fn, tables=["dim"], table_schemas={"dim": schema})
    h.process_broadcast_element(BroadcastElement.of("dim", 0, pa.Table.from_pandas(
        dim, schema=schema, preserve_index=False)))
    probe = np.concatenate([dim.k.to_numpy(), [100_000, 100_007, 650, 3, 999_999]])
    for upto in range(len(_versions()) + 1):
        if upto:
            kind, rows = _versions()[upto - 1]
            h.process_broadcast_element(BroadcastElement.of(
                "dim", upto, pa.Table.from_pandas(rows, schema=schema, preserve_index=False),
                kind="changes", change_type=kind))
        out = h.process_elements([{"k": int(k)} for k in probe])
        model = _model(dim, upto)
        want = [{"k": int(k), "name": model.get(int(k), (None, -1))[0],
                 "score": model.get(int(k), (None, -1))[1]} for k in probe]
        assert out == want, f"after version {upto}"
    state = h.executor.store.states["dim"]
    assert isinstance(state, ShardedTableState)
    whole = state.to_arrow().to_pandas().sort_values("k").reset_index(drop=True)
    model = _model(dim, len(_versions()))
    assert dict(zip(whole.k, zip(whole.name, whole.score, strict=True), strict=True)) == model


def test_a_task_reads_only_the_shards_of_its_keys(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    dim = _dimension(4000)
    fn = enrich(Lookup("dim", key="k", shards=8))
    h = BroadcastTestHarness(fn, tables=["dim"])
    h.process_broadcast_element(BroadcastElement.of("dim", 0, pa.Table.from_pandas(
        dim, preserve_index=False)))
    keys = dim.k.to_numpy()
    mine = keys[shard_of([pa.array(keys)], 8) == 3]
    state = h.executor.store.states["dim"]
    h.executor.store.begin_task()
    out = h.process_elements([{"k": int(k)} for k in mine])
    assert len(out) == len(mine) and all(r["name"] is not None for r in out)
    assert h.executor.store.shards_read() == [3]
    whole = pa.Table.from_pandas(dim, preserve_index=False).nbytes
    assert state.nbytes() < 1.5 * whole / 8  # this task's share: one shard of eight
    # keys of another type than the table's (int32, numeric strings) are found as its own
    for probe in (pa.array(mine[:20], pa.int32()), pa.array([str(k) for k in mine[:20]])):
        taken, found = state.lookup([probe], ["score"])
        assert found.all() and taken.column("score").to_pylist() == \
            dim.set_index("k").score.loc[mine[:20]].tolist()


def test_shards_are_declared_on_a_key():
    with pytest.raises(ValueError, match="shards must be a whole number"):
        Lookup("dim", key="k", shards=0)
    with pytest.raises(ValueError, match="share their event key columns"):
        enrich(Lookup("a", key="k", shards=2), Lookup("b", key="j", shards=2))
    # a sharded lookup runs in the Python workers, said in its engine's reason
    from lakecast.runtime.engine import choose_engine

    fn = enrich(Lookup("a", key="k", shards=2))
    assert fn.routing() == (["k"], 2)
    choice = choose_engine(None, fn)
    assert choice.engine == "python" and choice.reason.startswith("sharded lookups")
    with pytest.raises(ValueError, match="keep their shards in the Python workers"):
        choose_engine(None, fn, jvm_lookups=True)


# ------------------------------------------------------------------------ on real Spark
def test_the_hash_and_the_routing_are_sparks_own(spark):
    from pyspark.sql import functions as F

    from lakecast.runtime.shards import routing_columns

    strings = ["", "a", "ab", "abc", "abcd", "abcde", "é", "ÿþ", "日本語のテキスト", "\x00x",
               None, "a" * 33, "Zürich-123", "VIP"]
    longs = [0, 1, -1, 42, 2**31, -(2**63), 2**63 - 1, None, 7, -42, 123456789012, 5, 6, 8]
    ints = [0, 1, -1, 42, 2**31 - 1, -(2**31), None, 3, 4, 5, 6, 7, 8, 9]
    rows = list(zip(ints, longs, strings, strict=True))
    df = spark.createDataFrame(rows, "i int, l bigint, s string")
    got = df.select(F.hash(F.col("i").cast("bigint")).alias("hi"), F.hash("l").alias("hl"),
                    F.hash("s").alias("hs"), F.hash(F.col("l"), F.col("s")).alias("hls")
                    ).toPandas()
    i = pa.array(ints, pa.int32())
    s = pa.array(strings, pa.string())
    lng = pa.array(longs, pa.int64())
    assert spark_hash([i]).tolist() == got.hi.tolist()
    assert spark_hash([lng]).tolist() == got.hl.tolist()
    assert spark_hash([s]).tolist() == got.hs.tolist()
    assert spark_hash([lng, s]).tolist() == got.hls.tolist()
    # repartition(N, keys) puts each row in partition shard_of(keys, N)
    for n in (3, 8):
        routed = (df.repartition(n, *routing_columns(["i", "s"], df.schema))
                  .select("i", "s", F.spark_partition_id().alias("p")).toPandas())
        want = shard_of([pa.array(routed.i.astype("Int64"), pa.int64()),
                         pa.array(routed.s.tolist(), pa.string())], n)
        assert routed.p.tolist() == want.tolist()
    # events whose key is a string of digits, routed to a table keyed by integers: as
    # the table's key type, the shard the task computes from the cast key
    digits = spark.createDataFrame([(str(v),) for v in range(50)], "sn string")
    routed = (digits.repartition(4, *routing_columns(["sn"], digits.schema, [pa.int64()]))
              .select("sn", F.spark_partition_id().alias("p")).toPandas())
    want = shard_of([pa.array(routed.sn.astype("int64"), pa.int64())], 4)
    assert routed.p.tolist() == want.tolist()


def test_a_sharded_runtime_over_delta_versions_equals_pandas(spark, lake, caplog):
    """A dimension written by deltalake (as a user's asset writes it), its Change Data Feed
    turned on, then a Spark MERGE, a deltalake delete and a deltalake merge: every batch
    equals a pandas model, each task reads the one shard of its partition and holds about
    an eighth of the table; versions came both as changes (the overlay over the shards)
    and as whole tables (new shard files). The table is 4x the per-task budget (the budget
    over the 8 tasks): sharded, no batch is over budget; the same lookup unsharded is."""
    from deltalake import DeltaTable, write_deltalake
    from pyspark.sql import functions as F

    from lakecast import BroadcastRuntime
    from lakecast.delta import io as delta_io

    path = lake.table_path("dim")
    dim = _dimension(20_000)
    write_deltalake(path, dim)
    whole = pa.Table.from_pandas(dim, preserve_index=False).nbytes
    budget = 8 * whole // 4  # per task (of 8): a quarter of the table
    fn = enrich(Lookup("dim", key="k", shards=8, defaults={"score": -1}))
    runtime = BroadcastRuntime(spark, fn, {"dim": path}, state_budget_bytes=budget)
    assert runtime.state_engine == "python" and "sharded" in runtime.state_engine_reason
    probe = np.concatenate([dim.k.to_numpy()[::3], [100_000, 650, 3, 999_999]])
    events = spark.createDataFrame(pd.DataFrame({"k": probe, "eid": np.arange(len(probe))}))
    model = {int(r.k): (r.name, int(r.score)) for r in dim.itertuples()}

    kinds: set[str] = set()

    def check(label: str) -> None:
        result = runtime.process(events).persist()
        kinds.update(e.kind for e in result.new_elements)
        got = result.main.toPandas().sort_values("eid")
        want = [model.get(int(k), (None, -1)) for k in got.k]
        assert list(zip(got.name, got.score, strict=True)) == want, label
        metrics = result.metrics()
        assert len(metrics.tasks) == 8 and not metrics.over_budget, label
        for t in metrics.tasks:
            assert t.shards == ([t.partition] if t.rows_in else []), (label, t)
            assert t.state_bytes < 1.5 * whole / 8, (label, t.state_bytes, whole)
        assert metrics.rows_routed == len(probe) and metrics.shards_per_task == 1, label
        result.unpersist()

    check("v0")
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
              "(delta.enableChangeDataFeed = true)")
    delta_io.merge_upsert(spark, spark.createDataFrame(pd.DataFrame(
        {"k": [-50, 650, 100_000], "name": ["u", "v", "w"], "score": [1, 2, 3]})).select(
        F.col("k"), F.col("name"), F.col("score")), path, keys=["k"])
    model.update({-50: ("u", 1), 650: ("v", 2), 100_000: ("w", 3)})
    check("spark merge")
    DeltaTable(path).delete("k = -43 OR k = 650")
    model.pop(-43), model.pop(650)
    check("deltalake delete")
    new = pd.DataFrame({"k": [3, -36], "name": ["three", "m"], "score": [33, 44]})
    (DeltaTable(path).merge(new, "t.k = s.k", source_alias="s", target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all().execute())
    model.update({3: ("three", 33), -36: ("m", 44)})
    check("deltalake merge")
    runtime.close()
    assert kinds == {"full", "changes"}
    plain = BroadcastRuntime(spark, enrich(Lookup("dim", key="k", defaults={"score": -1})),
                             {"dim": path}, state_budget_bytes=budget, jvm_lookups=False)
    result = plain.process(events).persist()
    result.main.count()
    assert result.metrics().over_budget  # whole in every task: over the same budget
    result.unpersist()
    plain.close()
    # shards="auto": chosen from the table's size and a task's share of the budget, logged
    auto = enrich(Lookup("dim", key="k", shards="auto", defaults={"score": -1}))
    runtime = BroadcastRuntime(spark, auto, {"dim": path}, state_budget_bytes=budget)
    with caplog.at_level("INFO", logger="lakecast.runtime.routing"):
        result = runtime.process(events).persist()
        got = result.main.toPandas().sort_values("eid")
    assert list(zip(got.name, got.score, strict=True)) == [
        model.get(int(k), (None, -1)) for k in got.k]
    assert auto.routing()[1] >= 2 and "shards='auto'" in caplog.text
    assert result.metrics().shards_per_task == 1
    result.unpersist()
    runtime.close()


def test_a_checkpoint_of_a_sharded_state_is_the_tables_and_restores(tmp_path, monkeypatch):
    """A sharded state serializes to the same content as the whole table state (the
    checkpoint holds the table once), and that content restores into a sharded state
    with another shard count (a rescale)."""
    from lakecast.api.table_state import TableMapState
    from lakecast.snapshots.codec import deserialize_state, load_into, serialize_state

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    dim = pa.Table.from_pandas(_dimension(3000), preserve_index=False)
    changes = pa.Table.from_pandas(_versions()[0][1], schema=dim.schema, preserve_index=False)
    states = []
    for desc_shards in (None, 4):
        fn = enrich(Lookup("dim", key="k", shards=desc_shards))
        h = BroadcastTestHarness(fn, tables=["dim"], table_schemas={"dim": dim.schema})
        h.process_broadcast_element(BroadcastElement.of("dim", 0, dim))
        h.process_broadcast_element(BroadcastElement.of("dim", 1, changes, kind="changes",
                                                        change_type="update_postimage"))
        states.append(h.executor.store.states["dim"])
    plain, sharded = states
    assert type(plain) is TableMapState and isinstance(sharded, ShardedTableState)
    a, b = serialize_state("dim", plain), serialize_state("dim", sharded)
    assert a.digest == b.digest and a.n_entries == b.n_entries == 3000
    # made once per machine: the next task of the checkpoint reads it
    (made,) = list(tmp_path.rglob("once-*.arrow"))
    again = serialize_state("dim", sharded)
    assert (again.digest, again.values) == (b.digest, b.values) and made.exists()
    content = deserialize_state("table", b.values, b.schema_b64)
    fn3 = enrich(Lookup("dim", key="k", shards=3))
    h3 = BroadcastTestHarness(fn3, tables=["dim"])
    rescaled = h3.executor.store.states["dim"]
    load_into(rescaled, "table", content)
    assert serialize_state("dim", rescaled).digest == a.digest
    keys = [pa.array(dim.column("k").to_numpy()[::7])]
    want, _ = plain.lookup(keys, ["name", "score"])
    got, found = rescaled.lookup(keys, ["name", "score"])
    assert found.all() and got.equals(want)


def test_a_keyed_function_with_a_sharded_state_is_refused_with_the_fix():
    from lakecast.api.descriptors import MapStateDescriptor
    from lakecast.api.keyed import KeyedBroadcastProcessFunction
    from lakecast.runtime.keyed import KeyedBroadcastRuntime

    class Counts(KeyedBroadcastProcessFunction):
        key_by = "user_id"

        def state_descriptors(self):
            return [MapStateDescriptor("dim", key_columns=("user_id",), shards=4)]

    with pytest.raises(ValueError, match="routed by key group, not by shard"):
        KeyedBroadcastRuntime(None, Counts(), {"dim": "/nowhere"}, "/nowhere/state")
    with pytest.raises(Exception, match="needs key_columns"):
        MapStateDescriptor("flags", shards=2)


def _build_in_child(folder: str, rows: pa.Table, out: str) -> None:
    """Build shard files in another process (what a second Python worker does)."""
    from pathlib import Path

    from lakecast.runtime.shard_files import build

    build(Path(folder), BroadcastElement.of("dim", 0, rows), ["k"], None, 4)
    Path(out).write_text("done")


def test_a_build_killed_midway_is_taken_over_and_two_builders_build_once(tmp_path):
    """A process killed -9 while building leaves its lock and half-written files: the next
    task takes the lock over (its owner is gone) and builds; two processes at once build
    one set of files, and both read it."""
    import multiprocessing
    import subprocess
    import sys

    from lakecast.runtime.shard_files import Shard, build

    rows = pa.Table.from_pandas(_dimension(5000), preserve_index=False)
    folder = tmp_path / "ns" / "dim@v0-t0-n4"
    folder.parent.mkdir(parents=True)
    # a builder that takes the lock, writes half its files and is killed -9
    killed = subprocess.run([sys.executable, "-c", f"""
import fcntl, os, pathlib, signal
lock = open({str(folder) + '.lock'!r}, "a")
fcntl.flock(lock, fcntl.LOCK_EX)
half = pathlib.Path({str(folder)!r} + ".tmp-" + str(os.getpid()))
half.mkdir()
(half / "part-0").write_bytes(b"half a stream")
os.kill(os.getpid(), signal.SIGKILL)
"""])
    assert killed.returncode == -9 and list(folder.parent.glob("*.tmp-*"))
    build(folder, BroadcastElement.of("dim", 0, rows), ["k"], None, 4)
    assert (folder / "_DONE").exists() and not list(folder.parent.glob("*.tmp-*"))
    got = pa.concat_tables([Shard.open(folder / f"shard-{s}.arrow").table for s in range(4)])
    assert sorted(got.column("k").to_pylist()) == sorted(rows.column("k").to_pylist())

    again = tmp_path / "ns" / "dim@v1-t1-n4"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_build_in_child, args=(str(again), rows,
                                                       str(tmp_path / f"done{i}")))
             for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert (tmp_path / "done0").exists() and (tmp_path / "done1").exists()
    assert sum(Shard.open(again / f"shard-{s}.arrow").table.num_rows for s in range(4)) == 5000
    assert not folder.exists()  # the newer base pruned the older one


class Scores(BroadcastProcessFunction):
    """A broadcast function of its own over a sharded table-shaped state: it declares the
    state's shards and how its events are routed."""

    DIM = MapStateDescriptor("dim", key_columns=("k",), shards=4)
    batch_format = "arrow"

    def state_descriptors(self):
        return [self.DIM]

    def routing(self):
        return ["k"], 4

    def output_schema(self, input_schema):
        return pa.schema([*input_schema, ("score", pa.int64())])

    def process_broadcast_element(self, value, ctx):
        ctx.get_broadcast_state(self.DIM).apply(value, value_columns=["score"])

    def process_batch(self, batch, ctx):
        taken, _ = ctx.get_broadcast_state(self.DIM).lookup([batch.column("k")], ["score"])
        yield batch.append_column("score", taken.column("score"))


def test_a_broadcast_function_of_its_own_shards_its_state(tmp_path, monkeypatch):
    from lakecast import BroadcastRuntime

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    dim = _dimension(500)
    h = BroadcastTestHarness(Scores(), tables=["dim"])
    h.process_broadcast_element(BroadcastElement.of("dim", 0, pa.Table.from_pandas(
        dim, preserve_index=False)))
    out = h.process_elements([{"k": int(k)} for k in dim.k[:50]] + [{"k": 3}])
    assert [r["score"] for r in out] == [*dim.score[:50].tolist(), None]
    assert isinstance(h.executor.store.states["dim"], ShardedTableState)

    class Unrouted(Scores):
        def routing(self):
            return None

    with pytest.raises(ValueError, match="no routing"):
        BroadcastRuntime(None, Unrouted(), {"dim": "/nowhere"})
    assert MapStateDescriptor("d", key_columns=("k",), shards=2).shards == 2


def test_auto_shards_are_chosen_from_the_tables_size_and_the_budget(caplog):
    fn = enrich(Lookup("dim", key="k", shards="auto"), Lookup("small", key="j"))
    assert fn.routing() is None and fn.lookups[0].descriptor.shards is None
    from lakecast.runtime.engine import choose_engine

    assert choose_engine(None, fn).reason.startswith("sharded lookups")  # never the JVM
    said = fn.choose_shards({"dim": 10_000_000, "small": 50}, task_budget=3_000_000)
    assert said == ["Lookup('dim', shards='auto'): 10.0 MB against 3.0 MB per task: 4 shards"]
    assert fn.routing() == (["k"], 4) and fn.lookups[0].descriptor.shards == 4
    fits = enrich(Lookup("dim", key="k", shards="auto"))
    assert fits.choose_shards({"dim": 100}, 3_000_000)[0].endswith("not sharded")
    assert fits.routing() is None
    with pytest.raises(ValueError, match="or 'auto'"):
        Lookup("dim", key="k", shards="many")


def test_three_key_columns_an_empty_restore_and_a_shard_file_of_several_batches(
        tmp_path, monkeypatch):
    from lakecast.runtime.shard_files import HASH, Shard
    from lakecast.snapshots.codec import load_into

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    rows = pa.table({"a": [1, 1, 2, 2], "b": ["x", "y", "x", "y"], "c": [0, 0, 0, 1],
                     "v": [10, 11, 12, 13]})
    state = ShardedTableState(MapStateDescriptor("t", key_columns=("a", "b", "c"), shards=2))
    state.apply(BroadcastElement.of("t", 0, rows))
    taken, found = state.lookup([pa.array([2, 1, 9]), pa.array(["y", "x", "x"]),
                                 pa.array([1, 0, 0])], ["v"])
    assert found.tolist() == [True, True, False] and taken.column("v").to_pylist() == [
        13, 10, None]
    # a checkpoint of an empty state restores, then the next version's changes apply
    load_into(state, "table", rows.slice(0, 0))
    state.apply(BroadcastElement.of("t", 1, rows.slice(0, 1), kind="changes"))
    assert state.to_arrow().to_pylist() == rows.slice(0, 1).to_pylist()
    # a shard file written in several record batches is read whole
    t = pa.table({"k": [4, 5, 6, 7], HASH: pa.array([1, 2, 3, 4], pa.uint64())})
    path = tmp_path / "several.arrow"
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, t.schema) as w:
        w.write_table(t, max_chunksize=2)
    shard = Shard.open(path)
    assert shard.find([pa.array([5, 7, 8])], np.array([2, 4, 5], np.uint64), ["k"]
                      ).tolist() == [1, 3, -1]


def test_a_tasks_shards_travel_in_its_accounting_row():
    from lakecast.runtime.metrics import RunMetrics, TaskMetrics, unpack_task_row

    t = TaskMetrics(partition=3, pid=1, function_id="f", cache="warm", elements_applied=0,
                    rows_applied=0, state_version={}, state_bytes=10, rows_in=5, shards=[3])
    back = TaskMetrics.from_row(unpack_task_row(t.to_packed_row()))
    assert back.shards == [3]
    m = RunMetrics({}, [back, TaskMetrics(0, 1, "f", "warm", 0, 0, {}, 10, rows_in=7,
                                          shards=[0])])
    assert (m.summary()["shards_per_task"], m.summary()["rows_routed"]) == (1, 12)
