"""A pipeline's declaration (no Dagster), split by job: what the engine builds (the
function, tables, parallelism, checkpoint policy: this class, and :meth:`build` makes the
engine pipeline with :mod:`lakecast.build`), how Dagster names and shows it
(:class:`~dagster_lakecast.naming.DagsterNames`) and a project's hooks
(:class:`~dagster_lakecast.hooks.PipelineHooks`). The Dagster definitions come from
:func:`dagster_lakecast.factory.declare_pipeline`, which resolves the declaration once into
a :class:`~dagster_lakecast.handle.PipelineHandle`."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dagster_lakecast.hooks import PipelineHooks
from dagster_lakecast.naming import DagsterNames
from lakecast.api.functions import BroadcastProcessFunction
from lakecast.api.keyed import KeyedBroadcastProcessFunction
from lakecast.build import broadcast_pipeline, keyed_pipeline
from lakecast.config import Settings, get_settings
from lakecast.names import check_pipeline_name, check_table_name
from lakecast.pipeline.dedup import DedupSpec
from lakecast.pipeline.micro_batch import MicroBatchPipeline, PipelineSpec, Validator
from lakecast.pipeline.progress import MAIN_COUNT

#: the roles of a pipeline's tables
# (:class:`~dagster_lakecast.translator.DagsterLakecastTranslator`)
EVENTS, BROADCAST, MAIN, SIDE, REJECTED, STATE, PROGRESS, SNAPSHOTS = (
    "events", "broadcast", "main", "side", "rejected", "state", "progress", "snapshots")
__all__ = ["CheckpointPolicy", "DagsterNames", "PipelineDeclaration", "PipelineHooks"]


@dataclass(frozen=True)
class CheckpointPolicy:
    """How state is made durable. Broadcast functions: checkpoint the task-local state
    every ``every`` committed batches (``None``: never), keep ``keep`` checkpoints
    (defaults: ``LAKECAST_CHECKPOINT_EVERY`` and ``LAKECAST_KEEP_CHECKPOINTS``, 10 each). Keyed
    functions: their state is versioned in Delta with every batch; ``every`` compacts the
    keyed state table every N batches, and maintenance keeps the newest ``keep`` committed
    batches rewindable (:func:`lakecast.snapshots.horizon.batch_horizon`)."""

    every: int | None = field(default_factory=lambda: get_settings().checkpoint_every)
    keep: int | None = field(default_factory=lambda: get_settings().keep_checkpoints)


@dataclass(frozen=True)
class PipelineDeclaration:
    r"""What the engine builds for one pipeline, with its Dagster names and hooks.

    ``function``: a zero-argument callable (usually the class) returning a
    :class:`~lakecast.api.functions.BroadcastProcessFunction` or a
    :class:`~lakecast.api.keyed.KeyedBroadcastProcessFunction`. ``side_outputs``: side
    output name -> table. ``validator`` adds ``_reason`` to invalid events (they go to
    ``rejected_table``). ``execution="joins"``: a pure ``enrich(Lookup...)`` runs each
    batch as Spark broadcast joins (:mod:`lakecast.runtime.joins`; large cold batches, e.g.
    backfills) instead of on task-local state (``"tasks"``, warm micro-batches).
    ``events_rewrites``: an events commit that deletes or updates rows ``"fail"``\s the
    batch (a clear error naming the fix) or is skipped whole (``"skip"``, Delta's
    ``skipChangeCommits``). ``dagster``: how Dagster names and shows it
    (:class:`~dagster_lakecast.naming.DagsterNames`); ``hooks``: a project's own code
    (:class:`~dagster_lakecast.hooks.PipelineHooks`).
    """

    name: str
    function: Callable[[], BroadcastProcessFunction]
    events_table: str
    broadcast_tables: tuple[str, ...]
    output_table: str
    side_outputs: Mapping[str, str] = field(default_factory=dict)
    rejected_table: str | None = None
    validator: Validator | None = None
    parallelism: int | None = None
    checkpoint: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    timestamp_column: str | None = None
    order_columns: tuple[str, ...] = ()
    key_groups: int = 128
    dedup: DedupSpec | None = None
    events_rewrites: str = "fail"
    execution: str = "tasks"
    dagster: DagsterNames = field(default_factory=DagsterNames)
    hooks: PipelineHooks = field(default_factory=PipelineHooks)

    def __post_init__(self) -> None:
        """Names that become paths and Dagster names are checked here, naming the field."""
        check_pipeline_name(self.name, "name")
        tables = [("events_table", self.events_table), ("output_table", self.output_table),
                  *(("broadcast_tables", t) for t in self.broadcast_tables),
                  *((f"side_outputs.{s}", t) for s, t in self.side_outputs.items()),
                  *((("rejected_table", self.rejected_table),) if self.rejected_table else ())]
        for name, table in tables:
            check_table_name(table, name)

    @property
    def keyed(self) -> bool:
        return isinstance(self.function(), KeyedBroadcastProcessFunction)

    @property
    def state_table(self) -> str | None:
        """The keyed state table (keyed functions only)."""
        return f"{self.name}_keyed_state" if self.keyed else None

    @property
    def roles(self) -> dict[str, str]:
        """Every table of the pipeline and its role (:data:`EVENTS`, :data:`MAIN`, ...)."""
        roles = {self.events_table: EVENTS, **{t: BROADCAST for t in self.broadcast_tables},
                 self.output_table: MAIN, **{t: SIDE for t in self.side_outputs.values()}}
        if self.rejected_table:
            roles[self.rejected_table] = REJECTED
        if self.state_table:
            roles[self.state_table] = STATE
        roles[f"{self.name}_progress"] = PROGRESS
        if not self.keyed:
            roles[f"{self.name}_snapshots"] = SNAPSHOTS
        return roles

    @property
    def outputs(self) -> list[tuple[str, str]]:
        """``(table, count key)`` of every output asset, main output first."""
        out = [(self.output_table, MAIN_COUNT)]
        out += [(table, side) for side, table in self.side_outputs.items()]
        if self.rejected_table:
            out.append((self.rejected_table, "rejected"))
        return out

    def spec(self, max_versions_per_batch: int | None = None) -> PipelineSpec:
        return PipelineSpec(
            name=self.name, events_table=self.events_table,
            broadcast_tables=tuple(self.broadcast_tables), output_table=self.output_table,
            side_outputs=dict(self.side_outputs), rejected_table=self.rejected_table,
            max_versions_per_batch=max_versions_per_batch, state_table=self.state_table,
            dedup=self.dedup, events_rewrites=self.events_rewrites)  # fmt: skip

    def build(
        self,
        spark: Any,
        settings: Settings,
        *,
        parallelism: int | None = None,
        max_versions_per_batch: int | None = None,
        **run_options: Any,
    ) -> MicroBatchPipeline:
        """The engine pipeline over the lake of ``settings`` (:mod:`lakecast.build`, or the
        declaration's ``builder``, which alone takes ``run_options``)."""
        if self.hooks.builder is not None:
            return self.hooks.builder(spark, settings, parallelism=parallelism,
                                      max_versions_per_batch=max_versions_per_batch,
                                      **run_options)
        if run_options:
            raise ValueError(f"{self.name}: run options {sorted(run_options)} need a "
                             "builder in the pipeline's hooks (PipelineHooks.builder)")
        function = self.function()
        common: dict[str, Any] = dict(
            table_path=settings.table_path, checkpoint_root=settings.checkpoint_root,
            validator=self.validator, timestamp_column=self.timestamp_column,
            function_id=self.name)  # fmt: skip
        spec = self.spec(max_versions_per_batch)
        tasks = parallelism or self.parallelism
        if isinstance(function, KeyedBroadcastProcessFunction):
            if self.execution != "tasks":
                raise ValueError(f"{self.name}: execution={self.execution!r} is for a pure "
                                 "enrich(Lookup...); a keyed function runs on tasks")
            options: dict[str, Any] = {
                "order_columns": self.order_columns,
                "key_groups": self.key_groups,
                "parallelism": tasks,
            }
            if self.checkpoint.every:
                options["compact_every"] = self.checkpoint.every
            return keyed_pipeline(spark, spec, function, **common, **options)
        return broadcast_pipeline(
            spark,
            spec,
            function,
            parallelism=tasks,
            checkpoint_every=self.checkpoint.every,
            keep_checkpoints=self.checkpoint.keep,
            execution=self.execution,
            **common,
        )
