"""``<name>_maintenance_job`` and its schedule ``<name>_maintenance`` (or the names the
declaration gives) for every pipeline declared through the factory
(:func:`dagster_lakecast.factory.declare_pipeline`): compact, VACUUM and checkpoint the
Delta tables the pipeline writes (:mod:`dagster_lakecast.maintenance_tables`). The schedule
runs on ``LAKECAST_MAINTENANCE_CRON`` (daily at 03:00 UTC) and skips while the pipeline's
continuous job writes.

Tables: the outputs (main, side outputs, rejected), the progress log, and the keyed state
table (keyed function) or the snapshot table (broadcast function).

**Rewinds keep working.** A broadcast pipeline's retained checkpoints bound VACUUM
(:func:`lakecast.snapshots.horizon.rewind_horizon`): an output table's retention is
raised to the age of the oldest version a retained checkpoint can rewind it to (with a
warning), and VACUUM keeps those versions' files besides. A keyed pipeline has no
checkpoints: its state table is versioned with every batch and a rewind
(:func:`lakecast.pipeline.rewind.rewind`) rolls it back with the outputs, so its restore
points are its committed batches; the newest ``CheckpointPolicy.keep`` of them stay
rewindable (:func:`lakecast.snapshots.horizon.batch_horizon`), and so does the batch a
crashed run left pending. The rolled-back tables (outputs, keyed state) keep every file a
rewind needs: with a configured retention shorter than the age of the oldest version those
batches need, VACUUM keeps every version since that one instead (a retention of exactly that
age, not rounded up to whole hours as delta-rs's retention is), with a warning; those
versions' files are kept besides in any case.

**One writer at a time.** The job carries the pipeline's ``lakecast/exclusive`` tag (its
micro-batch job's name): the run queue never runs the two side by side; the op refuses to
start while a micro-batch run of the pipeline writes, and the micro-batch asset refuses
to start while a maintenance run does (:func:`dagster_lakecast.execute.refuse_second_writer`).
"""

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetObservation,
    AssetSpec,
    DefaultScheduleStatus,
    Failure,
    JobDefinition,
    OpExecutionContext,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    in_process_executor,
    job,
    op,
    schedule,
)

from dagster_lakecast.handle import PipelineHandle
from dagster_lakecast.maintenance_tables import (
    OUTPUT,
    PROGRESS,
    SNAPSHOTS,
    MaintainedTable,
    MaintenanceConfig,
    SparkOnDemand,
    describe,
    observation_metadata,
    retention_for,
    scheduled_run_config,
)
from dagster_lakecast.resources import LakecastSparkResource, LakeResource
from dagster_lakecast.runs import SecondWriterError, active_runs, writing_before
from dagster_lakecast.tags import EXCLUSIVE_TAG
from dagster_lakecast.translator import DagsterLakecastTranslator
from lakecast.config import Settings, get_settings
from lakecast.delta import io as delta_io
from lakecast.delta.maintenance import (
    Retention,
    default_retention_hours,
    log_retention_hours,
    maintain,
    table_properties,
)
from lakecast.pipeline.progress import ProgressLog
from lakecast.snapshots.horizon import HOUR_MS, RewindHorizon, batch_horizon, rewind_horizon
from lakecast.snapshots.store import SnapshotStore

__all__ = ["MaintenanceDefinitions", "declare_maintenance", "factory_tables"]


@dataclass(frozen=True)
class MaintenanceDefinitions:
    """A factory pipeline's maintenance: its job, schedule and internal-table assets."""

    job: JobDefinition
    schedule: ScheduleDefinition
    #: the progress log and keyed state (or snapshot) table as external assets, so the
    #: job's observations of them plot like those of the outputs
    specs: list[AssetSpec]


def factory_tables(pipe: PipelineHandle) -> list[MaintainedTable]:
    """Every Delta table the pipeline writes: outputs (and the keyed state table, which
    rewinds roll back with them), then its progress log, then its snapshot table
    (broadcast functions)."""
    tables = [MaintainedTable(pipe.name, t, OUTPUT) for t, _ in pipe.outputs]
    if pipe.decl.state_table:
        tables.append(MaintainedTable(pipe.name, pipe.decl.state_table, OUTPUT))
    tables.append(MaintainedTable(pipe.name, f"{pipe.name}_progress", PROGRESS))
    if not pipe.keyed:
        tables.append(MaintainedTable(pipe.name, f"{pipe.name}_snapshots", SNAPSHOTS))
    return tables


def horizon_of(pipe: PipelineHandle, settings: Settings, spark: Any) -> RewindHorizon:
    """What rewinds of ``pipe``'s pipeline can still restore (see the module doc)."""
    log = ProgressLog(spark, pipe.locate(settings).progress, pipe.name)
    if pipe.keyed:
        return batch_horizon(log, settings.table_path, pipe.decl.checkpoint.keep or 0, spark)
    store = SnapshotStore(spark, pipe.locate(settings).snapshots, pipe.name)
    return rewind_horizon(store, log, settings.table_path)


def rolled_back_retention(table: MaintainedTable, path: str, config: MaintenanceConfig,
                          horizon: RewindHorizon, now_ms: int | None = None,
                          keyed: bool = True
                          ) -> tuple[Retention, tuple[int, ...], list[str]]:
    """The VACUUM retention of a table rewinds roll back, the versions VACUUM keeps, and
    warnings. Broadcast pipelines (``keyed=False``) and tables never rolled back: as
    :func:`~dagster_lakecast.maintenance_tables.retention_for` (raised to what retained
    checkpoints need). Keyed pipelines: the retention (configured, else the table's Delta
    default) stands when it covers the oldest version a rewind needs, which is kept
    besides; when it is shorter, every version since that one is kept: no file removed
    after that version was committed is deleted, a retention of exactly its age."""
    if table.kind != OUTPUT or not keyed:
        return retention_for(table, path, config, horizon)
    props = table_properties(path)
    default = default_retention_hours(props)
    floor = default if config.retention_hours is None else config.retention_hours
    needed = tuple(horizon.versions.get(table.name, ()))
    old = horizon.oldest.get(table.name)
    why = horizon.describe(table.name, now_ms)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    age_h = 0.0 if old is None else max(0.0, (now - old.committed_at_ms) / HOUR_MS)
    enforce = config.retention_hours is None
    warnings = []
    if age_h > log_retention_hours(props):
        warnings.append(
            f"{table.name}: rewinds need {age_h:.1f} h of history but its JSON commits expire "
            f"after {log_retention_hours(props)} h (delta.logRetentionDuration): raise it, or "
            f"keep fewer batches rewindable")
    if old is None or floor >= age_h:
        source = "configured" if config.retention_hours is not None else "the table's default"
        return Retention(floor, floor, math.ceil(age_h), False, enforce,
                         f"VACUUM retention {floor} h ({source}); {why}"), needed, warnings
    latest = delta_io.latest_version(path)
    keep = tuple(range(old.version, (latest if latest is not None else old.version) + 1))
    reason = (f"VACUUM retention {floor} h is shorter than rewinds need ({age_h * 60:.1f} "
              f"min: {why}): every version since v{old.version} is kept instead")
    warnings.append(f"{table.name}: {reason}")
    return Retention(floor, floor, math.ceil(age_h), True, enforce, reason), keep, warnings


def refuse_beside_micro_batches(context: OpExecutionContext, pipe: PipelineHandle
                                ) -> None:
    """Fail (nothing touched) while a micro-batch run of the pipeline writes."""
    others = writing_before(context.instance, context.run_id, pipe.writers)
    if others:
        raise SecondWriterError(description=(
            f"{pipe.maintenance_job_name} refused: run {others[0].run_id} of "
            f"{others[0].job_name} is writing the {pipe.name} pipeline's tables; one writer "
            "at a time. The next scheduled run maintains them."))


def internal_specs(pipe: PipelineHandle, tables: list[MaintainedTable],
                   translator: DagsterLakecastTranslator) -> list[AssetSpec]:
    """Assets for the tables that are not outputs of the micro-batch asset (keyed state,
    progress log, snapshots)."""
    outputs = {t for t, _ in pipe.outputs}
    roles = pipe.roles
    return [translator.get_asset_spec(pipe.decl, t.name, roles[t.name])
            for t in tables if t.name not in outputs]


def declare_maintenance(pipe: PipelineHandle,
                        translator: DagsterLakecastTranslator | None = None
                        ) -> MaintenanceDefinitions:
    """The maintenance job, schedule and internal-table assets of ``pipe``."""
    translator = translator or DagsterLakecastTranslator()
    settings = get_settings()
    tables = factory_tables(pipe)
    op_name = f"maintain_{pipe.name}_tables"

    @op(name=op_name, out={},
        description=f"OPTIMIZE, VACUUM (keeping what rewinds can restore) and checkpoint the "
                    f"log of each Delta table the {pipe.name} pipeline writes; one "
                    "observation per table.")
    def maintain_tables(context: OpExecutionContext, config: MaintenanceConfig,
                        pyspark: LakecastSparkResource, lake: LakeResource
                        ) -> Iterator[AssetObservation]:
        refuse_beside_micro_batches(context, pipe)
        settings = lake.settings()
        horizon = horizon_of(pipe, settings, SparkOnDemand(pyspark))
        context.log.info(f"restore points a rewind can target: {list(horizon.checkpoints)}")
        target = config.target_file_mb * 1024 * 1024 if config.target_file_mb else None
        failed = []
        for table in tables:
            path = table.path(settings)
            if not delta_io.table_exists(path):
                context.log.info(f"{table.name}: no Delta table at {path} yet: nothing to do")
                continue
            try:
                retention, keep, warnings = rolled_back_retention(
                    table, path, config, horizon, keyed=pipe.keyed)
                for w in warnings:
                    context.log.warning(w)
                result = maintain(path, retention, keep, target_size=target)
            except delta_io.DeltaIOError as e:  # this table only: maintain the others
                context.log.error(str(e))
                failed.append(f"{table.name}: {e}")
                continue
            context.log.info(describe(table, result))
            yield AssetObservation(asset_key=pipe.asset_key(table.name),
                                   metadata=observation_metadata(result, path))
        if failed:
            raise Failure(description="; ".join(failed))

    @job(name=pipe.maintenance_job_name, tags={EXCLUSIVE_TAG: pipe.job_name},
         executor_def=in_process_executor,
         description=f"Compact, VACUUM and checkpoint the Delta tables the {pipe.name} "
                     "pipeline writes, keeping what rewinds can restore.")
    def maintenance_job() -> None:
        maintain_tables()

    @schedule(name=pipe.maintenance_schedule_name, job=maintenance_job,
              cron_schedule=settings.maintenance_cron, execution_timezone="UTC",
              default_status=DefaultScheduleStatus.RUNNING,
              description=f"Maintain the {pipe.name} pipeline's Delta tables "
                          "(LAKECAST_MAINTENANCE_CRON, daily at 03:00 UTC by default); "
                          f"skipped while {pipe.continuous_job_name} writes them.")
    def maintenance_schedule(context: ScheduleEvaluationContext) -> RunRequest | SkipReason:
        active = (active_runs(context.instance, (pipe.continuous_job_name,))
                  if context.instance_ref is not None else [])
        if active:
            return SkipReason(f"run {active[0].run_id} of {pipe.continuous_job_name} is "
                              "writing the tables; maintenance waits for a later tick")
        return RunRequest(run_config=scheduled_run_config(op_name, get_settings()))

    return MaintenanceDefinitions(maintenance_job, maintenance_schedule,
                                  internal_specs(pipe, tables, translator))
