"""What a pipeline's Dagster definitions are named and shown as (no Dagster import): the
translator's inputs (descriptions, deps, group, columns, lineage, freshness, asset keys,
automation) and the names of its sensor and maintenance job
(:class:`~dagster_lakecast.declaration.PipelineDeclaration` holds one :class:`DagsterNames`;
:class:`~dagster_lakecast.handle.PipelineHandle` resolves them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DagsterNames"]


@dataclass(frozen=True)
class DagsterNames:
    """How a pipeline appears in Dagster.

    For the translator (:class:`~dagster_lakecast.translator.DagsterLakecastTranslator`):
    ``description`` (the job's and the multi-asset's), ``descriptions`` (table -> asset
    description), ``group_name`` (default: the pipeline's name), ``deps`` (output table ->
    the tables it depends on; default: events and broadcast tables), ``columns`` (table ->
    a Dagster ``TableSchema`` shown before the first batch), ``lineage`` (output column ->
    its ``table.column`` inputs), ``freshness_seconds`` (the main output's
    ``FreshnessPolicy`` and the ``events_fresh`` check), ``asset_keys`` (table -> its key,
    e.g. the key of the user's asset that writes it; default: the table name),
    ``automation_condition`` (an ``AutomationCondition`` on the main output instead of the
    sensor, which is then declared stopped).

    For the factory: ``observe`` (input tables written outside Dagster: observable source
    assets whose data version is the Delta version) observed by ``observe_automation``;
    ``sensor`` / ``sensor_description`` (default ``<name>_sensor``); ``maintenance_job`` and
    ``maintenance_schedule`` (default ``<name>_maintenance_job``, ``<name>_maintenance``);
    ``writer_jobs`` (other jobs that write the tables: a run refuses to start and the
    sensor waits while one is active); ``broadcast_only_runs=False`` (a new broadcast
    version alone is no work for the sensor); ``state_budget`` (the ``state_budget``
    check); ``recompute_sample`` (rows the ``output_sample_recomputed`` check recomputes).
    """

    description: str = ""
    descriptions: Mapping[str, str] = field(default_factory=dict)
    group_name: str | None = None
    deps: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    columns: Mapping[str, Any] = field(default_factory=dict)
    lineage: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    freshness_seconds: float = 900.0
    asset_keys: Mapping[str, Any] = field(default_factory=dict)
    automation_condition: Any = None
    observe: tuple[str, ...] = ()
    observe_automation: Any = None
    sensor: str | None = None
    sensor_description: str | None = None
    maintenance_job: str | None = None
    maintenance_schedule: str | None = None
    writer_jobs: tuple[str, ...] = ()
    broadcast_only_runs: bool = True
    state_budget: bool = False
    recompute_sample: int = 200

    def sensor_for(self, pipeline: str) -> str:
        return self.sensor or f"{pipeline}_sensor"

    def maintenance_job_for(self, pipeline: str) -> str:
        return self.maintenance_job or f"{pipeline}_maintenance_job"

    def maintenance_schedule_for(self, pipeline: str) -> str:
        return self.maintenance_schedule or f"{pipeline}_maintenance"

    def group_for(self, pipeline: str) -> str:
        return self.group_name or pipeline
