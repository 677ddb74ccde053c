"""What one micro-batch did: :class:`BatchResult` (for logs and Dagster metadata)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lakecast.pipeline.progress import BatchPlan


@dataclass(frozen=True)
class BatchResult:
    """What one batch did (for logs and Dagster metadata)."""

    plan: BatchPlan
    counts: dict[str, int]
    seconds: float
    redone: bool
    state_version: dict[str, int] = field(default_factory=dict)
    broadcast_elements: int = 0
    broadcast_rows: int = 0
    state_bytes_per_task: int = 0
    parallelism: int = 0
    #: the runtime's budget for state x parallelism (0: the runtime has none)
    state_budget_bytes: int = 0
    updates_applied: int = 0
    cold_tasks: int = 0
    #: the longest build of a cold state copy (from its chain's files), seconds
    cold_build_seconds: float = 0.0
    #: state copies the holders' caches evicted during the batch (the JVM lookups' LRU)
    state_evictions: int = 0
    #: the most shards one task read, and the events routed to their shards' tasks (0:
    #: no sharded state, :mod:`lakecast.runtime.sharded_state`)
    shards_per_task: int = 0
    rows_routed: int = 0
    #: where the task-local state lived, and why (the runtime's ``state_engine``)
    state_engine: str = ""
    state_engine_reason: str = ""
    #: the Spark executors that ran the batch's tasks (from their accounting rows)
    executors: list[str] = field(default_factory=list)
    #: what the runtime's ``after_commit`` hook did (e.g. the checkpoint it took)
    checkpoint: Mapping[str, Any] | None = None
    #: what the runtime's ``before_commit`` hook checked (e.g. state hashes, a restore)
    state_check: Mapping[str, Any] | None = None
    #: broadcast versions refused at planning, with their reasons (the plan's record)
    refused_versions: list[dict[str, Any]] = field(default_factory=list)
    #: tables reloaded whole instead of applying their changes: ``{table, version, reason}``
    full_reloads: list[dict[str, Any]] = field(default_factory=list)
    #: the Delta version of every output table after the batch's commit
    output_versions: dict[str, int] = field(default_factory=dict)
    #: the cross-batch dedup's lookup: ``watermark`` (ISO), ``retained`` events, ``keys``
    #: found (empty without a dedup or before any commit)
    dedup: dict[str, Any] = field(default_factory=dict)
    #: seconds per phase of the batch, in order (:class:`Laps`): ``plan``, ``read``,
    #: ``state`` (the runtime's broadcast refresh), ``job`` (the Spark job(s) computing the
    #: outputs and counts), ``check``, ``write``, ``commit``, ``after_commit``
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def events_in(self) -> int:
        return self.counts["events_in"]


class Laps:
    """A batch's stopwatch: :meth:`lap` closes the phase that ran since the last lap."""

    def __init__(self) -> None:
        self.start = self._last = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        """Add the time since the last lap (or the start) to ``phase``."""
        now = time.perf_counter()
        self.seconds[phase] = round(self.seconds.get(phase, 0.0) + now - self._last, 4)
        self._last = now

    def total(self) -> float:
        """Seconds since the start."""
        return time.perf_counter() - self.start
