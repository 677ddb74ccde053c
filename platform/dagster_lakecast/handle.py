"""One resolved handle per pipeline, like Delta's ``DeltaTable.forPath``: made once from
the declaration and the translator when the definitions are declared, and passed down to
every definition (job, sensor, checks, maintenance, continuous run) and to the run seam.
It holds every table's role and asset key and the Dagster names; its :meth:`locate`
gives every path of one lake (the settings a run, tick or check uses) in one object.
Nothing below it resolves a key, a name or a path of the pipeline again."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dagster import AssetKey

from dagster_lakecast.declaration import (
    BROADCAST,
    EVENTS,
    PROGRESS,
    SNAPSHOTS,
    PipelineDeclaration,
)
from lakecast.config import PipelinePaths, Settings

if TYPE_CHECKING:
    from dagster_lakecast.translator import DagsterLakecastTranslator

__all__ = ["PipelineHandle", "PipelineLocation"]


@dataclass(frozen=True)
class PipelineLocation:
    """Every path of a pipeline in one lake: each table's and the pipeline's own folders
    (progress log, snapshots)."""

    settings: Settings
    tables: Mapping[str, str]
    paths: PipelinePaths

    def table(self, name: str) -> str:
        """The path of one of the pipeline's tables."""
        return self.tables[name]

    @property
    def progress(self) -> str:
        return self.paths.progress

    @property
    def snapshots(self) -> str:
        return self.paths.snapshots


@dataclass(frozen=True)
class PipelineHandle:
    """A declaration resolved: its tables' roles and asset keys, its Dagster names."""

    decl: PipelineDeclaration
    #: every table of the pipeline -> its role (``events``, ``main``, ...)
    roles: Mapping[str, str]
    #: every table of the pipeline -> its asset key
    keys: Mapping[str, AssetKey]
    keyed: bool

    @classmethod
    def resolve(cls, decl: PipelineDeclaration | PipelineHandle,
                translator: DagsterLakecastTranslator | None = None) -> PipelineHandle:
        """The handle of ``decl`` (a handle is returned as it is), keys from
        ``translator`` (default :class:`DagsterLakecastTranslator`)."""
        if isinstance(decl, PipelineHandle):
            return decl
        from dagster_lakecast.translator import DagsterLakecastTranslator

        translator = translator or DagsterLakecastTranslator()
        roles = decl.roles
        keys = {t: translator.get_asset_key(decl, t, r) for t, r in roles.items()}
        return cls(decl, roles, keys, decl.keyed)

    @property
    def name(self) -> str:
        return self.decl.name

    def asset_key(self, table: str) -> AssetKey:
        """The asset key of one of the pipeline's tables."""
        return self.keys[table]

    @property
    def inputs(self) -> tuple[str, ...]:
        """The events table, then the broadcast tables."""
        return tuple(t for t, r in self.roles.items() if r in (EVENTS, BROADCAST))

    @property
    def outputs(self) -> list[tuple[str, str]]:
        """``(table, count key)`` of every output asset, main output first."""
        return self.decl.outputs

    @property
    def job_name(self) -> str:
        return f"{self.name}_microbatch"

    @property
    def continuous_job_name(self) -> str:
        return f"{self.name}_continuous"

    @property
    def sensor_name(self) -> str:
        return self.decl.dagster.sensor_for(self.name)

    @property
    def maintenance_job_name(self) -> str:
        return self.decl.dagster.maintenance_job_for(self.name)

    @property
    def maintenance_schedule_name(self) -> str:
        return self.decl.dagster.maintenance_schedule_for(self.name)

    @property
    def writers(self) -> tuple[str, ...]:
        """Every job that writes the pipeline's tables: its own, its continuous job,
        ``writer_jobs``, then the maintenance job."""
        return (self.job_name, self.continuous_job_name, *self.decl.dagster.writer_jobs,
                self.maintenance_job_name)

    @property
    def group(self) -> str:
        return self.decl.dagster.group_for(self.name)

    def locate(self, settings: Settings) -> PipelineLocation:
        """Every path of the pipeline in the lake of ``settings``."""
        paths = settings.pipeline_paths(self.name)
        own = {PROGRESS: paths.progress, SNAPSHOTS: paths.snapshots}
        return PipelineLocation(settings, {t: own.get(r) or settings.table_path(t)
                                           for t, r in self.roles.items()}, paths)
