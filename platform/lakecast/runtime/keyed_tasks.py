"""The task side of :class:`~lakecast.runtime.keyed.KeyedBroadcastRuntime`: the keyed
state rows' layout, the ``__meta__`` row (:class:`StateMeta`), and :func:`run_keyed_task`,
what one Spark task runs over its key groups (the table itself:
:mod:`lakecast.runtime.keyed_store`)."""

from __future__ import annotations

import json
import os
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from lakecast.api.descriptors import UNMATCHED
from lakecast.api.element import BroadcastElement
from lakecast.api.keyed import KeyedBroadcastProcessFunction
from lakecast.delta.source import DeltaFilesElement
from lakecast.errors import LakecastError
from lakecast.runtime.executor import Collector, OutputLayout
from lakecast.runtime.keyed_executor import EVENT, PROC, KeyedExecutor, fork_store
from lakecast.runtime.tasks import TaskPlan

KIND, GROUP, KEY, STATE = "_kind", "_key_group", "_key", "_state"
NEXT_EVENT, NEXT_PROC, EXPIRES = "_next_event_timer", "_next_proc_timer", "_expires_at"
BATCH, DUE = "_batch", "_due"  # the batch that wrote a state row; whether it needs this batch
META_KEY = "__meta__"
STATE_SIDE, TASK_SIDE = "_keyed_state", "_task"
INTERNAL_SIDES = (STATE_SIDE, TASK_SIDE)

STATE_SCHEMA = pa.schema([
    (GROUP, pa.int32()), (KEY, pa.string()), (STATE, pa.binary()),
    (NEXT_EVENT, pa.int64()), (NEXT_PROC, pa.int64()), (EXPIRES, pa.int64()),
])
TASK_SCHEMA = pa.schema([
    ("task", pa.int32()), ("events_in", pa.int64()), ("state_rows_in", pa.int64()),
    ("keys_held", pa.int64()), ("changed_keys", pa.int64()), ("deleted_keys", pa.int64()),
    ("expired_entries", pa.int64()), ("timers_fired", pa.int64()),
    ("broadcast_elements", pa.int64()), ("state_bytes", pa.int64()),
    ("broadcast_state_bytes", pa.int64()), ("cache", pa.string()), ("pid", pa.int64()),
    ("seconds", pa.float64()),
])


class KeyedStateError(LakecastError):
    """The keyed state table cannot be used for this batch."""


@dataclass(frozen=True)
class StateMeta:
    """What the keyed state at one Delta version has seen."""

    batch_id: int = -1
    watermark: int | None = None
    processing_time: int = 0
    broadcast_versions: dict[str, int] = field(default_factory=dict)
    schemas: tuple[str, ...] = ()
    key_groups: int = 0

    def to_json(self) -> str:
        return json.dumps({**self.__dict__, "schemas": list(self.schemas)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> StateMeta:
        d = json.loads(text)
        d["schemas"] = tuple(d.get("schemas", ()))
        return cls(**d)


# ============================================================================ task side
#: worker-local cache: function id -> (executor replaying broadcast state, chain key)
_KEYED_CACHE: OrderedDict[str, tuple[KeyedExecutor, str | None]] = OrderedDict()
MAX_CACHED_FUNCTIONS = 4


def _acquire_keyed(plan: TaskPlan) -> tuple[KeyedExecutor, str]:
    """Broadcast state at the end of ``plan.chain`` from the worker cache (warm: apply only
    the links after the cached version). Replays have no keyed effects and no outputs."""
    fn = plan.function
    assert isinstance(fn, KeyedBroadcastProcessFunction)
    keys = [link.to_key for link in plan.chain]
    cached = _KEYED_CACHE.pop(plan.function_id, None)
    if cached is not None and (cached[1] in keys or (cached[1] is None and not keys)):
        ex, start, status = cached[0], (keys.index(cached[1]) + 1 if cached[1] else 0), "warm"
    else:
        ex, start, status = KeyedExecutor(fn, plan.tables), 0, "cold"
    ex.keyed_effects = False
    key = cached[1] if status == "warm" else None
    for link in plan.chain[start:]:
        elements = link.elements()
        ex.apply_broadcast(elements)
        for e in elements:  # rows read from files are in the state now: drop the copy
            if isinstance(e, DeltaFilesElement):
                e.release()
        key = link.to_key
    _KEYED_CACHE[plan.function_id] = (ex, key)
    while len(_KEYED_CACHE) > MAX_CACHED_FUNCTIONS:
        _KEYED_CACHE.popitem(last=False)
    return ex, status


@dataclass(frozen=True)
class KeyedTaskPlan:
    """What a keyed task needs (pickled into the ``mapInArrow`` closure)."""

    prefix: TaskPlan  # broadcast state up to V_prev (the worker cache's chain)
    new_elements: Any  # Broadcast[list[BroadcastElement]] | list: elements in (V_prev, V]
    event_columns: tuple[str, ...]
    layout: OutputLayout
    version: str  # lineage JSON of V
    watermark_before: int | None
    watermark: int | None
    processing_time: int
    all_keys_loaded: bool

    def elements(self) -> list[BroadcastElement]:
        b = self.new_elements
        return b if isinstance(b, list) else b.value


def _merge_into(out: Collector, c: Collector) -> None:
    out.main.extend(c.main)
    for name, items in c.side.items():
        out.side.setdefault(name, []).extend(items)


def run_keyed_task(plan: KeyedTaskPlan, batches: Iterator[pa.RecordBatch]
                   ) -> Iterator[pa.RecordBatch]:
    """One Spark task: restore keys, apply new broadcast elements, process, fire, persist.

    State rows come first, each key's rows oldest first (a changelog): a key's newest row
    is its state (a null state: deleted). A key is restored when its newest row is due
    (or every key is needed), else only when its events arrive."""
    from pyspark import TaskContext

    t0 = time.perf_counter()
    base, status = _acquire_keyed(plan.prefix)
    fn = plan.prefix.function
    assert isinstance(fn, KeyedBroadcastProcessFunction)
    ex = KeyedExecutor(fn, plan.prefix.tables, timestamp_column=plan.prefix.timestamp_column,
                       watermark=plan.watermark_before, processing_time=plan.processing_time,
                       store=fork_store(base.store))
    ctx = TaskContext.get()
    ex.task_index = ctx.partitionId() if ctx else 0
    ex.all_keys_loaded = plan.all_keys_loaded
    ids: dict[Any, tuple[int, str]] = {}  # key -> (key group, key string)
    newest: dict[str, tuple[int, bytes | None, bool]] = {}  # key string -> (group, state, due)
    pending: dict[str, tuple[int, bytes]] = {}  # not due: restored when its events come
    counts = {"events_in": 0, "state_rows_in": 0, "timers_fired": 0}
    applied = False
    null_key_tag = UNMATCHED.name
    cols = list(plan.event_columns)

    def restore() -> None:
        for k, (g, blob, due) in newest.items():
            if blob is None:
                continue  # a tombstone: the key holds nothing
            if due or plan.all_keys_loaded:
                ids[ex.load_key(blob)] = (g, k)
            else:
                pending[k] = (g, blob)
        newest.clear()

    def apply_new() -> Iterator[pa.RecordBatch]:
        restore()
        elements = plan.elements()
        if elements:
            yield from plan.layout.encode(ex.apply_broadcast(elements), plan.version)

    for batch in batches:
        kinds = batch.column(KIND).to_pylist()
        n_state = kinds.count(0)
        if n_state:
            state_rows = batch.slice(0, n_state)
            for g, k, blob, due in zip(state_rows.column(GROUP).to_pylist(),
                                       state_rows.column(KEY).to_pylist(),
                                       state_rows.column(STATE).to_pylist(),
                                       state_rows.column(DUE).to_pylist(), strict=True):
                newest[k] = (g, blob, bool(due))  # oldest first: the newest row wins
            counts["state_rows_in"] += n_state
        if n_state == batch.num_rows:
            continue
        if not applied:
            applied = True
            yield from apply_new()
        events = batch.slice(n_state)
        counts["events_in"] += events.num_rows
        rows = events.select(cols).to_pylist()
        groups = events.column(GROUP).to_pylist()
        keystr = events.column(KEY).to_pylist()
        out = Collector()
        start = 0
        for i in range(1, len(rows) + 1):
            if i < len(rows) and keystr[i] == keystr[start]:
                continue
            if keystr[start] is None:  # a null key has no state: unmatched, never dropped
                out.side.setdefault(null_key_tag, []).extend(rows[start:i])
            else:
                if keystr[start] in pending:
                    ex.load_key(pending.pop(keystr[start])[1])
                key = fn.get_key(rows[start])
                ids[key] = (groups[start], keystr[start])
                _merge_into(out, ex.process_key(key, rows[start:i]))
            start = i
        yield from plan.layout.encode(out, plan.version)
    if not applied:
        yield from apply_new()
    before = sum(len(e.timers) for e in ex.keyed.entries.values())
    fired = ex.fire_timers(watermark=plan.watermark, processing_time=plan.processing_time)
    yield from plan.layout.encode(fired, plan.version)
    counts["timers_fired"] = before - sum(len(e.timers) for e in ex.keyed.entries.values())
    expired = ex.keyed.expire()
    # one row per changed key: its new state, or a tombstone
    changed = sorted(ex.keyed.dirty, key=lambda k: ids.get(k, (0, ""))[1])
    g_col, k_col, s_col, ne, np_, exp = [], [], [], [], [], []
    deleted = 0
    for key in changed:
        if key not in ids:
            raise KeyedStateError(f"key {key!r} was written but never read in this task")
        blob = ex.dump_key(key)
        deleted += blob is None
        g_col.append(ids[key][0])
        k_col.append(ids[key][1])
        s_col.append(blob)
        ne.append(ex.next_timer(key, EVENT))
        np_.append(ex.next_timer(key, PROC))
        exp.append(ex.keyed.expires_at(key))
    side = Collector()
    if changed:
        side.side[STATE_SIDE] = [pa.RecordBatch.from_arrays(
            [pa.array(g_col, pa.int32()), pa.array(k_col, pa.string()),
             pa.array(s_col, pa.binary()), pa.array(ne, pa.int64()), pa.array(np_, pa.int64()),
             pa.array(exp, pa.int64())], schema=STATE_SCHEMA)]
    size = ex.keyed.size()
    side.side[TASK_SIDE] = [pa.RecordBatch.from_pylist([{
        "task": ex.task_index, "events_in": counts["events_in"],
        "state_rows_in": counts["state_rows_in"], "keys_held": size["keys"],
        "changed_keys": len(changed), "deleted_keys": deleted, "expired_entries": expired,
        "timers_fired": counts["timers_fired"], "broadcast_elements": len(plan.elements()),
        "state_bytes": size["bytes"], "broadcast_state_bytes": ex.store.nbytes(),
        "cache": status, "pid": os.getpid(), "seconds": time.perf_counter() - t0,
    }], schema=TASK_SCHEMA)]
    yield from plan.layout.encode(side, plan.version)
