"""The one-pass frame of a pure ``enrich(Lookup...)`` run, whatever reaches the rows.

Two probes reach a lookup's rows without Python in the tasks: broadcast joins against the
pinned versions (:mod:`lakecast.runtime.joins`) and the executor JVM's task-local state
(:mod:`lakecast.runtime.jvm_state`). Both add, per lookup, columns to the events; a
:class:`LookupPlan` turns them into the run's frame in the task plan's layout
(:class:`~lakecast.runtime.executor.OutputLayout`), with the task plan's semantics:

* defaults fill an output column only for events whose key has **no row** (a matched row's
  null stays null);
* ``on_missing="unmatched"`` / ``"hold"`` route key misses to those side outputs (hold
  wins), carrying the input event columns;
* ``_state_version`` is the run's version vector as a literal;
* the accounting is counted by one Spark ``Observation`` during the first action
  (:class:`JoinedResult`): one row for the whole job, or, where the probe measures what
  holds its state (the JVM's, one row per executor JVM), the rows it makes of it.

The columns that do not change between runs (values, defaults, routing, side outputs,
counts) are built once per events schema and reused: each run only attaches its probes'
columns, the lineage literal and a new observation. A Column is an unresolved expression,
so reusing one over another frame of the same schema is what Spark does with it anyway;
building one costs several py4j round trips, which a micro-batch pays on its critical path.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from lakecast.api.enrich import Enrichment, Lookup
from lakecast.errors import LakecastError
from lakecast.runtime.collected import CollectedOutput
from lakecast.runtime.executor import (
    OUTPUT_COLUMN,
    SIDE_PREFIX,
    VERSION_COLUMN,
    OutputLayout,
    version_json,
)
from lakecast.runtime.lookup_transform import apply_transform, transforms
from lakecast.runtime.metrics import TaskMetrics
from lakecast.runtime.result import BroadcastResult
from lakecast.spark import observed_metrics

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation, SparkSession
    from pyspark.sql.types import StructType

#: one lookup's columns on the probed frame, by name: ``(index, lookup, pairs) -> (missed,
#: values)``: a Column true where the key has no row, and one raw value Column per (state
#: column, output column) pair
ProbeColumns = Callable[[int, Lookup, list[tuple[str, str]]], tuple[Any, list[Any]]]
#: the accounting rows of a run from its observed metrics and the job's one row (its counts)
Holders = Callable[[Mapping[str, Any], TaskMetrics], list[TaskMetrics]]


@dataclass(frozen=True)
class _Columns:
    """What a run's frame is made of, but its probes, lineage and observation."""

    layout: OutputLayout
    inputs: list[Any]
    added: list[Any]
    #: the names of the events' and the added columns (what ``transform`` gets)
    enriched: list[str]
    route: Any
    sides: list[Any]
    counts: list[Any]


class LookupPlan:
    """The runs of one pure enrichment over one probe (see the module docstring)."""

    def __init__(self, function: Enrichment, probe: ProbeColumns, cache: str) -> None:
        self.function = function
        self.probe = probe
        #: the accounting row's ``cache`` (:data:`~lakecast.runtime.joins.JOIN_CACHE`,
        #: :data:`~lakecast.runtime.jvm_state.JVM_CACHE`)
        self.cache = cache
        #: the function's ``transform`` runs after the probes (:mod:`.lookup_transform`)
        self.transforms = transforms(function)
        self._columns: dict[tuple[str, ...], _Columns] = {}

    def _build(self, schemas: Mapping[str, Any], event_schema: StructType, lineage: bool,
               timezone: str) -> _Columns:
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

        function = self.function
        function.bind_tables(schemas)
        layout = OutputLayout.of(function, to_arrow_schema(event_schema, timezone=timezone),
                                 lineage)
        main_types = {f.name: f.dataType for f in
                      from_arrow_schema(layout.main, prefer_timestamp_ntz=False).fields}
        inputs = [F.col(f"`{c}`") for c in event_schema.fieldNames()]
        misses: dict[str, list[Any]] = {"unmatched": [], "hold": []}
        added: list[Any] = []
        names = list(event_schema.fieldNames())
        for i, lk in enumerate(function.lookups):
            pairs = lk.column_pairs(schemas[lk.table])
            missed, values = self.probe(i, lk, pairs)
            for (_, out), raw in zip(pairs, values, strict=True):
                value = raw.cast(main_types[out])
                default = lk.defaults.get(out)
                if default is not None:
                    value = F.when(missed, F.lit(default).cast(main_types[out])).otherwise(
                        value)
                added.append(value.alias(out))
                names.append(out)
            policy = function.policy(lk)
            if policy in misses:
                misses[policy].append(missed)
        held, unmatched = _any(misses["hold"]), _any(misses["unmatched"])
        route = F.lit(None).cast("string")
        if unmatched is not None:
            route = F.when(unmatched, F.lit("unmatched")).otherwise(route)
        if held is not None:
            route = F.when(held, F.lit("held")).otherwise(route)
        spark_layout = from_arrow_schema(layout.schema, prefer_timestamp_ntz=False)
        routed = {"unmatched": unmatched, "held": held}
        sides = []
        for name in layout.sides:
            struct_type = spark_layout[SIDE_PREFIX + name].dataType
            if routed.get(name) is not None:
                side = F.when(route == F.lit(name), F.struct(*inputs).cast(struct_type))
            else:  # declared, never emitted (a pure enrichment has no ctx.output of its own)
                side = F.lit(None).cast(struct_type)
            sides.append(side.alias(SIDE_PREFIX + name))
        counts = [F.count(F.lit(1)).alias("events_in")]
        tagged = F.col(OUTPUT_COLUMN)
        if layout.sides:  # else every event is a main row
            counts.append(F.count_if(tagged.isNull()).alias("rows_main"))
            counts += [F.count_if(tagged == F.lit(n)).alias(n) for n in layout.sides]
        return _Columns(layout, inputs, added, names, route.alias(OUTPUT_COLUMN), sides,
                        counts)

    def run(self, spark: SparkSession, events_schema: StructType, probed: DataFrame,
            schemas: Mapping[str, Any], versions: Mapping[str, int], lineage: bool,
            function_id: str, budget_bytes: int, *, timezone: str | None = None,
            state_bytes: int = 0, measured: Sequence[Any] = (),
            holders: Holders | None = None, watermark: int | None = None) -> JoinedResult:
        """The run's frame over ``probed`` (the events, of ``events_schema``, with every
        lookup's probe columns added), lazy. ``state_bytes``: the state one executor
        holds (its accounting row's, for the budget). ``measured``: aggregates the
        observations add (the probe's own measurements), which ``holders`` turns into the
        accounting rows (default: one row for the job). ``watermark``: what ``transform``'s
        context says (a function that transforms)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        tz = timezone or spark.conf.get("spark.sql.session.timeZone", "UTC")
        key = (events_schema.json(), str(lineage), tz,
               *(f"{t}:{schemas[t]}" for t in sorted(schemas)))
        cols = self._columns.get(key)
        if cols is None:
            cols = self._columns[key] = self._build(schemas, events_schema, lineage, tz)
        layout = cols.layout
        lineage_col = [F.lit(version_json(versions)).alias(VERSION_COLUMN)] if lineage else []
        tag = uuid.uuid4().hex[:12]
        observations = [Observation(f"lakecast-joins-{tag}")]

        def view(*passed: Any) -> DataFrame:
            if not self.transforms:
                return probed.select(*cols.inputs, *cols.added, *passed, *lineage_col)
            done = apply_transform(probed.select(*cols.inputs, *cols.added, *passed),
                                   self.function, cols.enriched, layout.main, versions,
                                   watermark)
            return done.select("*", *lineage_col) if lineage_col else done

        frame = view(cols.route, *cols.sides).observe(observations[0], *cols.counts,
                                                      *measured)
        main = None
        if not layout.sides:  # the main output is every row: its own plan, observed last,
            # so nothing sits between the projection and the sink
            observations.append(Observation(f"lakecast-joins-main-{tag}"))
            main = view().observe(observations[1], cols.counts[0], *measured)
        run = JoinRun(function_id, dict(versions), tuple(observations), main, self.cache,
                      state_bytes, holders)
        return JoinedResult(frame, layout, dict(versions), [], budget_bytes, joins=run)


def _any(conditions: list[Any]) -> Any:
    out = None
    for c in conditions:
        out = c if out is None else (out | c)
    return out


@dataclass(frozen=True)
class JoinRun:
    """What the accounting row of a lookup plan's run is made of."""

    function_id: str
    versions: dict[str, int]
    #: the frame's observation, then (without side outputs) the main view's
    counts: tuple[Observation, ...]
    #: the main output as its own plan (``None``: a view of the frame)
    main: DataFrame | None = None
    #: the accounting row's ``cache``: joins' or the JVM lookup's
    cache: str = "join"
    #: the state one executor JVM holds (0: joins hold none between runs)
    state_bytes: int = 0
    #: the accounting rows from the observed metrics and the job's row (``None``: that row)
    holders: Holders | None = None


@dataclass
class JoinedResult(BroadcastResult):
    """A :class:`BroadcastResult` whose accounting is ONE row for the whole job, from an
    observation of the first action on the frame (there are no Python tasks)."""

    joins: JoinRun | None = None

    @property
    def main(self) -> DataFrame:
        """Main output rows; without side outputs, every row (no filter to run)."""
        if self.joins is None or self.joins.main is None:
            return super().main
        return self.joins.main

    def persist(self) -> JoinedResult:
        """Persist the frame; the main output becomes a view of it (one computation)."""
        if self.joins is not None:
            self.joins = replace(self.joins, main=None)
        super().persist()
        return self

    def observe(self) -> JoinedResult:
        """Nothing to add: the run is observed already."""
        return self

    def task_rows(self) -> list[dict[str, Any]]:
        if self._task_rows is not None:
            return self._task_rows
        assert self.joins is not None
        seen = next((m for o in self.joins.counts if (m := observed_metrics(o)) is not None),
                    None)
        if seen is None:
            raise LakecastError(
                "no action has consumed this lookup result yet (or the Spark Connect server did "
                "not report its metrics): run the action (e.g. write result.main) before "
                "reading its metrics")
        events_in = int(seen["events_in"])
        metrics = TaskMetrics(
            partition=0, pid=os.getpid(), function_id=self.joins.function_id,
            cache=self.joins.cache, elements_applied=len(self.joins.versions), rows_applied=0,
            state_version=dict(self.joins.versions), state_bytes=self.joins.state_bytes,
            rows_in=events_in,
            rows_main=int(seen["rows_main"]) if self.layout.sides else events_in,
            rows_side={n: int(seen[n]) for n in self.layout.sides if int(seen[n])},
            executor="spark")
        rows = [metrics] if self.joins.holders is None else self.joins.holders(seen, metrics)
        self._task_rows = [m.to_row() for m in rows]
        return self._task_rows

    def collect(self, extra: DataFrame | None = None) -> CollectedOutput:
        out = super().collect(extra)
        self._task_rows = None
        return replace(out, task_rows=self.task_rows())
