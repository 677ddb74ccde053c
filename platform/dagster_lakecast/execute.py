"""The run seam: :func:`run_pipeline` runs a pipeline's pending micro-batches from any
Dagster asset and yields its materializations, like ``SlingResource.replicate`` and
``DbtCliResource.cli``: the factory's multi-asset calls it, the Component's overridable
``execute`` calls it, and a user's own ``@multi_asset`` can call it::

    fx = PipelineDeclaration(name="fx", function=ToEur, events_table="payments",
                             broadcast_tables=("fx_rates",), output_table="payments_eur")

    @dg.multi_asset(specs=output_specs(fx), can_subset=False)
    def payments_in_eur(context: dg.AssetExecutionContext, pyspark: LakecastSparkResource,
                        lake: LakeResource):
        context.log.info("my own step before the batches")
        yield from run_pipeline(context, fx, pyspark, lake)

A run processes the input versions it was requested for (the sensor's run tag), or the
newest committed when it starts, and ends; inputs that do not exist yet are said and
nothing is processed (:mod:`dagster_lakecast.inputs`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from dagster import (
    AssetExecutionContext,
    Config,
    DataVersion,
    Failure,
    MaterializeResult,
)
from pydantic import Field

from dagster_lakecast.declaration import PipelineDeclaration
from dagster_lakecast.handle import PipelineHandle
from dagster_lakecast.inputs import missing_inputs, missing_message
from dagster_lakecast.metadata import (
    batch_metadata,
    log_batch,
    record_batch,
    record_missed,
    requested_versions,
)
from dagster_lakecast.resources import LakecastSparkResource, LakeResource
from dagster_lakecast.runs import refuse_second_writer as refuse_writers
from dagster_lakecast.state_budget import reported_by_check
from dagster_lakecast.translator import DagsterLakecastTranslator
from lakecast.errors import LakecastError
from lakecast.pipeline.micro_batch import BatchResult, MicroBatchPipeline
from lakecast.pipeline.progress import BatchPlan, bounded_versions

__all__ = ["PipelineRunConfig", "run_pipeline"]


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


def refuse_second_writer(context: AssetExecutionContext, pipe: PipelineHandle) -> None:
    """Fail (nothing written) when another run of the pipeline's writers (its job, its
    ``writer_jobs``, its maintenance job) is writing."""
    refuse_writers(context.instance, context.run.run_id, pipe.job_name, pipe.writers, pipe.name)


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


def run_pipeline(context: AssetExecutionContext, pipe: PipelineDeclaration | PipelineHandle,
                 pyspark: LakecastSparkResource, lake: LakeResource,
                 config: PipelineRunConfig | None = None,
                 translator: DagsterLakecastTranslator | None = None
                 ) -> Iterator[MaterializeResult]:
    """Run the pending micro-batches of ``pipe`` (a declaration, resolved here with
    ``translator``, or the handle the factory resolved) in ``context``'s run, then end.
    Every committed
    batch is recorded as a materialization of the outputs as soon as the next one starts;
    the last one is yielded (one ``MaterializeResult`` per output, with the run's totals).
    ``config``: the run's bounds (default :class:`PipelineRunConfig`); ``translator``: the
    outputs' asset keys (default: the table names, or the declaration's ``asset_keys``).
    A refused second writer, or a batch that fails with a Lakecast error, is a Dagster
    ``Failure`` naming the cause."""
    pipe = PipelineHandle.resolve(pipe, translator)
    refuse_second_writer(context, pipe)
    settings = lake.settings()
    if config is None:
        config = (pipe.decl.hooks.run_config or PipelineRunConfig)()
    options = {k: v for k, v in config.model_dump().items() if k not in RUN_FIELDS}
    try:  # a malformed run tag is a clear error even before the tables exist
        until = None if config.follow else requested_versions(pipe, context.run.tags, settings)
    except LakecastError as e:
        raise Failure(description=str(e)) from e
    missing = missing_inputs(pipe, settings)
    if missing:  # nothing to read yet: said, not a failure (the next run reads them)
        context.log.warning(missing_message(pipe, settings, missing))
        return
    record_missed(context, pipe, settings)
    try:
        pipeline = pipe.decl.build(
            pyspark.session_for(pipe.name),
            settings,
            parallelism=config.parallelism,
            max_versions_per_batch=config.max_versions_per_batch,
            **options,
        )
        held: list[BatchResult] = []

        def before_batch(plan: BatchPlan) -> None:
            if held:  # the previous batch is committed: show it now
                record_batch(context, pipe, settings, held.pop())

        def on_batch(r: BatchResult) -> None:
            log_batch(context.log, r)
            held.append(r)

        budget = pipe.decl.dagster.state_budget
        with (reported_by_check if budget else contextlib.nullcontext)():
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
                f"no new events of {pipe.decl.events_table} since the last "
                f"committed batch (requested: {until}); new broadcast "
                "versions apply with the next events"
            )
            return
    except LakecastError as e:  # the reason as the step's failure, not a traceback
        raise Failure(description=str(e)) from e
    hook = pipe.decl.hooks.run_metadata
    run_meta = dict(hook(results)) if hook is not None else {}
    for asset, meta in batch_metadata(pipe, settings, held.pop()).items():
        meta["run_batches"] = len(results)
        meta["run_events"] = sum(r.counts["events_in"] for r in results)
        meta.update(run_meta)
        version = meta.get("delta_version")
        yield MaterializeResult(
            asset_key=pipe.asset_key(asset), metadata=meta,
            data_version=DataVersion(str(version)) if version is not None else None)
