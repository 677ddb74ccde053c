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
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lakecast.api.descriptors import MapStateDescriptor, StateDeclarationError
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

