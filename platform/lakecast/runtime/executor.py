"""The Spark-free core: one function instance, its task-local state, and the two contexts.

:class:`Executor` is shared by the in-memory harness and the Spark runtime so both
enforce the same rules: broadcast elements are applied in order with a read-write
:class:`~lakecast.api.Context`, events are processed with a read-only
:class:`~lakecast.api.ReadOnlyContext`, and missing state is routed by policy.
:class:`OutputLayout` turns main and side outputs into ONE Arrow schema (an
``_output`` tag column, and one struct column per side output) so a Spark job gets
every output from a single pass.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from lakecast.api.descriptors import (
    HELD,
    UNMATCHED,
    BroadcastOrderError,
    MapStateDescriptor,
    OutputTag,
    StateDeclarationError,
)
from lakecast.api.element import BroadcastElement, order_elements
from lakecast.api.functions import BroadcastProcessFunction, Context, ReadOnlyContext
from lakecast.api.read_only import ReadOnlyBroadcastState
from lakecast.api.state import BroadcastState
from lakecast.runtime.state_store import StateStore

OUTPUT_COLUMN = "_output"
VERSION_COLUMN = "_state_version"
SIDE_PREFIX = "_side_"


def to_epoch_ms(value: Any) -> int | None:
    """Epoch milliseconds of a datetime / date / number (``None`` stays ``None``)."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return int(value.timestamp() * 1000)
    if isinstance(value, dt.date):
        return int(dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC).timestamp()
                   * 1000)
    return int(value)


def version_json(versions: Mapping[str, int]) -> str:
    """The canonical lineage string of a state version, e.g. ``{"dim_users":7}``."""
    return json.dumps(dict(sorted(versions.items())), separators=(",", ":"))


@dataclass
class Collector:
    """Outputs of one call: main items and side items per tag name."""

    main: list[Any] = field(default_factory=list)
    side: dict[str, list[Any]] = field(default_factory=dict)

    def add_side(self, tag: OutputTag, value: Any) -> None:
        self.side.setdefault(tag.name, []).append(value)


class _ContextBase:
    def __init__(self, executor: Executor) -> None:
        self._ex = executor
        self._ts: int | None = None
        self._collector = Collector()

    def timestamp(self) -> int | None:
        return self._ts

    def current_processing_time(self) -> int:
        return int(time.time() * 1000)

    def current_watermark(self) -> int | None:
        return self._ex.watermark

    def output(self, tag: OutputTag, value: Any) -> None:
        if tag.name not in self._ex.tag_names:
            raise StateDeclarationError(
                f"side output {tag.name!r} is not declared in output_tags() of "
                f"{type(self._ex.function).__name__}"
            )
        self._collector.add_side(tag, value)

    def state_version(self) -> dict[str, int]:
        return dict(self._ex.store.versions)

    def state_available(self) -> bool:
        return self._ex.state_available()


class TaskReadOnlyContext(_ContextBase, ReadOnlyContext):
    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> ReadOnlyBroadcastState:
        return self._ex.read_only_state(descriptor)


class TaskBroadcastContext(_ContextBase, Context):
    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> BroadcastState:
        return self._ex.store.state(descriptor)


def as_items(result: Any) -> list[Any]:
    if result is None:
        return []
    if isinstance(result, pa.RecordBatch | pa.Table | Mapping) or hasattr(result, "dtypes"):
        return [result]
    return list(result)


class Executor:
    """One task-local function instance with its broadcast state.

    ``tables``: the broadcast table names the state is built from (for
    "state available" and the state version). ``None`` in the harness means "every
    table that delivered an element so far".
    """

    def __init__(
        self,
        function: BroadcastProcessFunction,
        tables: Sequence[str] | None = None,
        *,
        timestamp_column: str | None = None,
        watermark: int | None = None,
        namespace: str | None = None,
    ) -> None:
        self.function = function
        self.tables = list(tables) if tables is not None else None
        self.timestamp_column = timestamp_column
        self.watermark = watermark
        self.store = StateStore(function.state_descriptors(), namespace)
        self.tag_names = {t.name for t in function.side_output_tags()}
        self._ro_views: dict[str, ReadOnlyBroadcastState] = {}
        function.open()

    # -- state -----------------------------------------------------------------------
    def read_only_state(self, descriptor: MapStateDescriptor) -> ReadOnlyBroadcastState:
        view = self._ro_views.get(descriptor.name)
        if view is None or view.descriptor != descriptor:
            view = ReadOnlyBroadcastState(self.store.state(descriptor))
            self._ro_views[descriptor.name] = view
        return view

    def state_available(self) -> bool:
        if self.tables is None:
            return bool(self.store.versions) or self.store.elements_applied > 0
        return all(t in self.store.versions for t in self.tables)

    def apply_broadcast(self, elements: Iterable[Any], order: bool = True) -> Collector:
        """Apply broadcast elements with a read-write context.

        Delta elements are put in their total order first (``order``); an element at or
        below the table's applied version is skipped (re-delivery), a gap raises.
        Other values (harness) are applied as they come.
        """
        items = list(elements)
        delta = [e for e in items if isinstance(e, BroadcastElement)]
        if order and delta:
            others = [e for e in items if not isinstance(e, BroadcastElement)]
            items = order_elements(delta) + others
        ctx = self.broadcast_context()
        for e in items:
            if isinstance(e, BroadcastElement):
                applied = self.store.versions.get(e.table)
                if applied is not None and e.version <= applied:
                    continue
                if e.kind == "changes" and applied is not None and e.version != applied + 1:
                    raise BroadcastOrderError(
                        f"{e.table}: got changes of version {e.version} while at version "
                        f"{applied}; versions {applied + 1}..{e.version - 1} are missing"
                    )
                ctx._ts = e.commit_timestamp
            else:
                ctx._ts = None
            ctx._collector.main.extend(as_items(self.function.process_broadcast_element(e, ctx)))
            if isinstance(e, BroadcastElement):
                self.store.versions[e.table] = e.version
                self.store.rows_applied += e.num_rows
            self.store.elements_applied += 1
        return ctx._collector

    def broadcast_context(self) -> TaskBroadcastContext:
        """The read-write context of the broadcast side (the keyed executor extends it)."""
        return TaskBroadcastContext(self)

    # -- events ----------------------------------------------------------------------
    def process_batch(self, batch: pa.RecordBatch) -> Collector:
        """Process a batch of events (Arrow) with a read-only context."""
        ctx = TaskReadOnlyContext(self)
        fn = self.function
        if not self.state_available() and fn.missing_state != "default":
            tag = UNMATCHED if fn.missing_state == "unmatched" else HELD
            ctx._collector.add_side(tag, batch)
            return ctx._collector
        if fn.is_vectorized():
            arg: Any = batch.to_pandas() if fn.batch_format == "pandas" else batch
            ctx._collector.main.extend(as_items(fn.process_batch(arg, ctx)))
            return ctx._collector
        tcol = self.timestamp_column
        for row in batch.to_pylist():
            ctx._ts = to_epoch_ms(row.get(tcol)) if tcol else None
            out = fn.process_element(row, ctx)
            if out is not None:
                ctx._collector.main.extend(as_items(out))
        return ctx._collector

    def process_rows(self, rows: Sequence[Mapping[str, Any]]) -> Collector:
        """Per-element entry point for plain Python rows (the harness)."""
        return self._run_rows(rows, TaskReadOnlyContext(self))

    def _run_rows(self, rows: Sequence[Mapping[str, Any]], ctx: TaskReadOnlyContext) -> Collector:
        """``process_element`` over rows in order with ``ctx``, or every row to the
        missing-state side output while the broadcast state is not available."""
        fn = self.function
        if not self.state_available() and fn.missing_state != "default":
            tag = UNMATCHED if fn.missing_state == "unmatched" else HELD
            for r in rows:
                ctx._collector.add_side(tag, dict(r))
            return ctx._collector
        tcol = self.timestamp_column
        for row in rows:
            ctx._ts = to_epoch_ms(row.get(tcol)) if tcol else None
            ctx._collector.main.extend(as_items(fn.process_element(dict(row), ctx)))
        return ctx._collector


# --------------------------------------------------------------------------- output layout
def _nullable(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_nullable(True) for f in schema])


def const_string(value: str, n: int) -> pa.Array:
    """A string array of ``n`` copies of ``value``, built without a Python loop."""
    b = value.encode()
    size = len(b)
    if n * size >= 2**31 - 1:
        return pa.array([value] * n, pa.string())
    offsets = np.arange(0, (n + 1) * size, size, dtype=np.int32) if size else np.zeros(
        n + 1, dtype=np.int32
    )
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b * n)]
    )


def to_batches(items: Sequence[Any], schema: pa.Schema) -> list[pa.RecordBatch]:
    """Convert output items (row dicts, Arrow batches/tables, pandas frames) to ``schema``."""
    out: list[pa.RecordBatch] = []
    rows: list[Mapping[str, Any]] = []

    def flush_rows() -> None:
        if rows:
            out.append(pa.RecordBatch.from_pylist(list(rows), schema=schema))
            rows.clear()

    for item in items:
        if isinstance(item, Mapping):
            rows.append(item)
            continue
        flush_rows()
        if isinstance(item, pa.RecordBatch | pa.Table):
            t = item
        elif hasattr(item, "dtypes"):
            t = pa.Table.from_pandas(item, preserve_index=False)
        else:
            raise TypeError(
                f"output items must be row mappings, Arrow batches/tables or pandas frames, "
                f"got {type(item).__name__}"
            )
        missing = [f.name for f in schema if f.name not in t.schema.names]
        if missing:
            raise ValueError(f"output is missing columns {missing} of its schema {schema}")
        t = t.select(schema.names)
        if t.schema != schema:
            t = t.cast(schema)
        out.extend(t.to_batches() if isinstance(t, pa.Table) else [t])
    flush_rows()
    return [b for b in out if b.num_rows]


@dataclass(frozen=True)
class OutputLayout:
    """One Arrow schema carrying the main output and every side output.

    Columns: the main output's columns, ``_output`` (``NULL`` for main rows, else the
    side output's name), one struct column ``_side_<tag>`` per side output and, last,
    ``_state_version`` (lineage JSON, if enabled: last, so the Spark runtime appends it
    as a literal with one ``withColumn``).
    """

    main: pa.Schema
    sides: dict[str, pa.Schema]
    lineage: bool = True

    @classmethod
    def of(
        cls, function: BroadcastProcessFunction, input_schema: pa.Schema, lineage: bool = True
    ) -> OutputLayout:
        main = _nullable(function.output_schema(input_schema))
        for reserved in (OUTPUT_COLUMN, VERSION_COLUMN):
            if reserved in main.names:
                raise ValueError(f"{reserved!r} is a reserved output column name")
        sides = {
            t.name: _nullable(t.schema if t.schema is not None else input_schema)
            for t in function.side_output_tags()
        }
        return cls(main, sides, lineage)

    @property
    def schema(self) -> pa.Schema:
        fields = [*list(self.main), pa.field(OUTPUT_COLUMN, pa.string())]
        fields += [pa.field(SIDE_PREFIX + n, pa.struct(list(s))) for n, s in self.sides.items()]
        if self.lineage:
            fields.append(pa.field(VERSION_COLUMN, pa.string()))
        return pa.schema(fields)

    def encode(self, collector: Collector, version: str) -> Iterable[pa.RecordBatch]:
        """The collector's outputs as record batches of :attr:`schema`."""
        schema = self.schema
        for b in to_batches(collector.main, self.main):
            n = b.num_rows
            cols = [*list(b.columns), pa.nulls(n, pa.string())]
            cols += [pa.nulls(n, pa.struct(list(s))) for s in self.sides.values()]
            if self.lineage:
                cols.append(const_string(version, n))
            yield pa.RecordBatch.from_arrays(cols, schema=schema)
        for name, items in collector.side.items():
            for b in to_batches(items, self.sides[name]):
                n = b.num_rows
                cols = [pa.nulls(n, f.type) for f in self.main] + [const_string(name, n)]
                for other, s in self.sides.items():
                    if other == name:
                        cols.append(pa.StructArray.from_arrays(b.columns, fields=list(s)))
                    else:
                        cols.append(pa.nulls(n, pa.struct(list(s))))
                if self.lineage:
                    cols.append(const_string(version, n))
                yield pa.RecordBatch.from_arrays(cols, schema=schema)
