"""The task side of a checkpoint: each task hashes ITS task-local state
(:func:`manifest_task`), then the writer task of each distinct content emits its entries
(:func:`content_task`).

Every task function here reads its input to the end: PySpark discards a Python worker
whose ``mapInArrow`` function returned early, and with it the task-local state cached in
that worker (the next batch would start cold)."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping

import pyarrow as pa

from lakecast.runtime.tasks import TaskPlan, acquire, cached_executor
from lakecast.snapshots.codec import SerializedState, serialize_state
from lakecast.snapshots.errors import CheckpointDivergenceError
from lakecast.snapshots.table import ENTRY

# ============================================================================ task side
#: per worker: (function id, chain key, id(store)) -> serialized states (reused by the
#: content job when it lands on the same worker)
_SERIALIZED: OrderedDict[tuple[str, str, int], dict[str, SerializedState]] = OrderedDict()

MANIFEST_SCHEMA = (
    "task INT, state STRING, content_hash STRING, n_entries LONG, bytes LONG, "
    "schema STRING, pid INT, cache STRING, state_bytes LONG, rows LONG"
)
#: stored rows per emitted record batch, and its byte budget
EMIT_ROWS, EMIT_BYTES = 10_000, 32 << 20


def _serialized(plan: TaskPlan) -> tuple[dict[str, SerializedState], str]:
    ex, status, _, _ = acquire(plan)
    key = (plan.function_id, plan.chain[-1].to_key if plan.chain else "", id(ex.store))
    cached = _SERIALIZED.get(key)
    if cached is None:
        cached = {name: serialize_state(name, st) for name, st in ex.store.states.items()}
        _SERIALIZED[key] = cached
        while len(_SERIALIZED) > 1:
            _SERIALIZED.popitem(last=False)
    return cached, status


def _task_index(batches: Iterator[pa.RecordBatch]) -> int | None:
    """The task's index (its first input row); reads the WHOLE input (see the module doc)."""
    task = None
    for b in batches:
        if task is None and b.num_rows:
            task = int(b.column(0)[0].as_py())
    return task


def manifest_task(plan: TaskPlan) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow body of the manifest job: this task's hash per state."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = _task_index(batches)
        if task is None:
            return
        states, status = _serialized(plan)
        cached = cached_executor(plan.function_id)
        nbytes = cached.store.nbytes() if cached is not None else 0
        rows = [{"task": task, "state": s.name, "content_hash": s.digest,
                 "n_entries": s.n_entries, "bytes": s.nbytes, "schema": s.schema_b64,
                 "pid": os.getpid(), "cache": status, "state_bytes": nbytes,
                 "rows": s.n_rows}
                for s in states.values()]
        yield pa.RecordBatch.from_pylist(rows, schema=pa.schema([
            ("task", pa.int32()), ("state", pa.string()), ("content_hash", pa.string()),
            ("n_entries", pa.int64()), ("bytes", pa.int64()), ("schema", pa.string()),
            ("pid", pa.int32()), ("cache", pa.string()), ("state_bytes", pa.int64()),
            ("rows", pa.int64())]))

    return run


ENTRY_ARROW = pa.schema([
    ("checkpoint_id", pa.int64()), ("kind", pa.string()), ("task", pa.int32()),
    ("state", pa.string()), ("seq", pa.int64()), ("key", pa.string()), ("value", pa.binary()),
    ("content_hash", pa.string()), ("n_entries", pa.int64()), ("meta", pa.string()),
    ("created_at_ms", pa.int64()),
])


def content_task(plan: TaskPlan, checkpoint_id: int, writers: Mapping[str, tuple[int, str]],
                 created_at_ms: int
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
            for lo, hi in _spans(s.values):
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


def _spans(values: list[bytes]) -> Iterator[tuple[int, int]]:
    """``[lo, hi)`` ranges of at most :data:`EMIT_ROWS` rows and about :data:`EMIT_BYTES`."""
    lo, size = 0, 0
    for i, v in enumerate(values):
        if i > lo and (i - lo >= EMIT_ROWS or size + len(v) > EMIT_BYTES):
            yield lo, i
            lo, size = i, 0
        size += len(v)
    if lo < len(values):
        yield lo, len(values)
