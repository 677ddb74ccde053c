"""Task-local broadcast state on Spark.

:class:`BroadcastRuntime` lives on the driver for the life of a Spark application
(one per function). Each :meth:`BroadcastRuntime.process` call:

1. **refreshes**: reads new Delta versions of the broadcast tables as ordered
   :class:`~lakecast.api.element.BroadcastElement` s (CDF increments) and ships them as ONE
   Spark broadcast variable per increment (in-process Spark) or inside the task closure
   (Spark Connect, which has no broadcast variables; a cold base is a Delta file list
   that each task reads itself, so the closure stays small). The increments form a *chain*
   ``base -> v1 -> v2 ...`` whose links are named by state versions (the vector of
   applied Delta versions ``{table: version}``);
2. runs the function over the events with ``mapInArrow``: no shuffle, no lookups
   outside the task. Each task takes its function instance and state from a
   module-level cache in the (reused) Python worker, keyed by the runtime's function
   id; a worker already at version ``v`` applies only the links after ``v``, in order,
   with ``process_broadcast_element``. A cold worker builds from the base (full tables
   now; :meth:`BroadcastRuntime._base_elements` is the hook to restore a snapshot);
   after its outputs each task emits one accounting row (``_task``);
3. returns a :class:`BroadcastResult`: one lazily evaluated DataFrame holding main
   output, side outputs and held events (``_output`` tag column), split by its
   ``main`` / ``side(tag)`` / ``held`` views, each row carrying ``_state_version``.

The state version of a run is fixed on the driver before the job starts, so a
recomputed or retried task computes the same result (write each output with
``delta_io.write(..., txn=(app_id, batch_id))`` for exactly-once).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa

from lakecast.api.descriptors import HELD, UNMATCHED, OutputTag
from lakecast.api.element import CHANGE_TYPE, BroadcastElement
from lakecast.api.functions import BroadcastProcessFunction
from lakecast.delta.log import DeltaIOError, commit_info
from lakecast.delta.source import latest_versions, read_broadcast_elements
from lakecast.errors import LakecastError
from lakecast.pipeline.contract import TASK_SIDE
from lakecast.runtime.collected import EXTRA, CollectedOutput, split_outputs, with_extra
from lakecast.runtime.executor import (
    OUTPUT_COLUMN,
    SIDE_PREFIX,
    VERSION_COLUMN,
    OutputLayout,
    version_json,
)
from lakecast.runtime.metrics import (
    BUDGET_FIX,
    DEFAULT_STATE_BUDGET_BYTES,
    TASK_ROW_SCHEMA,
    RunMetrics,
    TaskMetrics,
    check_budget,
    warn_over_budget,
)
from lakecast.runtime.tasks import WARM_SCHEMA, ChainLink, TaskPlan, run_task, warm_task
from lakecast.spark import default_parallelism, is_connect, observed_metrics

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakecast.pipeline.contract import BatchOutput
    from lakecast.pipeline.progress import BatchPlan



# ============================================================================ driver side
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
        return self.frame.where(F.col(OUTPUT_COLUMN).isNull()).drop(
            OUTPUT_COLUMN, *[SIDE_PREFIX + n for n in self.layout.sides])

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
            cols.append(F.col(VERSION_COLUMN))
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
        self.frame = self.frame.observe(self._observation, F.collect_list(
            F.when(F.col(OUTPUT_COLUMN) == F.lit(TASK_SIDE), task)).alias("tasks"))
        return self

    def unpersist(self) -> None:
        if self._persisted:
            self.frame.unpersist()
            self._persisted = False

    def collect(self, extra: DataFrame | None = None) -> CollectedOutput:
        """Run the batch (one Spark action) and bring every output to the driver as
        Arrow, with the rows of ``extra`` (e.g. the rejected events) from the same job;
        the tasks' accounting rows are kept for :meth:`metrics`."""
        frame, sides = self.frame, dict(self.layout.sides)
        if extra is not None:
            frame, sides[EXTRA] = with_extra(frame, extra)
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
            rows = [r.asDict() for r in observed["tasks"]]
            self._task_rows = sorted(rows, key=lambda r: r["task"])
        if self._task_rows is None:
            if not self._persisted:
                raise LakecastError(
                    "task accounting of an unpersisted result would come from a second "
                    "computation: call persist() or observe() on the result before its "
                    "first action")
            names = self.layout.sides[TASK_SIDE].names
            rows = [r.asDict() for r in self.side(TASK_SIDE).select(*names).collect()]
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


class BroadcastRuntime:
    """Runs one :class:`~lakecast.api.BroadcastProcessFunction` over event DataFrames
    with task-local broadcast state built from Delta tables ``{name: path}``.

    Keep one instance per Spark application and call :meth:`process` per micro-batch;
    the state stays warm in the Python workers between calls.
    """

    def __init__(
        self,
        spark: SparkSession,
        function: BroadcastProcessFunction,
        tables: Mapping[str, str],
        *,
        lineage: bool = True,
        timestamp_column: str | None = None,
        state_budget_bytes: int = DEFAULT_STATE_BUDGET_BYTES,
        max_chain: int = 64,
        function_id: str | None = None,
        parallelism: int | None = None,
        reload_if: Callable[[str, int, int], str | None] | None = None,
    ) -> None:
        if not tables:
            raise ValueError("BroadcastRuntime needs at least one broadcast table")
        self.spark = spark
        self.function = function
        self.tables = dict(tables)
        self.lineage = lineage
        self.timestamp_column = timestamp_column
        self.state_budget_bytes = state_budget_bytes
        self.max_chain = max_chain
        # the worker cache's key: a given id is stable across processes (warm state
        # survives a new driver on the same Spark Connect session), qualified by the
        # tables read and the function's code so no other pipeline or code can match it
        self.function_id = (f"{function_id}@{function_identity(function, self.tables, spark)}"
                            if function_id else
                            f"{type(function).__qualname__}-{uuid.uuid4().hex[:12]}")
        self.version: dict[str, int] = {}
        self._chain: list[ChainLink] = []
        self._schemas: dict[str, pa.Schema] = {}
        self._base_bytes = 0
        self._tz: str | None = None
        self._parallelism: int | None = None
        #: tasks per batch in :meth:`process_batch` (events are repartitioned; ``None``:
        #: as read)
        self.parallelism = parallelism
        #: ``(table, from, to) -> reason`` to reload a table whole instead of applying its
        #: changes (e.g. a refused version in between, :mod:`lakecast.delta.validation`)
        self.reload_if = reload_if

    # -- the chain -------------------------------------------------------------------
    @property
    def chain(self) -> list[ChainLink]:
        return list(self._chain)

    @property
    def estimated_state_bytes(self) -> int:
        """Driver-side estimate of one state copy (Arrow size of base + increments)."""
        return self._base_bytes + sum(link.nbytes for link in self._chain[1:])

    def _base_elements(self, until: Mapping[str, int] | None) -> list[BroadcastElement]:
        """Elements a cold task builds its state from: the full tables.

        Hook: a later issue restores the state from a snapshot here instead.
        """
        return read_broadcast_elements(self.spark, self.tables, {}, until)

    @property
    def table_schemas(self) -> dict[str, pa.Schema]:
        """The broadcast tables' schemas seen so far (what ``bind_tables`` receives)."""
        return dict(self._schemas)

    def remember_schemas(self, elements: list[BroadcastElement]) -> None:
        """Record the tables' schemas of ``elements`` (full reads are authoritative)."""
        for e in elements:
            if e.kind != "full" and e.table in self._schemas:
                continue
            schema = e.schema  # (a DeltaFilesElement knows it without reading rows)
            if CHANGE_TYPE in schema.names:
                schema = schema.remove(schema.get_field_index(CHANGE_TYPE))
            self._schemas[e.table] = schema

    def ship(self, elements: list[BroadcastElement]) -> Any:
        """How ``elements`` travel to the tasks: one Spark broadcast variable in-process,
        the list itself (in the task closure) over Spark Connect."""
        if is_connect(self.spark):
            return list(elements)
        return self.spark.sparkContext.broadcast(elements)

    @staticmethod
    def release(link: ChainLink) -> None:
        """Free what :meth:`ship` allocated for ``link``."""
        if not isinstance(link.broadcast, list):
            link.broadcast.unpersist()

    def link(self, elements: list[BroadcastElement], version: dict[str, int]) -> ChainLink:
        """A chain link shipping ``elements`` (see :meth:`ship`), ending at ``version``."""
        self.remember_schemas(elements)
        return ChainLink(
            version_json(version), dict(version), self.ship(elements), len(elements),
            sum(e.num_rows for e in elements), sum(e.nbytes for e in elements),
        )

    def refresh(self, until: Mapping[str, int] | None = None) -> list[BroadcastElement]:
        """Read broadcast elements after the current state version (up to ``until`` or the
        newest versions) and append them to the chain; returns the new elements."""
        if self._chain and until is not None and (any(
            v < self.version.get(t, -1) for t, v in until.items()
        ) or set(self.version) - set(until)):  # replaying an older planned batch: rebuild
            # the state as of ``until`` (a table absent from it stays absent)
            self.close()
            self.version = {}
        if not self._chain:
            elements = self._base_elements(until)
            self.version = {e.table: e.version for e in elements}
            link = self.link(elements, self.version)
            self._chain = [link]
            self._base_bytes = link.nbytes
            return elements
        if until is None:
            latest = latest_versions(self.tables, self.spark)
            target = {t: v for t, v in latest.items() if v is not None}
        else:  # pinned: exactly the planned tables and versions
            target = dict(until)
        if all(self.version.get(t) == v for t, v in target.items()):
            return []
        elements = read_broadcast_elements(self.spark, self.tables, self.version, target,
                                           reload_if=self.reload_if)
        if not elements:
            return []
        for e in elements:
            self.version[e.table] = e.version
        inc_rows = sum(link.n_rows for link in self._chain[1:]) + sum(e.num_rows for e in elements)
        if len(self._chain) >= self.max_chain or inc_rows > 2 * max(self._chain[0].n_rows, 1):
            self._rebase()
        else:
            self._chain.append(self.link(elements, self.version))
        return elements

    def _rebase(self) -> None:
        """Replace the chain by a new base at the current version (cold tasks rebuild)."""
        old = self._chain
        elements = self._base_elements(self.version)
        link = self.link(elements, self.version)
        self._chain, self._base_bytes = [link], link.nbytes
        for o in old:
            self.release(o)

    # -- running ---------------------------------------------------------------------
    def plan(self, input_schema: pa.Schema, watermark: int | None = None) -> TaskPlan:
        """The task plan for the current chain (no Spark job)."""
        self.function.bind_tables(self._schemas)
        layout = OutputLayout.of(self.function, input_schema, self.lineage)
        layout = replace(layout, sides={**layout.sides, TASK_SIDE: TASK_ROW_SCHEMA})
        return TaskPlan(
            function_id=self.function_id,
            function=self.function,
            tables=tuple(sorted(self.tables)),
            chain=tuple(self._chain),
            layout=layout,
            timestamp_column=self.timestamp_column,
            watermark=watermark,
        )

    def process(
        self,
        events: DataFrame,
        *,
        refresh: bool = True,
        until: Mapping[str, int] | None = None,
        watermark: int | None = None,
    ) -> BroadcastResult:
        """Run the function over ``events`` at the newest (or ``until``) state version.

        Returns a lazy :class:`BroadcastResult`; nothing runs until an action.
        """
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

        t0 = time.perf_counter()
        new = self.refresh(until) if refresh or not self._chain else []
        refresh_s = time.perf_counter() - t0
        if self._tz is None:
            self._tz = self.spark.conf.get("spark.sql.session.timeZone", "UTC")
        tz = self._tz
        input_schema = to_arrow_schema(events.schema, timezone=tz)
        plan = self.plan(input_schema, watermark)
        layout = plan.layout
        # lineage: the state version is fixed here, before the job, so the JVM adds it as
        # a literal column; tasks still check that they are at exactly this version
        task_layout = replace(layout, lineage=False)
        plan = replace(plan, layout=task_layout)
        if self._parallelism is None:  # estimate; tasks report the real one
            self._parallelism = default_parallelism(self.spark)
        parallelism = self._parallelism
        if self.estimated_state_bytes * parallelism > self.state_budget_bytes:
            warn_over_budget(
                "estimated broadcast state",
                f"estimated broadcast state {self.estimated_state_bytes / 1e6:.1f} MB x "
                f"{parallelism} (default parallelism) exceeds the budget of "
                f"{self.state_budget_bytes / 1e6:.1f} MB; {BUDGET_FIX}",
                stacklevel=2,
            )
        spark_schema = from_arrow_schema(task_layout.schema, prefer_timestamp_ntz=False)
        frame = events.mapInArrow(_task_function(plan), spark_schema)
        if layout.lineage:  # the last column of the layout: one withColumn
            version = plan.chain[-1].to_key if plan.chain else version_json({})
            frame = frame.withColumn(VERSION_COLUMN, F.lit(version))
        return BroadcastResult(
            frame, layout, dict(self.version), new, self.state_budget_bytes, refresh_s
        )

    def warm_up(self, events: DataFrame, until: Mapping[str, int] | None = None) -> int:
        """Build the task-local state at ``until`` in :attr:`parallelism` tasks (``events``:
        the batches' input, for its schema), so that a first batch runs warm; returns the
        tasks that were cold."""
        from pyspark.sql.pandas.types import to_arrow_schema

        self.refresh(until)
        plan = self.plan(to_arrow_schema(events.schema, timezone="UTC"))
        p = self.parallelism or default_parallelism(self.spark)
        rows = self.spark.range(0, p, 1, p).mapInArrow(
            lambda batches: warm_task(plan, batches), WARM_SCHEMA).collect()
        return sum(int(r[0]) for r in rows)

    # -- the runtime contract (lakecast.pipeline.contract.BatchRuntime) ----------------
    def process_batch(self, events: DataFrame, plan: BatchPlan) -> BroadcastResult:
        """The batch at the plan's state version (events repartitioned to
        :attr:`parallelism` when set)."""
        if self.parallelism:
            events = events.repartition(self.parallelism)
        return self.process(events, until=plan.broadcast_versions)

    def before_commit(self, output: BatchOutput, plan: BatchPlan) -> Mapping[str, Any] | None:
        """Nothing to check (see :class:`~lakecast.snapshots.runtime.SnapshottingRuntime`)."""
        return None

    def commit_state(self, output: BatchOutput) -> None:
        """Nothing to persist: broadcast state is rebuilt from Delta versions."""

    def after_commit(self, plan: BatchPlan) -> Mapping[str, Any] | None:
        """No checkpoints (see :class:`~lakecast.snapshots.runtime.SnapshottingRuntime`)."""
        return None

    def on_rewind(self, plan: BatchPlan) -> None:
        """Nothing to do: the next batch rebuilds the state at its planned versions."""

    def close(self) -> None:
        """Release the broadcast variables of the chain."""
        for link in self._chain:
            self.release(link)
        self._chain = []


def function_identity(function: object, tables: Mapping[str, str],
                      spark: SparkSession | None = None) -> str:
    """A digest of ``function``'s class source and the broadcast tables: their paths and
    when each was created (a table deleted and created again restarts its versions, so
    the same version numbers must not match state cached from the old one)."""
    import hashlib
    import inspect

    try:
        source = inspect.getsource(type(function))
    except (OSError, TypeError):  # defined interactively: its name must do
        source = type(function).__qualname__
    lines = [source]
    for name, path in sorted(tables.items()):
        try:
            created: object = commit_info(path, 0, spark).timestamp_ms
        except (DeltaIOError, OSError):  # no table yet, or its first commit was cleaned up
            created = "-"
        lines.append(f"{name}={path}@{created}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]


ArrowMapFn = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def _task_function(plan: TaskPlan) -> ArrowMapFn:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return run_task(plan, batches)

    return run


def process_with_broadcast_state(
    spark: SparkSession,
    events: DataFrame,
    function: BroadcastProcessFunction,
    tables: Mapping[str, str],
    **options: Any,
) -> BroadcastResult:
    """One-shot convenience: a fresh :class:`BroadcastRuntime` and one :meth:`process`."""
    return BroadcastRuntime(spark, function, tables, **options).process(events)
