"""A pure lookup enrichment planned as Spark broadcast hash joins: ``execution="joins"``.

An :func:`~lakecast.api.enrich.enrich` of :class:`~lakecast.api.enrich.Lookup` s with
nothing else (no ``transform``, no own ``process_batch``) needs no Python in the tasks:
each lookup is a left join of the events with its broadcast table **time-travelled to the
run's pinned Delta version** (``versionAsOf``), hinted ``F.broadcast`` — Spark then ships
the table once per executor and every task probes its hash relation, the same task-local
copy of one state version. :func:`plan_joins` builds the run's one-pass frame in the
layout the task plan uses (:class:`~lakecast.runtime.executor.OutputLayout`), with the same
semantics:

* defaults fill an output column only for events whose key has **no row** (a matched row's
  null stays null), as :meth:`~lakecast.api.enrich.Enrichment.process_batch` does;
* ``on_missing="unmatched"`` / ``"hold"`` route key misses to those side outputs (hold
  wins), carrying the input event columns;
* ``_state_version`` is the pinned version vector as a literal;
* the accounting is one row for the whole job (:data:`JOIN_CACHE`, no Python tasks): the
  joined rows and each output's rows, counted by one Spark ``Observation`` during the
  first action. A left join emits one row per event when the table's keys are unique (a
  version with duplicate keys is refused by the pipeline's gate); the pipeline reconciles
  these rows against the events it counted itself, so a join that duplicated events fails.

When it pays: one large cold batch (a backfill, a replay, ``benchmarks.broadcast_enrichment``
(a)) — no Arrow round trip through the Python workers. Warm micro-batches against a large
table are cheaper on task-local state (``execution="tasks"``, the default): a join reads
and broadcasts the whole table every batch.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from lakecast.api.enrich import Enrichment, Lookup
from lakecast.delta import io as delta_io
from lakecast.errors import LakecastError
from lakecast.runtime.collected import CollectedOutput
from lakecast.runtime.executor import (
    OUTPUT_COLUMN,
    SIDE_PREFIX,
    VERSION_COLUMN,
    OutputLayout,
    version_json,
)
from lakecast.runtime.metrics import TaskMetrics
from lakecast.runtime.result import BroadcastResult
from lakecast.spark import observed_metrics

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation, SparkSession

#: ``TaskMetrics.cache`` of the joins plan's one accounting row (no Python task state)
JOIN_CACHE = "join"
#: the hooks a joinable function must leave as :class:`Enrichment` defines them
_HOOKS = ("process_batch", "transform", "process_broadcast_element", "process_element",
          "output_schema", "state_descriptors", "bind_tables")


def not_joinable(function: object) -> str | None:
    """Why ``function`` cannot run as broadcast joins (``None``: it can)."""
    if not isinstance(function, Enrichment):
        return (f"{type(function).__name__} is not an enrich(Lookup, ...) Enrichment: only "
                "pure lookups can be planned as joins")
    changed = [h for h in _HOOKS if getattr(type(function), h) is not getattr(Enrichment, h)]
    if changed:
        return (f"{type(function).__name__} overrides {', '.join(changed)}: Python logic "
                "runs in the tasks; use execution='tasks'")
    return None


#: how one lookup reaches its rows: ``(index, lookup, frame, pairs) -> (frame, missed,
#: values)``: the frame it adds to, a Column true where the key has no row, and one raw
#: value Column per (state column, output column) pair
Probe = Callable[[int, Lookup, "DataFrame", list[tuple[str, str]]],
                 tuple["DataFrame", Any, list[Any]]]


def plan_joins(spark: SparkSession, function: Enrichment, tables: Mapping[str, str],
               versions: Mapping[str, int], events: DataFrame, lineage: bool,
               function_id: str, budget_bytes: int) -> JoinedResult:
    """The run of ``function`` over ``events`` at ``versions`` as broadcast joins (lazy)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema

    missing = [lk.table for lk in function.lookups if lk.table not in versions]
    if missing:
        raise LakecastError(f"broadcast tables {missing} have no version yet: write them "
                            "before enriching against them")
    dims = {lk.table: delta_io.read(spark, tables[lk.table], version=versions[lk.table])
            for lk in function.lookups}
    schemas = {t: to_arrow_schema(d.schema, timezone="UTC") for t, d in dims.items()}

    def join(i: int, lk: Lookup, frame: DataFrame,
             pairs: list[tuple[str, str]]) -> tuple[DataFrame, Any, list[Any]]:
        keys = [(e, s, f"__lk{i}_k{j}") for j, (e, s) in enumerate(lk.key_pairs)]
        dim = dims[lk.table].select(
            *[F.col(f"`{s}`").alias(k) for _, s, k in keys],
            *[F.col(f"`{s}`").alias(f"__lk{i}_v{j}") for j, (s, _) in enumerate(pairs)])
        cond = [frame[f"`{e}`"] == dim[k] for e, _, k in keys]
        # the table's key is null only where no row matched (equality never matches null)
        return (frame.join(F.broadcast(dim), cond, "left"), F.col(keys[0][2]).isNull(),
                [F.col(f"__lk{i}_v{j}") for j in range(len(pairs))])

    return plan_lookups(spark, function, schemas, versions, events, lineage, function_id,
                        budget_bytes, join, JOIN_CACHE)


def plan_lookups(spark: SparkSession, function: Enrichment, schemas: Mapping[str, Any],
                 versions: Mapping[str, int], events: DataFrame, lineage: bool,
                 function_id: str, budget_bytes: int, probe: Probe, cache: str, *,
                 timezone: str | None = None,
                 finish: Callable[[DataFrame], DataFrame] | None = None,
                 state_bytes: int = 0) -> JoinedResult:
    """The run's one-pass frame from ``probe`` (joins, or the JVM lookup of
    :mod:`lakecast.runtime.jvm_state`): defaults, routing of misses, side outputs, lineage
    and the one observation, the same for every probe (lazy). ``finish``: what the probes
    add to the events in one step, after all of them (``None``: they add as they go);
    ``state_bytes``: the state one executor holds (its accounting row's, for the budget)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    function.bind_tables(schemas)
    tz = timezone or spark.conf.get("spark.sql.session.timeZone", "UTC")
    event_schema = events.schema
    layout = OutputLayout.of(function, to_arrow_schema(event_schema, timezone=tz), lineage)
    main_types = {f.name: f.dataType
                  for f in from_arrow_schema(layout.main, prefer_timestamp_ntz=False).fields}
    inputs = [F.col(f"`{c}`") for c in event_schema.fieldNames()]
    tag = uuid.uuid4().hex[:12]
    joined = events
    misses: dict[str, list[Any]] = {"unmatched": [], "hold": []}
    added: list[Any] = []
    for i, lk in enumerate(function.lookups):
        pairs = lk.column_pairs(schemas[lk.table])
        joined, missed, values = probe(i, lk, joined, pairs)
        for (_, out), raw in zip(pairs, values, strict=True):
            value = raw.cast(main_types[out])
            default = lk.defaults.get(out)
            if default is not None:
                value = F.when(missed, F.lit(default).cast(main_types[out])).otherwise(value)
            added.append(value.alias(out))
        policy = function.policy(lk)
        if policy in misses:
            misses[policy].append(missed)
    if finish is not None:
        joined = finish(joined)
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
    lineage_col = [F.lit(version_json(versions)).alias(VERSION_COLUMN)] if lineage else []
    observations = [Observation(f"lakecast-joins-{tag}")]
    counts = [F.count(F.lit(1)).alias("events_in")]
    tagged = F.col(OUTPUT_COLUMN)
    if layout.sides:  # else every event is a main row
        counts.append(F.count_if(tagged.isNull()).alias("rows_main"))
        counts += [F.count_if(tagged == F.lit(n)).alias(n) for n in layout.sides]
    frame = joined.select(*inputs, *added, route.alias(OUTPUT_COLUMN), *sides,
                          *lineage_col).observe(observations[0], *counts)
    main = None
    if not layout.sides:  # the main output is every row: its own plan, observed last, so
        # nothing sits between the projection and the sink
        observations.append(Observation(f"lakecast-joins-main-{tag}"))
        main = joined.select(*inputs, *added, *lineage_col).observe(
            observations[1], F.count(F.lit(1)).alias("events_in"))
    run = JoinRun(function_id, dict(versions), tuple(observations), main, cache,
                  state_bytes)
    return JoinedResult(frame, layout, dict(versions), [], budget_bytes, joins=run)


def _any(conditions: list[Any]) -> Any:
    out = None
    for c in conditions:
        out = c if out is None else (out | c)
    return out


@dataclass(frozen=True)
class JoinRun:
    """What the accounting row of a joins run is made of."""

    function_id: str
    versions: dict[str, int]
    #: the frame's observation, then (without side outputs) the main view's
    counts: tuple[Observation, ...]
    #: the main output as its own plan (``None``: a view of the frame)
    main: DataFrame | None = None
    #: the accounting row's ``cache``: :data:`JOIN_CACHE`, or the JVM lookup's
    cache: str = JOIN_CACHE
    #: the state one executor JVM holds (0: joins hold none between runs)
    state_bytes: int = 0


@dataclass
class JoinedResult(BroadcastResult):
    """A :class:`BroadcastResult` whose accounting is ONE row for the whole join job,
    from an observation of the first action on the frame (there are no Python tasks)."""

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
        """Nothing to add: the joins are observed already."""
        return self

    def task_rows(self) -> list[dict[str, Any]]:
        if self._task_rows is not None:
            return self._task_rows
        assert self.joins is not None
        seen = next((m for o in self.joins.counts if (m := observed_metrics(o)) is not None),
                    None)
        if seen is None:
            raise LakecastError(
                "no action has consumed this joins result yet (or the Spark Connect server "
                "did not report its metrics): run the action (e.g. write result.main) "
                "before reading its metrics")
        events_in = int(seen["events_in"])
        metrics = TaskMetrics(
            partition=0, pid=os.getpid(), function_id=self.joins.function_id,
            cache=self.joins.cache, elements_applied=len(self.joins.versions), rows_applied=0,
            state_version=dict(self.joins.versions), state_bytes=self.joins.state_bytes,
            rows_in=events_in,
            rows_main=int(seen["rows_main"]) if self.layout.sides else events_in,
            rows_side={n: int(seen[n]) for n in self.layout.sides if int(seen[n])},
            executor="spark")
        self._task_rows = [metrics.to_row()]
        return self._task_rows

    def collect(self, extra: DataFrame | None = None) -> CollectedOutput:
        out = super().collect(extra)
        self._task_rows = None
        return replace(out, task_rows=self.task_rows())

