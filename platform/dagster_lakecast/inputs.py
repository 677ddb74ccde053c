"""A pipeline's input tables as Dagster sees them: which ones exist yet, and observable
source assets for those written outside Dagster.

Definitions load without any table (no lake read at load time): a run, a sensor tick or
a continuous run whose inputs do not exist yet says which table is missing and what
creates it (:func:`missing_inputs`, :func:`missing_message`), and processes nothing.

An input table that no asset of the project writes (a dbt model, a Databricks job, a
script) can be declared *observed* (``observe`` in the declaration or the Component):
it becomes an observable source asset whose data version is its Delta version
(:func:`observed_inputs`), so Declarative Automation (``automation_condition`` on the
outputs) sees when it changes, as Dagster's guidance for data written outside Dagster
recommends. The pipeline's sensor records the same observations on each tick.
"""

from __future__ import annotations

from dagster import (
    AssetsDefinition,
    AssetSpec,
    DataVersion,
    ObserveResult,
    multi_observable_source_asset,
)

from dagster_lakecast.declaration import BROADCAST, EVENTS
from dagster_lakecast.handle import PipelineHandle
from lakecast.config import Settings
from lakecast.delta import io as delta_io

__all__ = ["missing_inputs", "missing_message", "observed_inputs"]


def input_tables(pipe: PipelineHandle) -> dict[str, str]:
    """Each input table of ``pipe`` and its role (``events`` or ``broadcast``)."""
    return {pipe.decl.events_table: EVENTS, **{t: BROADCAST for t in pipe.decl.broadcast_tables}}


def missing_inputs(pipe: PipelineHandle, settings: Settings) -> list[str]:
    """The input tables of ``pipe`` that are not Delta tables yet (from their logs, no
    Spark)."""
    return [t for t in input_tables(pipe)
            if not delta_io.table_exists(settings.table_path(t))]


def missing_message(pipe: PipelineHandle, settings: Settings, missing: list[str]) -> str:
    """One line naming each missing input table, where it is expected and what creates it;
    nothing was processed."""
    parts = []
    for table in missing:
        key = pipe.asset_key(table).to_user_string()
        parts.append(f"{input_tables(pipe)[table]} table {table!r} (asset {key}) is not a "
                     f"Delta table at {settings.table_path(table)} yet")
    keys = " ".join(pipe.asset_key(t).to_user_string() for t in missing)
    return (f"{pipe.name}: " + "; ".join(parts) + ". Nothing was processed: materialize "
            f"the asset(s) that write it (e.g. `dg launch --assets {keys}`) or write the "
            f"Delta table(s) there, then run again (the lake is {settings.lake_root}).")


def observed_inputs(pipe: PipelineHandle) -> AssetsDefinition | None:
    """One observable source asset per table the declaration's ``dagster.observe`` names:
    observing it records its newest Delta version as its data version (``None`` when
    nothing is observed); with ``dagster.observe_automation``, Declarative Automation
    observes them on that condition."""
    tables = [t for t in pipe.decl.dagster.observe if t in input_tables(pipe)]
    if not tables:
        return None
    specs = [AssetSpec(pipe.asset_key(t), group_name=pipe.group, kinds={"delta"},
                       automation_condition=pipe.decl.dagster.observe_automation,
                       description=f"{input_tables(pipe)[t].capitalize()} table {t!r} of "
                       f"the {pipe.name} pipeline, written outside Dagster (observed: its "
                       "data version is its Delta version).")
             for t in tables]

    @multi_observable_source_asset(name=f"{pipe.name}_observe_inputs", specs=specs,
                                   required_resource_keys={"lake"})
    def observe_inputs(context):
        settings: Settings = context.resources.lake.settings()
        for t in tables:
            version = delta_io.latest_version(settings.table_path(t))
            if version is None:
                context.log.warning(f"{t}: no Delta table at {settings.table_path(t)} yet")
                continue
            yield ObserveResult(asset_key=pipe.asset_key(t),
                                data_version=DataVersion(str(version)),
                                metadata={"delta_version": version,
                                          "path": settings.table_path(t)})

    return observe_inputs

