"""A batch's one-pass output brought to the driver as Arrow, split by output.

:meth:`lakecast.runtime.broadcast.BroadcastResult.collect` runs the batch's one Spark job
and hands the rows here: the main output (rows without an output tag), each side output
(its struct column, flattened) and the tasks' accounting rows — so the pipeline counts,
reconciles and writes small batches without another Spark job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lakecast.pipeline.contract import TASK_SIDE
from lakecast.runtime.executor import OUTPUT_COLUMN, SIDE_PREFIX, VERSION_COLUMN


@dataclass(frozen=True)
class CollectedOutput:
    """Every output of one batch as Arrow tables (``side_names``: the function's own)."""

    main: pa.Table
    sides: Mapping[str, pa.Table]
    task_rows: list[dict[str, Any]]

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
        if lineage:
            cols[VERSION_COLUMN] = rows.column(VERSION_COLUMN).combine_chunks()
        out[name] = pa.table(cols) if cols else pa.table({})
    tasks = out.pop(TASK_SIDE, None)
    task_rows = sorted(tasks.drop_columns([c for c in tasks.column_names
                                           if c == VERSION_COLUMN]).to_pylist()
                       if tasks is not None else [], key=lambda r: r["task"])
    return CollectedOutput(main, out, task_rows)
