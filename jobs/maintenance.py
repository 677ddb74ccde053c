"""``lake_maintenance_job`` and its daily schedule ``lake_maintenance``: compact, VACUUM and
checkpoint every Delta table the enrichment pipeline writes.

The pipeline appends one small file per batch to each output table (``enriched_events``,
``enrichment_unmatched``, ``enrichment_rejected``) and to its progress log, and one
checkpoint's files to its snapshot table. For each of these tables the job runs
:func:`lakecast.delta.maintenance.maintain` (delta-rs, no Spark job): OPTIMIZE
(``dataChange=false``: rows and Change Data Feed unchanged), VACUUM, a log checkpoint.

**Restore-to-checkpoint keeps working**: a rewind rolls the outputs back to the versions
a retained checkpoint's batch recorded (:mod:`lakecast.snapshots.horizon`). The VACUUM
retention of an output table is never shorter than the age of the oldest such version
(a shorter configured retention is raised to it, with a warning), never below Delta's
default of 7 days unless configured, and VACUUM keeps those versions' files besides.

**One writer at a time**: the job carries the micro-batch job's run tag
(``lakecast/exclusive: enrichment_microbatch``): the run queue never starts it beside a
micro-batch run, nor one beside it. It is one of the pipeline's writer jobs
(:data:`jobs.runs.WRITER_JOBS`): it refuses to start while a micro-batch or continuous
run writes, the sensor requests nothing while it is active, and the schedule skips while
a continuous run is active.

From the command line: ``dagster job execute -m jobs.definitions -j lake_maintenance_job``
(``--config`` with ``ops: {maintain_enrichment_tables: {config: {retention_hours: 48}}}``).
"""

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetObservation,
    AssetSpec,
    Config,
    DefaultScheduleStatus,
    Failure,
    MetadataValue,
    OpExecutionContext,
    RunRequest,
    ScheduleEvaluationContext,
    SkipReason,
    job,
    op,
    schedule,
)
from pydantic import Field

from assets.columns import column_metadata
from assets.resources import LakecastSparkResource, LakeResource
from jobs.enrichment_pipeline import ENRICHMENT, EXCLUSIVE_TAG
from jobs.runs import (
    CONTINUOUS_JOB,
    MAINTENANCE_JOB,
    MICROBATCH_JOB,
    active_runs,
    refuse_second_writer,
)
from lakecast.config import Settings
from lakecast.delta import io as delta_io
from lakecast.delta.maintenance import (
    MaintenanceResult,
    Retention,
    default_retention_hours,
    log_retention_hours,
    maintain,
    table_properties,
    vacuum_retention,
)
from lakecast.pipeline.micro_batch import PipelineSpec
from lakecast.pipeline.progress import ProgressLog, progress_path
from lakecast.snapshots.checkpointer import snapshot_path
from lakecast.snapshots.horizon import RewindHorizon, rewind_horizon
from lakecast.snapshots.store import SnapshotStore

#: when the schedule runs (cron, UTC); e.g. ``*/10 * * * *`` for a soak
MAINTENANCE_CRON = os.environ.get("LAKECAST_MAINTENANCE_CRON", "0 3 * * *")
#: the VACUUM retention (hours) of scheduled runs; unset: each table's default (7 days).
#: Never below what rewinds need (raised, with a warning); e.g. ``0`` for a soak
RETENTION_ENV = "LAKECAST_MAINTENANCE_RETENTION_HOURS"
OUTPUT, PROGRESS, SNAPSHOTS = "output", "progress", "snapshots"


@dataclass(frozen=True)
class MaintainedTable:
    """One Delta table of a pipeline: an output (rewinds roll it back), its progress log or
    its snapshot table. ``name`` is its asset key."""

    pipeline: str
    name: str
    kind: str

    def path(self, settings: Settings) -> str:
        if self.kind == PROGRESS:
            return progress_path(settings.checkpoint_root, self.pipeline)
        if self.kind == SNAPSHOTS:
            return snapshot_path(settings, self.pipeline)
        return settings.table_path(self.name)


def pipeline_tables(spec: PipelineSpec) -> list[MaintainedTable]:
    """Every Delta table a pipeline writes: outputs first, then its progress log and
    snapshot table (asset keys ``<pipeline>_progress`` and ``<pipeline>_snapshots``). The
    held table is not maintained yet (it gains one small file per batch that changes the
    held set; no asset stands for it)."""
    return [*(MaintainedTable(spec.name, t, OUTPUT) for t in spec.output_tables
              if t != spec.held_table),
            MaintainedTable(spec.name, f"{spec.name}_progress", PROGRESS),
            MaintainedTable(spec.name, f"{spec.name}_snapshots", SNAPSHOTS)]


TABLES = pipeline_tables(ENRICHMENT)

#: the progress log and snapshot table as (external) assets, so that the maintenance
#: job's observations of them are plotted like those of the output tables
INTERNAL_TABLE_SPECS = [
    AssetSpec(t.name, group_name="microbatch", kinds={"delta"},
              metadata=column_metadata(t.name),
              description=f"The {t.pipeline} pipeline's {t.kind} table (written by its "
                          f"micro-batches, maintained by {MAINTENANCE_JOB}).")
    for t in TABLES if t.kind != OUTPUT
]


class SparkOnDemand:
    """Stands for the run's Spark session and starts it on first use: the logs and files of
    a local lake are read without Spark, so a maintenance run normally starts no JVM (it
    does when a read needs Spark: damaged snapshot files, a lake on object storage)."""

    def __init__(self, resource: LakecastSparkResource) -> None:
        self.resource = resource

    def __getattr__(self, name: str) -> Any:
        return getattr(self.resource.spark_session, name)


def scheduled_run_config(op_name: str) -> dict[str, Any]:
    """The run config of a scheduled maintenance run: ``retention_hours`` from
    ``LAKECAST_MAINTENANCE_RETENTION_HOURS`` when set."""
    hours = os.environ.get(RETENTION_ENV)
    if not hours:
        return {}
    return {"ops": {op_name: {"config": {"retention_hours": int(hours)}}}}


class MaintenanceConfig(Config):
    """What the maintenance does to every table."""

    retention_hours: int | None = Field(
        default=None, description="VACUUM retention in hours (default: each table's "
        "delta.deletedFileRetentionDuration, 7 days unless set). An output table's is "
        "never shorter than the age of the oldest version a retained checkpoint can "
        "rewind it to: a shorter value is raised to that, with a warning.")
    target_file_mb: int | None = Field(
        default=None, description="OPTIMIZE's target file size in MB (default: "
        "delta.targetFileSize, else 100 MB).")


def retention_for(table: MaintainedTable, path: str, config: MaintenanceConfig,
                  horizon: RewindHorizon) -> tuple[Retention, tuple[int, ...], list[str]]:
    """The VACUUM retention of ``table``, the versions VACUUM keeps, and warnings."""
    props = table_properties(path)
    warnings = []
    if table.kind != OUTPUT:  # never rolled back: nothing older than its newest version
        why = f"no rewind rolls the {table.kind} table back"
        return vacuum_retention(config.retention_hours, 0, default_retention_hours(props),
                                why), (), warnings
    needed = horizon.needed_hours(table.name)
    retention = vacuum_retention(config.retention_hours, needed,
                                 default_retention_hours(props), horizon.describe(table.name))
    if needed > log_retention_hours(props):
        warnings.append(
            f"{table.name}: rewinds need {needed} h of history but its JSON commits expire "
            f"after {log_retention_hours(props)} h (delta.logRetentionDuration): raise it, or "
            f"keep fewer checkpoints")
    if retention.clamped:
        warnings.append(f"{table.name}: {retention.reason}")
    return retention, horizon.versions.get(table.name, ()), warnings


def observation_metadata(result: MaintenanceResult, path: str) -> dict[str, Any]:
    """Numeric metadata of one table's maintenance (plotted per asset in the UI)."""
    r = result
    return {
        "files_before": r.before.files, "files_after": r.after.files,
        "bytes_before": r.before.bytes, "bytes_after": r.after.bytes,
        "version_before": r.before.version, "version_after": r.after.version,
        "files_compacted": r.files_compacted, "files_written": r.files_written,
        "files_vacuumed": r.files_vacuumed, "log_checkpoint_version": r.checkpoint_version,
        "retention_hours": r.retention.hours,
        "retention_needed_hours": r.retention.needed_hours,
        "retention_clamped": r.retention.clamped,
        "retention": MetadataValue.text(r.retention.reason),
        "kept_versions": MetadataValue.json(list(r.kept_versions)),
        **{f"{step}_seconds": s for step, s in r.seconds.items()},
        "seconds": round(sum(r.seconds.values()), 3),
        "dagster/uri": MetadataValue.path(path),
    }


def describe(table: MaintainedTable, r: MaintenanceResult) -> str:
    """The log line of one table's maintenance."""
    return (f"{table.name}: {r.before.files} -> {r.after.files} files "
            f"({r.before.bytes} -> {r.after.bytes} bytes), v{r.before.version} -> "
            f"v{r.after.version}, {r.files_vacuumed} files vacuumed, log checkpoint at "
            f"v{r.checkpoint_version}, in {sum(r.seconds.values()):.2f}s; "
            f"{r.retention.reason}")


@op(name="maintain_enrichment_tables", out={},
    description="OPTIMIZE, VACUUM (keeping every version a retained checkpoint can rewind "
                "to) and checkpoint the log of each Delta table the enrichment pipeline "
                "writes; one observation per table.")
def maintain_enrichment_tables(
    context: OpExecutionContext, config: MaintenanceConfig, pyspark: LakecastSparkResource,
    lake: LakeResource,
) -> Iterator[AssetObservation]:
    refuse_second_writer(context.instance, context.run_id, MAINTENANCE_JOB)
    settings = lake.settings()
    spark: Any = SparkOnDemand(pyspark)
    horizon = rewind_horizon(
        SnapshotStore(spark, snapshot_path(settings, ENRICHMENT.name), ENRICHMENT.name),
        ProgressLog(spark, progress_path(settings.checkpoint_root, ENRICHMENT.name),
                    ENRICHMENT.name),
        settings.table_path)
    context.log.info(f"retained checkpoints a rewind can target: {list(horizon.checkpoints)}")
    target = config.target_file_mb * 1024 * 1024 if config.target_file_mb else None
    failed = []
    for table in TABLES:
        path = table.path(settings)
        if not delta_io.table_exists(path):
            context.log.info(f"{table.name}: no Delta table at {path} yet: nothing to do")
            continue
        t0 = time.perf_counter()
        try:
            retention, keep, warnings = retention_for(table, path, config, horizon)
            for w in warnings:
                context.log.warning(w)
            result = maintain(path, retention, keep, target_size=target)
        except delta_io.DeltaIOError as e:  # this table only: maintain the others
            context.log.error(str(e))
            failed.append(f"{table.name}: {e}")
            continue
        context.log.info(describe(table, result))
        meta = observation_metadata(result, path)
        meta["step_seconds"] = round(time.perf_counter() - t0, 3)
        yield AssetObservation(asset_key=table.name, metadata=meta)
    if failed:
        raise Failure(description="; ".join(failed))


@job(
    name=MAINTENANCE_JOB,
    tags={EXCLUSIVE_TAG: MICROBATCH_JOB},  # the run queue: never beside a micro-batch run
    description="Compact, VACUUM and checkpoint the Delta tables the enrichment pipeline "
                "writes (outputs, progress log, snapshots), keeping every version a "
                "retained checkpoint can rewind to.",
)
def lake_maintenance_job() -> None:
    maintain_enrichment_tables()


@schedule(
    name="lake_maintenance",
    job=lake_maintenance_job,
    cron_schedule=MAINTENANCE_CRON,
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Every day at 03:00 UTC (LAKECAST_MAINTENANCE_CRON), maintain the "
                "enrichment pipeline's Delta tables; skipped while a continuous run writes "
                "them.",
)
def lake_maintenance(context: ScheduleEvaluationContext) -> RunRequest | SkipReason:
    active = active_runs(context.instance, (CONTINUOUS_JOB,))
    if active:
        return SkipReason(f"run {active[0].run_id} of {CONTINUOUS_JOB} is writing the tables; "
                          f"maintenance waits for a later tick")
    return RunRequest(run_config=scheduled_run_config("maintain_enrichment_tables"))
