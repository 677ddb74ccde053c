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

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from dagster import (
    AssetChecksDefinition,
    AssetExecutionContext,
    AssetsDefinition,
    AssetSelection,
    AssetSpec,
    Config,
    DataVersion,
    Definitions,
    Failure,
    JobDefinition,
    MaterializeResult,
    ScheduleDefinition,
    SensorDefinition,
    define_asset_job,
    in_process_executor,
    multi_asset,
)
from pydantic import Field

from dagster_lakecast.checks import ON_REQUEST_CHECKS, pipeline_checks
from dagster_lakecast.continuous import declare_continuous
from dagster_lakecast.declaration import CheckpointPolicy, PipelineDeclaration
from dagster_lakecast.inputs import missing_inputs, missing_message, observed_inputs
from dagster_lakecast.maintenance import MaintenanceDefinitions, declare_maintenance
from dagster_lakecast.metadata import (
    batch_metadata,
    log_batch,
    record_batch,
    record_missed,
    requested_versions,
)
from dagster_lakecast.resources import LakecastSparkResource, LakeResource
from dagster_lakecast.runs import refuse_second_writer as refuse_writers
from dagster_lakecast.sensor import pipeline_sensor
from dagster_lakecast.state_budget import reported_by_check
from dagster_lakecast.tags import EXCLUSIVE_TAG, QUIET_RUN_LOGS
from dagster_lakecast.translator import DagsterLakecastTranslator
from lakecast.errors import LakecastError
from lakecast.pipeline.micro_batch import BatchResult, MicroBatchPipeline
from lakecast.pipeline.progress import BatchPlan, bounded_versions

__all__ = [
    "CheckpointPolicy", "PipelineDeclaration", "PipelineDefinitions", "PipelineRunConfig",
    "declare_pipeline",
]  # fmt: skip


class PipelineRunConfig(Config):
    """Bounds of one run of a factory-built job (a batch is never cut short). A
    declaration's ``run_config`` subclasses it; its extra fields go to the declaration's
    ``builder``."""

    max_batches: int | None = Field(default=None, description="Stop after this many batches.")
    max_seconds: float | None = Field(
        default=600.0, description="Start no batch after this many seconds (None: no limit)."
    )
    max_versions_per_batch: int | None = Field(
        default=None, description="Events versions one batch reads at most."
    )
    parallelism: int | None = Field(
        default=None, description="Tasks per batch (default: the declaration's)."
    )
    follow: bool = Field(
        default=False, description="Also process what commits while the run goes on."
    )


#: the fields of :class:`PipelineRunConfig` (the rest of a run config go to the builder)
RUN_FIELDS = frozenset(PipelineRunConfig.model_fields)


@dataclass(frozen=True)
class PipelineDefinitions:
    """What :func:`declare_pipeline` produced: spread it into ``Definitions``, or take
    :meth:`definitions`."""

    declaration: PipelineDeclaration
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


def output_specs(decl: PipelineDeclaration,
                 translator: DagsterLakecastTranslator | None = None) -> list[AssetSpec]:
    """One spec per output table (main output first), from the translator."""
    translator = translator or DagsterLakecastTranslator()
    roles = decl.roles
    return [translator.get_asset_spec(decl, table, roles[table]) for table, _ in decl.outputs]


def refuse_second_writer(context: AssetExecutionContext, decl: PipelineDeclaration) -> None:
    """Fail (nothing written) when another run of the pipeline's writers (its job, its
    ``writer_jobs``, its maintenance job) is writing."""
    refuse_writers(context.instance, context.run.run_id, decl.job_name, decl.writers, decl.name)


def check_new_broadcast_versions(
    pipeline: MicroBatchPipeline, until: Mapping[str, int | None] | None
) -> list[dict]:
    """Check the broadcast versions a run was requested for against the function's
    contracts even when no batch runs (a contract with policy ``fail`` raises); returns
    the refused versions."""
    gate = pipeline.version_gate
    if gate is None:
        return []
    last, _ = pipeline.log.last_committed()
    applied = last.broadcast_versions if last is not None else {}
    events, bvs = pipeline.current_versions()
    if until is not None:
        events, bvs = bounded_versions(events, bvs, until, pipeline.spec.events_table, applied)
    return [r.as_dict() for r in gate.plan(applied, bvs)[1]]


def make_assets(decl: PipelineDeclaration,
                translator: DagsterLakecastTranslator | None = None) -> AssetsDefinition:
    """The multi-asset that runs the pipeline's micro-batches."""
    config_class = decl.run_config or PipelineRunConfig
    if not issubclass(config_class, PipelineRunConfig):
        raise TypeError(f"{decl.name}: run_config {config_class.__name__} must subclass "
                        "dagster_lakecast.factory.PipelineRunConfig")
    quiet = reported_by_check if decl.state_budget else contextlib.nullcontext

    @multi_asset(
        specs=output_specs(decl, translator),
        name=f"{decl.name}_microbatch_assets",
        can_subset=False,
        description=decl.description or None,
    )
    def run_microbatches(
        context: AssetExecutionContext,
        config: config_class,  # type: ignore[valid-type]
        pyspark: LakecastSparkResource,
        lake: LakeResource,
    ) -> Iterator[MaterializeResult]:
        """Run the micro-batches for the versions the run was requested for, then end.
        Every committed batch is recorded as a materialization of the outputs as soon as the
        next one starts; the last one is the step's result, with the run's totals."""
        refuse_second_writer(context, decl)
        settings = lake.settings()
        missing = missing_inputs(decl, settings)
        if missing:  # nothing to read yet: said, not a failure (the next run reads them)
            context.log.warning(missing_message(decl, settings, missing))
            return
        record_missed(context, decl, settings)
        options = {k: v for k, v in config.model_dump().items() if k not in RUN_FIELDS}
        try:
            until = None if config.follow else requested_versions(decl, context.run.tags, settings)
            pipeline = decl.build(
                pyspark.session_for(decl.name),
                settings,
                parallelism=config.parallelism,
                max_versions_per_batch=config.max_versions_per_batch,
                **options,
            )
            held: list[BatchResult] = []

            def before_batch(plan: BatchPlan) -> None:
                if held:  # the previous batch is committed: show it now
                    record_batch(context, decl, settings, held.pop())

            def on_batch(r: BatchResult) -> None:
                log_batch(context.log, r)
                held.append(r)

            with quiet():
                results = pipeline.run(
                    max_batches=config.max_batches,
                    max_seconds=config.max_seconds,
                    until=until,
                    on_batch=on_batch,
                    before_batch=before_batch,
                )
            if not results:
                refused = check_new_broadcast_versions(pipeline, until)
                for ref in refused:
                    context.log.warning(
                        f"refused {ref['table']}@v{ref['version']}: " + "; ".join(ref["reasons"])
                    )
                context.log.info(
                    f"no new events of {decl.events_table} since the last "
                    f"committed batch (requested: {until}); new broadcast "
                    "versions apply with the next events"
                )
                return
        except LakecastError as e:  # the reason as the step's failure, not a traceback
            raise Failure(description=str(e)) from e
        run_meta = dict(decl.run_metadata(results)) if decl.run_metadata is not None else {}
        for asset, meta in batch_metadata(decl, settings, held.pop()).items():
            meta["run_batches"] = len(results)
            meta["run_events"] = sum(r.counts["events_in"] for r in results)
            meta.update(run_meta)
            version = meta.get("delta_version")
            yield MaterializeResult(
                asset_key=decl.asset_key(asset), metadata=meta,
                data_version=DataVersion(str(version)) if version is not None else None)

    return run_microbatches


def with_asset_keys(decl: PipelineDeclaration,
                    translator: DagsterLakecastTranslator) -> PipelineDeclaration:
    """``decl`` with the translator's asset key of every table it reads or writes."""
    roles = decl.roles
    return replace(decl, asset_keys={t: translator.get_asset_key(decl, t, r)
                                     for t, r in roles.items()})


def declare_pipeline(decl: PipelineDeclaration,
                     translator: DagsterLakecastTranslator | None = None) -> PipelineDefinitions:
    """The jobs, output assets, sensor, checks and schedule of ``decl``; asset specs from
    ``translator`` (default :class:`DagsterLakecastTranslator`)."""
    translator = translator or DagsterLakecastTranslator()
    declared, decl = decl, with_asset_keys(decl, translator)
    assets = make_assets(decl, translator)
    checks = pipeline_checks(decl)
    # the job runs its outputs' checks after each run, except those that are run on request
    # (the recomputation's cost grows with a keyed pipeline's history)
    in_runs = [key for c in checks for key in c.check_keys if key.name not in ON_REQUEST_CHECKS]
    job = define_asset_job(
        decl.job_name,
        selection=AssetSelection.assets(*(s.key for s in output_specs(decl, translator)))
        .without_checks() | AssetSelection.checks(*in_runs),
        tags={EXCLUSIVE_TAG: decl.job_name},
        config=QUIET_RUN_LOGS,
        # the steps share the run's one Spark session instead of a process (and JVM) each
        executor_def=in_process_executor,
        description=decl.description or f"Micro-batches of the {decl.name} pipeline.",
    )
    maintenance = declare_maintenance(decl, translator)
    return PipelineDefinitions(declared, assets, job, pipeline_sensor(decl, job), checks,
                               maintenance, declare_continuous(decl), observed_inputs(decl))
