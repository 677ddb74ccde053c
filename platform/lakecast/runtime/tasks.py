"""The task side of :class:`~lakecast.runtime.broadcast.BroadcastRuntime`: what runs in a
Spark task's Python worker.

A task takes its function instance and broadcast state from a module-level cache in the
(reused) Python worker, keyed by the runtime's function id; a worker already at version
``v`` applies only the chain links after ``v``, in order (:func:`acquire`). It then
processes its share of the events and emits, after its outputs, one accounting row
(:data:`TASK_SIDE`): events in, rows out, cache status, state bytes, timings.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from lakecast.api.element import BroadcastElement
from lakecast.api.functions import BroadcastProcessFunction
from lakecast.delta.source import DeltaFilesElement
from lakecast.pipeline.contract import TASK_SIDE
from lakecast.runtime.executor import Collector, Executor, OutputLayout, version_json
from lakecast.runtime.metrics import TASK_ROW_SCHEMA, TaskMetrics


# ============================================================================ task side
@dataclass(frozen=True)
class ChainLink:
    """One increment of broadcast elements; its elements travel in one Spark broadcast."""

    to_key: str  # state version after the link (canonical JSON)
    to_version: dict[str, int]
    broadcast: Any  # pyspark Broadcast[list[BroadcastElement]] (or a list, in-process)
    n_elements: int
    n_rows: int
    nbytes: int
    #: ``nbytes`` per table (the budget's share of a sharded table, without the elements)
    table_bytes: Mapping[str, int] = field(default_factory=dict)

    def elements(self) -> list[BroadcastElement]:
        b = self.broadcast
        return b if isinstance(b, list) else b.value


@dataclass(frozen=True)
class TaskPlan:
    """Everything a task needs; pickled into the ``mapInArrow`` closure."""

    function_id: str
    function: BroadcastProcessFunction
    tables: tuple[str, ...]
    chain: tuple[ChainLink, ...]  # base first
    layout: OutputLayout
    timestamp_column: str | None = None
    watermark: int | None = None


@dataclass
class _Entry:
    executor: Executor
    key: str | None = None


#: the worker-local cache: function id -> (function instance, state, version)
_CACHE: OrderedDict[str, _Entry] = OrderedDict()
MAX_CACHED_FUNCTIONS = 4


def acquire(plan: TaskPlan) -> tuple[Executor, str, int, int]:
    """The task-local executor at the plan's target version: (executor, cache status,
    elements applied, rows applied)."""
    entry = _CACHE.get(plan.function_id)
    keys = [link.to_key for link in plan.chain]
    if entry is not None and entry.key in keys:
        start, status = keys.index(entry.key) + 1, "warm"
    else:
        executor = Executor(plan.function, plan.tables, namespace=plan.function_id)
        entry, start, status = _Entry(executor), 0, "cold"
    before_e, before_r = entry.executor.store.elements_applied, entry.executor.store.rows_applied
    _CACHE.pop(plan.function_id, None)  # a failure below must not leave a half-applied state
    for link in plan.chain[start:]:
        elements = link.elements()
        entry.executor.apply_broadcast(elements)
        entry.key = link.to_key
        for e in elements:  # rows read from files are in the state now: drop the copy
            if isinstance(e, DeltaFilesElement):
                e.release()
    _CACHE[plan.function_id] = entry
    while len(_CACHE) > MAX_CACHED_FUNCTIONS:
        _CACHE.popitem(last=False)
    ex = entry.executor
    ex.timestamp_column, ex.watermark = plan.timestamp_column, plan.watermark
    return (ex, status, ex.store.elements_applied - before_e, ex.store.rows_applied - before_r)


def executor_id() -> str:
    """The Spark executor this Python worker serves: ``SPARK_EXECUTOR_ID`` where Spark sets
    it (Kubernetes); on a standalone worker, the executor's folder in the worker's work dir
    (``<work-dir>/app-<id>/<executor id>/...``, the executor's working directory);
    ``"driver"`` otherwise (local mode: the tasks run in the driver)."""
    if os.environ.get("SPARK_EXECUTOR_ID"):
        return os.environ["SPARK_EXECUTOR_ID"]
    parts = Path(os.getcwd()).parts
    for i, part in enumerate(parts[:-1]):
        if part.startswith("app-"):
            return parts[i + 1]
    return "driver"


def run_task(plan: TaskPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The body of one Spark task: acquire the state, process every batch, then emit this
    task's accounting row (the :data:`~lakecast.pipeline.contract.TASK_SIDE` output)."""
    from pyspark import TaskContext

    t0 = time.perf_counter()
    ex, status, n_elements, n_rows = acquire(plan)
    apply_s = time.perf_counter() - t0
    version = version_json(ex.store.versions)
    expected = plan.chain[-1].to_key if plan.chain else version_json({})
    if version != expected:
        raise RuntimeError(f"task state is at {version}, the plan expects {expected}")
    rows_in = rows_main = 0
    sides: dict[str, int] = {}
    ex.store.begin_task()
    t1 = time.perf_counter()
    for batch in batches:
        rows_in += batch.num_rows
        collector = ex.process_batch(batch)
        yield from plan.layout.encode(collector, version)
        for item in collector.main:
            rows_main += _count(item)
        for name, items in collector.side.items():
            sides[name] = sides.get(name, 0) + sum(_count(i) for i in items)
    ctx = TaskContext.get()
    metrics = TaskMetrics(
        partition=ctx.partitionId() if ctx else -1,
        pid=os.getpid(),
        function_id=plan.function_id,
        cache=status,
        elements_applied=n_elements,
        rows_applied=n_rows,
        state_version=dict(ex.store.versions),
        state_bytes=ex.store.nbytes(),
        rows_in=rows_in,
        rows_main=rows_main,
        rows_side=sides,
        apply_seconds=apply_s,
        process_seconds=time.perf_counter() - t1,
        attempt=ctx.attemptNumber() if ctx else 0,
        executor=executor_id(),
        shards=ex.store.shards_read(),
    )
    accounting = Collector()
    accounting.side[TASK_SIDE] = [pa.RecordBatch.from_pylist([metrics.to_packed_row()],
                                                             schema=TASK_ROW_SCHEMA)]
    yield from plan.layout.encode(accounting, version)


WARM_SCHEMA = "cold int"


def warm_task(plan: TaskPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A task that only acquires the state at the plan's version (a warm-up before a first
    batch); one row: whether it had to build the state from scratch."""
    for _ in batches:
        pass
    ex, status, _, _ = acquire(plan)
    ex.store.prepare()
    yield pa.RecordBatch.from_pylist([{"cold": int(status == "cold")}],
                                     schema=pa.schema([("cold", pa.int32())]))


def _count(item: Any) -> int:
    if isinstance(item, Mapping):
        return 1
    return int(getattr(item, "num_rows", None) or len(item))


def cached_executor(function_id: str) -> Executor | None:
    """This worker's cached executor of ``function_id`` (``None`` when cold)."""
    entry = _CACHE.get(function_id)
    return None if entry is None else entry.executor


def cached_function_ids() -> list[str]:
    """Function ids cached in this Python process (for tests/diagnostics)."""
    return list(_CACHE)
