"""A pipeline's declaration (no Dagster): its function, tables, parallelism and checkpoint
policy, how the engine pipeline is built from it (:mod:`lakecast.build`, or the
declaration's own ``builder``), and the optional hooks the factory calls (names, writers,
run config, metadata, sensor events). The Dagster definitions come from
:func:`dagster_lakecast.factory.declare_pipeline`."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lakecast.api.functions import BroadcastProcessFunction
from lakecast.api.keyed import KeyedBroadcastProcessFunction
from lakecast.build import broadcast_pipeline, keyed_pipeline
from lakecast.config import Settings, get_settings
from lakecast.names import check_pipeline_name, check_table_name
from lakecast.pipeline.batch_result import BatchResult
from lakecast.pipeline.dedup import DedupSpec
from lakecast.pipeline.micro_batch import MicroBatchPipeline, PipelineSpec, Validator
from lakecast.pipeline.progress import BatchCommit, BatchPlan

#: the roles of a pipeline's tables
# (:class:`~dagster_lakecast.translator.DagsterLakecastTranslator`)
EVENTS, BROADCAST, MAIN, SIDE, REJECTED, STATE, PROGRESS, SNAPSHOTS = (
    "events", "broadcast", "main", "side", "rejected", "state", "progress", "snapshots")

__all__ = [
    "Builder", "CheckpointPolicy", "MetadataHook", "PipelineDeclaration", "RecoveredHook",
    "RunMetadataHook", "SensorEventsHook",
]  # fmt: skip

#: ``hook(settings, result)`` -> extra metadata of one committed batch per output table
#: (``{table: {key: value}}``), added to that table's materialization
MetadataHook = Callable[[Settings, BatchResult], Mapping[str, Mapping[str, Any]]]
#: ``hook(settings, plan, commit)`` -> metadata per output table of a batch committed by a
#: run that died before recording it (recorded by the next run)
RecoveredHook = Callable[[Settings, BatchPlan, BatchCommit], Mapping[str, Mapping[str, Any]]]
#: ``hook(results)`` -> extra metadata of a run's last materializations (run totals)
RunMetadataHook = Callable[[list[BatchResult]], Mapping[str, Any]]
#: ``builder(spark, settings, parallelism=, max_versions_per_batch=, **run_options)`` ->
#: the engine pipeline (``run_options``: the run config's fields beyond the factory's own)
Builder = Callable[..., MicroBatchPipeline]
#: ``hook(context, previous, versions, settings)`` -> asset events (e.g. observations) a
#: sensor tick records, run or not (``previous``: the cursor's versions, ``None`` if unusable)
SensorEventsHook = Callable[
    [Any, Mapping[str, int | None] | None, Mapping[str, int | None], Settings], list[Any]
]


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
    """Everything the factory needs to know about one pipeline.

    ``function``: a zero-argument callable (usually the class) returning a
    :class:`~lakecast.api.functions.BroadcastProcessFunction` or a
    :class:`~lakecast.api.keyed.KeyedBroadcastProcessFunction`. ``side_outputs``: side
    output name -> table. ``validator`` adds ``_reason`` to invalid events (they go to
    ``rejected_table``). ``descriptions``: table -> asset description. ``metadata``: an
    optional :data:`MetadataHook` whose entries join each batch's materializations.

    ``columns``: table -> its columns (a Dagster ``TableSchema``), shown on its asset
    before the first batch; ``lineage``: output column -> the ``table.column`` inputs it is
    computed from (column lineage of the main output); ``freshness_seconds``: the main
    output's ``FreshnessPolicy`` fails when it was not updated for that long, and the
    ``events_fresh`` check when an events version older than that is unprocessed.

    Optional hooks, for pipelines with a history of their own (the example project's
    storefront enrichment): ``sensor`` names the sensor (default ``<name>_sensor``);
    ``maintenance_job`` and ``maintenance_schedule`` name the maintenance job and its
    schedule (default ``<name>_maintenance_job``, ``<name>_maintenance``); ``writer_jobs``
    are other jobs that write the tables (a run refuses to start and the sensor waits while
    one is active); ``broadcast_only_runs=False``: a new broadcast version alone is no work
    for the sensor (it applies with the next events); ``deps``: output table -> the assets
    it depends on (default: events and broadcast tables); ``builder`` builds the engine
    pipeline instead of :meth:`build`'s default; ``run_config``: a subclass of
    :class:`~dagster_lakecast.factory.PipelineRunConfig` whose extra fields go to
    ``builder``; ``run_metadata`` adds entries to a run's last materializations;
    ``recovered_metadata`` adds entries to the metadata of batches committed but not
    recorded by a killed run (the next run records them); ``state_budget``: the
    ``state_budget`` check and per-batch budget figures (broadcast state x parallelism);
    ``sensor_events``: asset events each sensor tick records (default: an observation of
    each input table whose Delta version moved).
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
    description: str = ""
    descriptions: Mapping[str, str] = field(default_factory=dict)
    group_name: str | None = None
    #: the ``events_fresh`` check fails when an events version older than this is
    #: unprocessed; the main output's FreshnessPolicy when it was not updated for this long
    freshness_seconds: float = 900.0
    columns: Mapping[str, Any] = field(default_factory=dict)
    lineage: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: rows of the main output the ``output_sample_recomputed`` check recomputes at most
    recompute_sample: int = 200
    metadata: MetadataHook | None = None
    sensor: str | None = None
    sensor_description: str | None = None
    maintenance_job: str | None = None
    maintenance_schedule: str | None = None
    #: the asset key of each table: set one to name a table's asset otherwise (e.g. the key
    #: of the user's asset that writes it; default: the table name); the factory fills the
    #: rest from its translator
    asset_keys: Mapping[str, Any] = field(default_factory=dict)
    #: input tables written outside Dagster: observable source assets whose data version
    #: is the Delta version (:mod:`dagster_lakecast.inputs`); ``observe_automation``: the
    #: ``AutomationCondition`` that observes them (e.g. ``cron_tick_passed``)
    observe: tuple[str, ...] = ()
    observe_automation: Any = None
    #: an ``AutomationCondition`` on the outputs (Declarative Automation, e.g. ``eager()``)
    #: instead of the sensor: the sensor is then declared stopped (start it to use both)
    automation_condition: Any = None
    #: an events commit that deletes or updates rows: ``"fail"`` the batch (a clear error
    #: naming the fix) or ``"skip"`` the commit whole (Delta's ``skipChangeCommits``)
    events_rewrites: str = "fail"
    writer_jobs: tuple[str, ...] = ()
    broadcast_only_runs: bool = True
    deps: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    builder: Builder | None = None
    #: a subclass of ``dagster_lakecast.factory.PipelineRunConfig`` (a Dagster ``Config``)
    run_config: Any = None
    run_metadata: RunMetadataHook | None = None
    recovered_metadata: RecoveredHook | None = None
    state_budget: bool = False
    sensor_events: SensorEventsHook | None = None
    #: ``"joins"``: a pure ``enrich(Lookup...)`` runs each batch as Spark broadcast joins
    #: (:mod:`lakecast.runtime.joins`; large cold batches, e.g. backfills) instead of on
    #: task-local state (``"tasks"``, warm micro-batches; for a pure lookup, held in the
    #: executor JVM and not checkpointed, :func:`lakecast.build.broadcast_pipeline`)
    execution: str = "tasks"

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
    def job_name(self) -> str:
        return f"{self.name}_microbatch"

    @property
    def continuous_job_name(self) -> str:
        return f"{self.name}_continuous"

    @property
    def maintenance_job_name(self) -> str:
        return self.maintenance_job or f"{self.name}_maintenance_job"

    @property
    def maintenance_schedule_name(self) -> str:
        return self.maintenance_schedule or f"{self.name}_maintenance"

    def asset_key(self, table: str) -> Any:
        """The asset key of ``table`` (the factory's translator; default: the table name)."""
        from dagster import AssetKey

        key = self.asset_keys.get(table)
        if key is None:
            return AssetKey(table)
        return key if isinstance(key, AssetKey) else AssetKey.from_user_string(str(key))

    @property
    def sensor_name(self) -> str:
        return self.sensor or f"{self.name}_sensor"

    @property
    def writers(self) -> tuple[str, ...]:
        """Every job that writes the pipeline's tables: its own, its continuous job,
        ``writer_jobs``, then the maintenance job."""
        return (self.job_name, self.continuous_job_name, *self.writer_jobs,
                self.maintenance_job_name)

    @property
    def group(self) -> str:
        return self.group_name or self.name

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
        out = [(self.output_table, "enriched")]
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
        if self.builder is not None:
            return self.builder(spark, settings, parallelism=parallelism,
                                max_versions_per_batch=max_versions_per_batch, **run_options)
        if run_options:
            raise ValueError(f"{self.name}: run options {sorted(run_options)} need a "
                             "builder in the pipeline's declaration (PipelineDeclaration.builder)")
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
