"""The Spark-free core of keyed broadcast processing, shared by the harness and the runtime.

:class:`KeyedExecutor` extends the broadcast :class:`~lakecast.runtime.executor.Executor` with a
:class:`~lakecast.runtime.keyed_backend.KeyedStateBackend`, timers, a watermark and a processing
clock. Order of work in one step (a micro-batch, or a harness call):

1. broadcast elements (read-write broadcast state; ``apply_to_keyed_state`` visits every
   key held here), only when :attr:`KeyedExecutor.keyed_effects` is on — a replay that
   merely rebuilds broadcast state has no keyed effects and no outputs;
2. events, key by key, each key's events in order (:meth:`KeyedExecutor.process_key`);
3. timers: event-time timers up to the new watermark, processing-time timers up to the
   processing time, in (time, key) order; timers registered while firing fire too if due
   (:meth:`KeyedExecutor.fire_timers`);
4. TTL cleanup of every expired entry
   (:meth:`~lakecast.runtime.keyed_backend.KeyedStateBackend.expire`).
"""

from __future__ import annotations

import copy
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from lakecast.api.descriptors import MapStateDescriptor, StateDeclarationError
from lakecast.api.keyed import (
    KeyedBroadcastProcessFunction,
    KeyedContext,
    KeyedReadOnlyContext,
    KeyedStateFunction,
    OnTimerContext,
    TimeDomain,
    TimerRegistrationError,
    TimerService,
)
from lakecast.api.keyed_state import AnyDescriptor, check_schema
from lakecast.runtime.executor import (
    Collector,
    Executor,
    TaskBroadcastContext,
    TaskReadOnlyContext,
    as_items,
)
from lakecast.runtime.keyed_backend import (
    KeyedStateBackend,
    KeyEntry,
    decode_key,
    encode_key,
    sort_key,
)
from lakecast.runtime.state_store import StateStore

EVENT, PROC = TimeDomain.EVENT_TIME.value, TimeDomain.PROCESSING_TIME.value


class _KeyTimers(TimerService):
    def __init__(self, ex: KeyedExecutor) -> None:
        self._ex = ex

    def current_processing_time(self) -> int:
        return self._ex.processing_time

    def current_watermark(self) -> int | None:
        return self._ex.watermark

    def _entry(self) -> KeyEntry:
        e = self._ex.keyed.entry(create=True)
        assert e is not None
        return e

    def _change(self, domain: str, ts: int, add: bool) -> None:
        e = self._entry()
        (e.timers.add if add else e.timers.discard)((domain, int(ts)))
        self._ex.keyed.touch()

    def register_event_time_timer(self, timestamp: int) -> None:
        self._change(EVENT, timestamp, True)

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._change(PROC, timestamp, True)

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._change(EVENT, timestamp, False)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._change(PROC, timestamp, False)


class _NoTimers(_KeyTimers):
    def _change(self, domain: str, ts: int, add: bool) -> None:
        raise TimerRegistrationError(
            "timers can only be registered in process_element or on_timer: a broadcast "
            "element has no key to own a timer (as in Flink)"
        )


class _KeyedROCtx(TaskReadOnlyContext, KeyedReadOnlyContext):
    _ex: KeyedExecutor

    def current_processing_time(self) -> int:
        return self._ex.processing_time

    def keyed_state_access(self) -> KeyedStateBackend:
        return self._ex.keyed  # the task's keyed state, handed to the API's context

    def task_index(self) -> int:
        return self._ex.task_index

    def timer_service(self) -> TimerService:
        return _KeyTimers(self._ex)


class _OnTimerCtx(_KeyedROCtx, OnTimerContext):
    _domain: TimeDomain = TimeDomain.EVENT_TIME

    def time_domain(self) -> TimeDomain:
        return self._domain


class _KeyedCtx(TaskBroadcastContext, KeyedContext):
    _ex: KeyedExecutor

    def current_processing_time(self) -> int:
        return self._ex.processing_time

    def timer_service(self) -> TimerService:
        return _NoTimers(self._ex)

    def task_index(self) -> int:
        return self._ex.task_index

    def apply_to_keyed_state(self, descriptor: AnyDescriptor,
                             function: KeyedStateFunction) -> None:
        ex = self._ex
        if not ex.keyed_effects:
            return  # a replay that only rebuilds broadcast state
        if not ex.all_keys_loaded:
            raise StateDeclarationError(
                f"{type(ex.function).__name__}.visits_keyed_state_on_broadcast is False, so "
                "this task does not hold every key's state; set it to True to use "
                "apply_to_keyed_state"
            )
        b = ex.keyed
        state = b.view(descriptor)
        try:
            for key in b.keys_with(descriptor):
                b.set_current_key(key)
                function(key, state)
        finally:
            b.clear_current_key()


def fork_store(store: StateStore) -> StateStore:
    """A copy of broadcast state that can be advanced without touching ``store``.

    States keep immutable parts (Arrow tables, indexes, frozen values) shared and copy
    their mutable containers, so a fork costs O(entries of dict states), not a deep copy.
    """
    new = copy.copy(store)
    new.versions = dict(store.versions)
    new.states = {}
    for name, s in store.states.items():
        c = copy.copy(s)
        for attr, value in vars(s).items():
            if isinstance(value, dict | set | list):
                setattr(c, attr, copy.copy(value))
            elif isinstance(value, np.ndarray):
                setattr(c, attr, value.copy())
        new.states[name] = c
    return new


class KeyedExecutor(Executor):
    """One task's keyed function: broadcast state, keyed state, timers and clocks."""

    function: KeyedBroadcastProcessFunction

    def __init__(
        self,
        function: KeyedBroadcastProcessFunction,
        tables: Sequence[str] | None = None,
        *,
        timestamp_column: str | None = None,
        watermark: int | None = None,
        processing_time: int = 0,
        store: StateStore | None = None,
    ) -> None:
        if not isinstance(function, KeyedBroadcastProcessFunction):
            raise TypeError(f"{type(function).__name__} is not a KeyedBroadcastProcessFunction")
        function.key_columns()  # fail early without key_by
        super().__init__(function, tables, timestamp_column=timestamp_column, watermark=watermark)
        if store is not None:
            self.store = store
        self.processing_time = processing_time
        self.keyed = KeyedStateBackend(function.keyed_state_descriptors(),
                                       clock=lambda: self.processing_time)
        #: whether broadcast elements act on keyed state and emit outputs (off in replays)
        self.keyed_effects = True
        #: whether every key's state is loaded (apply_to_keyed_state needs it)
        self.all_keys_loaded = True
        #: index of the parallel task (Spark partition id)
        self.task_index = 0

    def broadcast_context(self) -> _KeyedCtx:
        return _KeyedCtx(self)

    # -- events ----------------------------------------------------------------------
    def process_key(self, key: Hashable, rows: Sequence[Mapping[str, Any]]) -> Collector:
        """Process one key's events, in the given order, with its keyed state."""
        self.keyed.set_current_key(key)
        try:
            return self._run_rows(rows, _KeyedROCtx(self))
        finally:
            self.keyed.clear_current_key()

    def process_rows(self, rows: Sequence[Mapping[str, Any]]) -> Collector:
        """Events in arrival order (the harness): each goes to its key's state."""
        out = Collector()
        for row in rows:
            c = self.process_key(self.function.get_key(row), [row])
            out.main.extend(c.main)
            for name, items in c.side.items():
                out.side.setdefault(name, []).extend(items)
        return out

    def process_batch(self, batch: Any) -> Collector:
        return self.process_rows(batch.to_pylist())

    # -- timers ----------------------------------------------------------------------
    def _due(self, domain: str, bound: int | None) -> list[tuple[int, Hashable]]:
        if bound is None:
            return []
        due = [(ts, k) for k, e in self.keyed.entries.items() for d, ts in e.timers
               if d == domain and ts <= bound]
        due.sort(key=lambda tk: (tk[0], sort_key(tk[1])))
        return due

    def fire_timers(self, watermark: int | None = None,
                    processing_time: int | None = None) -> Collector:
        """Advance the watermark / processing time (never backwards) and fire due timers."""
        if watermark is not None and (self.watermark is None or watermark > self.watermark):
            self.watermark = watermark
        if processing_time is not None and processing_time > self.processing_time:
            self.processing_time = processing_time
        out = Collector()
        ctx = _OnTimerCtx(self)
        ctx._collector = out
        b = self.keyed
        for domain, bound in ((EVENT, self.watermark), (PROC, self.processing_time)):
            ctx._domain = TimeDomain(domain)
            while due := self._due(domain, bound):
                for ts, key in due:
                    e = b.entries.get(key)
                    if e is None or (domain, ts) not in e.timers:
                        continue  # deleted by an earlier timer of this round
                    e.timers.discard((domain, ts))
                    b.set_current_key(key)
                    b.touch()
                    ctx._ts = ts
                    try:
                        out.main.extend(as_items(self.function.on_timer(ts, ctx)))
                    finally:
                        b.clear_current_key()
        return out

    # -- persistence -----------------------------------------------------------------
    def dump_key(self, key: Hashable) -> bytes | None:
        """The key's serialized state (``None``: the key holds nothing any more)."""
        e = self.keyed.entries.get(key)
        return None if e is None or e.is_empty() else encode_key(key, e)

    def load_key(self, blob: bytes) -> Hashable:
        key, entry = decode_key(blob, self.keyed.descriptors)
        if not entry.is_empty():
            self.keyed.entries[key] = entry
        return key

    def check_restored_schema(self, stored: Mapping[str, Any]) -> None:
        check_schema(stored, self.keyed.descriptors.values())

    def next_timer(self, key: Hashable, domain: str) -> int | None:
        e = self.keyed.entries.get(key)
        times = [ts for d, ts in e.timers if d == domain] if e else []
        return min(times) if times else None


def keyed_descriptors(function: KeyedBroadcastProcessFunction) -> list[Any]:
    """The keyed descriptors of a function, validated (no clash with broadcast names)."""
    broadcast = {d.name for d in function.state_descriptors()}
    keyed = list(function.keyed_state_descriptors())
    clash = broadcast & {d.name for d in keyed}
    if clash:
        raise StateDeclarationError(f"state names {sorted(clash)} are both broadcast and keyed")
    for d in keyed:
        if isinstance(d, MapStateDescriptor) and d.key_columns:
            raise StateDeclarationError(f"keyed map state {d.name!r} cannot have key_columns")
    return keyed

