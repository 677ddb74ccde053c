"""Any Delta writer, any operation, no crash (issue 52): broadcast tables and the events
table written by ``deltalake`` (no Change Data Feed) or by Spark with or without it, and a
table deleted and created anew at its path, on real Spark and Delta.

Each broadcast scenario commits its operations one step at a time; after each step every
execution enriches the same events — task-local state in the executor JVM (the default of
a pure lookup), in the Python workers (``jvm_lookups=False``), broadcast joins
(``execution="joins"``), a keyed function reading broadcast state, and a JVM runtime that
only catches up every other step (several versions in one range) — and each output equals
pandas over the table as ``deltalake`` reads it at that version (read right after the
commit, independently of Lakecast).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from lakecast import BroadcastRuntime, Lookup, MapStateDescriptor, enrich
from lakecast.api.keyed import KeyedBroadcastProcessFunction
from lakecast.build import broadcast_pipeline
from lakecast.delta import io as delta_io
from lakecast.pipeline.events import AppendOnlyError
from lakecast.pipeline.micro_batch import PipelineSpec
from lakecast.runtime.keyed import KeyedBroadcastRuntime

DIM = "dim"
SEGMENTS = MapStateDescriptor("segments", int, str)
Step = Callable[[Any, str], None]  # (spark, path): commits one or more versions


def _dim(keys: list[int], tag: str, **extra: list[Any]) -> pd.DataFrame:
    """Dimension rows: key ``k``, a ``segment`` naming the step, a ``score``."""
    return pd.DataFrame({"k": pd.array(keys, dtype="int64"),
                         "segment": [f"{tag}{k}" for k in keys],
                         "score": [float(k) for k in keys], **extra})


# -- the writers' operations ----------------------------------------------------------

def dl_create(spark: Any, path: str) -> None:
    write_deltalake(path, _dim([0, 1, 2, 3, 4, 5], "a"), mode="overwrite")


def dl_append(spark: Any, path: str) -> None:
    write_deltalake(path, _dim([6, 7], "b"), mode="append")


def dl_append_nine(spark: Any, path: str) -> None:
    write_deltalake(path, _dim([9], "b"), mode="append")


def dl_merge(spark: Any, path: str) -> None:
    (DeltaTable(path).merge(_dim([1, 8], "m"), predicate="t.k = s.k", source_alias="s",
                            target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all().execute())


def dl_delete(spark: Any, path: str) -> None:
    DeltaTable(path).delete("k = 2")


def dl_update(spark: Any, path: str) -> None:
    DeltaTable(path).update(updates={"segment": "'upd'"}, predicate="k = 3")


def dl_optimize(spark: Any, path: str) -> None:
    DeltaTable(path).optimize.compact()


def dl_vacuum(spark: Any, path: str) -> None:
    DeltaTable(path).vacuum(retention_hours=0, enforce_retention_duration=False,
                            dry_run=False)


def dl_overwrite(spark: Any, path: str) -> None:
    write_deltalake(path, _dim([0, 3, 5, 9], "o"), mode="overwrite")


def dl_add_column(spark: Any, path: str) -> None:
    write_deltalake(path, _dim([0, 1, 5, 9], "c", extra=["x"] * 4), mode="overwrite",
                    schema_mode="overwrite")


def dl_drop_column(spark: Any, path: str) -> None:
    write_deltalake(path, _dim([1, 5, 6], "d").drop(columns=["score"]), mode="overwrite",
                    schema_mode="overwrite")


def _sql(*statements: str) -> Step:
    def step(spark: Any, path: str) -> None:
        for s in statements:
            spark.sql(s.format(t=f"delta.`{path}`"))
    step.__name__ = statements[0].split()[0].lower()
    return step


def spark_create_cdf(spark: Any, path: str) -> None:
    """Lakecast's Spark session: every new table records its Change Data Feed."""
    spark.createDataFrame(_dim([0, 1, 2, 3, 4, 5], "a")).write.format("delta").save(path)
    assert delta_io.table_properties(spark, path).get(delta_io.CDF_PROPERTY) == "true"


def spark_create_no_cdf(spark: Any, path: str) -> None:
    """A Spark session with default settings: no Change Data Feed."""
    spark.sql(f"CREATE TABLE delta.`{path}` (k BIGINT, segment STRING, score DOUBLE) "
              "USING delta TBLPROPERTIES (delta.enableChangeDataFeed = false)")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (0, 'a0', 0.0), (1, 'a1', 1.0), "
              "(2, 'a2', 2.0), (3, 'a3', 3.0), (4, 'a4', 4.0), (5, 'a5', 5.0)")


def spark_overwrite(spark: Any, path: str) -> None:
    spark.createDataFrame(_dim([0, 4, 9], "o")).write.format("delta").mode(
        "overwrite").save(path)


SPARK_OPS = [
    _sql("INSERT INTO {t} VALUES (6, 'i6', 6.0), (7, 'i7', 7.0)"),
    _sql("UPDATE {t} SET segment = 'upd' WHERE k = 1"),
    _sql("DELETE FROM {t} WHERE k = 2"),
    _sql("MERGE INTO {t} AS t USING (SELECT 3L AS k, 'm3' AS segment, 3.0 AS score UNION ALL "
         "SELECT 8L, 'm8', 8.0) AS s ON t.k = s.k WHEN MATCHED THEN UPDATE SET * "
         "WHEN NOT MATCHED THEN INSERT *"),
    _sql("OPTIMIZE {t}"),
    spark_overwrite,
]


def recreate(*steps: Step) -> Step:
    """Delete the table's folder, then create it anew with ``steps`` (versions restart)."""
    def step(spark: Any, path: str) -> None:
        shutil.rmtree(path)
        for s in steps:
            s(spark, path)
    step.__name__ = "recreate_" + "_".join(s.__name__ for s in steps)
    return step


def dl_create_other(spark: Any, path: str) -> None:
    write_deltalake(path, _dim([2, 4, 5], "r"), mode="overwrite")


SCENARIOS: dict[str, list[Step]] = {
    "deltalake": [dl_create, dl_append, dl_merge, dl_delete, dl_update, dl_optimize,
                  dl_vacuum, dl_overwrite, dl_add_column, dl_drop_column],
    "spark-cdf": [spark_create_cdf, *SPARK_OPS],
    "spark-no-cdf": [spark_create_no_cdf, *SPARK_OPS],
    "deltalake-then-spark": [dl_create, SPARK_OPS[0], SPARK_OPS[1], dl_append_nine,
                             SPARK_OPS[2]],
    # versions restart: fewer than applied (newest < applied), then as many and more
    # (the table's metadata id tells it apart)
    "recreated": [dl_create, dl_append, dl_merge, recreate(dl_create_other), dl_append,
                  recreate(dl_create, dl_append, dl_delete)],
}


# -- the functions and pandas ---------------------------------------------------------

def _lookup():
    return enrich(Lookup(DIM, key="k", columns=["segment"], defaults={"segment": "none"}))


class KeyedSegments(KeyedBroadcastProcessFunction):
    """Keyed by ``k``: counts each key's events (keyed state) and reads the key's segment
    from the broadcast state the dimension's elements build."""

    key_by = "k"

    def state_descriptors(self):
        return [SEGMENTS]

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        return pa.schema([("event_id", pa.int64()), ("k", pa.int64()),
                          ("segment", pa.string())])

    def process_broadcast_element(self, value, ctx):
        ctx.get_broadcast_state(SEGMENTS).apply(value, key_columns="k",
                                                value_columns="segment")

    def process_element(self, value, ctx):
        yield {"event_id": value["event_id"], "k": value["k"],
               "segment": ctx.get_broadcast_state(SEGMENTS).get(value["k"], "none")}


def _events_pdf(step: int) -> pd.DataFrame:
    keys = list(range(10))
    return pd.DataFrame({"event_id": pd.array([step * 100 + i for i in keys], dtype="int64"),
                         "k": pd.array(keys, dtype="int64")})


def _expected(events: pd.DataFrame, dim: pd.DataFrame) -> list[tuple[int, str]]:
    """pandas: each event's segment by key, ``none`` where the key has no row."""
    seg = dict(zip(dim["k"], dim["segment"], strict=True))
    return sorted((int(e), seg.get(k, "none")) for e, k in zip(events["event_id"],
                                                               events["k"], strict=True))


def _pairs(rows: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return sorted((int(r["event_id"]), r["segment"]) for r in rows)


# -- broadcast tables: writer x operation x execution ---------------------------------

@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_writer_and_operation_is_applied_in_every_execution(spark, tmp_path, scenario,
                                                                   caplog):
    path = str(tmp_path / DIM)
    tables = {DIM: path}
    runtimes = {
        "jvm": BroadcastRuntime(spark, _lookup(), tables, lineage=False),
        "python": BroadcastRuntime(spark, _lookup(), tables, jvm_lookups=False,
                                   lineage=False),
        "joins": BroadcastRuntime(spark, _lookup(), tables, execution="joins",
                                  lineage=False),
        "jvm-every-other-step": BroadcastRuntime(spark, _lookup(), tables, lineage=False),
    }
    assert [r.state_engine for r in runtimes.values()] == ["jvm", "python", "joins", "jvm"]
    keyed = KeyedBroadcastRuntime(spark, KeyedSegments(), tables, str(tmp_path / "state"),
                                  key_groups=4)
    caplog.set_level(logging.INFO, logger="lakecast.delta.source")
    try:
        for step, op in enumerate(SCENARIOS[scenario]):
            op(spark, path)
            version = DeltaTable(path).version()
            want_dim = DeltaTable(path, version=version).to_pandas()
            pdf = _events_pdf(step)
            events = spark.createDataFrame(pdf)
            want = _expected(pdf, want_dim)
            where = f"{scenario} step {step} ({op.__name__}, v{version})"
            for name, runtime in runtimes.items():
                if name == "jvm-every-other-step" and step % 2 and step != len(
                        SCENARIOS[scenario]) - 1:
                    continue
                got = _pairs(runtime.process(events).collect().main.to_pylist())
                assert got == want, f"{name}: {where}"
                assert runtime.version == {DIM: version}, f"{name}: {where}"
            result = keyed.process(events, batch_id=step, processing_time=0).persist()
            got = _pairs([r.asDict() for r in result.main.collect()])
            keyed.commit(result)
            result.unpersist()
            assert got == want, f"keyed: {where}"
    finally:
        for runtime in runtimes.values():
            runtime.close()
    reloads = [r for r in caplog.records if "full reload" in r.getMessage()]
    if scenario in ("deltalake", "spark-no-cdf", "deltalake-then-spark"):
        # rewrites of a table without a change feed are reloads: expected, at INFO, once
        assert reloads and all(r.levelno == logging.INFO for r in reloads), [
            (r.levelname, r.getMessage()) for r in reloads]
    if scenario == "recreated":
        assert any("the table was recreated" in r.getMessage() for r in reloads)


# -- the events table appended by deltalake ---------------------------------------------

def _events_batch(first: int, n: int) -> pd.DataFrame:
    ids = list(range(first, first + n))
    return pd.DataFrame({"event_id": pd.array(ids, dtype="int64"),
                         "k": pd.array([i % 11 for i in ids], dtype="int64"),
                         "day": [f"2026-01-0{1 + i % 3}" for i in ids]})


@pytest.mark.parametrize("read", ["driver", "spark"])
def test_events_appended_by_deltalake_across_batches_optimize_and_vacuum(
        spark, tmp_path, monkeypatch, caplog, read):
    """The events table has no Change Data Feed (``deltalake``, partitioned by ``day``):
    batch after batch — two appends in one batch, an OPTIMIZE and a VACUUM between
    batches — each event is enriched once, as pandas computes it from the dimension's
    version the batch planned; an events commit that deletes rows then fails the run with
    one clear line naming the table and version, and with ``events_rewrites="skip"`` it
    (and an UPDATE) is skipped whole while the appends after it are read. ``read``: the
    added files read on the driver (small appends) or by Spark (the size bound at 0)."""
    import lakecast.pipeline.events as events_module

    if read == "spark":
        monkeypatch.setattr(events_module, "DIRECT_READ_BYTES", 0)
    root = tmp_path / "lake"
    paths = {t: str(root / t) for t in ("events", DIM, "out")}
    dim_path = paths[DIM]
    write_deltalake(dim_path, _dim(list(range(8)), "a"), mode="overwrite")
    spec = PipelineSpec(name="anywriter", events_table="events", broadcast_tables=(DIM,),
                        output_table="out")
    pipelines = {
        e: broadcast_pipeline(spark, replace(spec, name=f"p_{e}", output_table=f"out_{e}"),
                              _lookup(), table_path=lambda t: str(root / t),
                              checkpoint_root=str(tmp_path / "ckpt"), **opts)
        for e, opts in {"jvm": {}}.items()}  # (every execution: the matrix above)
    events = paths["events"]
    sent: list[tuple[pd.DataFrame, int]] = []  # (events of the batch, dim version)

    def append(first: int, n: int) -> pd.DataFrame:
        batch = _events_batch(first, n)
        write_deltalake(events, batch, mode="append", partition_by=["day"])
        return batch

    def run(batch: pd.DataFrame) -> None:
        version = DeltaTable(dim_path).version()
        sent.append((batch, version))
        for p in pipelines.values():
            (result,) = p.run()
            assert result.counts["events_in"] == len(batch)
            assert result.state_version == {DIM: version}

    run(append(0, 30))  # batch 0: the table's first version
    run(pd.concat([append(100, 20), append(200, 25)]))  # two appends in one batch
    dl_merge(spark, dim_path)
    DeltaTable(events).optimize.compact()  # files rearranged: no new rows
    run(append(300, 15))
    DeltaTable(events).vacuum(retention_hours=0, enforce_retention_duration=False,
                              dry_run=False)
    dl_delete(spark, dim_path)
    run(append(400, 10))
    DeltaTable(events).optimize.compact()  # a batch of nothing but an OPTIMIZE
    for p in pipelines.values():  # planned, and no event in it
        assert [r.counts["events_in"] for r in p.run()] == [0]
    dims = {v: DeltaTable(dim_path, version=v).to_pandas() for _, v in sent}
    for name in pipelines:
        out = delta_io.read(spark, str(root / f"out_{name}")).toPandas()
        assert len(out) == sum(len(b) for b, _ in sent)  # each event once
        for batch, v in sent:
            got = out[out["event_id"].isin(batch["event_id"])]
            assert _pairs(got.to_dict("records")) == _expected(batch, dims[v]), (name, v)

    # an events commit that deletes rows: one clear line, table and version named
    DeltaTable(events).delete("event_id = 3")
    bad = DeltaTable(events).version()
    for p in pipelines.values():
        with pytest.raises(AppendOnlyError) as err:
            p.run()
        message = str(err.value)
        assert "\n" not in message
        assert f"events table events version {bad} (DELETE)" in message
        assert "Reset the pipeline's outputs and progress log" in message
        assert "events_rewrites='skip'" in message

    # the same pipelines told to skip such commits: the DELETE and an UPDATE are skipped
    # whole (said at WARNING), the appends around them are read once; nothing retracted
    updated = DeltaTable(events)
    updated.update(updates={"k": "0"}, predicate="event_id = 5")
    later = append(500, 12)
    skipping = {e: broadcast_pipeline(
        spark, replace(spec, name=f"p_{e}", output_table=f"out_{e}", events_rewrites="skip"),
        _lookup(), table_path=lambda t: str(root / t),
        checkpoint_root=str(tmp_path / "ckpt"), **opts) for e, opts in {"jvm": {}}.items()}
    with caplog.at_level(logging.WARNING, logger="lakecast.pipeline.events"):
        for p in skipping.values():
            results = p.run()
            assert sum(r.counts["events_in"] for r in results) == len(later), [
                (r.plan, r.counts) for r in results]
    said = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert any(f"version {bad} (DELETE)" in m for m in said), said
    assert any(f"version {bad + 1} (UPDATE)" in m for m in said), said
    version = DeltaTable(dim_path).version()
    for name in skipping:
        out = delta_io.read(spark, str(root / f"out_{name}")).toPandas()
        assert out["event_id"].is_unique and 3 in set(out["event_id"])  # not retracted
        assert len(out) == sum(len(b) for b, _ in sent) + len(later)
        got = out[out["event_id"].isin(later["event_id"])]
        want = DeltaTable(dim_path, version=version).to_pandas()
        assert _pairs(got.to_dict("records")) == _expected(later, want)


def test_an_events_file_compacted_and_vacuumed_before_it_was_read_is_a_clear_error(
        spark, tmp_path):
    """Appends, then OPTIMIZE and VACUUM (retention 0) before the pipeline read them: the
    rows cannot be told apart from older ones; the batch fails naming the file and the fix
    (not a Spark FileNotFound inside a job)."""
    root = tmp_path / "lake"
    write_deltalake(str(root / DIM), _dim([0, 1], "a"), mode="overwrite")
    events = str(root / "events")
    p = broadcast_pipeline(spark, PipelineSpec("gone", "events", (DIM,), "out"), _lookup(),
                           table_path=lambda t: str(root / t),
                           checkpoint_root=str(tmp_path / "ckpt"))
    write_deltalake(events, _events_batch(0, 5), mode="append")
    p.run()
    write_deltalake(events, _events_batch(10, 5), mode="append")
    DeltaTable(events).optimize.compact()
    DeltaTable(events).vacuum(retention_hours=0, enforce_retention_duration=False,
                              dry_run=False)
    with pytest.raises(AppendOnlyError, match="were compacted and vacuumed before the "
                                              "pipeline read them"):
        p.run()
    assert Path(events).exists()


@pytest.mark.connect
def test_small_appends_without_cdf_read_on_the_driver_over_spark_connect(connect_spark,
                                                                           tmp_path):
    """The driver-side read of small additions makes a local DataFrame the Lakecast Spark
    server takes (Spark Connect): two batches of ``deltalake`` appends (partitioned and a
    timestamp column), each event once, as pandas says."""
    root = tmp_path / "lake"
    write_deltalake(str(root / DIM), _dim(list(range(6)), "a"), mode="overwrite")
    events = str(root / "events")
    p = broadcast_pipeline(connect_spark, PipelineSpec("connected", "events", (DIM,), "out"),
                           _lookup(), table_path=lambda t: str(root / t),
                           checkpoint_root=str(tmp_path / "ckpt"))
    sent = []
    for first in (0, 100, 200):
        batch = _events_batch(first, 9)
        batch["at"] = pd.Timestamp("2026-01-01", tz="UTC") + pd.to_timedelta(
            batch["event_id"], unit="s")
        write_deltalake(events, batch, mode="append", partition_by=["day"])
        sent.append(batch)
        (result,) = p.run()
        assert result.counts["events_in"] == len(batch)
    out = delta_io.read(connect_spark, str(root / "out")).toPandas()
    every = pd.concat(sent)
    assert out["event_id"].is_unique and len(out) == len(every)
    dim = DeltaTable(str(root / DIM)).to_pandas()
    assert _pairs(out.to_dict("records")) == _expected(every, dim)
    got = out.set_index("event_id")["at"].sort_index()
    want = every.set_index("event_id")["at"].sort_index()
    assert (pd.to_datetime(got, utc=True) == want).all()
