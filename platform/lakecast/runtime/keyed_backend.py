"""The keyed state of one task: :class:`KeyedStateBackend`, the five primitives that view
the current key's state in it, and per-key serialization (:func:`encode_key`,
:func:`decode_key`). They implement the API's interfaces
(:mod:`lakecast.api.keyed_primitives`): the runtime hands a backend to the contexts it
gives a function. Descriptors, TTL and schema evolution are in
:mod:`lakecast.api.keyed_state`."""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from lakecast.api import keyed_primitives as api
from lakecast.api import typed
from lakecast.api.descriptors import MapStateDescriptor, StateDeclarationError
from lakecast.api.keyed_state import (
    AnyDescriptor,
    KeyedStateDescriptor,
    StateTtlConfig,
    StateVisibility,
    UpdateType,
    descriptor_schema,
    from_plain,
    kind_of,
    to_plain,
)


# =========================================================================== the backend
@dataclass
class KeyEntry:
    """Everything one key holds: raw state per name and its timers."""

    states: dict[str, Any] = field(default_factory=dict)
    timers: set[tuple[str, int]] = field(default_factory=set)  # (domain, ts)

    def is_empty(self) -> bool:
        return not self.states and not self.timers


class KeyedStateBackend(api.KeyedStateAccess):
    """The keyed state of one task: ``{key: KeyEntry}``, scoped by :attr:`current_key`.

    Raw layout per state kind (``ts`` = the entry's last TTL refresh, processing ms):
    value/reducing/aggregating ``(value, ts)``; list ``[(value, ts), ...]``;
    map ``{user_key: (value, ts)}``. Keys whose entries were touched are in
    :attr:`dirty` (the runtime persists exactly those).
    """

    def __init__(self, descriptors: Iterable[AnyDescriptor],
                 clock: Callable[[], int]) -> None:
        self.descriptors: dict[str, AnyDescriptor] = {}
        for d in descriptors:
            if d.name in self.descriptors:
                raise StateDeclarationError(f"keyed state {d.name!r} is declared twice")
            if not isinstance(d, KeyedStateDescriptor | MapStateDescriptor):
                raise StateDeclarationError(f"{d!r} is not a keyed state descriptor")
            self.descriptors[d.name] = d
        self.clock = clock
        self.entries: dict[Hashable, KeyEntry] = {}
        self.current_key: Hashable | None = None
        self.has_key = False
        self.dirty: set[Hashable] = set()
        self._views: dict[str, Any] = {}

    # -- scoping ---------------------------------------------------------------------
    def set_current_key(self, key: Hashable) -> None:
        self.current_key, self.has_key = key, True

    def clear_current_key(self) -> None:
        self.current_key, self.has_key = None, False

    def entry(self, create: bool = False) -> KeyEntry | None:
        if not self.has_key:
            raise StateDeclarationError(
                "keyed state is only accessible with a current key: in process_element, "
                "on_timer, or inside apply_to_keyed_state"
            )
        e = self.entries.get(self.current_key)
        if e is None and create:
            e = self.entries[self.current_key] = KeyEntry()
        return e

    def touch(self) -> None:
        self.dirty.add(self.current_key)
        e = self.entries.get(self.current_key)
        if e is not None and e.is_empty():
            del self.entries[self.current_key]

    def view(self, descriptor: AnyDescriptor) -> Any:
        """The state object of ``descriptor``, scoped to the current key."""
        declared = self.descriptors.get(descriptor.name)
        if declared is None:
            raise StateDeclarationError(
                f"keyed state {descriptor.name!r} is not declared in keyed_state_descriptors() "
                f"(declared: {sorted(self.descriptors)})"
            )
        if declared is not descriptor and descriptor_schema(declared) != descriptor_schema(
                descriptor):
            raise StateDeclarationError(f"keyed state {descriptor.name!r} is used with a "
                                        "descriptor that differs from the declared one")
        v = self._views.get(declared.name)
        if v is None:
            v = self._views[declared.name] = _VIEWS[kind_of(declared)](self, declared)
        return v

    def keys_with(self, descriptor: AnyDescriptor) -> list[Hashable]:
        """Keys holding state ``descriptor``, in a deterministic order."""
        return sorted((k for k, e in self.entries.items() if descriptor.name in e.states),
                      key=sort_key)

    # -- TTL -------------------------------------------------------------------------
    @staticmethod
    def expired(ttl: StateTtlConfig | None, ts: int, now: int) -> bool:
        return ttl is not None and ts + ttl.ttl_ms <= now

    def expire(self) -> int:
        """Remove every expired entry (all keys); returns how many were removed."""
        now = self.clock()
        removed = 0
        for key in list(self.entries):
            e = self.entries[key]
            for name in list(e.states):
                d = self.descriptors.get(name)
                if d is None or d.ttl is None:
                    continue
                raw = e.states[name]
                kind = kind_of(d)
                if kind == "list":
                    keep = [(v, t) for v, t in raw if not self.expired(d.ttl, t, now)]
                    removed += len(raw) - len(keep)
                    changed = len(keep) != len(raw)
                    if keep:
                        e.states[name] = keep
                    else:
                        del e.states[name]
                elif kind == "map":
                    keep_m = {k: (v, t) for k, (v, t) in raw.items()
                              if not self.expired(d.ttl, t, now)}
                    removed += len(raw) - len(keep_m)
                    changed = len(keep_m) != len(raw)
                    if keep_m:
                        e.states[name] = keep_m
                    else:
                        del e.states[name]
                else:
                    changed = self.expired(d.ttl, raw[1], now)
                    if changed:
                        del e.states[name]
                        removed += 1
                if changed:
                    self.dirty.add(key)
            if e.is_empty():
                del self.entries[key]
                self.dirty.add(key)
        return removed

    def expires_at(self, key: Hashable) -> int | None:
        """When the key's first TTL entry expires (``None``: nothing expires)."""
        e = self.entries.get(key)
        if e is None:
            return None
        times: list[int] = []
        for name, raw in e.states.items():
            d = self.descriptors.get(name)
            if d is None or d.ttl is None:
                continue
            kind = kind_of(d)
            stamps = ([t for _, t in raw] if kind == "list" else
                      [t for _, t in raw.values()] if kind == "map" else [raw[1]])
            times.extend(t + d.ttl.ttl_ms for t in stamps)
        return min(times) if times else None

    # -- size ------------------------------------------------------------------------
    def size(self) -> dict[str, int]:
        """Keys, entries (values + list elements + map entries), timers, approx. bytes."""
        entries = timers = 0
        for e in self.entries.values():
            timers += len(e.timers)
            for name, raw in e.states.items():
                kind = kind_of(self.descriptors[name]) if name in self.descriptors else "value"
                entries += len(raw) if kind in ("list", "map") else 1
        sample = list(self.entries.items())[:200]
        per_key = (sum(len(encode_key(k, e)) for k, e in sample) / len(sample)) if sample else 0
        return {"keys": len(self.entries), "entries": entries, "timers": timers,
                "bytes": int(per_key * len(self.entries) + sys.getsizeof(self.entries))}


def sort_key(key: Any) -> tuple[str, str]:
    return (type(key).__name__, repr(key))


# =========================================================================== primitives
class _State(api.State):
    def __init__(self, backend: KeyedStateBackend, descriptor: AnyDescriptor) -> None:
        self._b = backend
        self.descriptor = descriptor
        self._ttl = descriptor.ttl

    @property
    def name(self) -> str:
        return self.descriptor.name

    def _raw(self) -> Any:
        e = self._b.entry()
        return None if e is None else e.states.get(self.descriptor.name)

    def _set(self, raw: Any) -> None:
        e = self._b.entry(create=True)
        assert e is not None
        if raw is None or raw == [] or raw == {}:
            e.states.pop(self.descriptor.name, None)
        else:
            e.states[self.descriptor.name] = raw
        self._b.touch()

    def _now(self) -> int:
        return self._b.clock()

    def _visible(self, ts: int) -> bool:
        if not KeyedStateBackend.expired(self._ttl, ts, self._now()):
            return True
        assert self._ttl is not None
        return self._ttl.state_visibility is StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP

    def _refresh_on_read(self) -> bool:
        return self._ttl is not None and self._ttl.update_type is UpdateType.ON_READ_AND_WRITE

    def clear(self) -> None:
        """Remove this state of the current key."""
        if self._raw() is not None:
            self._set(None)

    def _current(self) -> Any:
        """The single stored value if visible, without refreshing its TTL."""
        raw = self._raw()
        return None if raw is None or not self._visible(raw[1]) else raw[0]

    def _read_single(self) -> Any:
        """The single stored value (value/reducing/aggregating), TTL-aware."""
        raw = self._raw()
        if raw is None or not self._visible(raw[1]):
            return None
        if self._refresh_on_read():
            self._set((raw[0], self._now()))
        return raw[0]


class ValueState(_State, api.ValueState):
    """One value of the current key."""

    def value(self) -> Any:
        return self._read_single()

    def update(self, value: Any) -> None:
        self._set(None if value is None else (value, self._now()))


class ListState(_State, api.ListState):
    """A list of values of the current key (TTL per element)."""

    def get(self) -> list[Any]:
        raw = self._raw() or []
        items = [(v, t) for v, t in raw if self._visible(t)]
        if self._refresh_on_read() and items:
            now = self._now()
            self._set([(v, now) for v, _ in items])
        return [v for v, _ in items]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.get())

    def add(self, value: Any) -> None:
        self._set([*(self._raw() or []), (value, self._now())])

    def add_all(self, values: Iterable[Any]) -> None:
        now = self._now()
        self._set([*(self._raw() or []), *((v, now) for v in values)])

    def update(self, values: Iterable[Any]) -> None:
        now = self._now()
        self._set([(v, now) for v in values])


class MapState(_State, api.MapState):
    """A map of the current key (TTL per entry)."""

    def _items(self) -> dict[Any, tuple[Any, int]]:
        return dict(self._raw() or {})

    def get(self, key: Hashable, default: Any = None) -> Any:
        items = self._items()
        hit = items.get(key)
        if hit is None or not self._visible(hit[1]):
            return default
        if self._refresh_on_read():
            items[key] = (hit[0], self._now())
            self._set(items)
        return hit[0]

    def contains(self, key: Hashable) -> bool:
        hit = self._items().get(key)
        return hit is not None and self._visible(hit[1])

    __contains__ = contains

    def put(self, key: Hashable, value: Any) -> None:
        items = self._items()
        items[key] = (value, self._now())
        self._set(items)

    def put_all(self, entries: Mapping[Any, Any]) -> None:
        items, now = self._items(), self._now()
        items.update({k: (v, now) for k, v in entries.items()})
        self._set(items)

    def remove(self, key: Hashable) -> None:
        items = self._items()
        if key in items:
            del items[key]
            self._set(items)

    def items(self) -> list[tuple[Any, Any]]:
        return [(k, v) for k, (v, t) in self._items().items() if self._visible(t)]

    def keys(self) -> list[Any]:
        return [k for k, _ in self.items()]

    def values(self) -> list[Any]:
        return [v for _, v in self.items()]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())

    def is_empty(self) -> bool:
        return not self.items()


class ReducingState(_State, api.ReducingState):
    """One value of the current key, folded with the descriptor's ``reduce_function``."""

    def get(self) -> Any:
        return self._read_single()

    def add(self, value: Any) -> None:
        current = self._current()
        fn = self.descriptor.reduce_function  # type: ignore[union-attr]
        self._set((value if current is None else fn(current, value), self._now()))


class AggregatingState(_State, api.AggregatingState):
    """An accumulator of the current key (``get()`` returns the aggregate's result)."""

    def get(self) -> Any:
        acc = self._read_single()
        if acc is None:
            return None
        return self.descriptor.aggregate_function.get_result(acc)  # type: ignore[union-attr]

    def add(self, value: Any) -> None:
        agg = self.descriptor.aggregate_function  # type: ignore[union-attr]
        acc = self._current()
        if acc is None:
            acc = agg.create_accumulator()
        self._set((agg.add(value, acc), self._now()))


_VIEWS: dict[str, type[_State]] = {
    "value": ValueState, "list": ListState, "map": MapState,
    "reducing": ReducingState, "aggregating": AggregatingState,
}


# =========================================================================== serialization
def encode_key(key: Hashable, entry: KeyEntry) -> bytes:
    """One key's state and timers as bytes (values in plain form, see :func:`to_plain`)."""
    states: dict[str, Any] = {}
    for name, raw in entry.states.items():
        if isinstance(raw, list):
            states[name] = [(to_plain(v), t) for v, t in raw]
        elif isinstance(raw, dict):
            states[name] = {to_plain(k): (to_plain(v), t) for k, (v, t) in raw.items()}
        else:
            states[name] = (to_plain(raw[0]), raw[1])
    try:
        return typed.dumps({"k": key, "s": states, "t": sorted(entry.timers)})
    except TypeError as e:
        raise TypeError(f"keyed state of key {key!r}: {e} cannot be stored; keyed state "
                        "holds scalars, str, bytes, dicts, lists, tuples, sets, dates, "
                        "Decimals or dataclasses") from None


def decode_key(blob: bytes, descriptors: Mapping[str, AnyDescriptor]) -> tuple[Hashable, KeyEntry]:
    """Inverse of :func:`encode_key`; states no longer declared are dropped."""
    try:
        data = typed.loads(blob)  # typed JSON: data, never code
    except ValueError as e:
        raise ValueError(
            f"a keyed state row is not typed JSON ({e}): it was written by an older Lakecast "
            "(pickled) or tampered with, and is never unpickled; rebuild the keyed state "
            "table (rewind or reset the pipeline)") from None
    entry = KeyEntry(timers={(d, int(t)) for d, t in data["t"]})
    for name, raw in data["s"].items():
        d = descriptors.get(name)
        if d is None:
            continue
        kind = kind_of(d)
        if kind == "list":
            entry.states[name] = [(from_plain(v, d.value_type), t) for v, t in raw]
        elif kind == "map":
            assert isinstance(d, MapStateDescriptor)
            entry.states[name] = {from_plain(k, d.key_type): (from_plain(v, d.value_type), t)
                                  for k, (v, t) in raw.items()}
        else:
            entry.states[name] = (from_plain(raw[0], d.value_type), raw[1])
    return data["k"], entry
