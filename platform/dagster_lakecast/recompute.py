"""The ``output_sample_recomputed`` asset check of factory-built pipelines: a sample of the
main output's rows recomputed from the events and the broadcast tables time-travelled to
the versions their batch applied, with the pipeline's own function in the engine's
in-memory harness (:mod:`lakecast.runtime.harness`, :mod:`lakecast.runtime.keyed_harness`),
compared column by column with the rows the batch wrote and the rows the table holds now.

1. **sample**: the rows the newest :data:`RECOMPUTE_BATCHES` committed batches (that wrote
   main output) appended to the output table (the files of the commit carrying the
   batch's ``txn``, read by time travel), ordered by a hash of ``seed`` and the row, the
   first ``dagster.recompute_sample`` of the declaration; their *row keys* are what is
   recomputed. A batch whose files VACUUM removed (after an OPTIMIZE) is skipped for an
   older one. A broadcast function's row key is the columns the output shares (name and
   type) with the events (an event's own columns); a keyed function's, its key columns;
2. **recompute**, broadcast functions: per sampled batch, its valid events (as the batch
   validated and de-duplicated them, :func:`lakecast.replay.batches.batch_input`) of the
   sampled row keys, through a harness whose broadcast state is read at the batch's
   planned ``broadcast_versions``. Keyed functions: each sampled key's events of EVERY
   batch from the first, through one keyed harness, batch by batch as the runtime runs
   them: the broadcast versions the batch planned (their changes applied with keyed
   effects), the batch's processing time (its plan time, as the runtime uses it), its
   events key by key in event-time and ``order_columns`` order, then timers at the batch's
   watermark (max(previous, the batch's max event time - the runtime's delay)), then TTL
   cleanup;
3. **compare** per (batch, row key): the recomputed rows with the rows the batch wrote
   (both ways: a row missing, changed or extra), and with the table's current rows of the
   key (a row changed or deleted since). ``_state_version`` is compared too.

Any mismatch fails the check (ERROR) naming table, batch, row key and column. A pipeline
without a committed batch passes: nothing to recompute. When the output cannot be tied
to events (no shared column; a keyed output without the key columns) the check fails
with WARN severity saying so. Cost: a few Spark jobs per sampled batch (a keyed pipeline:
two per batch of its history); it runs when asked or after a run's materializations,
never per batch.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import reduce
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa
from dagster import (
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    MetadataValue,
    asset_check,
)

from dagster_lakecast.handle import PipelineHandle
from dagster_lakecast.recompute_rows import (
    Mismatch,
    Row,
    compare_current,
    compare_group,
    describe_key,
)
from dagster_lakecast.resources import LakecastSparkResource, LakeResource
from lakecast.api.element import CHANGE_TYPE, BroadcastElement
from lakecast.api.keyed import KeyedBroadcastProcessFunction
from lakecast.config import Settings
from lakecast.delta import io as delta_io
from lakecast.delta.source import read_broadcast_elements
from lakecast.pipeline.micro_batch import MicroBatchPipeline
from lakecast.pipeline.progress import MAIN_COUNT, BatchCommit, BatchPlan
from lakecast.replay.batches import batch_input, history
from lakecast.runtime.executor import VERSION_COLUMN, OutputLayout, version_json
from lakecast.runtime.harness import BroadcastTestHarness
from lakecast.runtime.keyed_harness import KeyedBroadcastTestHarness

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["CHECK_NAME", "RECOMPUTE_BATCHES", "Recomputation", "recompute_check",
           "recompute_sample"]

CHECK_NAME = "output_sample_recomputed"
#: the sample is drawn from the newest this many committed batches that wrote main output
RECOMPUTE_BATCHES = 3
SEED = 17
#: mismatches listed in the metadata (the description names the first few)
MAX_LISTED = 10
ROW_KEY, BATCH = "_recompute_key", "_recompute_batch"
Done = list[tuple[BatchPlan, BatchCommit]]


@dataclass(frozen=True)
class Recomputation:
    """The check's verdict: passed, a description, metadata, severity of a failure."""

    passed: bool
    description: str
    metadata: dict[str, Any] = field(default_factory=dict)
    severity: AssetCheckSeverity = AssetCheckSeverity.ERROR
    mismatches: tuple[Mismatch, ...] = ()


def key_json(columns: Sequence[str]) -> Column:
    """The row key as Spark computes it everywhere here: JSON of the key columns."""
    from pyspark.sql import functions as F

    return F.to_json(F.struct(*columns))


def row_key_columns(pipe: PipelineHandle, function: Any, output: DataFrame,
                    events: DataFrame) -> tuple[list[str], str | None]:
    """The row key columns of the output (see the module docstring), or why there are none."""
    table = pipe.decl.output_table
    if isinstance(function, KeyedBroadcastProcessFunction):
        columns = list(function.key_columns())
        missing = [c for c in columns if c not in output.columns]
        if missing:
            return [], (f"cannot recompute {table}: its rows lack the key column(s) {missing} "
                        f"of {pipe.name}'s keyed function, so a row's key is unknown; add "
                        f"them to the function's output schema")
        return columns, None
    types = {f.name: f.dataType for f in events.schema.fields}
    columns = [f.name for f in output.schema.fields
               if f.name != VERSION_COLUMN and types.get(f.name) == f.dataType]
    if not columns:
        return [], (f"cannot recompute {table}: no column has the name and type of a column "
                    f"of {pipe.decl.events_table}, so a row cannot be tied to its events; carry "
                    f"the event's id into the output")
    return columns, None


def batch_commit_files(path: str, app_id: str, batch_id: int, before: int, end: int,
                       spark: SparkSession) -> tuple[int, list[str], bool]:
    """The version in ``(before, end]`` whose commit carries the batch's ``txn``
    (``app_id``, ``batch_id``), the file names it added, and whether they all still exist
    (a local table: VACUUM may have removed them after an OPTIMIZE)."""
    for version in range(before + 1, end + 1):
        actions = delta_io.commit_actions(path, version, spark)
        if any(a.get("txn", {}).get("appId") == app_id
               and int(a["txn"]["version"]) == batch_id for a in actions if "txn" in a):
            added = [unquote(a["add"]["path"]) for a in actions
                     if "add" in a and a["add"].get("dataChange", True)]
            there = "://" in path or all(os.path.exists(os.path.join(path, f)) for f in added)
            return version, [f.rsplit("/", 1)[-1] for f in added], there
    raise delta_io.DeltaIOError(
        f"{path}: no commit in versions {before + 1}..{end} carries txn {app_id}/{batch_id} "
        f"(the batch's write); was the table rewritten? Rewind or reset the pipeline")


def written_rows(spark: SparkSession, pipe: PipelineHandle, settings: Settings,
                 done: Done, batches: int, key: Sequence[str]
                 ) -> tuple[DataFrame | None, Done, list[int]]:
    """The main output rows the newest ``batches`` batches that wrote main output wrote
    (time travel to the batch's commit, the files it added), with the batch id and the row
    key; those batches (oldest first); and the newer batches skipped because their files
    are gone. At most ``3 * batches`` batches are looked at."""
    from pyspark.sql import functions as F

    table, path = pipe.decl.output_table, settings.table_path(pipe.decl.output_table)
    before_of = {p.batch_id: done[i - 1][1].output_versions.get(table, -1) if i else -1
                 for i, (p, _) in enumerate(done)}
    wrote = [(p, c) for p, c in done if int(c.counts.get(MAIN_COUNT, 0)) > 0]
    frames, chosen, skipped = [], [], []
    for plan, commit in reversed(wrote[-3 * batches:]):
        version, names, there = batch_commit_files(
            path, f"{pipe.name}:main", plan.batch_id, before_of[plan.batch_id],
            commit.output_versions.get(table, -1), spark)
        if not there:
            skipped.append(plan.batch_id)
            continue
        frames.append(delta_io.read(spark, path, version=version)
                      .where(F.col("_metadata.file_name").isin(names))
                      .withColumn(BATCH, F.lit(plan.batch_id)))
        chosen.insert(0, (plan, commit))
        if len(chosen) == batches:
            break
    if not frames:
        return None, [], skipped
    union = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)
    return union.withColumn(ROW_KEY, key_json(key)), chosen, skipped


def table_schemas(elements: Sequence[BroadcastElement]) -> dict[str, pa.Schema]:
    """Each broadcast table's schema as the runtime binds it (without ``_change_type``)."""
    out = {}
    for e in elements:
        schema = e.schema
        if CHANGE_TYPE in schema.names:
            schema = schema.remove(schema.get_field_index(CHANGE_TYPE))
        out.setdefault(e.table, schema)
    return out


def conform(rows: list[Row], function: Any, events: pa.Schema, versions: Mapping[str, int],
            target: pa.Schema) -> list[Row]:
    """Harness output rows as the runtime writes them (the function's output schema, the
    lineage column), cast to the output table's types."""
    main = OutputLayout.of(function, events, lineage=False).main
    t = pa.Table.from_pylist(rows, schema=main)
    t = t.append_column(VERSION_COLUMN, pa.array([version_json(versions)] * t.num_rows,
                                                 pa.string()))
    columns = []
    for f in target:
        if f.name not in t.column_names:
            columns.append(pa.nulls(t.num_rows, f.type))
            continue
        col = t.column(f.name)
        try:
            columns.append(col.cast(f.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            columns.append(col)
    return pa.Table.from_arrays(columns, names=target.names).to_pylist()


def _by(t: pa.Table, column: str) -> dict[Any, pa.Table]:
    """Rows of ``t`` per value of ``column`` (the column dropped), in first-seen order."""
    import pyarrow.compute as pc

    body = t.drop_columns([column])
    return {v: body.filter(pc.equal(t.column(column), v))
            for v in dict.fromkeys(t.column(column).to_pylist())}


def broadcast_expected(spark: SparkSession, pipe: PipelineHandle,
                       pipeline: MicroBatchPipeline, done: Done, chosen: Done,
                       keys: list[str], key: Sequence[str], target: pa.Schema
                       ) -> dict[tuple[int, str], list[Row]]:
    """Recomputed rows per (batch, row key) of a broadcast function."""
    from pyspark.sql import functions as F

    tables = {t: pipeline.table_path(t) for t in pipe.decl.broadcast_tables}
    prev = {p.batch_id: done[i - 1][1] if i else None for i, (p, _) in enumerate(done)}
    out: dict[tuple[int, str], list[Row]] = {}
    for plan, _ in chosen:
        valid, _ = batch_input(pipeline, plan, prev[plan.batch_id])
        events = valid.withColumn(ROW_KEY, key_json(key)).where(F.col(ROW_KEY).isin(keys))
        arrow = events.toArrow()
        if not arrow.num_rows:
            continue
        elements = read_broadcast_elements(spark, tables, {}, plan.broadcast_versions)
        function = pipe.decl.function()
        h = BroadcastTestHarness(function, tables=sorted(tables),
                                 table_schemas=table_schemas(elements),
                                 timestamp_column=pipe.decl.timestamp_column)
        h.process_broadcast_elements(elements)
        for k, rows in _by(arrow, ROW_KEY).items():
            got = h.process_batch(rows)
            out[(plan.batch_id, k)] = conform(got, function, rows.schema,
                                              plan.broadcast_versions, target)
    return out


def _sort_value(v: Any) -> tuple[bool, Any]:
    return (v is not None, v)


#: batches whose inputs one Spark job reads (a union) in a keyed replay
CHUNK = 25


def keyed_inputs(pipeline: MicroBatchPipeline, batches: Done, keys: list[str],
                 key: Sequence[str], tcol: str | None
                 ) -> tuple[dict[int, dict[str, pa.Table]], dict[int, int | None], pa.Schema]:
    """Per batch: its valid events of the sampled keys (per row key) and the largest event
    time of ALL its valid events (the watermark's input); and the events' Arrow schema.
    Read :data:`CHUNK` batches per Spark job."""
    from pyspark.sql import functions as F

    rows: dict[int, dict[str, pa.Table]] = {}
    tops: dict[int, int | None] = {}
    schema: pa.Schema | None = None
    frames: list[DataFrame] = []
    aggs: list[DataFrame] = []

    def flush() -> None:
        nonlocal schema
        t = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames).toArrow()
        schema = t.drop_columns([BATCH, ROW_KEY]).schema
        rows.update({b: _by(part, ROW_KEY) for b, part in _by(t, BATCH).items()})
        if aggs:
            tops.update({r[0]: r[1] for r in reduce(lambda a, b: a.union(b), aggs).collect()})
        frames.clear()
        aggs.clear()

    prev: BatchCommit | None = None
    for plan, commit in batches:
        valid, _ = batch_input(pipeline, plan, prev)
        prev = commit
        frames.append(valid.withColumn(ROW_KEY, key_json(key)).where(F.col(ROW_KEY).isin(keys))
                      .withColumn(BATCH, F.lit(plan.batch_id)))
        if tcol is not None:
            ts = F.col(tcol)
            if dict(valid.dtypes)[tcol].startswith("timestamp"):
                ts = F.unix_millis(ts)
            aggs.append(valid.agg(F.max(ts).cast("long").alias("top"))
                        .select(F.lit(plan.batch_id).alias("b"), "top"))
        if len(frames) == CHUNK:
            flush()
    if frames:
        flush()
    assert schema is not None
    return rows, tops, schema


def keyed_expected(spark: SparkSession, pipe: PipelineHandle,
                   pipeline: MicroBatchPipeline, done: Done, chosen: Done,
                   keys: list[str], key: Sequence[str], target: pa.Schema
                   ) -> tuple[dict[tuple[int, str], list[Row]], dict[str, Any]]:
    """Recomputed rows per (batch, row key) of a keyed function: every sampled key's
    events replayed from the first batch (see the module docstring); and what each
    replayed batch used (processing time, watermark, versions)."""
    tables = {t: pipeline.table_path(t) for t in pipe.decl.broadcast_tables}
    function = pipe.decl.function()
    h = KeyedBroadcastTestHarness(function, tables=sorted(tables),
                                  timestamp_column=pipe.decl.timestamp_column)
    delay = int(getattr(pipeline.runtime, "watermark_delay_ms", 0) or 0)
    tcol, order = pipe.decl.timestamp_column, list(pipe.decl.order_columns)
    wanted = {p.batch_id for p, _ in chosen}
    replayed = [(p, c) for p, c in done if p.batch_id <= max(wanted)]
    inputs, tops, schema = keyed_inputs(pipeline, replayed, keys, key, tcol)
    applied: dict[str, int] = {}
    schemas: dict[str, pa.Schema] = {}
    watermark: int | None = None
    owner = {tuple(json.loads(k).get(c) for c in key): k for k in keys}
    out: dict[tuple[int, str], list[Row]] = {}
    used: dict[str, Any] = {}
    for plan, _ in replayed:
        target_versions = dict(plan.broadcast_versions)
        elements = (read_broadcast_elements(spark, tables, applied, target_versions)
                    if target_versions != applied else [])
        if elements:
            schemas.update(table_schemas(elements))
            function.bind_tables(schemas)
        applied = target_versions
        h.executor.processing_time = plan.planned_at_ms  # the runtime's clock for the batch
        got = h.process_broadcast_elements(elements)
        events = inputs.get(plan.batch_id, {})
        for k in sorted(events):
            rows = sorted(events[k].to_pylist(), key=lambda r: tuple(
                _sort_value(r.get(c)) for c in ([tcol] if tcol else []) + order))
            got += h.process_elements(rows)
        top = tops.get(plan.batch_id)
        if top is not None:
            batch_wm = int(top) - delay
            watermark = batch_wm if watermark is None else max(watermark, batch_wm)
        got += (h.advance_watermark(watermark) if watermark is not None
                else h.set_processing_time(plan.planned_at_ms))
        h.expire()
        if plan.batch_id not in wanted:
            continue
        used[str(plan.batch_id)] = {"processing_time": plan.planned_at_ms,
                                    "watermark": watermark, "versions": target_versions}
        for row in conform(got, function, schema, target_versions, target):
            k = owner.get(tuple(row.get(c) for c in key))
            if k is not None:
                out.setdefault((plan.batch_id, k), []).append(row)
    return out, used


def _group(t: pa.Table, by_batch: bool) -> dict[Any, list[Row]]:
    out: dict[Any, list[Row]] = {}
    drop = [c for c in (ROW_KEY, BATCH) if c in t.column_names]
    for row, body in zip(t.select(drop).to_pylist(), t.drop_columns(drop).to_pylist(),
                         strict=True):
        k = (row[BATCH], row[ROW_KEY]) if by_batch else row[ROW_KEY]
        out.setdefault(k, []).append(body)
    return out


def recompute_sample(pipe: PipelineHandle, spark: SparkSession, settings: Settings, *,
                     sample: int | None = None, batches: int = RECOMPUTE_BATCHES,
                     seed: int = SEED) -> Recomputation:
    """Recompute a sample of ``pipe``'s main output (see the module docstring)."""
    from pyspark.sql import functions as F

    t0 = time.perf_counter()
    table = pipe.decl.output_table
    bound = pipe.decl.dagster.recompute_sample if sample is None else sample
    meta: dict[str, Any] = {"rows_sampled": 0, "rows_matched": 0, "mismatch_count": 0,
                            "batches_covered": MetadataValue.json([]), "sample_bound": bound,
                            "seed": seed}
    pipeline = pipe.decl.build(spark, settings)
    done = history(pipeline)
    if not done:
        return Recomputation(True, f"{pipe.name} has no committed batch yet: nothing to "
                             f"recompute in {table}", meta)
    if not any(int(c.counts.get(MAIN_COUNT, 0)) for _, c in done) or bound <= 0:
        return Recomputation(True, f"no committed batch of {pipe.name} wrote rows to {table}: "
                             "nothing to recompute", meta)
    function = pipe.decl.function()
    current = delta_io.read(spark, settings.table_path(table))
    events = delta_io.read(spark, settings.table_path(pipe.decl.events_table))
    key, why = row_key_columns(pipe, function, current, events)
    if why is not None:
        return Recomputation(False, why, meta, AssetCheckSeverity.WARN)
    written, chosen, skipped = written_rows(spark, pipe, settings, done, batches, key)
    meta["batches_skipped"] = MetadataValue.json(skipped)
    if written is None:
        return Recomputation(False, f"cannot read the rows the newest batches {skipped} of "
                             f"{pipe.name} wrote to {table}: their files are gone (VACUUM "
                             "after OPTIMIZE); run the check after the next batch",
                             meta, AssetCheckSeverity.WARN)
    body = [c for c in written.columns if c not in (ROW_KEY, BATCH)]
    sampled = (written.orderBy(F.xxhash64(F.lit(seed), F.to_json(F.struct(*body))), BATCH)
               .limit(bound).select(ROW_KEY).toArrow())
    keys = sorted(set(sampled.column(ROW_KEY).to_pylist()))
    mine = written.where(F.col(ROW_KEY).isin(keys)).toArrow()
    target = mine.drop_columns([ROW_KEY, BATCH]).schema
    now = current.withColumn(ROW_KEY, key_json(key)).where(F.col(ROW_KEY).isin(keys)).toArrow()
    if isinstance(function, KeyedBroadcastProcessFunction):
        expected, used = keyed_expected(spark, pipe, pipeline, done, chosen, keys, key, target)
    else:
        expected = broadcast_expected(spark, pipe, pipeline, done, chosen, keys, key, target)
        used = {str(p.batch_id): {"versions": p.broadcast_versions} for p, _ in chosen}
    wrote, held = _group(mine, by_batch=True), _group(now, by_batch=False)
    columns = target.names
    mismatches: list[Mismatch] = []
    matched = 0
    for b, k in sorted(set(wrote) | set(expected)):
        mismatches += compare_group(table, b, describe_key(key, json.loads(k)),
                                    expected.get((b, k), []), wrote.get((b, k), []),
                                    columns)[1]
    for k in keys:
        rows = [(b, r) for (b, kk), rs in sorted(expected.items()) if kk == k for r in rs]
        found, bad = compare_current(table, describe_key(key, json.loads(k)), rows,
                                     held.get(k, []), columns)
        matched += found
        mismatches += bad
    meta.update({
        "rows_sampled": sampled.num_rows, "keys_sampled": len(keys),
        "rows_compared": mine.num_rows, "rows_recomputed": sum(map(len, expected.values())),
        "rows_matched": matched, "mismatch_count": len(mismatches),
        "mismatches": MetadataValue.json([m.as_dict() for m in mismatches[:MAX_LISTED]]),
        "batches_covered": MetadataValue.json([p.batch_id for p, _ in chosen]),
        "versions_used": MetadataValue.json(used), "row_key": MetadataValue.json(key),
        "batches_replayed": (len([p for p, _ in done if p.batch_id <= chosen[-1][0].batch_id])
                             if isinstance(function, KeyedBroadcastProcessFunction)
                             else len(chosen)),
        "seconds": round(time.perf_counter() - t0, 2),
    })
    ids = [p.batch_id for p, _ in chosen]
    if mismatches:
        shown = "; ".join(m.describe() for m in mismatches[:3])
        more = f" (and {len(mismatches) - 3} more)" if len(mismatches) > 3 else ""
        return Recomputation(False, f"{len(mismatches)} mismatch(es) recomputing "
                             f"{sampled.num_rows} sampled row(s) of {table} (batches {ids}): "
                             f"{shown}{more}", meta, mismatches=tuple(mismatches))
    return Recomputation(True, f"{mine.num_rows} row(s) of {table} ({len(keys)} row key(s) "
                         f"sampled from batches {ids}) recompute exactly from "
                         f"{pipe.decl.events_table} and {', '.join(pipe.decl.broadcast_tables)} at "
                         "their batches' versions", meta)


def recompute_check(pipe: PipelineHandle) -> AssetChecksDefinition:
    """The ``output_sample_recomputed`` check on ``pipe``'s main output."""

    @asset_check(
        asset=pipe.asset_key(pipe.decl.output_table),
        name=CHECK_NAME,
        description=f"Up to {pipe.decl.dagster.recompute_sample} rows of "
        f"{pipe.decl.output_table} from the "
        f"newest {RECOMPUTE_BATCHES} batches recomputed from {pipe.decl.events_table} and the "
        "broadcast tables at the versions their batch applied, column by column.",
    )
    def check_recomputed(pyspark: LakecastSparkResource, lake: LakeResource
                         ) -> AssetCheckResult:
        r = recompute_sample(pipe, pyspark.session_for(pipe.name), lake.settings())
        return AssetCheckResult(passed=r.passed, severity=r.severity, metadata=r.metadata,
                                description=r.description)

    return check_recomputed
