"""Broadcast-state metrics: per task, per run, and the state-size budget.

The seeds' rule: total broadcast memory = state size x parallelism; keep it under
~100 MB. :func:`check_budget` warns with :class:`StateBudgetWarning` (and
:attr:`RunMetrics.over_budget` is set) when a run exceeds the configured budget.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

DEFAULT_STATE_BUDGET_BYTES = 100 * 1024 * 1024


class StateBudgetWarning(UserWarning):
    """Broadcast state x parallelism exceeds the configured budget."""


@dataclass
class TaskMetrics:
    """What one Spark task (one task-local state copy) did."""

    partition: int
    pid: int
    function_id: str
    cache: str  # "cold" (state built from the base) or "warm" (cached state reused)
    elements_applied: int  # broadcast elements applied by this task
    rows_applied: int
    state_version: dict[str, int]
    state_bytes: int
    rows_in: int = 0
    rows_main: int = 0
    rows_side: dict[str, int] = field(default_factory=dict)
    apply_seconds: float = 0.0
    process_seconds: float = 0.0
    attempt: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TaskMetrics:
        return cls(**dict(d))

    def to_row(self) -> dict[str, Any]:
        """This task's accounting row (:data:`TASK_ROW_SCHEMA`)."""
        d = self.as_dict()
        d["task"] = d.pop("partition")
        d["events_in"] = d.pop("rows_in")
        d["rows_side"] = json.dumps(d["rows_side"], sort_keys=True)
        d["state_version"] = json.dumps(d["state_version"], sort_keys=True)
        return d

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TaskMetrics:
        d = {k: row[k] for k in TASK_ROW_SCHEMA.names}
        d["partition"] = d.pop("task")
        d["rows_in"] = d.pop("events_in")
        d["rows_side"] = json.loads(d["rows_side"] or "{}")
        d["state_version"] = json.loads(d["state_version"] or "{}")
        return cls(**d)


#: the accounting row a broadcast task emits after its outputs (see
#: :mod:`lakecast.pipeline.contract`)
TASK_ROW_SCHEMA = pa.schema([
    ("task", pa.int32()), ("pid", pa.int64()), ("function_id", pa.string()),
    ("cache", pa.string()), ("elements_applied", pa.int64()), ("rows_applied", pa.int64()),
    ("state_version", pa.string()), ("state_bytes", pa.int64()), ("events_in", pa.int64()),
    ("rows_main", pa.int64()), ("rows_side", pa.string()), ("apply_seconds", pa.float64()),
    ("process_seconds", pa.float64()), ("attempt", pa.int32()),
])


@dataclass
class RunMetrics:
    """Aggregate of one run (one Spark job over a batch of events)."""

    state_version: dict[str, int]
    tasks: list[TaskMetrics]
    budget_bytes: int = DEFAULT_STATE_BUDGET_BYTES
    refresh_seconds: float = 0.0
    new_elements: int = 0  # broadcast elements read from Delta for this run
    new_element_rows: int = 0

    @property
    def parallelism(self) -> int:
        return len(self.tasks)

    @property
    def broadcast_updates_applied(self) -> int:
        return sum(t.elements_applied for t in self.tasks)

    @property
    def state_bytes_per_task(self) -> int:
        return max((t.state_bytes for t in self.tasks), default=0)

    @property
    def state_bytes_total(self) -> int:
        """State size x parallelism (every task holds its own copy)."""
        return self.state_bytes_per_task * self.parallelism

    @property
    def resident_copies(self) -> int:
        """Distinct Python workers holding a copy (workers are reused across tasks)."""
        return len({t.pid for t in self.tasks})

    @property
    def over_budget(self) -> bool:
        return self.state_bytes_total > self.budget_bytes

    @property
    def rows_in(self) -> int:
        return sum(t.rows_in for t in self.tasks)

    @property
    def rows_main(self) -> int:
        return sum(t.rows_main for t in self.tasks)

    def rows_side(self, tag: str) -> int:
        return sum(t.rows_side.get(tag, 0) for t in self.tasks)

    @property
    def rows_held(self) -> int:
        return self.rows_side("held")

    @property
    def process_seconds(self) -> float:
        return max((t.process_seconds + t.apply_seconds for t in self.tasks), default=0.0)

    def summary(self) -> dict[str, Any]:
        sides: dict[str, int] = {}
        for t in self.tasks:
            for k, v in t.rows_side.items():
                sides[k] = sides.get(k, 0) + v
        return {
            "state_version": self.state_version,
            "parallelism": self.parallelism,
            "resident_copies": self.resident_copies,
            "broadcast_updates_applied": self.broadcast_updates_applied,
            "cold_tasks": sum(t.cache == "cold" for t in self.tasks),
            "state_bytes_per_task": self.state_bytes_per_task,
            "state_bytes_total": self.state_bytes_total,
            "budget_bytes": self.budget_bytes,
            "over_budget": self.over_budget,
            "rows_in": self.rows_in,
            "rows_main": self.rows_main,
            "rows_side": sides,
            "refresh_seconds": round(self.refresh_seconds, 4),
            "max_task_seconds": round(self.process_seconds, 4),
            "new_elements": self.new_elements,
            "new_element_rows": self.new_element_rows,
        }


def check_budget(state_bytes_per_task: int, parallelism: int, budget_bytes: int,
                 what: str = "broadcast state") -> bool:
    """Warn (:class:`StateBudgetWarning`) when state x parallelism exceeds the budget."""
    total = state_bytes_per_task * parallelism
    if total > budget_bytes:
        warnings.warn(
            f"{what}: {state_bytes_per_task / 1e6:.1f} MB per task x {parallelism} tasks = "
            f"{total / 1e6:.1f} MB exceeds the budget of {budget_bytes / 1e6:.1f} MB; "
            "shrink the state (fewer columns/rows) or lower the parallelism",
            StateBudgetWarning,
            stacklevel=3,
        )
        return True
    return False
