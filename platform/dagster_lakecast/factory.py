"""The pipeline factory: declare a micro-batch pipeline, get its Dagster definitions.

A :class:`PipelineDeclaration` names a process function (broadcast or keyed), the events
table, the broadcast tables, the output, side-output and rejected tables, the parallelism
and the checkpoint policy. :func:`declare_pipeline` turns it into:

* ``<name>_microbatch``: an asset job over one multi-asset whose specs are the output
  tables, each depending on the events and broadcast tables (lineage in the UI). A run
  processes the table versions it was requested for (run tag ``lakecast/versions``) and
  ends; every committed batch becomes a materialization of each output with plottable
  numbers (:mod:`dagster_lakecast.metadata`);
* ``<name>_sensor`` (or the declaration's ``sensor`` name): requests a run when the events
  or a broadcast table has a new Delta version (:mod:`dagster_lakecast.sensor`);
* asset checks ``counts_reconcile``, ``broadcast_versions_accepted``, ``events_fresh`` and,
  with ``state_budget=True``, ``state_budget`` (:mod:`dagster_lakecast.checks`);
* ``<name>_continuous``: one long run that processes each commit as it lands
  (:mod:`dagster_lakecast.continuous`);
* ``<name>_maintenance_job`` and its schedule ``<name>_maintenance`` (or the names the
  declaration gives): OPTIMIZE, VACUUM and log checkpoints of the pipeline's tables
  (:mod:`dagster_lakecast.maintenance`).

Asset specs come from a :class:`~dagster_lakecast.translator.DagsterLakecastTranslator`
(keys, groups, descriptions, declared columns, column lineage, the main output's
``FreshnessPolicy``). The engine part is :meth:`PipelineDeclaration.build`
(:mod:`lakecast.build`, or the declaration's ``builder``).
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetChecksDefinition,
    AssetExecutionContext,
    AssetsDefinition,
    AssetSelection,
    AssetSpec,
    Definitions,
    JobDefinition,
    MaterializeResult,
    ScheduleDefinition,
    SensorDefinition,
    define_asset_job,
    in_process_executor,
    multi_asset,
)

from dagster_lakecast.checks import ON_REQUEST_CHECKS, pipeline_checks
from dagster_lakecast.continuous import declare_continuous
from dagster_lakecast.declaration import CheckpointPolicy, PipelineDeclaration
from dagster_lakecast.execute import PipelineRunConfig, run_pipeline
from dagster_lakecast.handle import PipelineHandle
from dagster_lakecast.inputs import observed_inputs
from dagster_lakecast.maintenance import MaintenanceDefinitions, declare_maintenance
from dagster_lakecast.resources import LakecastSparkResource, LakeResource
from dagster_lakecast.sensor import pipeline_sensor
from dagster_lakecast.tags import EXCLUSIVE_TAG, QUIET_RUN_LOGS
from dagster_lakecast.translator import DagsterLakecastTranslator

__all__ = [
    "CheckpointPolicy", "PipelineDeclaration", "PipelineDefinitions", "PipelineRunConfig",
    "declare_pipeline", "output_specs", "run_pipeline",
]  # fmt: skip


@dataclass(frozen=True)
class PipelineDefinitions:
    """What :func:`declare_pipeline` produced: spread it into ``Definitions``, or take
    :meth:`definitions`."""

    declaration: PipelineDeclaration
    #: the declaration resolved (asset keys, names), as every definition got it
    handle: PipelineHandle
    assets: AssetsDefinition
    #: the asset job (what ``define_asset_job`` returns)
    job: Any
    sensor: SensorDefinition
    checks: list[AssetChecksDefinition]
    #: ``<name>_maintenance_job``, its schedule and the internal tables' assets
    maintenance: MaintenanceDefinitions
    #: ``<name>_continuous``
    continuous: JobDefinition
    #: the observable source assets of the tables in ``declaration.observe`` (or ``None``)
    observed: AssetsDefinition | None = None

    @property
    def schedules(self) -> list[ScheduleDefinition]:
        return [self.maintenance.schedule]

    def definitions(self) -> Definitions:
        """Every definition of the pipeline, to merge into a project's (resources are the
        project's: ``pyspark`` and ``lake``)."""
        return Definitions(
            assets=[self.assets, *self.maintenance.specs,
                    *([self.observed] if self.observed is not None else [])],
            asset_checks=self.checks,
            jobs=[self.job, self.continuous, self.maintenance.job],
            schedules=self.schedules, sensors=[self.sensor])


def output_specs(pipe: PipelineDeclaration | PipelineHandle,
                 translator: DagsterLakecastTranslator | None = None) -> list[AssetSpec]:
    """One spec per output table (main output first), from the translator."""
    translator = translator or DagsterLakecastTranslator()
    pipe = PipelineHandle.resolve(pipe, translator)
    return [translator.get_asset_spec(pipe.decl, table, pipe.roles[table])
            for table, _ in pipe.outputs]


#: what runs a pipeline's batches in its multi-asset (:func:`run_pipeline`'s signature)
Execute = Callable[..., Iterator[MaterializeResult]]


def make_assets(pipe: PipelineHandle,
                translator: DagsterLakecastTranslator | None = None,
                execute: Execute | None = None) -> AssetsDefinition:
    """The multi-asset that runs the pipeline's micro-batches (``execute``, default
    :func:`~dagster_lakecast.execute.run_pipeline`)."""
    config_class = pipe.decl.hooks.run_config or PipelineRunConfig
    if not issubclass(config_class, PipelineRunConfig):
        raise TypeError(f"{pipe.name}: run_config {config_class.__name__} must subclass "
                        "dagster_lakecast.factory.PipelineRunConfig")

    @multi_asset(
        specs=output_specs(pipe, translator),
        name=f"{pipe.name}_microbatch_assets",
        can_subset=False,
        description=pipe.decl.dagster.description or None,
    )
    def run_microbatches(
        context: AssetExecutionContext,
        config: config_class,  # type: ignore[valid-type]
        pyspark: LakecastSparkResource,
        lake: LakeResource,
    ) -> Iterator[MaterializeResult]:
        """Run the micro-batches for the versions the run was requested for, then end
        (:func:`dagster_lakecast.execute.run_pipeline`, or the ``execute`` given)."""
        yield from (execute or run_pipeline)(context, pipe, pyspark, lake, config)

    return run_microbatches


def declare_pipeline(decl: PipelineDeclaration,
                     translator: DagsterLakecastTranslator | None = None,
                     execute: Execute | None = None) -> PipelineDefinitions:
    """The jobs, output assets, sensor, checks and schedule of ``decl``; asset specs from
    ``translator`` (default :class:`DagsterLakecastTranslator`); the multi-asset's batches
    run by ``execute`` (default :func:`~dagster_lakecast.execute.run_pipeline`). The
    declaration is resolved once (:class:`~dagster_lakecast.handle.PipelineHandle`) and
    the handle passed to every definition."""
    translator = translator or DagsterLakecastTranslator()
    pipe = PipelineHandle.resolve(decl, translator)
    assets = make_assets(pipe, translator, execute)
    checks = pipeline_checks(pipe)
    # the job runs its outputs' checks after each run, except those that are run on request
    # (the recomputation's cost grows with a keyed pipeline's history)
    in_runs = [key for c in checks for key in c.check_keys if key.name not in ON_REQUEST_CHECKS]
    job = define_asset_job(
        pipe.job_name,
        selection=AssetSelection.assets(*(s.key for s in output_specs(pipe, translator)))
        .without_checks() | AssetSelection.checks(*in_runs),
        tags={EXCLUSIVE_TAG: pipe.job_name},
        config=QUIET_RUN_LOGS,
        # the steps share the run's one Spark session instead of a process (and JVM) each
        executor_def=in_process_executor,
        description=pipe.decl.dagster.description
        or f"Micro-batches of the {pipe.name} pipeline.",
    )
    maintenance = declare_maintenance(pipe, translator)
    return PipelineDefinitions(decl, pipe, assets, job, pipeline_sensor(pipe, job), checks,
                               maintenance, declare_continuous(pipe), observed_inputs(pipe))
