"""``LakecastPipelineComponent``: a Lakecast pipeline declared in a ``defs.yaml``.

``dg scaffold defs dagster_lakecast.LakecastPipelineComponent defs/payments`` writes a
``defs.yaml`` to fill in::

    type: dagster_lakecast.LakecastPipelineComponent
    attributes:
      name: payments
      function: my_project.defs.payments.function:ToEur   # module:attribute
      events_table: payments
      broadcast_tables: [fx_rates]
      output_table: payments_eur
      side_outputs: {unmatched: payments_unmatched}
      parallelism: 2
      checkpoint: {every: 10, keep: 10}
      freshness_seconds: 900
      translation: {group_name: payments, key_prefix: lake}   # every table's asset spec
      lake: {lake_root: s3a://bucket/lake}                     # the lake resource's fields

``translation`` is applied to each table's ``AssetSpec`` like the ``translation`` of the
Components Dagster ships (``{{ table }}``, ``{{ role }}``, ``{{ pipeline }}`` and
``{{ spec }}`` in templates); ``lake`` and ``pyspark`` set the fields of the
:class:`~dagster_lakecast.LakeResource` and :class:`~dagster_lakecast.LakecastSparkResource`
the definitions carry (two components of one project must agree on them).

It builds the same definitions as :func:`dagster_lakecast.declare_pipeline` (micro-batch
job, sensor, continuous job, output assets, checks, maintenance job and schedule) and the
``pyspark`` and ``lake`` resources. Loading reads no table: the input tables may not exist
yet (a run says which one is missing and what creates it). A function that does not
import, a field of the wrong type or an unknown field fails loading with a message naming
the file, the field and the fix.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import dagster as dg
from dagster.components import Resolver, Scaffolder, ScaffoldRequest, scaffold_with
from dagster.components.utils.translation import TranslationFn, TranslationFnResolver
from pydantic import ConfigDict, Field

from dagster_lakecast.declaration import CheckpointPolicy, PipelineDeclaration
from dagster_lakecast.execute import PipelineRunConfig, run_pipeline
from dagster_lakecast.factory import declare_pipeline
from dagster_lakecast.handle import PipelineHandle
from dagster_lakecast.naming import DagsterNames
from dagster_lakecast.resources import LakecastSparkResource, LakeResource
from dagster_lakecast.translator import DagsterLakecastTranslator
from lakecast.errors import LakecastError
from lakecast.pipeline.dedup import DedupSpec

__all__ = ["LakecastPipelineComponent"]

#: the resources every component's definitions carry (one object each: they merge)
RESOURCES: dict[str, Any] = {"pyspark": LakecastSparkResource(), "lake": LakeResource()}

TEMPLATE = """\
type: {type_name}
attributes:
  name: {name}
  # the process function: module:attribute, a zero-argument callable (usually the class)
  function: {module}:MyFunction
  events_table: events
  broadcast_tables: [my_broadcast_table]
  output_table: {name}_out
  # side_outputs: {{unmatched: {name}_unmatched}}
  parallelism: 2
  checkpoint: {{every: 10, keep: 10}}
  freshness_seconds: 900
"""


class ComponentError(LakecastError):
    """A ``defs.yaml`` of :class:`LakecastPipelineComponent` that cannot be built."""


class CheckpointModel(dg.Model):
    """How state is made durable (:class:`~dagster_lakecast.CheckpointPolicy`)."""

    every: int | None = Field(default=10, description="Checkpoint every N batches "
                              "(null: never).")
    keep: int | None = Field(default=10, description="Checkpoints (or rewindable batches) "
                             "kept.")


class DedupModel(dg.Model):
    """Exactly once per key across batches (:class:`lakecast.pipeline.dedup.DedupSpec`)."""

    key: str = Field(description="The events' key column (e.g. payment_id).")
    time_column: str = Field(description="The events' event-time column.")
    reason: str = Field(default="duplicate_key", description="The rejection reason.")


class LakeModel(dg.Model):
    """The fields of the ``lake`` resource (:class:`~dagster_lakecast.LakeResource`)."""

    lake_root: str = Field(default="", description="Where the Delta tables are (default: "
                           "LAKECAST_LAKE_ROOT, else the project's var/lake).")
    checkpoint_root: str = Field(default="", description="Where the pipelines' progress and "
                                 "snapshots are (default: LAKECAST_CHECKPOINT_ROOT).")


class SparkModel(dg.Model):
    """The fields of the ``pyspark`` resource (:class:`~dagster_lakecast.LakecastSparkResource`)."""

    spark_config: dict[str, str] = Field(default_factory=dict, description="Spark settings "
                                         "over Lakecast's session factory's.")


@dataclass(frozen=True)
class TableProps:
    """What a ``translation`` template sees of one table: ``table``, ``role``, ``pipeline``."""

    table: str
    role: str
    pipeline: str


class ComponentTranslator(DagsterLakecastTranslator):
    """The default translator with the component's ``translation`` applied to every spec
    (and to the keys that deps and the run seam use)."""

    def __init__(self, fn: TranslationFn[TableProps]) -> None:
        self.fn = fn

    def get_asset_key(self, decl: PipelineDeclaration, table: str, role: str) -> dg.AssetKey:
        base = super().get_asset_key(decl, table, role)
        return self.fn(dg.AssetSpec(base), TableProps(table, role, decl.name)).key

    def get_asset_spec(self, decl: PipelineDeclaration, table: str, role: str
                       ) -> dg.AssetSpec:
        spec = super().get_asset_spec(decl, table, role)
        base = spec.replace_attributes(key=super().get_asset_key(decl, table, role))
        return self.fn(base, TableProps(table, role, decl.name))


class LakecastPipelineScaffolder(Scaffolder):
    """Writes a ``defs.yaml`` to fill in beside a ``function.py`` placeholder."""

    def scaffold(self, request: ScaffoldRequest) -> None:
        target = Path(request.target_path)
        target.mkdir(parents=True, exist_ok=True)
        name = target.name.replace("-", "_")
        module = f"<your_package>.defs.{name}.function"
        if request.project_root is not None:
            try:
                rel = target.resolve().relative_to((request.project_root / "src").resolve())
                module = ".".join(rel.parts) + ".function"
            except ValueError:
                pass
        (target / "defs.yaml").write_text(
            TEMPLATE.format(type_name=request.type_name, name=name, module=module))


def resolve_function(path: str, where: str) -> Any:
    """The object at ``module:attribute`` (or ``module.attribute``)."""
    module, sep, attr = path.partition(":")
    if not sep:
        module, _, attr = path.rpartition(".")
    if not module or not attr:
        raise ComponentError(f"{where}: field 'function' = {path!r} is not an import path; "
                             "write module:attribute, e.g. my_project.fx:ToEur")
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ComponentError(f"{where}: field 'function' = {path!r} does not import ({e}); "
                             "fix the module path or the name, and make the module "
                             "importable from the project") from e
    if not callable(found):
        raise ComponentError(f"{where}: field 'function' = {path!r} is not callable; name "
                             "the process function's class")
    return found


@scaffold_with(LakecastPipelineScaffolder)
class LakecastPipelineComponent(dg.Component, dg.Model, dg.Resolvable):
    """A Lakecast pipeline: a broadcast (or keyed) process function over an events table and
    broadcast tables, writing an output table (and side outputs), run per sensor tick or
    continuously."""

    # the resolved automation_condition is a Dagster object, not a pydantic type
    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str = Field(description="The pipeline's name (jobs are <name>_microbatch, "
                      "<name>_continuous, <name>_maintenance_job).")
    function: str = Field(description="module:attribute of the process function's class.")
    events_table: str = Field(description="The Delta table of events.")
    broadcast_tables: list[str] = Field(description="The Delta tables whose versions are "
                                        "the broadcast stream.")
    output_table: str = Field(description="The main output table.")
    side_outputs: dict[str, str] = Field(default_factory=dict, description="Side output "
                                         "name -> table.")
    rejected_table: str | None = Field(default=None, description="Where invalid events go.")
    parallelism: int | None = Field(default=None, description="Tasks per batch.")
    checkpoint: CheckpointModel = Field(default_factory=CheckpointModel)
    freshness_seconds: float = Field(default=900.0, description="The main output's "
                                     "freshness window (and the events_fresh check's).")
    timestamp_column: str | None = Field(default=None, description="The events' time column "
                                         "(keyed functions' timers).")
    order_columns: list[str] = Field(default_factory=list, description="Columns that order "
                                     "a key's events (keyed functions).")
    dedup: DedupModel | None = Field(default=None, description="Reject later copies of a key.")
    description: str = ""
    group_name: str | None = None
    columns: dict[str, list[dict[str, str]]] = Field(
        default_factory=dict, description="table -> [{name, type, description}] shown on "
        "its asset before the first batch.")
    lineage: dict[str, list[str]] = Field(
        default_factory=dict, description="output column -> ['table.column', ...] inputs "
        "(column lineage of the main output).")
    execution: str = Field(default="tasks", description="tasks (task-local state) or joins "
                           "(a pure lookup as Spark broadcast joins).")
    events_rewrites: Literal["fail", "skip"] = Field(
        default="fail", description="An events commit that deletes or updates rows: fail "
        "the batch (a clear error), or skip the commit (its rows are not read; outputs are "
        "not retracted), as Delta's skipChangeCommits.")
    asset_keys: dict[str, str] = Field(
        default_factory=dict, description="table -> the asset key of its asset, e.g. "
        "'raw/clicks' (default: the table name): an input table's key names the user's asset "
        "that writes it.")
    observe: list[str] = Field(
        default_factory=list, description="Input tables written outside Dagster: observable "
        "source assets whose data version is the Delta version.")
    observe_cron: str | None = Field(
        default=None, description="Observe the 'observe' tables on this cron schedule "
        "(Declarative Automation: AutomationCondition.cron_tick_passed).")
    automation_condition: Annotated[
        dg.AutomationCondition | None,
        Resolver.default(model_field_type=str | None, description=(
            "Declarative Automation of the main output instead of the sensor (which is then "
            "declared stopped), e.g. \"{{ automation_condition.eager() }}\"."))] = None

    translation: Annotated[
        TranslationFn[TableProps] | None,
        TranslationFnResolver[TableProps](
            lambda t: {"table": t.table, "role": t.role, "pipeline": t.pipeline}),
    ] = None
    lake: LakeModel | None = Field(default=None, description="The lake resource's fields.")
    pyspark: SparkModel | None = Field(default=None, description="The pyspark resource's "
                                       "fields.")

    def declaration(self, where: str = "defs.yaml") -> PipelineDeclaration:
        """The :class:`PipelineDeclaration` this component stands for."""
        function = resolve_function(self.function, where)
        return PipelineDeclaration(
            name=self.name, function=function, events_table=self.events_table,
            broadcast_tables=tuple(self.broadcast_tables), output_table=self.output_table,
            side_outputs=dict(self.side_outputs), rejected_table=self.rejected_table,
            parallelism=self.parallelism,
            checkpoint=CheckpointPolicy(self.checkpoint.every, self.checkpoint.keep),
            timestamp_column=self.timestamp_column, order_columns=tuple(self.order_columns),
            dedup=DedupSpec(**self.dedup.model_dump()) if self.dedup else None,
            execution=self.execution, events_rewrites=self.events_rewrites,
            dagster=DagsterNames(
                description=self.description, group_name=self.group_name,
                freshness_seconds=self.freshness_seconds,
                columns={t: dg.TableSchema(columns=[dg.TableColumn(**c) for c in cols])
                         for t, cols in self.columns.items()},
                lineage={c: tuple(s) for c, s in self.lineage.items()},
                asset_keys=dict(self.asset_keys), observe=tuple(self.observe),
                automation_condition=self.automation_condition,
                observe_automation=dg.AutomationCondition.cron_tick_passed(self.observe_cron)
                if self.observe_cron else None))

    def translator(self) -> DagsterLakecastTranslator:
        """The translator of the component's assets (its ``translation`` applied)."""
        if self.translation is None:
            return DagsterLakecastTranslator()
        return ComponentTranslator(self.translation)

    def resources(self) -> dict[str, Any]:
        """The ``pyspark`` and ``lake`` resources (the defaults' objects unless set)."""
        return {"pyspark": LakecastSparkResource(spark_config=dict(self.pyspark.spark_config))
                if self.pyspark else RESOURCES["pyspark"],
                "lake": LakeResource(**self.lake.model_dump()) if self.lake
                else RESOURCES["lake"]}

    def execute(self, context: dg.AssetExecutionContext, pipe: PipelineHandle,
                pyspark: LakecastSparkResource, lake: LakeResource,
                config: PipelineRunConfig | None = None) -> Iterator[dg.MaterializeResult]:
        """Run the pipeline's pending batches in the micro-batch asset's step; override it
        to add steps around them (call ``super().execute(...)`` or
        :func:`~dagster_lakecast.run_pipeline`), like Dagster's own Components."""
        yield from run_pipeline(context, pipe, pyspark, lake, config)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        where = str(Path(context.path) / "defs.yaml")
        try:
            made = declare_pipeline(self.declaration(where), self.translator(),
                                    execute=self.execute)
        except LakecastError as e:
            raise ComponentError(str(e) if where in str(e) else f"{where}: {e}") from e
        defs = made.definitions()
        return dg.Definitions.merge(defs, dg.Definitions(resources=self.resources()))
