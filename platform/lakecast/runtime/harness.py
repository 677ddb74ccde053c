"""In-memory test harness: run a broadcast function without Spark (like PySpark's TwsTester).

::

    h = BroadcastTestHarness(MyFunction())
    h.process_broadcast_element(BroadcastElement.of("flags", 0, [{"name": "x", "on": True}]))
    assert h.process_elements([{"user_id": 1}]) == [{"user_id": 1, "x": True}]
    assert h.side_output(UNMATCHED) == []

It uses the same executor as the Spark runtime, so the same read-only rules apply:
any write to broadcast state from ``process_element`` / ``process_batch`` raises
:class:`~lakecast.api.ReadOnlyStateError`. Vectorized functions (``process_batch``) get
the events as one Arrow batch; their outputs come back as row dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from lakecast.api.descriptors import HELD, MapStateDescriptor, OutputTag
from lakecast.api.functions import BroadcastProcessFunction
from lakecast.runtime.executor import Collector, Executor


def _rows(items: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if isinstance(item, pa.RecordBatch | pa.Table):
            out.extend(item.to_pylist())
        elif hasattr(item, "dtypes") and hasattr(item, "to_dict"):
            out.extend(item.to_dict("records"))
        else:
            out.append(item)
    return out


class BroadcastTestHarness:
    """Feed events and broadcast elements to a function; inspect outputs and state."""

    def __init__(
        self,
        function: BroadcastProcessFunction,
        *,
        tables: Sequence[str] | None = None,
        table_schemas: Mapping[str, pa.Schema] | None = None,
        event_schema: pa.Schema | None = None,
        timestamp_column: str | None = None,
        watermark: int | None = None,
    ) -> None:
        if table_schemas:
            function.bind_tables(table_schemas)
        self.function = function
        self.event_schema = event_schema
        self.executor = Executor(
            function, tables, timestamp_column=timestamp_column, watermark=watermark
        )
        #: every main output so far, in order
        self.outputs: list[Any] = []
        self._side: dict[str, list[Any]] = {}

    def _collect(self, c: Collector) -> list[Any]:
        main = _rows(c.main)
        self.outputs.extend(main)
        for name, items in c.side.items():
            self._side.setdefault(name, []).extend(_rows(items))
        return main

    # -- input -------------------------------------------------------------------------
    def set_watermark(self, watermark: int | None) -> None:
        self.executor.watermark = watermark

    def process_broadcast_element(self, value: Any) -> list[Any]:
        """Apply one broadcast element; returns its main outputs (if any)."""
        return self._collect(self.executor.apply_broadcast([value]))

    def process_broadcast_elements(self, values: Iterable[Any]) -> list[Any]:
        """Apply several broadcast elements; Delta elements are applied in their total order."""
        return self._collect(self.executor.apply_broadcast(values))

    def process_element(self, value: Mapping[str, Any]) -> list[Any]:
        """Process one event; returns its main outputs."""
        return self.process_elements([value])

    def process_elements(self, values: Sequence[Mapping[str, Any]]) -> list[Any]:
        """Process events (one Arrow batch for vectorized functions); returns main outputs."""
        if self.function.is_vectorized():
            batch = pa.RecordBatch.from_pylist(list(values), schema=self.event_schema)
            return self._collect(self.executor.process_batch(batch))
        return self._collect(self.executor.process_rows(values))

    def process_batch(self, batch: pa.RecordBatch | pa.Table) -> list[Any]:
        """Process an Arrow batch of events (either form); returns main outputs as dicts."""
        if isinstance(batch, pa.Table):
            batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else \
                pa.RecordBatch.from_pylist([], schema=batch.schema)
        return self._collect(self.executor.process_batch(batch))

    # -- inspection --------------------------------------------------------------------
    def side_output(self, tag: OutputTag | str) -> list[Any]:
        """Everything emitted to side output ``tag`` so far."""
        return list(self._side.get(tag if isinstance(tag, str) else tag.name, []))

    @property
    def held(self) -> list[Any]:
        """Events held back so far (to be retried)."""
        return self.side_output(HELD)

    def take_held(self) -> list[Any]:
        """Remove and return the held events (to feed them again)."""
        return self._side.pop(HELD.name, [])

    def state(self, descriptor: MapStateDescriptor) -> dict[Any, Any]:
        """A plain-Python copy of one broadcast state."""
        return self.executor.store.snapshot()[self.executor.store.state(descriptor).descriptor.name]

    @property
    def state_version(self) -> dict[str, int]:
        return dict(self.executor.store.versions)

    @property
    def elements_applied(self) -> int:
        return self.executor.store.elements_applied
