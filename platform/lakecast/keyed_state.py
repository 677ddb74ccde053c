"""Keyed state: descriptors, TTL, the five primitives, their backend and serialization.

Primitives (Flink's names and methods): :class:`ValueState` (``value/update/clear``),
:class:`ListState` (``get/add/add_all/update/clear``), :class:`MapState`
(``get/put/put_all/remove/contains/keys/values/items/is_empty/clear``),
:class:`ReducingState` and :class:`AggregatingState` (``get/add/clear``). Each is a view
of the *current key's* state in a :class:`KeyedStateBackend`.

TTL (:class:`StateTtlConfig`) is processing-time based as in Flink: an entry (a value, a
list element, a map entry) expires ``ttl`` after its last write (``ON_CREATE_AND_WRITE``)
or last access (``ON_READ_AND_WRITE``); ``NEVER_RETURN_EXPIRED`` hides expired entries
before they are cleaned up. :meth:`KeyedStateBackend.expire` removes them (the runtime
calls it at every batch end: Flink's ``cleanupFullSnapshot``).

Serialization (:func:`encode_key`, :func:`decode_key`) stores values in plain form
(dataclasses as field dicts), so state survives adding or removing a field of a
dataclass value type; :func:`check_schema` refuses a changed field type (or a new field
without a default) with :class:`StateSchemaError` before any data is processed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import pickle
import sys
import typing
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from lakecast.api import MapStateDescriptor, StateDeclarationError
from lakecast.errors import LakecastError


class StateSchemaError(LakecastError):
    """Restored keyed state is incompatible with the declared state types."""


# =========================================================================== TTL
class UpdateType(enum.Enum):
    """When an entry's TTL restarts."""

    ON_CREATE_AND_WRITE = "on_create_and_write"
    ON_READ_AND_WRITE = "on_read_and_write"


class StateVisibility(enum.Enum):
    """Whether an expired entry that is not cleaned up yet may be returned."""

    NEVER_RETURN_EXPIRED = "never_return_expired"
    RETURN_EXPIRED_IF_NOT_CLEANED_UP = "return_expired_if_not_cleaned_up"


def _ms(value: int | float | dt.timedelta) -> int:
    return int(value.total_seconds() * 1000) if isinstance(value, dt.timedelta) else int(value)


@dataclass(frozen=True)
class StateTtlConfig:
    """Time-to-live of keyed state entries (processing time, milliseconds)."""

    ttl_ms: int
    update_type: UpdateType = UpdateType.ON_CREATE_AND_WRITE
    state_visibility: StateVisibility = StateVisibility.NEVER_RETURN_EXPIRED

    def __post_init__(self) -> None:
        if self.ttl_ms <= 0:
            raise ValueError(f"a TTL must be positive, got {self.ttl_ms} ms")

    @staticmethod
    def new_builder(ttl: int | float | dt.timedelta) -> _TtlBuilder:
        """Flink-style builder: ``StateTtlConfig.new_builder(timedelta(hours=1)).build()``."""
        return _TtlBuilder(_ms(ttl))


@dataclass
class _TtlBuilder:
    ttl_ms: int
    update_type: UpdateType = UpdateType.ON_CREATE_AND_WRITE
    state_visibility: StateVisibility = StateVisibility.NEVER_RETURN_EXPIRED

    def set_update_type(self, update_type: UpdateType) -> _TtlBuilder:
        self.update_type = update_type
        return self

    def set_state_visibility(self, visibility: StateVisibility) -> _TtlBuilder:
        self.state_visibility = visibility
        return self

    def build(self) -> StateTtlConfig:
        return StateTtlConfig(self.ttl_ms, self.update_type, self.state_visibility)


# =========================================================================== descriptors
@dataclass(eq=False)
class KeyedStateDescriptor:
    """Base of the keyed state descriptors: a name, a value type and an optional TTL."""

    name: str
    value_type: Any = object
    ttl: StateTtlConfig | None = field(default=None, kw_only=True)

    kind: typing.ClassVar[str] = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise StateDeclarationError(f"a {type(self).__name__} needs a name")

    def enable_time_to_live(self, ttl_config: StateTtlConfig) -> typing.Self:
        """Give this state a TTL (returns the descriptor, for chaining)."""
        self.ttl = ttl_config
        return self

    def type_schema(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": type_schema(self.value_type)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


@dataclass(eq=False, repr=False)
class ValueStateDescriptor(KeyedStateDescriptor):
    """One value per key."""

    kind: typing.ClassVar[str] = "value"


@dataclass(eq=False, repr=False)
class ListStateDescriptor(KeyedStateDescriptor):
    """A list of values per key (``value_type`` is the element type; TTL per element)."""

    kind: typing.ClassVar[str] = "list"


@dataclass(eq=False, repr=False)
class ReducingStateDescriptor(KeyedStateDescriptor):
    """One value per key, folded with ``reduce_function(a, b)`` on every ``add``."""

    reduce_function: Callable[[Any, Any], Any] = field(default=None, kw_only=True)  # type: ignore[assignment]
    kind: typing.ClassVar[str] = "reducing"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not callable(self.reduce_function):
            raise StateDeclarationError(f"{self.name!r}: reduce_function must be callable")


class AggregateFunction:
    """An incremental aggregation (Flink's ``AggregateFunction``): the accumulator is the
    stored state, :meth:`get_result` is what ``get()`` returns."""

    def create_accumulator(self) -> Any:
        raise NotImplementedError

    def add(self, value: Any, accumulator: Any) -> Any:
        raise NotImplementedError

    def get_result(self, accumulator: Any) -> Any:
        return accumulator

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError


@dataclass(eq=False, repr=False)
class AggregatingStateDescriptor(KeyedStateDescriptor):
    """An accumulator per key (``value_type`` is the accumulator type)."""

    aggregate_function: AggregateFunction = field(default=None, kw_only=True)  # type: ignore[assignment]
    kind: typing.ClassVar[str] = "aggregating"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.aggregate_function, AggregateFunction):
            raise StateDeclarationError(f"{self.name!r}: aggregate_function must be an "
                                        "AggregateFunction")


AnyDescriptor = KeyedStateDescriptor | MapStateDescriptor


def kind_of(descriptor: AnyDescriptor) -> str:
    return "map" if isinstance(descriptor, MapStateDescriptor) else descriptor.kind


def descriptor_schema(descriptor: AnyDescriptor) -> dict[str, Any]:
    """The stored schema of a keyed state (for compatibility checks on restore)."""
    if isinstance(descriptor, MapStateDescriptor):
        return {"kind": "map", "key": type_schema(descriptor.key_type),
                "value": type_schema(descriptor.value_type)}
    return descriptor.type_schema()


# =========================================================================== type schemas
def _type_name(t: Any) -> str:
    if isinstance(t, str):
        return t
    if typing.get_origin(t) is not None or isinstance(t, type(int | None)):
        return repr(t).replace("typing.", "")
    return getattr(t, "__name__", repr(t))


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # unresolvable annotations: compare their text
        return {f.name: f.type for f in dataclasses.fields(cls)}


def type_schema(t: Any) -> dict[str, Any]:
    """A JSON-able description of a state value type (dataclass fields, or the type name)."""
    if t is None or t is object or t is Any:
        return {"type": "any"}
    if dataclasses.is_dataclass(t) and isinstance(t, type):
        hints = _hints(t)
        return {"type": "dataclass", "name": t.__qualname__,
                "fields": {f.name: _type_name(hints.get(f.name, f.type))
                           for f in dataclasses.fields(t)}}
    return {"type": _type_name(t)}


def _compatible(where: str, stored: Mapping[str, Any], current: Mapping[str, Any],
                current_type: Any) -> None:
    if "any" in (stored.get("type"), current.get("type")):
        return
    if stored.get("type") == "dataclass" and current.get("type") == "dataclass":
        old, new = stored["fields"], current["fields"]
        changed = {f: (old[f], new[f]) for f in old.keys() & new.keys() if old[f] != new[f]}
        if changed:
            detail = ", ".join(f"{f}: {a} -> {b}" for f, (a, b) in sorted(changed.items()))
            raise StateSchemaError(
                f"{where}: field type changed ({detail}); restored state cannot be read. "
                "Add a new field instead, or migrate the state (rewind to an empty state)."
            )
        added = set(new) - set(old)
        no_default = [
            f.name for f in dataclasses.fields(current_type)
            if f.name in added and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if no_default:
            raise StateSchemaError(
                f"{where}: new fields {sorted(no_default)} have no default, so restored "
                "values cannot be upgraded; give them defaults"
            )
        return
    if stored.get("type") != current.get("type"):
        raise StateSchemaError(
            f"{where}: type changed from {stored.get('type')} to {current.get('type')}; "
            "restored state cannot be read"
        )


def check_schema(stored: Mapping[str, Any], descriptors: Iterable[AnyDescriptor]) -> None:
    """Raise :class:`StateSchemaError` when restored state (``stored``: state name ->
    :func:`descriptor_schema`) cannot be read with ``descriptors``. States that are no
    longer declared are dropped; newly declared ones start empty."""
    for d in descriptors:
        old = stored.get(d.name)
        if old is None:
            continue
        new = descriptor_schema(d)
        if old.get("kind") != new["kind"]:
            raise StateSchemaError(
                f"keyed state {d.name!r} was a {old.get('kind')} state and is now a "
                f"{new['kind']} state; restored state cannot be read"
            )
        if new["kind"] == "map":
            _compatible(f"keyed state {d.name!r} (map key)", old["key"], new["key"], d.key_type)
        _compatible(f"keyed state {d.name!r}", old["value"], new["value"], d.value_type)


def schema_json(descriptors: Iterable[AnyDescriptor]) -> str:
    """The canonical JSON of the keyed states' schemas (stored beside the state)."""
    return json.dumps({d.name: descriptor_schema(d) for d in descriptors}, sort_keys=True,
                      separators=(",", ":"))


def to_plain(value: Any) -> Any:
    """Plain form of a value: dataclasses become field dicts (recursively)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return type(value)(to_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    return value


def from_plain(plain: Any, t: Any) -> Any:
    """Rebuild a value of type ``t`` from its plain form; dataclass fields that are gone
    are dropped and new fields take their defaults."""
    if plain is None or not (dataclasses.is_dataclass(t) and isinstance(t, type)):
        return plain
    if not isinstance(plain, Mapping):
        return plain
    hints = _hints(t)
    kwargs = {}
    for f in dataclasses.fields(t):
        if f.name in plain and f.init:
            kwargs[f.name] = from_plain(plain[f.name], hints.get(f.name))
    return t(**kwargs)


# =========================================================================== the backend
@dataclass
class KeyEntry:
    """Everything one key holds: raw state per name and its timers."""

    states: dict[str, Any] = field(default_factory=dict)
    timers: set[tuple[str, int]] = field(default_factory=set)  # (domain, ts)

    def is_empty(self) -> bool:
        return not self.states and not self.timers


class KeyedStateBackend:
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
                      key=_sort_key)

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


def _sort_key(key: Any) -> tuple[str, str]:
    return (type(key).__name__, repr(key))


# =========================================================================== primitives
class _State:
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


class ValueState(_State):
    """One value of the current key."""

    def value(self) -> Any:
        return self._read_single()

    def update(self, value: Any) -> None:
        self._set(None if value is None else (value, self._now()))


class ListState(_State):
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


class MapState(_State):
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


class ReducingState(_State):
    """One value of the current key, folded with the descriptor's ``reduce_function``."""

    def get(self) -> Any:
        return self._read_single()

    def add(self, value: Any) -> None:
        current = self._current()
        fn = self.descriptor.reduce_function  # type: ignore[union-attr]
        self._set((value if current is None else fn(current, value), self._now()))


class AggregatingState(_State):
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
    return pickle.dumps({"k": key, "s": states, "t": sorted(entry.timers)}, protocol=5)


def decode_key(blob: bytes, descriptors: Mapping[str, AnyDescriptor]) -> tuple[Hashable, KeyEntry]:
    """Inverse of :func:`encode_key`; states no longer declared are dropped."""
    data = pickle.loads(blob)
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
