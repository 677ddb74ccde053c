"""An enrichment's vectorized ``transform`` after lookups that ran without Python.

An :class:`~lakecast.api.enrich.Enrichment` that overrides only ``transform`` (and
``output_schema`` for the columns it adds) — the tutorial's ``ToEur`` — keeps its lookups
on the fast path (:mod:`lakecast.runtime.jvm_state`): the JVM adds the looked-up columns,
then one ``mapInArrow`` step runs ``transform`` over each Arrow batch of the enriched
events in the Python workers, exactly as the task plan runs it (every row of the batch,
before the misses are routed to their side outputs; the rows it returns must be the rows it
got). The routing, side outputs and lineage columns pass through it unchanged.

``transform`` sees a :class:`TransformContext`: the run's state versions, the watermark and
the processing time. Reading broadcast state or emitting a side output from ``transform``
needs the Python workers' state: it fails with an error that says so (``jvm_lookups=False``
keeps such a function there).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
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
    run over its enriched columns, which become ``main``'s; lazy."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import StructType

    enriched = list(enriched)
    passed = [f for f in frame.schema.fields if f.name not in set(enriched)]
    schema = StructType([*from_arrow_schema(main, prefer_timestamp_ntz=False).fields, *passed])
    run = _batches(function, enriched, main, [f.name for f in passed],
                   TransformContext(type(function).__name__, versions, watermark))
    return frame.mapInArrow(run, schema)


def _batches(function: Enrichment, enriched: list[str], main: pa.Schema, passed: list[str],
             ctx: TransformContext) -> Callable[[Iterator[pa.RecordBatch]],
                                                Iterator[pa.RecordBatch]]:
    name = type(function).__name__

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            got = function.transform(pa.RecordBatch.from_arrays(
                [b.column(c) for c in enriched], names=enriched), ctx)
            if got.num_rows != b.num_rows:
                raise LakecastError(
                    f"{name}.transform returned {got.num_rows} rows for a batch of "
                    f"{b.num_rows}: transform keeps the rows it gets (it may add columns); "
                    "route rows with Lookup(on_missing=...) or override process_batch")
            out = to_batches([got], main)
            columns = list(out[0].columns) if out else [pa.nulls(0, f.type) for f in main]
            yield pa.RecordBatch.from_arrays(
                [*columns, *(b.column(c) for c in passed)],
                names=[*main.names, *passed])

    return run
