"""An enrichment's vectorized ``transform`` after lookups that ran without Python.

An :class:`~lakecast.api.enrich.Enrichment` that overrides only ``transform`` (and
``output_schema`` for the columns it adds) — the tutorial's ``ToEur`` — keeps its lookups
on the fast path (:mod:`lakecast.runtime.jvm_state`): the JVM adds the looked-up columns,
then one scalar Arrow UDF runs ``transform`` over each Arrow batch of the enriched
events in the Python workers, exactly as the task plan runs it (every row of the batch,
before the misses are routed to their side outputs; the rows it returns must be the rows it
got). Only the columns it makes come back from Python: the routing, side outputs and
lineage columns, and the columns it returns as it got them (found by a probe of null rows
when the run is planned, checked on every batch), stay in the JVM.

``transform`` sees a :class:`TransformContext`: the run's state versions, the watermark and
the processing time. Reading broadcast state or emitting a side output from ``transform``
needs the Python workers' state: it fails with an error that says so (``jvm_lookups=False``
keeps such a function there).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakecast.api.enrich import Enrichment
from lakecast.api.functions import ReadOnlyContext
from lakecast.errors import LakecastError
from lakecast.runtime.executor import to_batches

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: the hooks an :class:`Enrichment` may override and keep its lookups off Python
TRANSFORM_HOOKS = ("transform", "output_schema")
#: the hooks that put the whole function in the Python workers when overridden
PYTHON_HOOKS = ("process_batch", "process_broadcast_element", "process_element",
                "state_descriptors", "bind_tables")


def overridden(function: object, hooks: Sequence[str]) -> list[str]:
    """Which of ``hooks`` ``function``'s class overrides (of :class:`Enrichment`'s)."""
    return [h for h in hooks if getattr(type(function), h) is not getattr(Enrichment, h)]


def transforms(function: object) -> bool:
    """Whether ``function`` is an enrichment whose only Python is its ``transform``."""
    return (isinstance(function, Enrichment) and not overridden(function, PYTHON_HOOKS)
            and "transform" in overridden(function, TRANSFORM_HOOKS))


class TransformContext(ReadOnlyContext):
    """What ``transform`` sees after lookups that ran in the JVM: versions, watermark,
    time; no broadcast state and no side outputs of its own (see the module doc)."""

    def __init__(self, function: str, versions: Mapping[str, int],
                 watermark: int | None) -> None:
        self._function = function
        self._versions = dict(versions)
        self._watermark = watermark

    def _refuse(self, what: str) -> LakecastError:
        return LakecastError(
            f"{self._function}.transform {what}, but its lookups ran in the executor JVM, "
            "where no Python state is kept: pass jvm_lookups=False to its runtime (or "
            "`jvm_lookups: false` in its declaration) to run the whole function in the "
            "Python workers")

    def get_broadcast_state(self, descriptor: Any) -> Any:
        raise self._refuse(f"reads the broadcast state {getattr(descriptor, 'name', '?')!r}")

    def output(self, tag: Any, value: Any) -> None:
        raise self._refuse(f"emits to the side output {getattr(tag, 'name', tag)!r}")

    def timestamp(self) -> int | None:
        return None

    def current_processing_time(self) -> int:
        return int(time.time() * 1000)

    def current_watermark(self) -> int | None:
        return self._watermark

    def state_version(self) -> dict[str, int]:
        return dict(self._versions)

    def state_available(self) -> bool:
        return True


def apply_transform(frame: DataFrame, function: Enrichment, enriched: Sequence[str],
                    main: pa.Schema, versions: Mapping[str, int],
                    watermark: int | None = None) -> DataFrame:
    """``frame`` (the ``enriched`` columns, then columns passed through) with ``transform``
    run over its enriched columns, which become ``main``'s; lazy.

    One scalar Arrow UDF (``arrow_udf``) per plan: the columns ``transform`` gets (its
    :attr:`~lakecast.api.enrich.Enrichment.transform_reads`, else every enriched column) go
    to the Python workers, only the columns it makes come back (a column it returns as it
    got it stays in the JVM, as do the columns passed through)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
    from pyspark.sql.types import StructType

    enriched = list(enriched)
    try:
        reads = function.transform_columns(enriched)
    except ValueError as e:
        raise LakecastError(str(e)) from None
    ctx = TransformContext(type(function).__name__, versions, watermark)
    inputs = to_arrow_schema(frame.select(*[F.col(f"`{c}`") for c in reads]).schema)
    returned, kept = _probe(function, inputs, enriched, main, ctx)
    made = pa.schema([f for f in main if f.name in returned and f.name not in kept]
                     or [main.field(0)])
    absent = [f.name for f in main if f.name not in made.names and f.name not in enriched]
    if absent:
        raise LakecastError(
            f"{type(function).__name__}.output_schema has {absent}, which its transform "
            f"does not return (over the columns {reads}): return them from transform")
    run = _arrays(function, reads, made, [c for c in kept if c not in made.names], ctx)
    step = frame.select("*", F.arrow_udf(run, StructType(from_arrow_schema(
        made, prefer_timestamp_ntz=False).fields))(
        *[F.col(f"`{c}`") for c in reads]).alias(_MADE))
    passed = [f.name for f in frame.schema.fields if f.name not in set(enriched)]
    return step.select(*[F.col(f"`{_MADE}`.`{f.name}`").alias(f.name) if f.name in made.names
                         else F.col(f"`{f.name}`") for f in main],
                       *[F.col(f"`{c}`") for c in passed])


#: the struct column of what ``transform`` made (dropped by the step's projection)
_MADE = "__lakecast_transform"


def _buffers(array: pa.Array) -> list[int]:
    return [b.address for b in array.buffers() if b is not None and b.size]


def _same(a: pa.Array, b: pa.Array) -> bool:
    """Whether ``a`` is ``b``'s data (the same buffers: ``transform`` returned it as is)."""
    return (a.type == b.type and len(a) == len(b) and a.offset == b.offset
            and bool(_buffers(a)) and _buffers(a) == _buffers(b))


def _probe(function: Enrichment, inputs: pa.Schema, enriched: Sequence[str],
           main: pa.Schema, ctx: TransformContext) -> tuple[set[str], list[str]]:
    """What ``transform`` returns over ``inputs`` (the columns it gets, of the
    ``enriched`` ones): the names of ``main`` it returns, and those it returns as it got
    them — found by running it over a probe batch of three null rows. Where it fails
    there, it is taken to return every column of ``main`` it got or that is new. Each
    batch of the run checks the kept columns again (:func:`_arrays`)."""
    unseen = set(enriched) - set(inputs.names)  # columns transform does not get
    possible = {f.name for f in main} - unseen
    probe = pa.RecordBatch.from_arrays([pa.nulls(3, f.type) for f in inputs],
                                       schema=inputs)
    try:
        got = function.transform(probe, ctx)
    except Exception:  # a transform that needs real rows: nothing kept
        return possible, []
    if not isinstance(got, pa.RecordBatch) or got.num_rows != probe.num_rows:
        return possible, []
    kept = [f.name for f in main
            if f.name in inputs.names and f.name in got.schema.names
            and inputs.field(f.name).type == f.type
            and _same(got.column(f.name), probe.column(f.name))]
    returned = possible if not unseen else {f.name for f in main} & set(got.schema.names)
    return returned, kept


def _arrays(function: Enrichment, reads: list[str], made: pa.Schema, kept: list[str],
            ctx: TransformContext) -> Callable[..., pa.Array]:
    name = type(function).__name__

    def run(*columns: pa.Array) -> pa.Array:
        batch = pa.RecordBatch.from_arrays(list(columns), names=reads)
        got = function.transform(batch, ctx)
        if got.num_rows != batch.num_rows:
            raise LakecastError(
                f"{name}.transform returned {got.num_rows} rows for a batch of "
                f"{batch.num_rows}: transform keeps the rows it gets (it may add columns); "
                "route rows with Lookup(on_missing=...) or override process_batch")
        for c in kept:
            if not (_same(got.column(c), batch.column(c))
                    or got.column(c).equals(batch.column(c))):
                raise LakecastError(
                    f"{name}.transform changed the column {c!r}, which it returned unchanged "
                    "when its run was planned (a probe of null rows), so its lookups' fast "
                    "path keeps it in the JVM: return the column unchanged always, or pass "
                    "jvm_lookups=False to run the whole function in the Python workers")
        out = to_batches([got], made)
        cols = list(out[0].columns) if out else [pa.nulls(0, f.type) for f in made]
        return pa.StructArray.from_arrays(cols, fields=list(made))

    return run
