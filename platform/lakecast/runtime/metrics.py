"""Broadcast-state metrics: per task, per run, and the state-size budget.

The seeds' rule: total broadcast memory = state size x parallelism; keep it under
~100 MB. :attr:`RunMetrics.over_budget` is set on every run that exceeds the configured
budget; :func:`check_budget` also warns with :class:`StateBudgetWarning`, once per process
(:func:`warn_over_budget`): a pipeline over budget would otherwise warn on every batch.
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
    #: the Spark executor whose Python worker ran the task ("driver": local mode)
    executor: str = "driver"
    #: states the holder's cache evicted since its last run (the JVM lookups' LRU)
    evictions: int = 0
    #: the shards of sharded states the task read (:mod:`lakecast.runtime.sharded_state`)
    shards: list[int] = field(default_factory=list)

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

    def to_packed_row(self) -> dict[str, str]:
        """This task's accounting row as it travels (:data:`TASK_ROW_SCHEMA`: one JSON
        string, see :func:`unpack_task_row`)."""
        return {TASK_JSON: json.dumps(self.to_row(), sort_keys=True)}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TaskMetrics:
        row = unpack_task_row(row)
        d = {k: row[k] for k in TASK_FIELDS if k in row}
        d["partition"] = d.pop("task")
        d["rows_in"] = d.pop("events_in")
        d["rows_side"] = json.loads(d["rows_side"] or "{}")
        d["state_version"] = json.loads(d["state_version"] or "{}")
        return cls(**d)


#: the fields of a broadcast task's accounting row (:meth:`TaskMetrics.to_row`)
TASK_FIELDS = ("task", "pid", "function_id", "cache", "elements_applied", "rows_applied",
               "state_version", "state_bytes", "events_in", "rows_main", "rows_side",
               "apply_seconds", "process_seconds", "attempt", "executor", "evictions",
               "shards")
TASK_JSON = "task_json"
#: the accounting row a broadcast task emits after its outputs (see
#: :mod:`lakecast.pipeline.contract`), as it travels: ONE JSON string. Every main row
#: carries this side output's struct as a null; a struct of one string costs ~4 bytes a
#: row where the 15 typed fields cost ~94 (each child array is written at full length),
#: which was ~190 MB of nulls through Arrow for 2M events.
TASK_ROW_SCHEMA = pa.schema([(TASK_JSON, pa.string())])


def unpack_task_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """An accounting row as a dict of its fields, from its travelling form (one JSON
    string) or as is (already unpacked, or a runtime whose rows travel as fields)."""
    if TASK_JSON in row:
        return dict(json.loads(row[TASK_JSON]))
    return dict(row)


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
    def executors(self) -> list[str]:
        """Distinct Spark executors whose Python workers ran the tasks."""
        return sorted({t.executor for t in self.tasks})

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
    def shards_per_task(self) -> int:
        """The most shards of sharded states one task read (0: none is sharded)."""
        return max((len(t.shards) for t in self.tasks), default=0)

    @property
    def rows_routed(self) -> int:
        """Events shuffled to the tasks of their keys' shards (0: none is sharded)."""
        return self.rows_in if any(t.shards for t in self.tasks) else 0

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
            "cold_build_seconds": round(max((t.apply_seconds for t in self.tasks
                                             if t.cache == "cold"), default=0.0), 4),
            "executors": len(self.executors),
            "state_evictions": sum(t.evictions for t in self.tasks),
            "shards_per_task": self.shards_per_task,
            "rows_routed": self.rows_routed,
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


BUDGET_FIX = ("shrink the state (fewer columns/rows), lower the parallelism, or shard the "
              "table (Lookup(..., shards=N): each task keeps one shard)")
"""What to do about a state over budget (in the warning and wherever it is reported)."""

#: the kinds of over-budget warning this process has already given
_warned: set[str] = set()


def warn_over_budget(kind: str, message: str, stacklevel: int = 3) -> bool:
    """Warn ``message`` as a :class:`StateBudgetWarning` if no warning of ``kind`` was given
    in this process yet (the numbers change from batch to batch, so Python's own
    once-per-location filter would let every batch warn); returns whether it warned."""
    if kind in _warned:
        return False
    _warned.add(kind)
    warnings.warn(f"{message} (warned once per process)", StateBudgetWarning,
                  stacklevel=stacklevel + 1)
    return True


def reset_budget_warnings() -> None:
    """Forget the warnings given: the next run over budget warns again (for tests)."""
    _warned.clear()


def format_bytes(n: float) -> str:
    """``n`` bytes in MB (one decimal), or in kB below 0.1 MB."""
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def budget_message(state_bytes_per_task: int, parallelism: int, budget_bytes: int,
                   what: str = "broadcast state") -> str:
    """State x parallelism against the budget, with the fix."""
    total = state_bytes_per_task * parallelism
    return (f"{what}: {format_bytes(state_bytes_per_task)} per task x {parallelism} tasks = "
            f"{format_bytes(total)} exceeds the budget of {format_bytes(budget_bytes)}; "
            f"{BUDGET_FIX}")


def check_budget(state_bytes_per_task: int, parallelism: int, budget_bytes: int,
                 what: str = "broadcast state") -> bool:
    """Whether state x parallelism exceeds the budget; the first time in a process it
    does, warn (:class:`StateBudgetWarning`)."""
    if state_bytes_per_task * parallelism > budget_bytes:
        warn_over_budget(what, budget_message(state_bytes_per_task, parallelism, budget_bytes,
                                              what))
        return True
    return False
