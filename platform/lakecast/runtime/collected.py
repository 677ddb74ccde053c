"""A batch's one-pass output brought to the driver as Arrow, split by output.

:meth:`lakecast.runtime.result.BroadcastResult.collect` runs the batch's one Spark job
and hands the rows here: the main output (rows without an output tag), each side output
(its struct column, flattened) and the tasks' accounting rows — so the pipeline counts,
reconciles and writes small batches without another Spark job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from lakecast.pipeline.contract import TASK_SIDE
from lakecast.runtime.executor import OUTPUT_COLUMN, SIDE_PREFIX, VERSION_COLUMN
from lakecast.runtime.metrics import unpack_task_row

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructField, StructType

#: the tag of rows collected with the outputs in the same job (e.g. rejected events)
EXTRA = "_extra"


@dataclass(frozen=True)
class CollectedOutput:
    """Every output of one batch as Arrow tables (``side_names``: the function's own)."""

    main: pa.Table
    sides: Mapping[str, pa.Table]
    task_rows: list[dict[str, Any]]
    #: the rows of the ``extra`` frame collected in the same job (:func:`with_extra`)
    extra: pa.Table | None = None

    def output_counts(self) -> dict[str | None, int]:
        """Rows per output (``None``: main), internal outputs excluded."""
        counts: dict[str | None, int] = {None: self.main.num_rows}
        counts.update({n: t.num_rows for n, t in self.sides.items() if t.num_rows})
        return counts

    def side(self, name: str) -> pa.Table:
        return self.sides[name]


def split_outputs(table: pa.Table, sides: Mapping[str, pa.Schema], lineage: bool
                  ) -> CollectedOutput:
    """Split the one-pass frame's rows (``sides``: side output → its schema)."""
    tag = table.column(OUTPUT_COLUMN)
    structs = [SIDE_PREFIX + n for n in sides]
    main = table.filter(pc.is_null(tag)).drop_columns([*structs, OUTPUT_COLUMN])
    out: dict[str, pa.Table] = {}
    for name, schema in sides.items():
        rows = table.filter(pc.fill_null(pc.equal(tag, name), False))
        struct = rows.column(SIDE_PREFIX + name).combine_chunks()
        if isinstance(struct, pa.ChunkedArray):  # an empty column has no chunk
            struct = pa.array([], type=struct.type)
        cols = {f: struct.field(f) for f in schema.names}
        if lineage and name != EXTRA:
            cols[VERSION_COLUMN] = rows.column(VERSION_COLUMN).combine_chunks()
        out[name] = pa.table(cols) if cols else pa.table({})
    tasks = out.pop(TASK_SIDE, None)
    extra = out.pop(EXTRA, None)
    task_rows = sorted((unpack_task_row(r) for r in tasks.drop_columns(
        [c for c in tasks.column_names if c == VERSION_COLUMN]).to_pylist())
        if tasks is not None else [], key=lambda r: r["task"])
    return CollectedOutput(main, out, task_rows, extra)


def with_extra(frame: DataFrame, extra: DataFrame, known: StructType | None = None
               ) -> tuple[DataFrame, pa.Schema]:
    """``frame`` with the rows of ``extra`` added as the side output :data:`EXTRA` (one
    struct column), so one action brings both to the driver; and ``extra``'s schema.
    ``known``: ``frame``'s Spark schema when the client knows it; the union then carries
    its schema too (:func:`known_schema`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructField, StructType

    column = SIDE_PREFIX + EXTRA
    schema = extra.schema  # known when ``extra`` came with ``DataFrame.to``
    # every field nullable: the main rows hold a null struct (Arrow cannot view its
    # children as non-nullable)
    fields = [F.when(F.col(f.name).isNotNull(), F.col(f.name)).alias(f.name) for f in schema]
    tagged = extra.select(F.lit(EXTRA).alias(OUTPUT_COLUMN), F.struct(*fields).alias(column))
    struct_type = StructType([StructField(f.name, f.dataType, True) for f in schema])
    union = frame.withColumn(column, F.lit(None).cast(struct_type)).unionByName(
        tagged, allowMissingColumns=True)
    if known is not None:
        union = union.to(known_schema(known, StructField(column, struct_type, True)))
    return union, to_arrow_schema(schema, timezone="UTC")


def known_schema(schema: StructType, *added: StructField) -> StructType:
    """``schema`` with the ``added`` columns after its own, every column nullable: the
    schema of a frame the client built (a union of the outputs and other rows, literal
    columns), to pass to ``DataFrame.to`` so that bringing it to the driver asks the
    server for no schema (a Spark Connect round trip that analyzes the whole plan)."""
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(f.name, f.dataType, True) for f in [*schema, *added]])
