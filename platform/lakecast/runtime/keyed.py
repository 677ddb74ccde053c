"""Keyed broadcast processing on Spark, with keyed state versioned in Delta.

:class:`KeyedBroadcastRuntime` runs a :class:`~lakecast.api.keyed.KeyedBroadcastProcessFunction`
over one micro-batch of events at a time:

1. **plan (driver)**: the keyed state of the previous batch (a Delta table version), the
   broadcast state version it has seen ``V_prev``, the target ``V`` (newest, or the
   batch plan's), the new watermark ``max(previous, max event time - delay)`` and the
   batch's processing time (fixed when planned, so a retry computes the same result);
2. **shuffle**: each event gets ``_key_group = pmod(xxhash64(key), key_groups)``; the
   rows of the state table the batch needs (every row of the keys in the batch, of the
   keys with due timers or expiring TTL — or of every key when new broadcast elements may
   ``apply_to_keyed_state``; :mod:`lakecast.runtime.keyed_store`) are unioned with the
   events, hash-partitioned by key group and sorted (state rows first, each key's oldest
   first; then each key's events by time and order columns);
3. **task**: the task-local broadcast state at ``V_prev`` comes from the worker cache of
   :mod:`lakecast.runtime` (warm across batches), is forked, and the elements in
   ``(V_prev, V]`` are applied with keyed effects (``apply_to_keyed_state`` on this task's
   keys, broadcast-side outputs) on each key's newest row; then events key by key, then
   timers, then TTL cleanup; the task emits outputs, one row per changed key, and one
   accounting row;
4. **commit**: :meth:`KeyedBroadcastRuntime.commit` appends the changed keys (tombstones
   for deleted ones) and a ``__meta__`` row (batch id, watermark, ``V``, schemas) to the
   state table in one blind append, and compacts it every ``compact_every`` batches — one
   Delta version per batch, so restoring keyed state to any batch is Delta time travel.

Keyed state lives by key group, not by task: any parallelism reads it (rescaling is
free, nothing duplicated or missing), and the number of key groups is fixed for the life
of the state (like Flink's max parallelism).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa

from lakecast.api.keyed import KeyedBroadcastProcessFunction
from lakecast.api.keyed_state import check_schema, schema_json
from lakecast.delta.source import latest_versions, read_broadcast_elements
from lakecast.pipeline.contract import BaseRuntime
from lakecast.runtime.broadcast import BroadcastRuntime
from lakecast.runtime.engine import KEYED, EngineChoice
from lakecast.runtime.executor import OutputLayout, version_json
from lakecast.runtime.keyed_executor import (
    keyed_descriptors,
)
from lakecast.runtime.keyed_store import DEFAULT_COMPACT_EVERY, KeyedStateStore
from lakecast.runtime.keyed_tasks import (
    BATCH,
    DUE,
    GROUP,
    INTERNAL_SIDES,
    KEY,
    KIND,
    STATE,
    STATE_SCHEMA,
    STATE_SIDE,
    TASK_SCHEMA,
    TASK_SIDE,
    KeyedStateError,
    KeyedTaskPlan,
    StateMeta,
    run_keyed_task,
)
from lakecast.runtime.metrics import (
    DEFAULT_STATE_BUDGET_BYTES,
    RunMetrics,
    TaskMetrics,
    check_budget,
)
from lakecast.runtime.result import BroadcastResult
from lakecast.runtime.tasks import ChainLink, TaskPlan
from lakecast.spark import default_parallelism

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakecast.pipeline.contract import BatchOutput
    from lakecast.pipeline.progress import BatchPlan

log = logging.getLogger(__name__)

# ============================================================================ driver side
@dataclass
class KeyedResult(BroadcastResult):
    """The one-pass output of a keyed batch: main/side outputs as in
    :class:`~lakecast.runtime.result.BroadcastResult`, plus the changed keyed state rows
    (:attr:`state_changes`) and one accounting row per task (:attr:`tasks`)."""

    batch_id: int = -1
    meta: StateMeta = field(default_factory=StateMeta)
    input_state_version: int | None = None

    internal_sides: ClassVar[tuple[str, ...]] = INTERNAL_SIDES

    @property
    def state_changes(self) -> DataFrame:
        return self.side(STATE_SIDE).select(*STATE_SCHEMA.names)

    @property
    def tasks(self) -> DataFrame:
        return self.side(TASK_SIDE).select(*TASK_SCHEMA.names)

    def metrics(self) -> RunMetrics:
        """Per-task metrics from the accounting rows; warns when broadcast state x
        parallelism exceeds the budget."""
        rows = self.task_rows()
        tasks = [TaskMetrics(
            partition=r["task"], pid=r["pid"], function_id="", cache=r["cache"],
            elements_applied=r["broadcast_elements"], rows_applied=0,
            state_version=dict(self.state_version),
            state_bytes=r["broadcast_state_bytes"], rows_in=r["events_in"],
            process_seconds=r["seconds"]) for r in rows]
        m = RunMetrics(state_version=dict(self.state_version), tasks=tasks,
                       budget_bytes=self.budget_bytes, refresh_seconds=self.refresh_seconds,
                       new_elements=len(self.new_elements),
                       new_element_rows=sum(e.num_rows for e in self.new_elements))
        if tasks:
            check_budget(m.state_bytes_per_task, m.parallelism, m.budget_bytes)
        return m

    def keyed_summary(self) -> dict[str, int]:
        """Keyed-state numbers of the batch, summed over tasks (keys held, changed and
        deleted keys, expired entries, timers fired, keyed state bytes)."""
        keys = ("keys_held", "changed_keys", "deleted_keys", "expired_entries",
                "timers_fired", "state_bytes", "events_in")
        return {k: sum(int(r[k]) for r in self.task_rows()) for k in keys}

    def summary(self) -> dict[str, int]:
        """Keyed counts of the batch for the pipeline: changed keys, timers fired."""
        keyed = self.keyed_summary()
        return {"changed_keys": keyed["changed_keys"], "timers_fired": keyed["timers_fired"]}


class KeyedBroadcastRuntime(BaseRuntime):
    """Runs a keyed broadcast function over micro-batches, keyed state in Delta at
    ``state_path`` (a changelog compacted every ``compact_every`` batches,
    :mod:`lakecast.runtime.keyed_store`). Keep one per Spark application; call
    :meth:`process` then (after the outputs are written) :meth:`commit` per batch.
    ``engine``: the ``"keyed"`` choice of :func:`~lakecast.runtime.engine.choose_engine`."""

    def __init__(
        self,
        spark: SparkSession,
        function: KeyedBroadcastProcessFunction,
        tables: Mapping[str, str],
        state_path: str,
        *,
        timestamp_column: str | None = None,
        order_columns: Sequence[str] = (),
        watermark_delay_ms: int = 0,
        key_groups: int = 128,
        parallelism: int | None = None,
        lineage: bool = True,
        state_budget_bytes: int = DEFAULT_STATE_BUDGET_BYTES,
        function_id: str | None = None,
        max_chain: int = 32,
        compact_every: int = DEFAULT_COMPACT_EVERY,
        engine: EngineChoice = KEYED,
    ) -> None:
        if not isinstance(function, KeyedBroadcastProcessFunction):
            raise TypeError(f"{type(function).__name__} is not a KeyedBroadcastProcessFunction")
        if engine.engine != "keyed":
            raise ValueError(f"KeyedBroadcastRuntime cannot run the {engine.engine!r} engine")
        sharded = [d.name for d in function.state_descriptors() if d.shards]
        if sharded:
            raise ValueError(
                f"{type(function).__name__} is keyed and declares sharded broadcast states "
                f"{sharded}: a keyed function's events are routed by key group, not by shard, "
                "so every task would read every shard. Declare them without shards, or look "
                "the rows up with a sharded Lookup in an enrichment before this function")
        #: the state engine and why (:mod:`lakecast.runtime.engine`)
        self.engine = engine
        self.state_engine: str = engine.engine
        self.state_engine_reason: str = engine.reason
        self.descriptors = keyed_descriptors(function)
        self.spark = spark
        self.function = function
        self.tables = dict(tables)
        self.state_path = state_path
        self.timestamp_column = timestamp_column
        self.order_columns = tuple(order_columns)
        self.watermark_delay_ms = watermark_delay_ms
        self.key_groups = key_groups
        self.parallelism = parallelism
        self.max_chain = max_chain
        fid = function_id or f"{type(function).__qualname__}-{uuid.uuid4().hex[:12]}"
        # the broadcast side: its chain of broadcast variables and the worker cache
        # (a function may have no broadcast table: keyed state only)
        chain_tables = dict(tables) or {"__none__": f"{state_path}/__no_broadcast_table__"}
        self.broadcast = BroadcastRuntime(spark, function, chain_tables, lineage=lineage,
                                          timestamp_column=timestamp_column,
                                          state_budget_bytes=state_budget_bytes,
                                          function_id=fid,
                                          engine=EngineChoice("python", engine.reason))
        self._chain: list[ChainLink] = []
        self._chain_version: dict[str, int] = {}
        self.store = KeyedStateStore(spark, state_path, key_groups, compact_every)
        self._schema = schema_json(self.descriptors)

    @property
    def function_id(self) -> str:
        return self.broadcast.function_id

    def replica(self, state_path: str) -> KeyedBroadcastRuntime:
        """The same function, tables and settings over the keyed state at ``state_path``
        (e.g. a replay's copy, :meth:`KeyedStateStore.copy_to`), with a worker cache of
        its own (a fresh function id)."""
        return KeyedBroadcastRuntime(
            self.spark, self.function, self.tables, state_path,
            timestamp_column=self.timestamp_column, order_columns=self.order_columns,
            watermark_delay_ms=self.watermark_delay_ms, key_groups=self.key_groups,
            parallelism=self.parallelism, lineage=self.broadcast.lineage,
            state_budget_bytes=self.broadcast.state_budget_bytes, max_chain=self.max_chain,
            compact_every=self.store.compact_every, engine=self.engine)

    # -- keyed state: which version feeds a batch -------------------------------------
    def state_before(self, batch_id: int) -> tuple[int | None, StateMeta]:
        """The state table version (and its meta) that batch ``batch_id`` starts from:
        the newest version written by an earlier batch (``None``: no state yet)."""
        return self.store.state_before(batch_id)

    # -- the broadcast chain up to the keyed state's version --------------------------
    def _chain_to(self, target: Mapping[str, int]) -> None:
        target = dict(target)
        if self._chain and self._chain_version == target:
            return
        if self._chain and all(self._chain_version.get(t, -1) <= v for t, v in target.items()) \
                and set(self._chain_version) <= set(target) and len(self._chain) < self.max_chain:
            new = read_broadcast_elements(self.spark, self.tables, self._chain_version, target)
            self._chain.append(self.broadcast.link(new, target))
        else:  # first batch, a rewind, or a long chain: a new base at ``target``
            for link in self._chain:
                self.broadcast.release(link)
            tables = {t: p for t, p in self.tables.items() if t in target}
            base = read_broadcast_elements(self.spark, tables, {}, target) if tables else []
            self._chain = [self.broadcast.link(base, target)] if base else []
        self._chain_version = target

    # -- one batch -------------------------------------------------------------------
    def process(
        self,
        events: DataFrame,
        *,
        batch_id: int,
        processing_time: int | None = None,
        until: Mapping[str, int] | None = None,
    ) -> KeyedResult:
        """Run the function over one batch of ``events`` (lazy: nothing runs until an
        action). ``processing_time`` (epoch ms; default now) drives processing-time
        timers and TTL; ``until`` pins the broadcast versions (default: newest)."""
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

        t0 = time.perf_counter()
        proc_time = int(time.time() * 1000) if processing_time is None else int(processing_time)
        state_version, meta = self.state_before(batch_id)
        if meta.key_groups and meta.key_groups != self.key_groups:
            raise KeyedStateError(
                f"the keyed state at {self.state_path} has {meta.key_groups} key groups; this "
                f"runtime was configured with {self.key_groups} (key groups are fixed for the "
                "life of the state)")
        for stored in meta.schemas:  # refuse a breaking change before any data is touched
            check_schema(json.loads(stored), self.descriptors)
        prev = dict(meta.broadcast_versions)
        latest = {t: v for t, v in latest_versions(self.tables, self.spark).items()
                  if v is not None}
        target = dict(until) if until is not None else latest  # pinned: absent stays absent
        # a table whose newest version is older than the applied one was deleted and
        # created anew (its versions restarted): it is reloaded whole at ``target``
        recreated = {t for t, v in prev.items() if t in latest and latest[t] < v}
        if any(target.get(t, -1) < v for t, v in prev.items() if t not in recreated):
            raise KeyedStateError(f"batch {batch_id} would move broadcast state back from "
                                  f"{prev} to {target}")
        self._chain_to({t: v for t, v in prev.items() if t not in recreated})
        new = read_broadcast_elements(self.spark, self.tables, prev, target) \
            if target != prev else []
        new_bc: Any = self.broadcast.ship(new) if new else []
        self.broadcast.remember_schemas(new)  # table schemas for bind_tables

        # watermark: max(previous, max event time - delay)
        tcol = self.timestamp_column
        watermark = meta.watermark
        if tcol is not None:
            ts = F.col(tcol)
            if dict(events.dtypes)[tcol].startswith("timestamp"):
                ts = F.unix_millis(ts)
            row = events.agg(F.max(ts)).collect()[0]
            if row[0] is not None:
                batch_wm = int(row[0]) - self.watermark_delay_ms
                watermark = batch_wm if watermark is None else max(watermark, batch_wm)

        tz = self.spark.conf.get("spark.sql.session.timeZone", "UTC")
        input_schema = to_arrow_schema(events.schema, timezone=tz)
        prefix = TaskPlan(
            function_id=self.function_id, function=self.function,
            tables=tuple(sorted(self.tables)), chain=tuple(self._chain),
            layout=None,  # type: ignore[arg-type]
            timestamp_column=tcol, watermark=meta.watermark,
        )
        self.function.bind_tables(self.broadcast.table_schemas)
        layout = OutputLayout.of(self.function, input_schema, self.broadcast.lineage)
        layout = replace(layout, sides={**layout.sides, STATE_SIDE: STATE_SCHEMA,
                                        TASK_SIDE: TASK_SCHEMA})
        all_keys = bool(new) and self.function.visits_keyed_state_on_broadcast
        plan = KeyedTaskPlan(prefix, new_bc, tuple(events.columns), layout,
                             version_json(target), meta.watermark, watermark, proc_time,
                             all_keys)

        key_cols = self.function.key_columns()
        missing = [c for c in key_cols if c not in events.columns]
        if missing:
            raise KeyedStateError(f"events have no key column(s) {missing}")
        any_null = F.lit(False)
        for c in key_cols:
            any_null = any_null | F.col(c).isNull()
        keyed_events = events.select(
            "*", F.lit(1).cast("int").alias(KIND),
            F.when(any_null, F.lit(None)).otherwise(
                F.pmod(F.xxhash64(*key_cols), F.lit(self.key_groups))).cast("int").alias(GROUP),
            F.when(any_null, F.lit(None)).otherwise(
                F.to_json(F.struct(*key_cols))).alias(KEY),
            F.lit(None).cast("binary").alias(STATE),
            F.lit(None).cast("long").alias(BATCH),
            F.lit(None).cast("boolean").alias(DUE),
        )
        frames = [keyed_events]
        if state_version is not None:
            frames.append(self._state_rows(events, keyed_events, state_version, all_keys,
                                           watermark, proc_time))
        union = frames[0] if len(frames) == 1 else frames[0].unionByName(
            frames[1], allowMissingColumns=True)
        p = self.parallelism or default_parallelism(self.spark)
        order = [KIND, GROUP, KEY, BATCH] + ([tcol] if tcol else []) + list(self.order_columns)
        shuffled = union.repartition(p, GROUP).sortWithinPartitions(*order)
        spark_schema = from_arrow_schema(layout.schema, prefer_timestamp_ntz=False)
        frame = shuffled.mapInArrow(_keyed_task_function(plan), spark_schema)
        new_meta = StateMeta(
            batch_id=batch_id, watermark=watermark, processing_time=proc_time,
            broadcast_versions=target,
            schemas=tuple(dict.fromkeys([*meta.schemas, self._schema])),
            key_groups=self.key_groups,
        )
        return KeyedResult(
            frame, layout, dict(target), list(new), self.broadcast.state_budget_bytes,
            time.perf_counter() - t0, batch_id=batch_id, meta=new_meta,
            input_state_version=state_version,
        )

    def _state_rows(self, events: DataFrame, keyed_events: DataFrame, version: int,
                    all_keys: bool, watermark: int | None, proc_time: int) -> DataFrame:
        """The state rows a batch needs (every row of each needed key, each with
        ``_due``), shaped like the keyed events."""
        from pyspark.sql import functions as F

        batch_keys = keyed_events.where(F.col(KEY).isNotNull()).select(GROUP, KEY)
        state = self.store.rows_for_batch(version, batch_keys, all_keys, watermark, proc_time)
        cols = [F.lit(None).cast(t).alias(n) for n, t in events.dtypes]
        return state.select(*cols, F.lit(0).cast("int").alias(KIND), F.col(GROUP),
                            F.col(KEY), F.col(STATE), F.col(BATCH), F.col(DUE))

    def commit(self, result: KeyedResult, changes: pa.Table | None = None) -> int:
        """Persist the batch's keyed state (after its outputs are written): append its
        changed rows and meta row, compacting every ``compact_every`` batches; returns
        the state table version. ``changes``: the changed rows when the result was
        already collected (its :data:`STATE_SIDE` side; default: computed from
        ``result``). Idempotent: a batch already committed is not appended again."""
        if changes is None:
            changes = result.state_changes.toArrow()
        version = self.store.commit(changes, result.meta)
        self._chain_to(result.meta.broadcast_versions)
        return version

    # -- the runtime contract (lakecast.pipeline.contract.BatchRuntime) ----------------
    def process_batch(self, events: DataFrame, plan: BatchPlan) -> KeyedResult:
        """The batch at the plan's versions and processing time (fixed when planned, so a
        redo is deterministic)."""
        return self.process(events, batch_id=plan.batch_id, processing_time=plan.planned_at_ms,
                            until=plan.broadcast_versions)

    def before_commit(self, output: BatchOutput, plan: BatchPlan) -> Mapping[str, Any] | None:
        """Nothing to check before the writes: keyed state is written in :meth:`commit_state`."""
        return None

    def commit_state(self, output: BatchOutput) -> None:
        """Append the batch's keyed state to the state table (see :meth:`commit`)."""
        if not isinstance(output, KeyedResult):
            raise TypeError(f"{type(output).__name__} is not a KeyedResult")
        self.commit(output)

    def after_commit(self, plan: BatchPlan) -> Mapping[str, Any] | None:
        """Keyed state is versioned in Delta with every batch: no separate checkpoint."""
        return None

    def on_rewind(self, plan: BatchPlan) -> None:
        """The state table was rolled back with the outputs: forget the cached version."""
        self.store.forget()

    def state_size(self, version: int | None = None) -> dict[str, int]:
        """Keys and bytes of the keyed state (a version of its table, default latest)."""
        return self.store.size(version)

    def close(self) -> None:
        for link in self._chain:
            self.broadcast.release(link)
        self._chain = []
        self.broadcast.close()


def _keyed_task_function(plan: KeyedTaskPlan) -> Any:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return run_keyed_task(plan, batches)

    return run


__all__ = ["KeyedBroadcastRuntime", "KeyedResult", "KeyedStateError", "StateMeta"]
