"""Drive a keyed example step by step: in the in-memory harness or on Spark + Delta.

A scenario is a list of :class:`Step`: the broadcast table's full contents after the
step (``None``: unchanged), the step's events and its processing time. Both drivers
follow the runtime's per-batch order: new broadcast versions, events (per key in
``(ts, order columns)`` order), the watermark (``max ts - delay``) with its event-time
timers, then processing time and TTL cleanup.

A table change is written as Delta commits the way a pipeline would: the first version
as a full write, then one MERGE of the new and changed rows and one DELETE of the rows
that are gone. The harness receives the same versions as
:class:`~lakecast.api.element.BroadcastElement` values (full, then CDF-style changes).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lakecast.api.element import BroadcastElement
from lakecast.api.keyed import KeyedBroadcastProcessFunction
from lakecast.delta import io as delta_io
from lakecast.runtime.executor import VERSION_COLUMN
from lakecast.runtime.keyed_harness import KeyedBroadcastTestHarness

Row = dict[str, Any]


@dataclass(frozen=True)
class Step:
    """One micro-batch: a new table version (or ``None``), events and processing time."""

    table: list[Row] | None
    events: list[Row]
    processing_time: int


@dataclass
class Outputs:
    """Main and side outputs collected over several steps."""

    main: list[Row] = field(default_factory=list)
    side: dict[str, list[Row]] = field(default_factory=dict)

    def extend(self, other: Outputs) -> None:
        self.main.extend(other.main)
        for name, rows in other.side.items():
            self.side.setdefault(name, []).extend(rows)


def sorted_rows(rows: Sequence[Mapping[str, Any]]) -> list[Row]:
    """Rows as plain dicts in a canonical order (to compare outputs as multisets)."""
    return sorted((dict(r) for r in rows), key=lambda r: sorted((k, repr(v)) for k, v in
                                                                r.items()))


def table_changes(old: Sequence[Row] | None, new: Sequence[Row], key: str
                  ) -> tuple[list[Row], list[Row]]:
    """(rows new or changed, rows deleted) going from table ``old`` to table ``new``."""
    before = {r[key]: r for r in old or ()}
    after = {r[key]: r for r in new}
    upserts = [r for k, r in after.items() if before.get(k) != r]
    deletes = [r for k, r in before.items() if k not in after]
    return upserts, deletes


def event_order(events: Sequence[Row], order_columns: Sequence[str]) -> list[Row]:
    """Events in ``(ts, order columns)`` order."""
    return sorted(events, key=lambda e: (e["ts"], *(e[c] for c in order_columns)))


class HarnessDriver:
    """Runs a scenario in :class:`KeyedBroadcastTestHarness`, one :meth:`step` at a time."""

    def __init__(self, function: KeyedBroadcastProcessFunction, *, table: str, key: str,
                 order_columns: Sequence[str], watermark_delay_ms: int = 0) -> None:
        self.harness = KeyedBroadcastTestHarness(function, timestamp_column="ts")
        self.tags = [t.name for t in function.side_output_tags()]
        self.table, self.key = table, key
        self.order_columns = tuple(order_columns)
        self.delay = watermark_delay_ms
        self.version = -1
        self.rows: list[Row] | None = None
        self.watermark: int | None = None
        self.outputs = Outputs()

    def elements(self, new: list[Row]) -> list[BroadcastElement]:
        """The broadcast elements bringing the table from its current rows to ``new``."""
        out: list[BroadcastElement] = []
        if self.rows is None:
            self.version += 1
            out.append(BroadcastElement.of(self.table, self.version, new, kind="full"))
        else:
            upserts, deletes = table_changes(self.rows, new, self.key)
            known = {r[self.key] for r in self.rows}
            if upserts:
                self.version += 1
                types = ["update_postimage" if r[self.key] in known else "insert"
                         for r in upserts]
                out.append(BroadcastElement.of(self.table, self.version, upserts,
                                               kind="changes", change_type=types))
            if deletes:
                self.version += 1
                out.append(BroadcastElement.of(self.table, self.version, deletes,
                                               kind="changes", change_type="delete"))
        self.rows = list(new)
        return out

    def step(self, step: Step) -> Outputs:
        """Run one step; returns its outputs (also accumulated in :attr:`outputs`)."""
        h = self.harness
        main_before = len(h.outputs)
        side_before = {n: len(h.side_output(n)) for n in self.tags}
        # The step's clock: state written in this step is stamped with its time. The
        # examples use no processing-time timers, so setting it first fires nothing.
        h.set_processing_time(step.processing_time)
        if step.table is not None:
            h.process_broadcast_elements(self.elements(step.table))
        if step.events:
            h.process_elements(event_order(step.events, self.order_columns))
            top = max(e["ts"] for e in step.events) - self.delay
            self.watermark = top if self.watermark is None else max(self.watermark, top)
            h.advance_watermark(self.watermark)
        h.expire()
        got = Outputs(main=list(h.outputs[main_before:]),
                      side={n: h.side_output(n)[side_before[n]:] for n in self.tags
                            if len(h.side_output(n)) > side_before[n]})
        self.outputs.extend(got)
        return got

    def run(self, steps: Sequence[Step]) -> Outputs:
        for s in steps:
            self.step(s)
        return self.outputs


def write_table_version(spark: Any, path: str, old: Sequence[Row] | None, new: Sequence[Row],
                        key: str, schema: str) -> None:
    """Commit ``new`` as the table's next contents: a full write the first time, then a
    MERGE of new/changed rows and a DELETE of removed keys (each only if needed)."""
    columns = [f.strip().split()[0] for f in schema.split(",")]

    def frame(rows: Sequence[Row]) -> Any:
        return spark.createDataFrame([tuple(r[c] for c in columns) for r in rows], schema)

    if old is None:
        delta_io.write(frame(new), path, mode="overwrite")
        return
    upserts, deletes = table_changes(old, new, key)
    if upserts:
        delta_io.merge_upsert(spark, frame(upserts), path, [key])
    if deletes:
        keys = ", ".join(repr(r[key]) for r in deletes)
        delta_io.delete(spark, path, f"{key} IN ({keys})")


class SparkDriver:
    """Runs a scenario with :class:`~lakecast.runtime.keyed.KeyedBroadcastRuntime`."""

    def __init__(self, spark: Any, function: KeyedBroadcastProcessFunction, *, root: str,
                 table: str, key: str, table_schema: str, event_schema: str,
                 order_columns: Sequence[str], side_tags: Sequence[str] = (),
                 watermark_delay_ms: int = 0) -> None:
        from lakecast.runtime.keyed import KeyedBroadcastRuntime

        self.spark = spark
        self.table_path = f"{root}/{table}"
        self.key, self.table_schema, self.event_schema = key, table_schema, event_schema
        self.event_columns = [f.strip().split()[0] for f in event_schema.split(",")]
        self.side_tags = tuple(side_tags)
        self.rows: list[Row] | None = None
        self.batch_id = 0
        self.outputs = Outputs()
        self.runtime = KeyedBroadcastRuntime(
            spark, function, tables={table: self.table_path}, state_path=f"{root}/_state",
            timestamp_column="ts", order_columns=tuple(order_columns),
            watermark_delay_ms=watermark_delay_ms,
        )

    def step(self, step: Step) -> Outputs:
        """Commit the step's table version, process its events as one batch, commit state."""
        if step.table is not None:
            write_table_version(self.spark, self.table_path, self.rows, step.table, self.key,
                                self.table_schema)
            self.rows = list(step.table)
        events = self.spark.createDataFrame(
            [tuple(e[c] for c in self.event_columns) for e in step.events], self.event_schema)
        result = self.runtime.process(events, batch_id=self.batch_id,
                                      processing_time=step.processing_time)
        result.persist()
        try:
            got = Outputs(main=_collect(result.main),
                          side={t: _collect(result.side(t)) for t in self.side_tags})
            self.runtime.commit(result)
        finally:
            result.unpersist()
        self.batch_id += 1
        self.outputs.extend(got)
        return got

    def run(self, steps: Sequence[Step]) -> Outputs:
        for s in steps:
            self.step(s)
        return self.outputs


def _collect(frame: Any) -> list[Row]:
    """A result frame's rows as dicts, without the lineage column."""
    if VERSION_COLUMN in frame.columns:
        frame = frame.drop(VERSION_COLUMN)
    return [r.asDict(recursive=True) for r in frame.collect()]


def run_on_spark(make_driver: Callable[[Any, str], SparkDriver], steps: Sequence[Step],
                 root: str | None = None) -> Outputs:
    """Run ``steps`` on the process's Spark session (a temporary lake unless ``root``)."""
    from lakecast.spark import get_spark

    spark = get_spark(app_name="lakecast-examples")
    if root is not None:
        return make_driver(spark, root).run(steps)
    with tempfile.TemporaryDirectory(prefix="lakecast-example-") as tmp:
        return make_driver(spark, tmp).run(steps)
