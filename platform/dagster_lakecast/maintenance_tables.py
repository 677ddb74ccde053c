"""The pieces of table maintenance (:mod:`dagster_lakecast.maintenance`): which tables a
pipeline writes, the maintenance run's config, each table's VACUUM retention, and what a
run records per table.

The maintenance itself is :func:`lakecast.delta.maintenance.maintain` (delta-rs, no Spark
job): OPTIMIZE (``dataChange=false``: rows and Change Data Feed unchanged), VACUUM, a log
checkpoint.
"""

from dataclasses import dataclass
from typing import Any

from dagster import Config, MetadataValue
from pydantic import Field

from dagster_lakecast.resources import LakecastSparkResource
from lakecast.config import Settings
from lakecast.delta.maintenance import (
    MaintenanceResult,
    Retention,
    default_retention_hours,
    log_retention_hours,
    table_properties,
    vacuum_retention,
)
from lakecast.snapshots.horizon import RewindHorizon

__all__ = [
    "OUTPUT", "PROGRESS", "SNAPSHOTS", "MaintainedTable", "MaintenanceConfig", "SparkOnDemand",
    "describe", "observation_metadata", "retention_for", "scheduled_run_config",
]  # fmt: skip

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
            return settings.pipeline_paths(self.pipeline).progress
        if self.kind == SNAPSHOTS:
            return settings.pipeline_paths(self.pipeline).snapshots
        return settings.table_path(self.name)


class SparkOnDemand:
    """Stands for the run's Spark session and starts it on first use: the logs and files of
    a local lake are read without Spark, so a maintenance run normally starts no JVM (it
    does when a read needs Spark: damaged snapshot files, a lake on object storage)."""

    def __init__(self, resource: LakecastSparkResource) -> None:
        self.resource = resource

    def __getattr__(self, name: str) -> Any:
        return getattr(self.resource.spark_session, name)


def scheduled_run_config(op_name: str, settings: Settings) -> dict[str, Any]:
    """The run config of a scheduled maintenance run: ``retention_hours`` from
    ``LAKECAST_MAINTENANCE_RETENTION_HOURS`` (``Settings.maintenance_retention_hours``)
    when set."""
    hours = settings.maintenance_retention_hours
    if hours is None:
        return {}
    return {"ops": {op_name: {"config": {"retention_hours": hours}}}}


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
