"""In-memory test harness for keyed broadcast functions (no Spark), like PySpark's TwsTester.

::

    h = KeyedBroadcastTestHarness(FraudDetector(), timestamp_column="ts")
    h.process_broadcast_element(BroadcastElement.of("fraud_rules", 0, rules))
    h.process_elements(transactions)          # routed to each key's state, in order
    h.advance_watermark(60_000)               # fires event-time timers
    h.set_processing_time(3_600_000)          # fires processing-time timers, ages TTL
    assert h.outputs == [...]
    assert h.keyed_state(LAST, "u1") == 12.5

The same :class:`~lakecast.runtime.keyed_executor.KeyedExecutor` runs inside Spark tasks, so
read-only broadcast state, timer rules and TTL behave the same. :meth:`snapshot` and
:meth:`restore` round-trip the keyed state through its serialized form (with the schema
check), so state schema evolution can be unit-tested too.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from lakecast.api.descriptors import MapStateDescriptor
from lakecast.api.keyed import KeyedBroadcastProcessFunction
from lakecast.api.keyed_state import KeyedStateDescriptor, kind_of, schema_json
from lakecast.runtime.harness import BroadcastTestHarness
from lakecast.runtime.keyed_executor import KeyedExecutor, keyed_descriptors


class KeyedBroadcastTestHarness(BroadcastTestHarness):
    """Feed events, broadcast elements and time to a keyed function; inspect everything.

    Inherits the inputs (``process_broadcast_element(s)``, ``process_element(s)`` — each
    event goes to its key's state) and ``outputs`` / ``side_output`` / ``held``."""

    executor: KeyedExecutor

    def __init__(
        self,
        function: KeyedBroadcastProcessFunction,
        *,
        tables: Sequence[str] | None = None,
        table_schemas: Mapping[str, pa.Schema] | None = None,
        timestamp_column: str | None = None,
        processing_time: int = 0,
        watermark: int | None = None,
    ) -> None:
        keyed_descriptors(function)
        if table_schemas:
            function.bind_tables(table_schemas)
        self.function = function
        self.event_schema = None
        self.executor = KeyedExecutor(function, tables, timestamp_column=timestamp_column,
                                      watermark=watermark, processing_time=processing_time)
        self.outputs: list[Any] = []
        self._side: dict[str, list[Any]] = {}

    def advance_watermark(self, watermark: int) -> list[Any]:
        """Move the watermark forward and fire due event-time timers; returns their outputs."""
        return self._collect(self.executor.fire_timers(watermark=watermark))

    def set_processing_time(self, processing_time: int) -> list[Any]:
        """Move processing time forward (TTL ages with it) and fire due processing-time
        timers; returns their outputs."""
        return self._collect(self.executor.fire_timers(processing_time=processing_time))

    def expire(self) -> int:
        """Clean up every expired TTL entry now (the runtime does it at each batch end)."""
        return self.executor.keyed.expire()

    # -- inspection --------------------------------------------------------------------
    def keys(self, descriptor: KeyedStateDescriptor | MapStateDescriptor | None = None
             ) -> list[Hashable]:
        """Keys holding any state (or state ``descriptor``), in a deterministic order."""
        b = self.executor.keyed
        if descriptor is not None:
            return b.keys_with(descriptor)
        return sorted(b.entries, key=lambda k: (type(k).__name__, repr(k)))

    def keyed_state(self, descriptor: KeyedStateDescriptor | MapStateDescriptor,
                    key: Hashable) -> Any:
        """What the state holds for ``key`` right now (as the function would read it,
        without refreshing TTL): a value, a list, or a dict."""
        b = self.executor.keyed
        e = b.entries.get(key)
        raw = None if e is None else e.states.get(descriptor.name)
        kind = kind_of(descriptor)
        if raw is None:
            return [] if kind == "list" else {} if kind == "map" else None
        now, ttl = b.clock(), descriptor.ttl

        def visible(t: int) -> bool:
            return not b.expired(ttl, t, now)

        if kind == "list":
            return [v for v, t in raw if visible(t)]
        if kind == "map":
            return {k: v for k, (v, t) in raw.items() if visible(t)}
        value = raw[0] if visible(raw[1]) else None
        if kind == "aggregating" and value is not None:
            return descriptor.aggregate_function.get_result(value)  # type: ignore[union-attr]
        return value

    def timers(self, key: Hashable) -> list[tuple[str, int]]:
        e = self.executor.keyed.entries.get(key)
        return sorted(e.timers) if e else []

    def state_size(self) -> dict[str, int]:
        return self.executor.keyed.size()

    @property
    def broadcast_state_version(self) -> dict[str, int]:
        return dict(self.executor.store.versions)

    def broadcast_state(self, descriptor: MapStateDescriptor) -> dict[Any, Any]:
        return self.executor.store.snapshot()[descriptor.name]

    # -- persistence -------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The keyed state in its stored form: ``{"schema": json, "keys": [bytes, ...]}``."""
        ex = self.executor
        blobs = [ex.dump_key(k) for k in self.keys()]
        return {"schema": schema_json(ex.keyed.descriptors.values()),
                "keys": [b for b in blobs if b is not None],
                "watermark": ex.watermark, "processing_time": ex.processing_time}

    @classmethod
    def restore(cls, function: KeyedBroadcastProcessFunction, snapshot: Mapping[str, Any],
                **options: Any) -> KeyedBroadcastTestHarness:
        """A harness whose keyed state is restored from :meth:`snapshot` (checks the schema
        first: :class:`~lakecast.api.keyed_state.StateSchemaError` on a breaking change)."""
        import json

        options.setdefault("processing_time", snapshot.get("processing_time", 0))
        options.setdefault("watermark", snapshot.get("watermark"))
        h = cls(function, **options)
        h.executor.check_restored_schema(json.loads(snapshot["schema"]))
        for blob in snapshot["keys"]:
            h.executor.load_key(blob)
        return h
