"""How a pipeline's tables become Dagster assets: one overridable class, like
``DagsterSlingTranslator`` and ``DagsterDbtTranslator``.

Subclass :class:`DagsterLakecastTranslator` and override :meth:`get_asset_spec` (or
:meth:`get_asset_key` for keys alone, e.g. a key prefix) and pass it to
:func:`dagster_lakecast.declare_pipeline`; a Component's ``translation`` field sets keys,
groups, descriptions and kinds from its ``defs.yaml`` (:mod:`dagster_lakecast.component`)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from dagster import (
    AssetDep,
    AssetKey,
    AssetSpec,
    FreshnessPolicy,
    TableColumnDep,
    TableColumnLineage,
)

from dagster_lakecast.declaration import (
    BROADCAST,
    EVENTS,
    MAIN,
    PROGRESS,
    REJECTED,
    SIDE,
    SNAPSHOTS,
    STATE,
    PipelineDeclaration,
)

__all__ = ["DagsterLakecastTranslator"]

COLUMN_SCHEMA = "dagster/column_schema"
COLUMN_LINEAGE = "dagster/column_lineage"


class DagsterLakecastTranslator:
    """Maps each table of a pipeline and its role (``events``, ``broadcast``, ``main``,
    ``side``, ``rejected``, ``state``, ``progress``, ``snapshots``) to an ``AssetSpec``."""

    def get_asset_key(self, decl: PipelineDeclaration, table: str, role: str) -> AssetKey:
        """The asset key of ``table``: the declaration's ``dagster.asset_keys`` entry, else
        the table name."""
        key = decl.dagster.asset_keys.get(table)
        if key is None:
            return AssetKey(table)
        return key if isinstance(key, AssetKey) else AssetKey.from_user_string(str(key))

    def get_description(self, decl: PipelineDeclaration, table: str, role: str) -> str:
        """The declaration's description of ``table``, else one from its role."""
        names = decl.dagster
        if table in names.descriptions:
            return names.descriptions[table]
        maintenance = names.maintenance_job_for(decl.name)
        side = next((s for s, t in decl.side_outputs.items() if t == table), table)
        return {
            MAIN: f"Main output of the {decl.name} pipeline.",
            SIDE: f"Side output {side!r} of the {decl.name} pipeline.",
            REJECTED: f"Invalid events of {decl.events_table}, with the reason.",
            STATE: f"The {decl.name} pipeline's keyed state table (written by its "
                   f"micro-batches, maintained by {maintenance}).",
            PROGRESS: f"The {decl.name} pipeline's progress table (written by its "
                      f"micro-batches, maintained by {maintenance}).",
            SNAPSHOTS: f"The {decl.name} pipeline's snapshots table (written by its "
                       f"micro-batches, maintained by {maintenance}).",
        }.get(role, table)

    def get_deps(self, decl: PipelineDeclaration, table: str, role: str) -> list[AssetDep]:
        """What an output is computed from: the declaration's ``deps`` for it, else the
        events table (and, except for rejected events, every broadcast table), with column
        lineage on the main output when the declaration has ``lineage``."""
        inputs = decl.dagster.deps.get(table) or (
            (decl.events_table,) if role == REJECTED
            else (decl.events_table, *decl.broadcast_tables))
        return [AssetDep(self.get_asset_key(decl, t, decl.roles.get(t, BROADCAST)))
                for t in inputs]

    def get_metadata(self, decl: PipelineDeclaration, table: str, role: str
                     ) -> dict[str, Any]:
        """The declared columns (``dagster/column_schema``) and, on the main output, the
        declared column lineage (``dagster/column_lineage``)."""
        meta: dict[str, Any] = {}
        names = decl.dagster
        if table in names.columns:
            meta[COLUMN_SCHEMA] = names.columns[table]
        if role == MAIN and names.lineage:
            meta[COLUMN_LINEAGE] = TableColumnLineage(deps_by_column={
                column: [TableColumnDep(asset_key=self.get_asset_key(
                    decl, src.rsplit(".", 1)[0], decl.roles.get(src.rsplit(".", 1)[0],
                                                                BROADCAST)),
                    column_name=src.rsplit(".", 1)[1]) for src in sources]
                for column, sources in names.lineage.items()})
        return meta

    def get_asset_spec(self, decl: PipelineDeclaration, table: str, role: str) -> AssetSpec:
        """The spec of one output (``main``, ``side``, ``rejected``) or internal table
        (``state``, ``progress``, ``snapshots``) of the pipeline."""
        output = role in (MAIN, SIDE, REJECTED)
        return AssetSpec(
            self.get_asset_key(decl, table, role),
            deps=self.get_deps(decl, table, role) if output else [],
            skippable=output,
            group_name=decl.dagster.group_for(decl.name),
            kinds={"spark", "delta"} if output else {"delta"},
            description=self.get_description(decl, table, role),
            metadata=self.get_metadata(decl, table, role) or None,
            freshness_policy=FreshnessPolicy.time_window(
                fail_window=timedelta(seconds=decl.dagster.freshness_seconds))
            if role == MAIN else None,
            automation_condition=decl.dagster.automation_condition if role == MAIN else None,
        )

    def input_key(self, decl: PipelineDeclaration, table: str) -> AssetKey:
        """The asset key of an input table (events or broadcast)."""
        return self.get_asset_key(decl, table,
                                  EVENTS if table == decl.events_table else BROADCAST)
