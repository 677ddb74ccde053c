"""Checkpoints in a pipeline: what one wrote (:class:`CheckpointResult`), when to take
them and what to keep (:class:`Checkpointer`, used by
:meth:`~lakecast.snapshots.runtime.SnapshottingRuntime.after_commit`), where they live,
and :func:`restore_checkpoint` (rewind a pipeline to one)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakecast.pipeline.progress import BatchPlan, ProgressLog
from lakecast.pipeline.rewind import rewind
from lakecast.snapshots.errors import SnapshotError
from lakecast.snapshots.store import (
    CheckpointHeader,
    ManifestRow,
    RestoredCheckpoint,
    SnapshotStore,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakecast.config import Settings

log = logging.getLogger(__name__)

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


def snapshot_path(settings: Settings, pipeline: str) -> str:
    """Where a pipeline's snapshot table lives (next to its progress log)."""
    return settings.pipeline_paths(pipeline).snapshots


class Checkpointer:
    """When a pipeline checkpoints and what it keeps: every ``every`` committed batches,
    the newest ``keep`` checkpoints (never one in use), and only checkpoints of the
    current lineage are restorable (a rewind abandons the batches after its target)."""

    def __init__(self, store: SnapshotStore, log: ProgressLog, every: int = 1,
                 keep: int | None = 10) -> None:
        if every < 1:
            raise SnapshotError(f"checkpoint every must be >= 1, got {every}")
        self.store = store
        self.log = log
        self.every = every
        self.keep = keep
        self.results: list[CheckpointResult] = []
        self.removed: list[int] = []
        self._last: int | None = None
        self._abandoned: set[int] = set()
        self._synced = False  # read on first use: a run with nothing to do reads nothing

    def sync(self) -> None:
        """Re-read which batches rewinds abandoned (their checkpoints are not restorable)."""
        self._abandoned = set(self.log.abandoned())
        ids = [h.checkpoint_id for h in self.store.headers()
               if h.checkpoint_id not in self._abandoned]
        self._last = max(ids) if ids else None
        self._synced = True

    def _ensure_synced(self) -> None:
        if not self._synced:
            self.sync()

    def eligible(self, checkpoint_id: int) -> bool:
        self._ensure_synced()
        return checkpoint_id not in self._abandoned

    def due(self, plan: BatchPlan) -> bool:
        return self.due_at(plan.batch_id)

    def due_at(self, batch_id: int) -> bool:
        """Whether batch ``batch_id`` is checkpointed (with no checkpoint running)."""
        self._ensure_synced()
        return self._last is None or batch_id - self._last >= self.every

    def record(self, result: CheckpointResult, pinned: set[int]) -> None:
        """Remember a checkpoint just taken, then apply retention."""
        self._ensure_synced()
        self.results.append(result)
        self._last = result.header.batch_id
        log.info("checkpoint %s", describe(result))
        if self.keep:
            self.removed += self.store.retain(self.keep, lambda: self.in_use(pinned),
                                              verified=result.header.checkpoint_id)

    def in_use(self, pinned: set[int]) -> set[int]:
        used = set(pinned)
        rewinds = [p for p in self.log.state()[0] if p.is_restore]
        if rewinds and rewinds[-1].restore_of is not None:
            used.add(rewinds[-1].restore_of)
        return used


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
    store = SnapshotStore(spark, snapshot_path(settings, pipeline), pipeline)
    plog = ProgressLog(spark, settings.pipeline_paths(pipeline).progress, pipeline)
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
