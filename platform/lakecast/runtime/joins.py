"""A pure lookup enrichment planned as Spark broadcast hash joins: ``execution="joins"``.

An :func:`~lakecast.api.enrich.enrich` of :class:`~lakecast.api.enrich.Lookup` s with
nothing else (no ``transform``, no own ``process_batch``) needs no Python in the tasks:
each lookup is a left join of the events with its broadcast table **time-travelled to the
run's pinned Delta version** (``versionAsOf``), hinted ``F.broadcast`` — Spark then ships
the table once per executor and every task probes its hash relation, the same task-local
copy of one state version. :func:`plan_joins` hands the joined frame to a
:class:`~lakecast.runtime.lookup_plan.LookupPlan`, which gives it the task plan's layout and
semantics (defaults, routing of misses, lineage, one accounting row). A left join emits one
row per event when the table's keys are unique (a version with duplicate keys is refused by
the pipeline's gate); the pipeline reconciles these rows against the events it counted
itself, so a join that duplicated events fails.

When it pays: one large cold batch (a backfill, a replay) — no state to keep. Warm
micro-batches against a large table are cheaper on task-local state (``execution="tasks"``,
the default; for a pure lookup, in the executor JVM): a join reads and broadcasts the whole
table every batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lakecast.api.enrich import Enrichment, Lookup
from lakecast.delta import io as delta_io
from lakecast.errors import LakecastError
from lakecast.runtime.lookup_plan import JoinedResult, LookupPlan
from lakecast.runtime.lookup_transform import PYTHON_HOOKS, TRANSFORM_HOOKS, overridden

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: ``TaskMetrics.cache`` of the joins plan's one accounting row (no Python task state)
JOIN_CACHE = "join"


def not_joinable(function: object) -> str | None:
    """Why ``function`` cannot run as broadcast joins (``None``: it can)."""
    if not isinstance(function, Enrichment):
        return (f"{type(function).__name__} is not an enrich(Lookup, ...) Enrichment: only "
                "pure lookups can be planned as joins")
    changed = overridden(function, (*PYTHON_HOOKS, *TRANSFORM_HOOKS))
    if changed:
        return (f"{type(function).__name__} overrides {', '.join(changed)}: Python logic "
                "runs in the tasks; use execution='tasks'")
    return None


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

    def join(frame: DataFrame, i: int, lk: Lookup) -> DataFrame:
        pairs = lk.column_pairs(schemas[lk.table])
        keys = [(e, s, f"__lk{i}_k{j}") for j, (e, s) in enumerate(lk.key_pairs)]
        dim = dims[lk.table].select(
            *[F.col(f"`{s}`").alias(k) for _, s, k in keys],
            *[F.col(f"`{s}`").alias(f"__lk{i}_v{j}") for j, (s, _) in enumerate(pairs)])
        cond = [frame[f"`{e}`"] == dim[k] for e, _, k in keys]
        return frame.join(F.broadcast(dim), cond, "left")

    def columns(i: int, lk: Lookup, pairs: list[tuple[str, str]]) -> tuple[Any, list[Any]]:
        # the table's key is null only where no row matched (equality never matches null)
        return (F.col(f"__lk{i}_k0").isNull(),
                [F.col(f"__lk{i}_v{j}") for j in range(len(pairs))])

    probed = events
    for i, lk in enumerate(function.lookups):
        probed = join(probed, i, lk)
    return LookupPlan(function, columns, JOIN_CACHE).run(
        spark, events.schema, probed, schemas, versions, lineage, function_id, budget_bytes)
