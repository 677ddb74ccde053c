"""Checkpoint and restore task-local broadcast state: :class:`SnapshottingRuntime`.

A :class:`~lakecast.runtime.BroadcastRuntime` whose

* :meth:`SnapshottingRuntime.checkpoint` runs a Spark job over ``p`` tasks where each task
  serializes ITS task-local state (the worker cache the batch just used, or built from
  the same chain), hashes it, and reports a manifest row per state; the driver fails the
  checkpoint when tasks disagree (:class:`~lakecast.snapshots.CheckpointDivergenceError`),
  then a second job writes each distinct content once, and the header, manifest and
  content rows commit together (one Delta version);
* cold start (``_base_elements``, the engine's documented hook) restores from the newest
  complete checkpoint at or before the needed state version instead of reading the full
  tables, redistributing task states as Flink does (new task ``i`` reads old task
  ``i mod p_old``), then catches up with the Delta increments since the checkpoint.

Restored state enters the chain as :class:`SnapshotElement` s (one per broadcast table,
carrying the table's checkpointed version); :class:`SnapshotAware` wraps the user's
function so that applying them loads the states directly — never through the user's
``process_broadcast_element``.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakecast.api import BroadcastProcessFunction, Context, MapStateDescriptor, ReadOnlyContext
from lakecast.progress import BatchPlan, ProgressLog
from lakecast.runtime import BroadcastRuntime, TaskPlan, _acquire
from lakecast.snapshots import (
    ENTRY,
    CheckpointDivergenceError,
    CheckpointHeader,
    ManifestRow,
    RestoredCheckpoint,
    SerializedState,
    SnapshotError,
    SnapshotStore,
    load_into,
    now_ms,
    schema_from_b64,
    schema_to_b64,
    serialize_state,
)
from lakecast.source import BroadcastElement

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakecast.config import Settings

log = logging.getLogger(__name__)


# ============================================================================ restore element
@dataclass(frozen=True, eq=False)
class SnapshotElement(BroadcastElement):
    """A broadcast element standing for "table ``table`` at ``version``, restored from a
    checkpoint". ``rows`` is empty (with the table's schema); the first element of a
    restore carries every state's content in ``contents``."""

    contents: Mapping[str, tuple[str, Any]] | None = None
    checkpoint_id: int = -1
    entries: int = 0
    content_bytes: int = 0

    @property
    def num_rows(self) -> int:
        return self.entries

    @property
    def nbytes(self) -> int:
        return self.content_bytes


class SnapshotAware(BroadcastProcessFunction):
    """Wraps a function so that :class:`SnapshotElement` s load checkpointed state; every
    other call is delegated to the wrapped function unchanged."""

    def __init__(self, inner: BroadcastProcessFunction) -> None:
        self.inner = inner

    # delegation -------------------------------------------------------------------------
    @property
    def missing_state(self) -> Any:  # type: ignore[override]
        return self.inner.missing_state

    @property
    def batch_format(self) -> Any:  # type: ignore[override]
        return self.inner.batch_format

    def is_vectorized(self) -> bool:  # type: ignore[override]
        return self.inner.is_vectorized()

    def state_descriptors(self) -> Sequence[MapStateDescriptor]:
        return self.inner.state_descriptors()

    def output_tags(self) -> Sequence[Any]:
        return self.inner.output_tags()

    def side_output_tags(self) -> list[Any]:
        return self.inner.side_output_tags()

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        return self.inner.output_schema(input_schema)

    def bind_tables(self, schemas: Mapping[str, pa.Schema]) -> None:
        self.inner.bind_tables(schemas)

    def open(self) -> None:
        self.inner.open()

    def process_element(self, value: Any, ctx: ReadOnlyContext) -> Iterable[Any] | None:
        return self.inner.process_element(value, ctx)

    def process_batch(self, batch: Any, ctx: ReadOnlyContext) -> Any:
        return self.inner.process_batch(batch, ctx)

    def process_broadcast_element(self, value: Any, ctx: Context) -> Iterable[Any] | None:
        if isinstance(value, SnapshotElement):
            if value.contents is not None:
                declared = {d.name: d for d in self.inner.state_descriptors()}
                for name, (kind, content) in value.contents.items():
                    load_into(ctx.get_broadcast_state(declared[name]), kind, content)
            return None
        return self.inner.process_broadcast_element(value, ctx)


def declared_states(function: BroadcastProcessFunction) -> dict[str, dict[str, Any]]:
    """``{state: {"kind", "key_columns"}}`` of a function (stored in every checkpoint)."""
    return {d.name: {"kind": "table" if d.table_shaped else "dict",
                     "key_columns": list(d.key_columns)}
            for d in function.state_descriptors()}


# ============================================================================ task side
#: per worker: (function id, chain key, id(store)) -> serialized states (reused by the
#: content job when it lands on the same worker)
_SERIALIZED: OrderedDict[tuple[str, str, int], dict[str, SerializedState]] = OrderedDict()

MANIFEST_SCHEMA = (
    "task INT, state STRING, content_hash STRING, n_entries LONG, bytes LONG, "
    "schema STRING, pid INT, cache STRING, state_bytes LONG"
)


def _serialized(plan: TaskPlan) -> tuple[dict[str, SerializedState], str]:
    ex, status, _, _ = _acquire(plan)
    key = (plan.function_id, plan.chain[-1].to_key if plan.chain else "", id(ex.store))
    cached = _SERIALIZED.get(key)
    if cached is None:
        cached = {name: serialize_state(name, st) for name, st in ex.store.states.items()}
        _SERIALIZED[key] = cached
        while len(_SERIALIZED) > 1:
            _SERIALIZED.popitem(last=False)
    return cached, status


def _task_index(batches: Iterator[pa.RecordBatch]) -> int | None:
    for b in batches:
        if b.num_rows:
            return int(b.column(0)[0].as_py())
    return None


def manifest_task(plan: TaskPlan) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow body of the manifest job: this task's hash per state."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = _task_index(batches)
        if task is None:
            return
        from lakecast.runtime import _CACHE

        states, status = _serialized(plan)
        entry = _CACHE.get(plan.function_id)
        nbytes = entry.executor.store.nbytes() if entry is not None else 0
        rows = [{"task": task, "state": s.name, "content_hash": s.digest,
                 "n_entries": s.n_entries, "bytes": s.nbytes, "schema": s.schema_b64,
                 "pid": os.getpid(), "cache": status, "state_bytes": nbytes}
                for s in states.values()]
        yield pa.RecordBatch.from_pylist(rows, schema=pa.schema([
            ("task", pa.int32()), ("state", pa.string()), ("content_hash", pa.string()),
            ("n_entries", pa.int64()), ("bytes", pa.int64()), ("schema", pa.string()),
            ("pid", pa.int32()), ("cache", pa.string()), ("state_bytes", pa.int64())]))

    return run


ENTRY_ARROW = pa.schema([
    ("checkpoint_id", pa.int64()), ("kind", pa.string()), ("task", pa.int32()),
    ("state", pa.string()), ("seq", pa.int64()), ("key", pa.string()), ("value", pa.binary()),
    ("content_hash", pa.string()), ("n_entries", pa.int64()), ("meta", pa.string()),
    ("created_at_ms", pa.int64()),
])


def content_task(plan: TaskPlan, checkpoint_id: int, writers: Mapping[str, tuple[int, str]],
                 created_at_ms: int, chunk: int = 100_000
                 ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow body of the content job: the writer task of each distinct content emits
    its entries (after checking its state still has the manifest's hash)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = _task_index(batches)
        mine = [s for s, (t, _) in writers.items() if t == task]
        if task is None or not mine:
            return
        states, _ = _serialized(plan)
        for name in mine:
            s = states[name]
            want = writers[name][1]
            if s.digest != want:
                raise CheckpointDivergenceError(name, {want: [task], s.digest: [task]},
                                                checkpoint_id)
            for lo in range(0, max(s.n_entries, 0), chunk):
                hi = min(lo + chunk, s.n_entries)
                n = hi - lo
                yield pa.RecordBatch.from_arrays([
                    pa.array([checkpoint_id] * n, pa.int64()), pa.array([ENTRY] * n),
                    pa.nulls(n, pa.int32()), pa.array([name] * n),
                    pa.array(range(lo, hi), pa.int64()), pa.array(s.keys[lo:hi], pa.string()),
                    pa.array(s.values[lo:hi], pa.binary()), pa.array([s.digest] * n),
                    pa.nulls(n, pa.int64()), pa.nulls(n, pa.string()),
                    pa.array([created_at_ms] * n, pa.int64()),
                ], schema=ENTRY_ARROW)

    return run


# ============================================================================ driver side
@dataclass
class CheckpointResult:
    """What one checkpoint wrote."""

    header: CheckpointHeader
    manifest: list[ManifestRow]
    delta_version: int
    stored_bytes: int  # bytes of the files the checkpoint's commit added
    state_bytes: int  # serialized bytes of one task's state (all states)
    distinct_contents: int
    pids: list[int] = field(default_factory=list)

    @property
    def flink_bytes(self) -> int:
        """What one copy per task would cost: p x state size."""
        return self.header.parallelism * self.state_bytes


class SnapshottingRuntime(BroadcastRuntime):
    """A :class:`BroadcastRuntime` that checkpoints its task states to a
    :class:`~lakecast.snapshots.SnapshotStore` and restores from it on cold start.

    ``parallelism``: tasks per run (the events are repartitioned by the caller) and of
    each checkpoint. ``restore``: restore from checkpoints on cold start (``False``: build
    from the full tables). ``eligible``: which checkpoint ids belong to the current
    lineage (after a rewind, checkpoints of abandoned batches do not).
    """

    def __init__(
        self,
        spark: SparkSession,
        function: BroadcastProcessFunction,
        tables: Mapping[str, str],
        store: SnapshotStore,
        *,
        parallelism: int | None = None,
        restore: bool = True,
        function_id: str | None = None,
        **options: Any,
    ) -> None:
        self.user_function = function
        fid = function_id or f"{type(function).__qualname__}-{uuid.uuid4().hex[:12]}"
        super().__init__(spark, SnapshotAware(function), tables, function_id=fid, **options)
        self.store = store
        self.parallelism = parallelism
        self.restore = restore
        self.eligible: Callable[[int], bool] | None = None
        self.restore_checkpoint_id: int | None = None  # pin the next cold start to this one
        self.restored: RestoredCheckpoint | None = None  # what the last cold start used
        self._restoring = False

    @property
    def task_parallelism(self) -> int:
        return self.parallelism or self.spark.sparkContext.defaultParallelism

    # -- restore -----------------------------------------------------------------------
    def request_restore(self, checkpoint_id: int) -> None:
        """Make the next run restore from ``checkpoint_id`` (state at that checkpoint),
        in fresh task caches."""
        self.close()
        self.version = {}
        self.restore_checkpoint_id = checkpoint_id
        base = self.function_id.split("~")[0]
        self.function_id = f"{base}~r{checkpoint_id}-{uuid.uuid4().hex[:6]}"

    def _base_elements(self, until: Mapping[str, int] | None) -> list[BroadcastElement]:
        if self._chain or not self.restore:  # a rebase, or restore disabled
            return super()._base_elements(until)
        pinned = self.restore_checkpoint_id
        restored = self.store.resolve(
            pinned, max_versions=until, eligible=self.eligible,
            parallelism=self.task_parallelism, states=declared_states(self.user_function),
        ) if self.store.exists() else None
        if pinned is not None and (restored is None or restored.header.checkpoint_id != pinned):
            why = "; ".join(restored.skipped) if restored else "no complete checkpoint"
            if restored is None:
                raise SnapshotError(f"cannot restore checkpoint {pinned}: {why}")
            log.warning("checkpoint %s unusable, restored %s instead: %s", pinned,
                        restored.header.checkpoint_id, why)
        self.restored = restored
        self.restore_checkpoint_id = None  # the pin applies to one cold start
        if restored is None:
            return super()._base_elements(until)
        self._restoring = True
        h = restored.header
        log.info("restoring broadcast state from checkpoint %d (state %s, p %d -> %d)",
                 h.checkpoint_id, h.state_version, h.parallelism, self.task_parallelism)
        out: list[BroadcastElement] = []
        nbytes = sum(getattr(c, "nbytes", 0) for _, c in restored.contents.values())
        for i, (table, version) in enumerate(sorted(h.state_version.items())):
            schema = (schema_from_b64(h.table_schemas[table]) if table in h.table_schemas
                      else self._table_schema(table, version))
            out.append(SnapshotElement(
                table, version, 0, "full", schema.empty_table(),
                reason=f"restored from checkpoint {h.checkpoint_id}",
                contents=restored.contents if i == 0 else None,
                checkpoint_id=h.checkpoint_id,
                entries=restored.n_entries if i == 0 else 0,
                content_bytes=nbytes if i == 0 else 0,
            ))
        return out

    def _table_schema(self, table: str, version: int) -> pa.Schema:
        from lakecast import delta_io

        return delta_io.read(self.spark, self.tables[table], version=version).limit(0).toArrow(
        ).schema

    def refresh(self, until: Mapping[str, int] | None = None) -> list[BroadcastElement]:
        new = super().refresh(until)
        if self._restoring:  # the base is the checkpoint: catch up to ``until``
            self._restoring = False
            new = new + super().refresh(until)
        return new

    # -- checkpoint --------------------------------------------------------------------
    def task_plan(self) -> TaskPlan:
        if not self._chain:
            raise SnapshotError("nothing to checkpoint: the runtime has not processed a batch")
        return TaskPlan(function_id=self.function_id, function=self.function,
                        tables=tuple(sorted(self.tables)), chain=tuple(self._chain),
                        layout=None)  # type: ignore[arg-type]

    def task_manifest(self, parallelism: int | None = None) -> list[ManifestRow]:
        """Each of ``p`` tasks hashes its task-local state (one Spark job, no write)."""
        p = parallelism or self.task_parallelism
        plan = self.task_plan()
        rows = (self.spark.range(0, p, 1, p)
                .mapInArrow(manifest_task(plan), MANIFEST_SCHEMA).collect())
        return sorted((ManifestRow(r["task"], r["state"], r["content_hash"], r["n_entries"],
                                   {"bytes": r["bytes"], "schema": r["schema"], "pid": r["pid"],
                                    "cache": r["cache"], "state_bytes": r["state_bytes"]})
                       for r in rows), key=lambda m: (m.task, m.state))

    def checkpoint(
        self,
        checkpoint_id: int,
        *,
        batch_id: int,
        events_start: int,
        events_end: int,
        parallelism: int | None = None,
    ) -> CheckpointResult:
        """Checkpoint every task's broadcast state (see the module doc); one Delta commit."""
        from lakecast import delta_io

        p = parallelism or self.task_parallelism
        manifest = self.task_manifest(p)
        states = declared_states(self.user_function)
        got = {(m.task, m.state) for m in manifest}
        missing = [(t, s) for t in range(p) for s in states if (t, s) not in got]
        if missing:
            raise SnapshotError(f"checkpoint {checkpoint_id}: tasks did not report {missing}")
        writers: dict[str, tuple[int, str]] = {}
        for s in states:
            by_hash: dict[str, list[int]] = {}
            for m in manifest:
                if m.state == s:
                    by_hash.setdefault(m.content_hash, []).append(m.task)
            if len(by_hash) > 1:
                raise CheckpointDivergenceError(s, by_hash, checkpoint_id)
            (digest, tasks), = by_hash.items()
            writers[s] = (min(tasks), digest)
        created = now_ms()
        header = CheckpointHeader(
            checkpoint_id=checkpoint_id, pipeline=self.store.pipeline, batch_id=batch_id,
            events_start=events_start, events_end=events_end,
            state_version=dict(self.version), parallelism=p, states=states,
            table_schemas={t: schema_to_b64(s) for t, s in self._schemas.items()},
            function=f"{type(self.user_function).__module__}."
                     f"{type(self.user_function).__qualname__}",
            created_at_ms=created,
        )
        content = (self.spark.range(0, p, 1, p)
                   .mapInArrow(content_task(self.task_plan(), checkpoint_id, writers, created),
                               _spark_schema()))
        rows = content.unionByName(self.store.small_rows(header, manifest))
        version = self.store.write(header, rows)
        info = delta_io.commit_info(self.store.path, version, self.spark)
        stored = int(info.metrics.get("numOutputBytes", 0))
        task0 = [m for m in manifest if m.task == 0]
        return CheckpointResult(
            header, manifest, version, stored, sum(int(m.meta["bytes"]) for m in task0),
            len({m.content_hash for m in manifest}), sorted({m.meta["pid"] for m in manifest}),
        )


def _spark_schema() -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(ENTRY_ARROW)


def describe(result: CheckpointResult) -> dict[str, Any]:
    """A JSON-able summary of a checkpoint (logs, Dagster metadata)."""
    h = result.header
    return {
        "checkpoint_id": h.checkpoint_id, "delta_version": result.delta_version,
        "parallelism": h.parallelism, "state_version": json.dumps(h.state_version),
        "stored_bytes": result.stored_bytes, "state_bytes": result.state_bytes,
        "p_x_state_bytes": result.flink_bytes, "distinct_contents": result.distinct_contents,
        "worker_pids": len(result.pids),
    }


# ============================================================================ pipeline glue
def snapshot_path(settings: Settings, pipeline: str) -> str:
    """Where a pipeline's snapshot table lives (next to its progress log)."""
    return settings.checkpoint_path(f"{pipeline}/snapshots")


def progress_path(settings: Settings, pipeline: str) -> str:
    return settings.checkpoint_path(f"{pipeline}/progress")


class Checkpointer:
    """The pipeline's ``on_commit`` / ``on_rewind``: checkpoint every ``every`` committed
    batches, keep the newest ``keep`` checkpoints (never the one in use), and pin the
    runtime to a rewind's checkpoint."""

    def __init__(self, runtime: SnapshottingRuntime, log: ProgressLog, every: int = 1,
                 keep: int | None = 10) -> None:
        if every < 1:
            raise SnapshotError(f"checkpoint every must be >= 1, got {every}")
        self.runtime = runtime
        self.log = log
        self.every = every
        self.keep = keep
        self.results: list[CheckpointResult] = []
        self.removed: list[int] = []
        self._last: int | None = None
        self.sync()

    def sync(self) -> None:
        """Checkpoints of batches abandoned by rewinds are not restorable."""
        abandoned = self.log.abandoned()
        self.runtime.eligible = lambda cid: cid not in abandoned
        ids = [h.checkpoint_id for h in self.runtime.store.headers() if h.checkpoint_id
               not in abandoned]
        self._last = max(ids) if ids else None

    def in_use(self) -> set[int]:
        used = set()
        if self.runtime.restored is not None:
            used.add(self.runtime.restored.header.checkpoint_id)
        if self.runtime.restore_checkpoint_id is not None:
            used.add(self.runtime.restore_checkpoint_id)
        rewinds = [p for p in self.log.state()[0] if p.is_restore]
        if rewinds and rewinds[-1].restore_of is not None:
            used.add(rewinds[-1].restore_of)
        return used

    def __call__(self, plan: BatchPlan, result: Any) -> None:
        if self._last is not None and plan.batch_id - self._last < self.every:
            return
        cp = self.runtime.checkpoint(
            plan.batch_id, batch_id=plan.batch_id, events_start=plan.events_start,
            events_end=plan.events_end,
        )
        self.results.append(cp)
        self._last = plan.batch_id
        log.info("checkpoint %s", describe(cp))
        if self.keep:
            self.removed += self.runtime.store.retain(self.keep, self.in_use,
                                                      verified=cp.header.checkpoint_id)

    def on_rewind(self, plan: BatchPlan) -> None:
        assert plan.restore_of is not None
        self.runtime.request_restore(plan.restore_of)
        self.sync()


def restore_checkpoint(
    spark: SparkSession,
    settings: Settings,
    pipeline: str,
    checkpoint_id: int | None = None,
    timestamp_ms: int | None = None,
) -> tuple[BatchPlan, RestoredCheckpoint]:
    """Rewind ``pipeline`` to a checkpoint (by id, or the newest created at or before
    ``timestamp_ms``; the newest complete one by default): the checkpoint is validated
    first (an incomplete/corrupt one is skipped for the previous complete one, see
    :attr:`RestoredCheckpoint.skipped`), then outputs of later batches are rolled back.
    The next run restores the state from it and resumes from its offsets."""
    from lakecast.pipeline import rewind

    store = SnapshotStore(spark, snapshot_path(settings, pipeline), pipeline)
    plog = ProgressLog(spark, progress_path(settings, pipeline), pipeline)
    if not store.exists():
        raise SnapshotError(f"pipeline {pipeline!r} has no checkpoints ({store.path})")
    abandoned = plog.abandoned()
    known = store.checkpoint_ids()
    if checkpoint_id is not None and checkpoint_id not in known:
        raise SnapshotError(f"no checkpoint {checkpoint_id} for {pipeline!r} (checkpoints: "
                            f"{known or 'none'})")
    if checkpoint_id is not None and checkpoint_id in abandoned:
        raise SnapshotError(f"checkpoint {checkpoint_id} belongs to batches abandoned by an "
                            "earlier restore; pick one from `lakecast snapshots list`")
    restored = store.resolve(checkpoint_id, timestamp_ms=timestamp_ms,
                             eligible=lambda cid: cid not in abandoned)
    if restored is None:
        what = (f"checkpoint {checkpoint_id}" if checkpoint_id is not None
                else "a checkpoint" if timestamp_ms is None
                else f"a checkpoint created at or before {timestamp_ms} ms")
        raise SnapshotError(f"no complete {what} to restore for {pipeline!r} (see "
                            "`lakecast snapshots list`)")
    h = restored.header
    plan = rewind(spark, plog, settings.table_path, h.batch_id, h.state_version)
    return plan, restored
