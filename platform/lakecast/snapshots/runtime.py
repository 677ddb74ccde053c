"""Checkpoint and restore task-local broadcast state: :class:`SnapshottingRuntime`.

A :class:`~lakecast.runtime.BroadcastRuntime` whose

* :meth:`SnapshottingRuntime.before_commit` (a batch that will be checkpointed, before
  anything of it is written) runs a Spark job over ``p`` tasks where each task
  serializes ITS task-local state (the worker cache the batch just used, or built from
  the same chain), hashes it, and reports a manifest row per state; the driver fails the
  batch when tasks disagree (:class:`~lakecast.snapshots.CheckpointDivergenceError`). In
  a continuous run that job runs ahead, in the background after the batch before, and is
  used when the batch's state is the one it hashed (no broadcast version in between);
* :meth:`SnapshottingRuntime.checkpoint` (after the commit) reuses that manifest, then a
  second job writes each distinct content once, and the header, manifest and content
  rows commit together (one Delta version; :mod:`lakecast.snapshots.capture`); with
  :meth:`~SnapshottingRuntime.defer_checkpoints`, in a background thread;
* cold start (``_base_elements``, the engine's documented hook) restores from the newest
  complete checkpoint at or before the needed state version instead of reading the full
  tables, redistributing task states as Flink does (new task ``i`` reads old task
  ``i mod p_old``), then catches up with the Delta increments since the checkpoint.

Restored state enters the chain as :class:`~lakecast.snapshots.restored.SnapshotElement` s,
which :class:`~lakecast.snapshots.restored.SnapshotAware` (the user's function, wrapped)
loads directly.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakecast.api.element import BroadcastElement
from lakecast.api.functions import BroadcastProcessFunction
from lakecast.runtime.broadcast import BroadcastRuntime
from lakecast.runtime.engine import EngineChoice, python_engine
from lakecast.runtime.tasks import TaskPlan
from lakecast.snapshots.capture import Captured, check_divergence, task_manifest, write_checkpoint
from lakecast.snapshots.checkpointer import Checkpointer, CheckpointResult, describe
from lakecast.snapshots.codec import schema_from_b64, schema_to_b64
from lakecast.snapshots.errors import SnapshotError
from lakecast.snapshots.records import ManifestRow
from lakecast.snapshots.restored import SnapshotAware, SnapshotElement, declared_states
from lakecast.snapshots.store import RestoredCheckpoint, SnapshotStore
from lakecast.spark import default_parallelism

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakecast.pipeline.contract import BatchOutput
    from lakecast.pipeline.progress import BatchPlan


log = logging.getLogger(__name__)


# ============================================================================ driver side
class SnapshottingRuntime(BroadcastRuntime):
    """A :class:`BroadcastRuntime` that checkpoints its task states to a
    :class:`~lakecast.snapshots.SnapshotStore` and restores from it on cold start.

    ``parallelism``: tasks per batch (:meth:`process_batch` repartitions the events) and
    of each checkpoint. ``restore``: restore from checkpoints on cold start (``False``:
    build from the full tables). ``checkpointer``: when to checkpoint in a pipeline
    (:meth:`after_commit`), which checkpoints belong to the current lineage, retention;
    without one the runtime checkpoints only when :meth:`checkpoint` is called.
    ``engine``: a ``"python"`` :class:`~lakecast.runtime.engine.EngineChoice` (what
    :mod:`lakecast.build` chose); without one, why the state is in the Python workers is
    said here (:func:`~lakecast.runtime.engine.python_engine`).
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
        checkpointer: Checkpointer | None = None,
        engine: EngineChoice | None = None,
        **options: Any,
    ) -> None:
        self.user_function = function
        fid = function_id or f"{type(function).__qualname__}-{uuid.uuid4().hex[:12]}"
        if engine is None:
            engine = python_engine(function, execution=options.pop("execution", "tasks"),
                                   jvm_lookups=options.pop("jvm_lookups", None))
        if not engine.python_state:
            raise ValueError(f"a SnapshottingRuntime checkpoints the Python workers' state; "
                             f"the {engine.engine!r} engine keeps none ({engine.reason})")
        super().__init__(spark, SnapshotAware(function), tables, function_id=fid,
                         parallelism=parallelism, engine=engine, **options)
        self.store = store
        self.restore = restore
        self.checkpointer = checkpointer
        self.restore_checkpoint_id: int | None = None  # pin the next cold start to this one
        self.restored: RestoredCheckpoint | None = None  # what the last cold start used
        #: what the last cold start skipped, and why (also in :meth:`before_commit`'s report)
        self.restore_skipped: list[str] = []
        self._restore_report: dict[str, Any] | None = None
        self._verified: tuple[int, str, str, list[ManifestRow]] | None = None
        self._restoring = False
        self._background: ThreadPoolExecutor | None = None
        self._inflight: Future[dict[str, Any]] | None = None
        self._early: tuple[tuple[int, str, str], Future[list[ManifestRow]]] | None = None

    @property
    def task_parallelism(self) -> int:
        return self.parallelism or default_parallelism(self.spark)

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
            pinned, max_versions=until,
            eligible=self.checkpointer.eligible if self.checkpointer else None,
            parallelism=self.task_parallelism, states=declared_states(self.user_function),
        ) if self.store.exists() else None
        if pinned is not None and (restored is None or restored.header.checkpoint_id != pinned):
            why = "; ".join(restored.skipped) if restored else "no complete checkpoint"
            if restored is None:
                raise SnapshotError(f"cannot restore checkpoint {pinned}: {why}")
            log.warning("checkpoint %s unusable, restored %s instead: %s", pinned,
                        restored.header.checkpoint_id, why)
        self.restored = restored
        self.restore_skipped = list(self.store.skipped) if self.store.exists() else []
        self._restore_report = {
            "restored_from_checkpoint": restored.header.checkpoint_id if restored else -1,
            "skipped_checkpoints": len(self.restore_skipped),
            "refused_checkpoints": len(self.store.refusals) if self.store.exists() else 0,
            "skipped_checkpoint_reasons": "; ".join(self.restore_skipped) or "none"}
        self.restore_checkpoint_id = None  # the pin applies to one cold start
        if restored is None:
            if self.restore_skipped:  # each skip was logged on its own line
                log.warning("no checkpoint of %s reads and verifies (%d skipped); rebuilding "
                            "the broadcast state from the tables", self.store.pipeline,
                            len(self.restore_skipped))
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
        from lakecast.delta import io as delta_io

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
        return task_manifest(self.spark, self.task_plan(), parallelism or self.task_parallelism)

    def checkpoint(
        self,
        checkpoint_id: int,
        *,
        batch_id: int,
        events_start: int,
        events_end: int,
        parallelism: int | None = None,
        manifest: list[ManifestRow] | None = None,
    ) -> CheckpointResult:
        """Checkpoint every task's broadcast state (see the module doc); one Delta commit.
        ``manifest``: the tasks' hashes of this state, when :meth:`before_commit` took
        them (else a manifest job runs first)."""
        p = parallelism or self.task_parallelism
        manifest = self.task_manifest(p) if manifest is None else manifest
        return self._write_checkpoint(self._capture(p), checkpoint_id, batch_id,
                                      events_start, events_end, manifest)

    def _capture(self, parallelism: int) -> Captured:
        """What a checkpoint of the current state needs, fixed now (a checkpoint taken in
        the background must not see the state the next batches move to)."""
        return Captured(self.task_plan(), dict(self.version), parallelism,
                         {t: schema_to_b64(s) for t, s in self.table_schemas.items()})

    def _write_checkpoint(self, at: Captured, checkpoint_id: int, batch_id: int,
                          events_start: int, events_end: int,
                          manifest: list[ManifestRow]) -> CheckpointResult:
        """The content job and the one Delta commit of a checkpoint of state ``at``."""
        fn = self.user_function
        return write_checkpoint(
            self.spark, self.store, at, declared_states(fn),
            f"{type(fn).__module__}.{type(fn).__qualname__}", checkpoint_id,
            batch_id=batch_id, events_start=events_start, events_end=events_end,
            manifest=manifest)

    def check_divergence(self, manifest: Sequence[ManifestRow], p: int, checkpoint_id: int,
                         batch_id: int | None = None) -> dict[str, tuple[int, str]]:
        """Every task reported every state with one hash per state, or raise (naming the
        state and which tasks hold which hash); returns state -> (writer task, hash)."""
        return check_divergence(
            manifest, declared_states(self.user_function), p, checkpoint_id,
            batch_id=batch_id, pipeline=self.store.pipeline if batch_id is not None else None)

    # -- the runtime contract's hooks (lakecast.pipeline.contract.BatchRuntime) ---------
    # -- checkpoints in the background -------------------------------------------------
    def defer_checkpoints(self) -> bool:
        """Take each due checkpoint in a background thread from now on, so the next batches
        do not wait for it (a continuous run); the check that every task holds the same
        state (:meth:`before_commit`) still runs before the batch is written. No second
        checkpoint starts while one runs; a failed one is raised by the next
        :meth:`after_commit` or by :meth:`settle`. A process that dies meanwhile leaves
        no checkpoint (one Delta commit holds all of it): restore uses the one before."""
        if self._background is None:
            self._background = ThreadPoolExecutor(1, thread_name_prefix="lakecast-checkpoint")
        return True

    def settle(self) -> Mapping[str, Any] | None:
        """Wait for a checkpoint taken in the background; its summary (``None``: none
        was running). Raises its error if it failed."""
        if self._inflight is None:
            return None
        future, self._inflight = self._inflight, None
        return future.result()

    def _running(self) -> bool:
        return self._inflight is not None and not self._inflight.done()

    def _due(self, plan: BatchPlan) -> bool:
        cp = self.checkpointer
        return cp is not None and not self._running() and cp.due(plan)

    def close(self) -> None:
        """Wait for a checkpoint running in the background, then release the chain."""
        try:
            self.settle()
        finally:
            early, self._early = self._early, None
            if early is not None:  # hashes taken ahead that no batch used
                early[1].exception()
            super().close()

    def _hash_ahead(self, plan: BatchPlan) -> None:
        """With :meth:`defer_checkpoints`, when the batch after ``plan`` will be
        checkpointed: start the manifest job now, in the background, between the two
        batches. That batch's :meth:`before_commit` uses its hashes when the state is
        still this one (same function identity and chain: no broadcast version since)."""
        cp = self.checkpointer
        nxt = plan.batch_id + 1
        if (self._background is None or cp is None or self._early is not None
                or not self._chain or self._running() or not cp.due_at(nxt)):
            return
        self._early = ((nxt, self.function_id, self._chain_key()), self._background.submit(
            task_manifest, self.spark, self.task_plan(), self.task_parallelism))

    def _early_manifest(self, plan: BatchPlan) -> list[ManifestRow] | None:
        """The manifest :meth:`_hash_ahead` took of this batch's state, if it did (its
        error, if it failed, is raised here)."""
        early, self._early = self._early, None
        if early is None or early[0] != (plan.batch_id, self.function_id, self._chain_key()):
            return None
        return early[1].result()

    def before_commit(self, output: BatchOutput, plan: BatchPlan) -> Mapping[str, Any] | None:
        """Before anything of the batch is written: if the batch will be checkpointed, each
        task hashes its state (the manifest job) and tasks that disagree fail the batch
        (:class:`~lakecast.snapshots.CheckpointDivergenceError` naming pipeline, batch,
        state and tasks). Returns what it checked, plus (once) what the cold start
        restored and skipped."""
        report, self._restore_report = dict(self._restore_report or {}), None
        self._verified = None
        if not self._due(plan):
            return report or None
        p = self.task_parallelism
        ahead = self._early_manifest(plan)
        manifest = ahead or self.task_manifest(p)
        self.check_divergence(manifest, p, plan.batch_id, batch_id=plan.batch_id)
        self._verified = (plan.batch_id, self.function_id, self._chain_key(), manifest)
        report["state_tasks_verified"] = p
        report["state_hashed_ahead"] = int(ahead is not None)
        return report

    def _chain_key(self) -> str:
        return self._chain[-1].to_key if self._chain else ""

    def pinned_checkpoints(self) -> set[int]:
        """Checkpoints this runtime restored from or will restore from (never removed)."""
        used = set()
        if self.restored is not None:
            used.add(self.restored.header.checkpoint_id)
        if self.restore_checkpoint_id is not None:
            used.add(self.restore_checkpoint_id)
        return used

    def after_commit(self, plan: BatchPlan) -> Mapping[str, Any] | None:
        """Checkpoint when the checkpointer says the batch is due; returns its summary.
        With :meth:`defer_checkpoints`: starts it in the background and returns the
        summary of one that finished since (raising its error if it failed)."""
        done = self.settle() if self._inflight is not None and not self._running() else None
        cp = self.checkpointer
        if cp is None or not self._due(plan):
            self._hash_ahead(plan)
            return done
        v = self._verified
        manifest = v[3] if v is not None and v[:3] == (
            plan.batch_id, self.function_id, self._chain_key()) else None
        self._verified = None
        p = self.task_parallelism
        if manifest is None:
            manifest = self.task_manifest(p)
        at, pinned = self._capture(p), self.pinned_checkpoints()

        def take() -> dict[str, Any]:
            result = self._write_checkpoint(at, plan.batch_id, plan.batch_id,
                                            plan.events_start, plan.events_end, manifest)
            cp.record(result, pinned)
            return describe(result)

        if self._background is None:
            return take()
        self._inflight = self._background.submit(self._in_background, take, plan.batch_id)
        return done

    def _in_background(self, take: Any, batch_id: int) -> dict[str, Any]:
        """Run ``take`` (a checkpoint) in the background thread; a failure becomes a
        :class:`SnapshotError` that says what it leaves (the batch is committed)."""
        try:
            return take()
        except SnapshotError:
            raise
        except Exception as e:  # raised to the run by settle() / the next after_commit
            raise SnapshotError(
                f"pipeline {self.store.pipeline!r}: checkpoint {batch_id} (due at batch "
                f"{batch_id}, already committed) failed in the background writing "
                f"{self.store.path}: {type(e).__name__}: {str(e).splitlines()[0][:400]}. "
                f"Nothing of it was committed (one Delta commit holds a checkpoint), so a "
                f"restore uses the checkpoint before it; fix the snapshot table (or move it "
                f"aside) and restart the run: its next due batch checkpoints again") from e

    def on_rewind(self, plan: BatchPlan) -> None:
        """Pin the next cold start to the rewind's checkpoint, in fresh task caches."""
        assert plan.restore_of is not None
        self.settle()
        self.request_restore(plan.restore_of)
        if self.checkpointer is not None:
            self.checkpointer.sync()
