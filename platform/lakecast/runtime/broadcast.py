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
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakecast.api.element import CHANGE_TYPE, BroadcastElement
from lakecast.api.enrich import Enrichment
from lakecast.api.functions import BroadcastProcessFunction
from lakecast.delta.log import DeltaIOError, commit_info
from lakecast.delta.source import latest_versions, read_broadcast_elements
from lakecast.pipeline.contract import TASK_SIDE, BaseRuntime
from lakecast.runtime.engine import EngineChoice, Execution, choose_engine
from lakecast.runtime.executor import OutputLayout, version_json
from lakecast.runtime.joins import plan_joins
from lakecast.runtime.jvm_files import StateFiles
from lakecast.runtime.jvm_state import JvmLookups, not_in_jvm, say_once
from lakecast.runtime.metrics import (
    BUDGET_FIX,
    DEFAULT_STATE_BUDGET_BYTES,
    TASK_ROW_SCHEMA,
    warn_over_budget,
)
from lakecast.runtime.result import BroadcastResult
from lakecast.runtime.routing import choose_shards, per_task_bytes, route
from lakecast.runtime.tasks import WARM_SCHEMA, ChainLink, TaskPlan, run_task, warm_task
from lakecast.spark import default_parallelism, is_connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakecast.pipeline.contract import BatchOutput
    from lakecast.pipeline.progress import BatchPlan


class BroadcastRuntime(BaseRuntime):
    """Runs one :class:`~lakecast.api.BroadcastProcessFunction` over event DataFrames
    with task-local broadcast state built from Delta tables ``{name: path}``.

    Keep one instance per Spark application and call :meth:`process` per micro-batch;
    the state stays warm in the Python workers between calls — or, for a pure
    ``enrich(Lookup...)``, in the executor JVM (:mod:`lakecast.runtime.jvm_state`;
    ``jvm_lookups=False`` keeps it in the Python workers, ``True`` requires the JVM).
    ``engine``: the state engine chosen for it (:func:`~lakecast.runtime.engine.choose_engine`,
    as :mod:`lakecast.build` does); without one it is chosen here from ``execution`` and
    ``jvm_lookups``.
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
        execution: Execution = "tasks",
        jvm_lookups: bool | None = None,
        engine: EngineChoice | None = None,
    ) -> None:
        if not tables:
            raise ValueError("BroadcastRuntime needs at least one broadcast table")
        if engine is None:
            engine = choose_engine(spark, function, execution=execution,
                                   jvm_lookups=jvm_lookups)
        if engine.engine not in ("python", "jvm", "joins"):
            raise ValueError(f"BroadcastRuntime cannot run the {engine.engine!r} engine")
        #: the state engine and why (:mod:`lakecast.runtime.engine`)
        self.engine = engine
        sharded = [d.name for d in function.state_descriptors() if d.shards]
        if sharded and function.routing() is None:
            raise ValueError(f"{type(function).__name__} declares sharded states {sharded} "
                             "but no routing(): return the event columns equal to their key "
                             "and the shard count")
        #: ``"tasks"``: task-local state (Python workers or executor JVM); ``"joins"``: a
        #: pure ``enrich(Lookup...)`` as Spark broadcast joins (:mod:`lakecast.runtime.joins`)
        self.execution: Execution = "joins" if engine.engine == "joins" else "tasks"
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
        self._ephemeral_id = not function_id
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
        #: the ``"jvm"`` engine's lookups (:mod:`lakecast.runtime.jvm_state`); ``None``: the
        #: state is in the Python workers (or joins have none)
        self.jvm: JvmLookups | None = self._jvm_lookups() if engine.engine == "jvm" else None

    def _jvm_lookups(self) -> JvmLookups:
        from lakecast.config import get_settings

        assert isinstance(self.function, Enrichment)
        settings = get_settings()
        return JvmLookups(StateFiles.at(settings.jvm_state_dir, settings), self.function_id,
                          self.function, ephemeral=self._ephemeral_id)

    @property
    def state_engine(self) -> str:
        """Where the task-local state lives: ``"jvm"``, ``"python"`` or ``"joins"`` (a
        ``"jvm"`` engine whose columns' types sent the lookups back: ``"python"``)."""
        if self.engine.engine == "jvm" and self.jvm is None:
            return "python"
        return self.engine.engine

    @property
    def state_engine_reason(self) -> str:
        """Why :attr:`state_engine` holds the state (one line, for a batch's metadata)."""
        return self.engine.reason

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
        the list itself (in the task closure) over Spark Connect; JVM lookups keep the list
        (the driver writes it as state files)."""
        if is_connect(self.spark) or getattr(self, "jvm", None) is not None:
            return list(elements)
        return self.spark.sparkContext.broadcast(elements)

    def release(self, link: ChainLink) -> None:
        """Free what :meth:`ship` allocated for ``link``."""
        if self.jvm is not None:
            self.jvm.forget(link)
        if not isinstance(link.broadcast, list):
            link.broadcast.unpersist()

    def link(self, elements: list[BroadcastElement], version: dict[str, int]) -> ChainLink:
        """A chain link shipping ``elements`` (see :meth:`ship`), ending at ``version``."""
        self.remember_schemas(elements)
        sizes: dict[str, int] = {}
        for e in elements:
            sizes[e.table] = sizes.get(e.table, 0) + e.nbytes
        return ChainLink(
            version_json(version), dict(version), self.ship(elements), len(elements),
            sum(e.num_rows for e in elements), sum(sizes.values()), sizes,
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
            choose_shards(self.function, elements, self.state_budget_bytes // max(
                1, self.parallelism or default_parallelism(self.spark)))
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
        # a sharded table's changes are held whole by every task: rebase before they
        # outgrow a shard
        shards = max([d.shards or 1 for d in self.function.state_descriptors()] or [1])
        if len(self._chain) >= self.max_chain or inc_rows > 2 * max(
                self._chain[0].n_rows, 1) // shards:
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
        if self.jvm is not None:
            self.jvm.prune()

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
        from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

        t0 = time.perf_counter()
        if self.execution == "joins":
            return self._process_joins(events, until, t0)
        new = self.refresh(until) if refresh or not self._chain else []
        refresh_s = time.perf_counter() - t0
        if self.jvm is not None:
            result = self._process_jvm(events, watermark)
            if result is not None:
                result.new_elements = new
                result.refresh_seconds = time.perf_counter() - t0
                return result
        if self._tz is None:
            self._tz = self.spark.conf.get("spark.sql.session.timeZone", "UTC")
        tz = self._tz
        events = route(events, self.function, self._schemas)  # (sharded: to their shards)
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
        per_task = per_task_bytes(self.function, self._chain, self.estimated_state_bytes)
        if per_task * parallelism > self.state_budget_bytes:
            warn_over_budget(
                "estimated broadcast state",
                f"estimated broadcast state {per_task / 1e6:.1f} MB per task x "
                f"{parallelism} (default parallelism) exceeds the budget of "
                f"{self.state_budget_bytes / 1e6:.1f} MB; {BUDGET_FIX}",
                stacklevel=2,
            )
        spark_schema = from_arrow_schema(task_layout.schema, prefer_timestamp_ntz=False)
        frame = events.mapInArrow(_task_function(plan), spark_schema)
        # lineage: the views add the version as a literal last, above the filter and the
        # observation, so the tasks' rows are projected once on their way to the sink
        version = None
        if layout.lineage:
            version = plan.chain[-1].to_key if plan.chain else version_json({})
        return BroadcastResult(frame, layout, dict(self.version), new,
                               self.state_budget_bytes, refresh_s, version_literal=version,
                               frame_schema=spark_schema)

    def _process_joins(self, events: DataFrame, until: Mapping[str, int] | None,
                       t0: float) -> BroadcastResult:
        """``execution="joins"``: the tables time-travelled to ``until`` (or their newest
        versions), broadcast-joined to the events by Spark."""
        if until is None:
            latest = latest_versions(self.tables, self.spark)
            until = {t: v for t, v in latest.items() if v is not None}
        self.version = dict(until)
        result = plan_joins(self.spark, self.function, self.tables, self.version, events,
                            self.lineage, self.function_id, self.state_budget_bytes)
        result.refresh_seconds = time.perf_counter() - t0
        return result

    def _process_jvm(self, events: DataFrame,
                     watermark: int | None = None) -> BroadcastResult | None:
        """The lookups in the executor JVM, or ``None`` (said once) when the columns'
        types keep them in the Python workers from now on."""
        from pyspark.sql.pandas.types import to_arrow_schema

        assert self.jvm is not None and isinstance(self.function, Enrichment)
        if self._tz is None:
            self._tz = self.spark.conf.get("spark.sql.session.timeZone", "UTC")
        why = not_in_jvm(self.function, self._schemas,
                         to_arrow_schema(events.schema, timezone=self._tz))
        if why is not None:
            say_once(why)
            self.jvm = None
            return None
        return self.jvm.plan(self.spark, self._chain, self._schemas, self.version, events,
                             self.lineage, self.function_id, self.state_budget_bytes,
                             timezone=self._tz, state_bytes=self.estimated_state_bytes,
                             watermark=watermark)

    def warm_up(self, events: Callable[[], DataFrame],
                until: Mapping[str, int] | None = None) -> int:
        """Build the task-local state at ``until`` in :attr:`parallelism` tasks (``events``
        gives the batches' input, for its schema), so that a first batch runs warm; returns
        the tasks that were cold (none with ``execution="joins"``: there is no task state)."""
        if self.execution == "joins":
            return 0
        from pyspark.sql.pandas.types import to_arrow_schema

        self.refresh(until)
        p = self.parallelism or default_parallelism(self.spark)
        if self.jvm is not None:  # executors build the state; none is a Python task's
            return self.jvm.warm(self.spark, self._chain, self._schemas, p)
        plan = self.plan(to_arrow_schema(events().schema, timezone="UTC"))
        rows = self.spark.range(0, p, 1, p).mapInArrow(
            lambda batches: warm_task(plan, batches), WARM_SCHEMA).collect()
        return sum(int(r[0]) for r in rows)

    # -- the runtime contract (lakecast.pipeline.contract.BatchRuntime) ----------------
    def process_batch(self, events: DataFrame, plan: BatchPlan) -> BroadcastResult:
        """The batch at the plan's state version (events repartitioned to
        :attr:`parallelism` when set)."""
        if self.parallelism and self.function.routing() is None:  # (routed: per shard)
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
        """Release the broadcast variables of the chain (and the JVM lookups' files of a
        runtime without a stable function id)."""
        for link in self._chain:
            self.release(link)
        self._chain = []
        if self.jvm is not None:
            self.jvm.close()


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
