"""Exactly-once micro-batch pipeline: new events with broadcast state, into Delta.

One call of :meth:`MicroBatchPipeline.run` processes everything that arrived
since the last committed batch, as one or more batches:

1. **plan**: the events table's new version range and the broadcast tables'
   current versions (the state version) are logged first
   (:class:`~lakecast.pipeline.progress.ProgressLog`); a planned but uncommitted batch
   from a crashed run is redone with exactly its plan;
2. **read** the new events (append-only: the rows of the files the range added,
   :func:`~lakecast.pipeline.events.read_new_events`; the first batch reads the table);
3. **validate**: rows a validator marks with a ``_reason`` go to the rejected
   side table with their reason and raw record — never dropped, never a crash; so do
   valid rows whose key an earlier batch accepted (``spec.dedup``, :mod:`.dedup`);
4. **process** the valid rows with the pipeline's runtime (any
   :class:`~lakecast.pipeline.contract.BatchRuntime`: task-local state on Spark), in one
   pass that yields the main output, every side output and one accounting row per task;
5. **reconcile** before writing anything: events in = events the tasks consumed (their
   accounting rows) + rejected, or the batch fails with nothing written; then the
   runtime's ``before_commit`` check (e.g. every task holds the same broadcast state),
   which fails the batch with nothing written either; held events of earlier batches
   are re-offered with the new ones and the held set is kept (:mod:`.held`);
6. **write** each output to its own Delta table with ``txnAppId``/``txnVersion``
   = (pipeline:output, batch id), so a retry never writes twice;
7. let the runtime persist state versioned with the outputs (``commit_state``), then
   **commit** the counts and every output table's version (so a rewind can roll the
   outputs back to any committed batch), then call the runtime's ``after_commit`` hook
   (e.g. checkpoint the broadcast state, :mod:`lakecast.snapshots.runtime`).

Rewinds (:mod:`lakecast.pipeline.rewind`) go back to a checkpointed batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from lakecast.delta import io as delta_io
from lakecast.delta.validation import VersionGate
from lakecast.errors import LakecastError
from lakecast.pipeline.batch_result import BatchResult as BatchResult
from lakecast.pipeline.batch_result import Laps
from lakecast.pipeline.contract import BatchRuntime, CollectableOutput
from lakecast.pipeline.dedup import CROSS_BATCH_DUPLICATES as CROSS_BATCH_DUPLICATES
from lakecast.pipeline.dedup import LATE_EVENTS as LATE_EVENTS
from lakecast.pipeline.dedup import DedupLookup, Prior, rejected_counts
from lakecast.pipeline.events import AppendOnlyError as AppendOnlyError
from lakecast.pipeline.events import ValidatedSchemas, read_new_events, rejected_rows
from lakecast.pipeline.faults import crash_point
from lakecast.pipeline.held import HELD_SIDE, UNMATCHED_SIDE, Held, HeldEvents, HeldOutcome
from lakecast.pipeline.progress import (
    MAIN_COUNT,
    BatchCommit,
    BatchPlan,
    ProgressLog,
    bounded_versions,
)
from lakecast.pipeline.rewind import finish_rewind
from lakecast.pipeline.spec import PipelineSpec as PipelineSpec
from lakecast.pipeline.task_errors import translated

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

REASON_COLUMN = "_reason"
#: default :attr:`MicroBatchPipeline.collect_max_rows`
COLLECT_MAX_ROWS = 200_000

Validator = Callable[["DataFrame"], "DataFrame"]
"""Adds a ``_reason`` column: null for a valid row, else why it is rejected."""


class ConcurrentRunError(LakecastError):
    """Another process planned the same batch differently: only one may run it."""


class ReconciliationError(LakecastError):
    """A batch's output counts do not add up to its input count."""


class MicroBatchPipeline:
    """Plans, processes and commits micro-batches exactly once."""

    def __init__(
        self,
        spark: SparkSession,
        spec: PipelineSpec,
        table_path: Callable[[str], str],
        log: ProgressLog,
        runtime: BatchRuntime,
        validator: Validator | None = None,
        version_gate: VersionGate | None = None,
    ) -> None:
        self.spark = spark
        self.spec = spec
        self.table_path = table_path
        self.log = log
        self.runtime = runtime
        self.validator = validator
        #: checks broadcast versions at planning (refused ones are not planned)
        self.version_gate = version_gate
        #: batches of at most this many events are collected to the driver and written
        #: with delta-rs (no Spark job per output); larger ones are written by Spark
        self.collect_max_rows = COLLECT_MAX_ROWS
        self._valid_schemas = ValidatedSchemas()
        #: the cross-batch dedup of ``spec.dedup`` (``None``: off)
        #: the held events of ``spec.held_table`` (``None``: the pipeline holds nothing); a
        #: copy of a held event is a duplicate for the dedup, as one of an output's event
        self.held = None if spec.held_table is None else HeldEvents(
            spark, spec.name, spec.held_table, table_path(spec.held_table), spec.hold_timeout)
        if self.held is not None and UNMATCHED_SIDE not in spec.side_outputs:
            raise ValueError(f"{spec.name}: a held_table needs an {UNMATCHED_SIDE!r} side "
                             f"output (where held events go after the hold timeout)")
        self.dedup = None if spec.dedup is None else DedupLookup(
            spark, spec.dedup, table_path, spec.events_table,
            [spec.output_table, *spec.side_outputs.values(),
             *([spec.held_table] if spec.held_table else [])])

    @property
    def output_tables(self) -> list[str]:
        """Every table the pipeline writes (:attr:`PipelineSpec.output_tables`)."""
        return self.spec.output_tables

    def output_versions(self) -> dict[str, int]:
        out = {}
        for t in self.output_tables:
            v = delta_io.latest_version(self.table_path(t), self.spark)
            out[t] = -1 if v is None else v
        return out

    # -- planning -------------------------------------------------------------

    def current_versions(self) -> tuple[int | None, dict[str, int]]:
        """Latest version of the events table and of each broadcast table that exists."""
        events = delta_io.latest_version(self.table_path(self.spec.events_table), self.spark)
        bvs = {}
        for t in self.spec.broadcast_tables:
            v = delta_io.latest_version(self.table_path(t), self.spark)
            if v is not None:
                bvs[t] = v
        return events, bvs

    def next_plan(self, until: Mapping[str, int | None] | None = None
                  ) -> tuple[BatchPlan | None, bool]:
        """The batch to run next and whether it redoes a crashed one; ``None`` if idle.

        ``until`` bounds the plan to table versions (e.g. those a run was requested for):
        events past ``until[events_table]`` and broadcast versions past ``until[table]``
        are left to a later batch (a broadcast table never goes back behind what the
        last batch applied). A crashed batch is redone whatever the bound.
        """
        plans, commits = self.log.state()
        pending, last, _ = ProgressLog.position_of(plans, commits)
        if pending is not None:
            return pending, True
        events_end, bvs = self.current_versions()
        start = last.events_end if last else -1
        if until is not None:
            events_end, bvs = bounded_versions(events_end, bvs, until, self.spec.events_table,
                                       last.broadcast_versions if last else {})
        if events_end is None or events_end <= start:
            return None, False
        if self.spec.max_versions_per_batch:
            events_end = min(events_end, start + self.spec.max_versions_per_batch)
        batch_id = max(p.batch_id for p in plans) + 1 if plans else 0
        refused: list[dict[str, Any]] = []
        if self.version_gate is not None:  # plan the newest good versions only
            applied = last.broadcast_versions if last is not None else {}
            bvs, bad = self.version_gate.plan(applied, bvs)
            refused = [r.as_dict() for r in bad]
        return BatchPlan(batch_id, start, events_end, bvs, refused=refused), False

    # -- one batch ------------------------------------------------------------

    def read_events(self, plan: BatchPlan) -> tuple[DataFrame, int | None]:
        """The plan's new events and their row count from the Delta log
        (:func:`~lakecast.pipeline.events.read_new_events`)."""
        return read_new_events(self.spark, self.table_path(self.spec.events_table),
                               self.spec.events_table, plan, self.spec.events_rewrites)

    def run_batch(self, plan: BatchPlan, redone: bool = False) -> BatchResult:
        """Process one planned batch: count and reconcile first, then write, then commit.

        A batch of at most :attr:`collect_max_rows` events (and no keyed state table) is
        brought to the driver as Arrow in one Spark job, then counted, reconciled and
        written with delta-rs (:func:`lakecast.delta.io.append_arrow`); a larger one is
        counted and written by Spark jobs. Both write with the same transaction ids.
        """
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        laps = Laps()
        if not redone:
            self.log.write_plan(plan)
            logged = self.log.pending()
            if logged is None or (logged.events_start, logged.events_end,
                                  logged.broadcast_versions) != (
                    plan.events_start, plan.events_end, plan.broadcast_versions):
                raise ConcurrentRunError(
                    f"{self.spec.name}: batch {plan.batch_id} was planned by another process "
                    f"({logged}); only one run of a pipeline may be active at a time"
                )
        crash_point("planned", plan.batch_id)
        laps.lap("plan")
        events, n_logged = self.read_events(plan)
        collect = (not self.spec.state_table and n_logged is not None
                   and n_logged <= self.collect_max_rows)
        rejected = None
        prior = self._prior(plan)
        # a collected batch is one Spark job: its branches share the read (Spark reuses the
        # identical exchange), so caching it would only cost (~0.9 s of a ~2 s batch)
        keep = (lambda df: df) if collect else (
            lambda df: df.persist(StorageLevel.MEMORY_AND_DISK))
        if self.validator is not None or (prior is not None and prior.marks):
            checked = keep(self._validate(events, prior))
            rejected = checked.filter(F.col(REASON_COLUMN).isNotNull())
            valid = self._valid_schemas.known(
                events, checked.filter(F.col(REASON_COLUMN).isNull()).drop(REASON_COLUMN),
                marked=prior is not None and prior.marks)
            if collect and n_logged is not None:  # rejected: counted from collected rows
                counts = {"events_in": n_logged}
            else:
                by_reason = {r[0]: r[1]
                             for r in checked.groupBy(REASON_COLUMN).count().collect()}
                counts = {"events_in": sum(by_reason.values()),
                          "rejected": sum(n for k, n in by_reason.items() if k is not None),
                          **rejected_counts(self.dedup, by_reason)}
        else:
            checked = keep(events)
            valid = checked
            counts = {"events_in": n_logged if collect and n_logged is not None
                      else checked.count()}
        if self.dedup is not None:
            counts = {CROSS_BATCH_DUPLICATES: 0, LATE_EVENTS: 0, **counts}
        held = None
        if self.held is not None:  # the held set the last batch left, re-offered
            _, last = self.log.last_committed()
            held = (self.held.prior(last.output_versions if last else {}),
                    lambda v=valid: v.columns)  # asked only when needed (a schema request)
            if held[0] is not None:
                valid = self.held.offer(valid, held[0])
        crash_point("read", plan.batch_id)
        laps.lap("read")
        result = self.runtime.process_batch(valid, plan)
        laps.lap("state")
        try:
            if collect and isinstance(result, CollectableOutput):
                state_check = self._collected(result, rejected, counts, plan, held, laps)
            else:
                if rejected is not None and "rejected" not in counts:  # not collectable
                    by = dict(rejected.groupBy(REASON_COLUMN).count().collect())
                    counts.update(rejected=sum(by.values()), **rejected_counts(self.dedup, by))
                state_check = self._distributed(result.persist(), rejected, counts, plan, held,
                                                laps)
            metrics = result.metrics()
        finally:
            result.unpersist()
            if not collect:
                checked.unpersist()
        crash_point("outputs_written", plan.batch_id)
        output_versions = self.output_versions()
        self.log.write_commit(BatchCommit(plan.batch_id, counts,
                                          output_versions=output_versions))
        laps.lap("commit")
        summary = metrics.summary()
        batch = BatchResult(
            plan, counts, laps.total(), redone,
            state_version=dict(result.state_version),
            broadcast_elements=len(result.new_elements),
            broadcast_rows=sum(e.num_rows for e in result.new_elements),
            state_bytes_per_task=metrics.state_bytes_per_task,
            parallelism=metrics.parallelism,
            state_budget_bytes=metrics.budget_bytes,
            updates_applied=metrics.broadcast_updates_applied,
            cold_build_seconds=float(summary.get("cold_build_seconds", 0.0)),
            **{k: int(summary.get(k, 0)) for k in ("cold_tasks", "state_evictions",
                                                     "shards_per_task", "rows_routed")},
            state_engine=self.runtime.state_engine,
            state_engine_reason=self.runtime.state_engine_reason,
            executors=metrics.executors,
            state_check=state_check,
            refused_versions=list(plan.refused),
            full_reloads=[
                {"table": e.table, "version": e.version, "reason": e.meta["full_reload"]}
                for e in result.new_elements if (getattr(e, "meta", None) or {}).get(
                    "full_reload")],
            output_versions=output_versions,
            dedup={} if prior is None else prior.summary(),
        )
        checkpoint = self.runtime.after_commit(plan)
        laps.lap("after_commit")
        return replace(batch, checkpoint=checkpoint or None, phases=laps.seconds)

    def _prior(self, plan: BatchPlan) -> Prior | None:
        """What the dedup checks the batch against: the accepted events as of the output
        versions the last committed batch recorded (never this batch's own writes)."""
        if self.dedup is None:
            return None
        _, last = self.log.last_committed()
        return self.dedup.prior(plan, last.output_versions if last is not None else {})

    def _validate(self, events: DataFrame, prior: Prior | None) -> DataFrame:
        """Events with ``_reason``: the validator's, then the cross-batch duplicates."""
        from pyspark.sql import functions as F

        checked = (self.validator(events) if self.validator is not None
                   else events.withColumn(REASON_COLUMN, F.lit(None).cast("string")))
        if prior is None or not prior.marks or self.dedup is None:
            return checked
        return self.dedup.mark(checked, prior, REASON_COLUMN)

    def _reconcile(self, by_output: Mapping[str | None, int], tasks: list[dict[str, Any]],
                   summary: Mapping[str, int], counts: dict[str, int], plan: BatchPlan,
                   held: HeldOutcome | None = None) -> None:
        """Fill ``counts`` from the outputs and the tasks' accounting rows; raise unless
        events in + held re-offered = events the tasks consumed + rejected (nothing is
        written yet)."""
        known = {*self.spec.side_outputs, *([HELD_SIDE] if self.held is not None else [])}
        unknown = {k for k in by_output if k is not None} - known
        if unknown:
            raise ReconciliationError(
                f"side outputs {sorted(unknown)} of {self.spec.name} have no table; "
                f"configured: {sorted(self.spec.side_outputs)} (held events need "
                f"PipelineSpec.held_table)")
        counts[MAIN_COUNT] = by_output.get(None, 0)
        for side in self.spec.side_outputs:
            counts[side] = by_output.get(side, 0)
        if held is not None:
            if by_output.get(HELD_SIDE, 0) != held.held.num_rows + held.expired.num_rows:
                raise ReconciliationError(
                    f"batch {plan.batch_id}: {by_output.get(HELD_SIDE, 0)} events held but "
                    f"{held.held.num_rows} kept + {held.expired.num_rows} expired")
            held.apply(counts)
        # the tasks count what they consumed (outputs need not be 1:1 with events)
        counts["processed"] = sum(int(r["events_in"]) for r in tasks)
        counts.update(summary)
        consumed = counts["processed"] + counts.get("rejected", 0)
        offered = counts["events_in"] + counts.get("held_retried", 0)
        if consumed != offered:
            raise ReconciliationError(
                f"batch {plan.batch_id}: events in + held re-offered = {offered} but the "
                f"tasks consumed {counts['processed']} and {counts.get('rejected', 0)} were "
                f"rejected ({counts}); nothing was written or committed"
            )

    def _collected(self, result: Any, rejected: DataFrame | None, counts: dict[str, int],
                   plan: BatchPlan, held: Held, laps: Laps) -> Mapping[str, Any] | None:
        """A small batch: one job for the outputs and the rejected rows, then Arrow counts
        and delta-rs writes."""
        out = result.collect(None if rejected is None
                             else rejected_rows(rejected, plan, REASON_COLUMN))
        laps.lap("job")
        bad = out.extra
        if bad is not None:
            counts["rejected"] = bad.num_rows
            if self.dedup is not None:
                bad, counts[CROSS_BATCH_DUPLICATES] = self.dedup.finish_rejected(bad)
                counts[LATE_EVENTS] = self.dedup.late_count(bad)
        settled = self._settle(out.sides.get(HELD_SIDE), held, plan)
        self._reconcile(out.output_counts(), out.task_rows, result.summary(), counts, plan,
                        settled)
        state_check = self.runtime.before_commit(result, plan)
        laps.lap("check")
        sides = out.sides if settled is None or self.held is None else self.held.route(
            out.sides, settled, arrow=True)
        self._write_outputs(self._append, out.main, sides,
                            bad if bad is not None and bad.num_rows else None, plan, settled)
        self.runtime.commit_state(result)
        laps.lap("write")
        return state_check

    def _distributed(self, result: Any, rejected: DataFrame | None, counts: dict[str, int],
                     plan: BatchPlan, held: Held, laps: Laps) -> Mapping[str, Any] | None:
        """A large batch: counted by Spark actions, written by Spark jobs (the held
        events are brought to the driver)."""
        names = result.side_output_names
        settled = self._settle(result.side(HELD_SIDE).toArrow() if held and HELD_SIDE in names
                               else None, held, plan)
        self._reconcile(result.output_counts(), result.task_rows(), result.summary(),
                        counts, plan, settled)
        laps.lap("job")
        state_check = self.runtime.before_commit(result, plan)
        laps.lap("check")
        bad = None if rejected is None else rejected_rows(rejected, plan, REASON_COLUMN)
        if bad is not None and self.dedup is not None:
            bad = bad.withColumn("reason", self.dedup.public_reason(bad["reason"]))
        sides = {s: result.side(s) for s in names}
        if settled is not None and self.held is not None:
            sides = self.held.route(sides, settled, arrow=False)
        self._write_outputs(self._write, result.main, sides, bad, plan, settled)
        if self.spec.state_table:
            crash_point("outputs_written", plan.batch_id)
        self.runtime.commit_state(result)
        if self.spec.state_table:
            crash_point("state_written", plan.batch_id)
        laps.lap("write")
        return state_check

    def _settle(self, rows: pa.Table | None, held: Held, plan: BatchPlan) -> HeldOutcome | None:
        """The batch's held set and expired events (``None``: the pipeline holds nothing)."""
        return None if self.held is None or held is None else self.held.settle(
            rows, held[0], held[1], plan)

    def _write_outputs(self, write: Callable[[Any, str, str, BatchPlan], None], main: Any,
                       sides: Mapping[str, Any], rejected: Any, plan: BatchPlan,
                       held: HeldOutcome | None = None) -> None:
        """Write the main output first (freshness), then the side outputs, the held set
        and the rejected rows, each with ``write`` (Spark or delta-rs)."""
        write(main, self.spec.output_table, "main", plan)
        crash_point("main_written", plan.batch_id)
        for side, table in self.spec.side_outputs.items():
            if side in sides:
                write(sides[side], table, side, plan)
        if held is not None and self.held is not None:
            self.held.write(held, plan)
        if rejected is not None:
            write(rejected, self._rejected_table(), "rejected", plan)

    def _append(self, table: Any, name: str, output: str, plan: BatchPlan) -> None:
        delta_io.append_arrow(table, self.table_path(name),
                              txn=(f"{self.spec.name}:{output}", plan.batch_id))

    def _write(self, df: DataFrame, table: str, output: str, plan: BatchPlan) -> None:
        delta_io.write(
            df, self.table_path(table), txn=(f"{self.spec.name}:{output}", plan.batch_id),
            merge_schema=True,
        )

    def _rejected_table(self) -> str:
        if self.spec.rejected_table is None:
            raise ReconciliationError(
                f"invalid events and no rejected table configured for {self.spec.name}"
            )
        return self.spec.rejected_table

    def warm_up(self) -> int | None:
        """Build the runtime's task-local state at the last committed batch's versions
        before the first batch (a continuous run's first batch then runs warm); returns
        the tasks that were cold, ``None`` when the runtime has nothing to warm or nothing
        is committed yet."""
        last, _ = self.log.last_committed()
        if last is None:
            return None

        def events() -> DataFrame:
            frame = delta_io.read(self.spark, self.table_path(self.spec.events_table))
            return frame if self.validator is None else \
                self.validator(frame).drop(REASON_COLUMN)

        return self.runtime.warm_up(events, last.broadcast_versions)

    def defer_checkpoints(self) -> bool:
        """Let the runtime checkpoint in the background (a continuous run: the next batches
        do not wait); whether it can. Call :meth:`settle` before the process ends."""
        return self.runtime.defer_checkpoints()

    def settle(self) -> Mapping[str, Any] | None:
        """Wait for the runtime's background work (a checkpoint); its summary, if any."""
        return self.runtime.settle()

    # -- driver ---------------------------------------------------------------

    def run(self, max_batches: int | None = None,
            on_batch: Callable[[BatchResult], None] | None = None, *,
            until: Mapping[str, int | None] | None = None,
            max_seconds: float | None = None,
            before_batch: Callable[[BatchPlan], None] | None = None) -> list[BatchResult]:
        """Run batches until caught up — with the tables, or with ``until`` (table →
        version, see :meth:`next_plan`) — or until ``max_batches`` ran or ``max_seconds``
        passed (checked between batches; a batch is never cut short). ``before_batch`` is
        called with each plan before it runs, ``on_batch`` with each result."""
        results: list[BatchResult] = []
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        while max_batches is None or len(results) < max_batches:
            if deadline is not None and time.monotonic() >= deadline:
                break
            plan, redone = self.next_plan(until)
            if plan is None:
                break
            if plan.is_restore:  # a rewind interrupted before its rollback finished
                finish_rewind(self.spark, self.log, self.table_path, plan)
                self.runtime.on_rewind(plan)
                continue
            if before_batch is not None:
                before_batch(plan)
            try:
                result = self.run_batch(plan, redone)
            except Exception as e:  # a known cause: one line, the trace in the Spark log
                known = translated(e, self.spec.name, plan.batch_id, plan.broadcast_versions)
                if known is None:
                    raise
                raise known from None
            results.append(result)
            if on_batch is not None:
                on_batch(result)
        return results

