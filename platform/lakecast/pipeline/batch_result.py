"""What one micro-batch did: :class:`BatchResult` (for logs and Dagster metadata)."""

from __future__ import annotations

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

    @property
    def events_in(self) -> int:
        return self.counts["events_in"]
