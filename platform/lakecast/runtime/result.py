"""The output of one broadcast run: :class:`BroadcastResult`.

One lazily evaluated DataFrame holds the main output, the side outputs, the held events
and the tasks' accounting rows (``_output`` tag column); the result splits it into views
and turns the accounting rows into :class:`~lakecast.runtime.metrics.RunMetrics`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from lakecast.api.descriptors import HELD, UNMATCHED, OutputTag
from lakecast.api.element import BroadcastElement
from lakecast.errors import LakecastError
from lakecast.pipeline.contract import TASK_SIDE
from lakecast.runtime.collected import (
    EXTRA,
    CollectedOutput,
    known_schema,
    split_outputs,
    with_extra,
)
from lakecast.runtime.executor import OUTPUT_COLUMN, SIDE_PREFIX, VERSION_COLUMN, OutputLayout
from lakecast.runtime.metrics import RunMetrics, TaskMetrics, check_budget, unpack_task_row
from lakecast.spark import observed_metrics

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType


@dataclass
class BroadcastResult:
    """The one-pass output of a run (a :class:`~lakecast.pipeline.contract.BatchOutput`).
    Views are lazy DataFrames over :attr:`frame`. For the tasks' accounting rows behind
    :meth:`metrics` to come from the same computation as the outputs, either call
    :meth:`persist` before the first action (several actions, e.g. one write per output),
    or :meth:`observe` when ONE action consumes the result (e.g. writing :attr:`main`):
    the accounting rows are then aggregated on the way to the sink, without a cache."""

    frame: DataFrame
    layout: OutputLayout
    state_version: dict[str, int]
    new_elements: list[BroadcastElement]
    budget_bytes: int
    refresh_seconds: float = 0.0
    #: the state version as lineage JSON when the frame leaves ``_state_version`` to the
    #: views (they add it as a literal last: one projection of the rows to the sink)
    version_literal: str | None = None
    #: :attr:`frame`'s Spark schema when the client knows it (the tasks' declared output):
    #: :meth:`collect` then asks the server for no schema
    frame_schema: StructType | None = None
    _persisted: bool = field(default=False, repr=False)
    _task_rows: list[dict[str, Any]] | None = field(default=None, repr=False)
    _observation: Any = field(default=None, repr=False)

    #: side outputs that carry the runtime's own rows, not the function's
    internal_sides: ClassVar[tuple[str, ...]] = (TASK_SIDE,)

    @property
    def main(self) -> DataFrame:
        """Main output rows (with ``_state_version`` when lineage is on)."""
        from pyspark.sql import functions as F

        # the frame is main columns, _output, side structs, _state_version: dropping the
        # tag and struct columns is one call (a select would cost several per column)
        return self._versioned(self.frame.where(F.col(OUTPUT_COLUMN).isNull()).drop(
            OUTPUT_COLUMN, *[SIDE_PREFIX + n for n in self.layout.sides]))

    def _versioned(self, frame: DataFrame) -> DataFrame:
        """``frame`` with the ``_state_version`` literal (when the frame leaves it out)."""
        from pyspark.sql import functions as F

        if self.version_literal is None:
            return frame
        return frame.withColumn(VERSION_COLUMN, F.lit(self.version_literal))

    def side(self, tag: OutputTag | str) -> DataFrame:
        """Rows of side output ``tag``."""
        from pyspark.sql import functions as F

        name = tag if isinstance(tag, str) else tag.name
        if name not in self.layout.sides:
            raise KeyError(f"no side output {name!r}; this function has "
                           f"{self.side_output_names}")
        struct = f"{SIDE_PREFIX}{name}"
        names = [f"{struct}.`{n}`" for n in self.layout.sides[name].names]
        cols = [F.col(n).alias(n.split(".", 1)[1].strip("`")) for n in names]
        if self.layout.lineage:
            cols.append(F.col(VERSION_COLUMN) if self.version_literal is None
                        else F.lit(self.version_literal).alias(VERSION_COLUMN))
        return self.frame.where(F.col(OUTPUT_COLUMN) == F.lit(name)).select(*cols)

    @property
    def side_output_names(self) -> list[str]:
        return [n for n in self.layout.sides if n not in self.internal_sides]

    @property
    def unmatched(self) -> DataFrame | None:
        """Events whose broadcast state/key was missing (``None`` if impossible)."""
        return self.side(UNMATCHED) if UNMATCHED.name in self.layout.sides else None

    @property
    def held(self) -> DataFrame | None:
        """Events held back: union them into the next batch's events to retry them."""
        return self.side(HELD) if HELD.name in self.layout.sides else None

    def held_events(self) -> DataFrame | None:
        """Held events with exactly the input event columns (ready to be retried)."""
        h = self.held
        return None if h is None else h.drop(VERSION_COLUMN)

    def persist(self) -> BroadcastResult:
        """Persist the one-pass frame so outputs and accounting come from one computation."""
        from pyspark import StorageLevel

        self.frame = self.frame.persist(StorageLevel.MEMORY_AND_DISK)
        self._persisted = True
        return self

    def observe(self) -> BroadcastResult:
        """Gather the tasks' accounting rows during the first action on any view (a Spark
        ``Observation``): for a result consumed by one action, this replaces
        :meth:`persist` and its cache. Call it before that action."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        task = F.col(SIDE_PREFIX + TASK_SIDE)
        self._observation = Observation(f"lakecast-tasks-{uuid.uuid4().hex[:12]}")
        # (collect_list skips nulls: the struct is null on every row but the accounting
        # rows, so no per-row comparison of the tag is needed)
        self.frame = self.frame.observe(self._observation,
                                        F.collect_list(task).alias("tasks"))
        return self

    def unpersist(self) -> None:
        if self._persisted:
            self.frame.unpersist()
            self._persisted = False

    def collect(self, extra: DataFrame | None = None) -> CollectedOutput:
        """Run the batch (one Spark action) and bring every output to the driver as
        Arrow, with the rows of ``extra`` (e.g. the rejected events) from the same job;
        the tasks' accounting rows are kept for :meth:`metrics`."""
        from pyspark.sql.types import StringType, StructField

        frame, sides = self._versioned(self.frame), dict(self.layout.sides)
        known = self.frame_schema
        if known is not None and self.version_literal is not None:
            known = known_schema(known, StructField(VERSION_COLUMN, StringType(), True))
        if extra is not None:
            frame, sides[EXTRA] = with_extra(frame, extra, known)
        elif known is not None:
            frame = frame.to(known_schema(known))
        out = split_outputs(frame.toArrow(), sides, self.layout.lineage)
        self._task_rows = out.task_rows
        return out

    def output_counts(self) -> dict[str | None, int]:
        """Rows per output (``None``: main), internal outputs excluded; one action."""
        rows = self.frame.groupBy(OUTPUT_COLUMN).count().collect()
        return {r[0]: int(r[1]) for r in rows if r[0] not in self.internal_sides}

    def task_rows(self) -> list[dict[str, Any]]:
        """The tasks' accounting rows, by task (one action, then remembered)."""
        if self._task_rows is None and self._observation is not None:
            observed = observed_metrics(self._observation)
            if observed is None:
                raise LakecastError(
                    "no action has consumed this observed result yet (or the Spark Connect "
                    "server did not report the write's metrics): run the action (e.g. write "
                    "result.main) before reading its metrics, or persist() instead")
            rows = [unpack_task_row(r.asDict()) for r in observed["tasks"]]
            self._task_rows = sorted(rows, key=lambda r: r["task"])
        if self._task_rows is None:
            if not self._persisted:
                raise LakecastError(
                    "task accounting of an unpersisted result would come from a second "
                    "computation: call persist() or observe() on the result before its "
                    "first action")
            names = self.layout.sides[TASK_SIDE].names
            rows = [unpack_task_row(r.asDict())
                    for r in self.side(TASK_SIDE).select(*names).collect()]
            self._task_rows = sorted(rows, key=lambda r: r["task"])
        return self._task_rows

    def summary(self) -> dict[str, int]:
        """Runtime-specific counts of the batch (none for a broadcast function)."""
        return {}

    def metrics(self) -> RunMetrics:
        """Per-task and aggregate metrics from the accounting rows; warns when over budget."""
        tasks = [TaskMetrics.from_row(r) for r in self.task_rows()]
        m = RunMetrics(
            state_version=dict(self.state_version),
            tasks=tasks,
            budget_bytes=self.budget_bytes,
            refresh_seconds=self.refresh_seconds,
            new_elements=len(self.new_elements),
            new_element_rows=sum(e.num_rows for e in self.new_elements),
        )
        if tasks:
            check_budget(m.state_bytes_per_task, m.parallelism, m.budget_bytes)
        return m
