"""``enrichment_microbatch``: enrich new events with the current broadcast state, exactly once.

The storefront enrichment is declared to the pipeline factory (:func:`dagster_lakecast.factory.
declare_pipeline`) like every pipeline: :data:`ENRICHMENT_DECLARATION`. The factory builds
the asset job ``enrichment_microbatch`` over three assets — ``enriched_events`` and its side
outputs ``enrichment_unmatched`` and ``enrichment_rejected`` (group ``microbatch``) — that
depend on the events table and the broadcast tables, so lineage shows in the UI; the
sensor ``broadcast_versions_sensor`` (:mod:`jobs.storefront.sensors`) that starts it; and the checks
``counts_reconcile``, ``broadcast_versions_accepted``, ``events_fresh`` and
``state_budget``. Each run processes the versions it was requested for (see
:mod:`lakecast.pipeline`) and ends.

What the enrichment adds through the declaration's hooks: its run config
(:class:`MicroBatchRunConfig`: ``checkpoint_every``, ``state_budget_bytes``), its engine
builder (:func:`jobs.storefront.pipeline.build_pipeline`), ``enrichment_continuous`` as a
second writer, ``lake_maintenance_job`` as its maintenance (:mod:`jobs.storefront.maintenance`), its
per-batch metadata (:mod:`jobs.storefront.batch_metadata`, also for batches a killed run did not
record), its run totals (``run_*``), the state budget, and the sensor's observation of the
``events`` source asset. A new broadcast version alone is no work for its sensor.

The same pipeline runs without Dagster: ``python -m jobs.storefront.microbatch [--max-batches N]``.
"""


import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

from dagster import AssetKey, AssetObservation, MetadataValue, SensorEvaluationContext
from pydantic import Field

from assets.columns import COLUMNS, schemas
from assets.raw import events_observation
from assets.tables import DIM_PRODUCTS, EVENTS, USER_SEGMENTS
from dagster_lakecast import (
    EXCLUSIVE_TAG,
    VERSIONS_TAG,
    CheckpointPolicy,
    DagsterNames,
    PipelineDeclaration,
    PipelineHooks,
    PipelineRunConfig,
    declare_pipeline,
)
from jobs.storefront.batch_metadata import recovered_metadata, result_metadata
from jobs.storefront.enrichment import StorefrontEnrichment, validate_events
from jobs.storefront.pipeline import (
    CONTINUOUS_JOB,
    DEFAULT,
    ENRICHED_EVENTS,
    ENRICHMENT,
    ENRICHMENT_REJECTED,
    ENRICHMENT_UNMATCHED,
    MAINTENANCE_JOB,
    build_pipeline,
    refused_versions,
    summarize,
)
from lakecast.config import Settings, get_settings
from lakecast.errors import LakecastError
from lakecast.pipeline.micro_batch import BatchResult, MicroBatchPipeline
from lakecast.runtime.metrics import DEFAULT_STATE_BUDGET_BYTES

__all__ = [
    "ENRICHED_EVENTS",
    "ENRICHMENT",
    "ENRICHMENT_DECLARATION",
    "ENRICHMENT_PIPELINE",
    "ENRICHMENT_REJECTED",
    "ENRICHMENT_UNMATCHED",
    "EXCLUSIVE_TAG",
    "VERSIONS_TAG",
    "MicroBatchRunConfig",
    "broadcast_versions_accepted",
    "build_pipeline",
    "enrichment_continuous",
    "enrichment_microbatch",
    "enrichment_microbatch_assets",
    "main",
    "state_budget",
    "summarize",
]  # fmt: skip


class MicroBatchRunConfig(PipelineRunConfig):
    """Bounds of one run of ``enrichment_microbatch`` (a batch is never cut short)."""

    max_batches: int | None = Field(
        default=None, description="Stop after this many batches (default: no limit).")
    max_seconds: float | None = Field(
        default=600.0, description="Start no batch after this many seconds (None: no limit).")
    max_versions_per_batch: int | None = Field(
        default=None, description="Events versions one batch reads at most (default: all "
        "the run processes, in one batch).")
    parallelism: int | None = Field(
        default=None, description="Tasks per batch (events are repartitioned; default: "
        "LAKECAST_PARALLELISM, else as read). On a cluster, the executors' cores spread the "
        "state over every executor.")
    checkpoint_every: int = Field(
        default=DEFAULT, description="Checkpoint the broadcast state every "
        "N batches (counted across runs; a cold start restores the newest checkpoint and "
        "applies the table versions since; -1: LAKECAST_CHECKPOINT_EVERY, default 10).")
    follow: bool = Field(
        default=False, description="Also process what commits while the run is going "
        "(until caught up); by default a run processes the versions it was requested for.")
    state_budget_bytes: int = Field(
        default=DEFAULT_STATE_BUDGET_BYTES, description="Budget for the broadcast state x "
        "parallelism: a batch over it makes the state_budget check WARN (with the numbers).")


def build_from_config(spark: Any, settings: Settings, *, parallelism: int | None = None,
                      max_versions_per_batch: int | None = None,
                      checkpoint_every: int = DEFAULT,
                      state_budget_bytes: int = DEFAULT_STATE_BUDGET_BYTES,
                      ) -> MicroBatchPipeline:
    """The declaration's builder: :func:`build_pipeline` with a run's config (the run
    config's defaults when built outside a run, e.g. by ``output_sample_recomputed``)."""
    return build_pipeline(spark, settings, max_versions_per_batch, parallelism=parallelism,
                          checkpoint_every=checkpoint_every,
                          state_budget_bytes=state_budget_bytes)


def run_totals(results: list[BatchResult]) -> dict[str, Any]:
    """The run's totals on its last materializations: ``run_*``, every version refused
    during the run and the full reloads."""
    return {
        **{f"run_{k}": v for k, v in summarize(results).items()},
        "refused_versions": MetadataValue.json(refused_versions(results)),
        "full_reloads": MetadataValue.json([f for r in results for f in r.full_reloads]),
    }


def observe_events(context: SensorEvaluationContext, previous: Mapping[str, int | None] | None,
                   versions: Mapping[str, int | None], settings: Settings
                   ) -> list[AssetObservation]:
    """An observation of the ``events`` source asset when its Delta version moved since the
    cursor and since the newest recorded observation (a skipped tick does not advance the
    cursor), run or not (:func:`assets.raw.events_observation`)."""
    current = versions.get(EVENTS)
    if previous is not None and previous.get(EVENTS) == current:
        return []
    record = context.instance.get_latest_data_version_record(AssetKey(EVENTS), is_source=True)
    observation = record.asset_observation if record is not None else None
    if observation is None or observation.data_version != str(current):
        return [events_observation(settings)]
    return []


#: the storefront enrichment, as the factory builds it
ENRICHMENT_DECLARATION = PipelineDeclaration(
    name=ENRICHMENT.name,
    function=StorefrontEnrichment,
    events_table=ENRICHMENT.events_table,
    broadcast_tables=ENRICHMENT.broadcast_tables,
    output_table=ENRICHED_EVENTS,
    side_outputs=dict(ENRICHMENT.side_outputs),
    rejected_table=ENRICHMENT_REJECTED,
    validator=validate_events,
    checkpoint=CheckpointPolicy(),
    timestamp_column="event_ts",
    dedup=ENRICHMENT.dedup,
    dagster=DagsterNames(
        columns=schemas(*COLUMNS),  # each table's declared columns (assets/columns.py)
        description="Enrich new events with the current broadcast state, exactly once.",
        descriptions={
            ENRICHED_EVENTS: "Events enriched with product, segment and feature-flag "
            "broadcast state; _state_version says which Delta versions enriched each row.",
            ENRICHMENT_UNMATCHED: "Side output: valid events whose product is not in "
            "dim_products.",
            ENRICHMENT_REJECTED: "Side output: malformed events and duplicate event_ids "
            "(within a batch, or of an event an earlier batch accepted), with the reason.",
        },
        deps={ENRICHED_EVENTS: (EVENTS, DIM_PRODUCTS, USER_SEGMENTS),
              ENRICHMENT_UNMATCHED: (EVENTS, DIM_PRODUCTS), ENRICHMENT_REJECTED: (EVENTS,)},
        group_name="microbatch",
        sensor="broadcast_versions_sensor",
        sensor_description="Requests one enrichment micro-batch when the events table "
        "moved past the last committed batch (or a crashed batch must be redone).",
        maintenance_job=MAINTENANCE_JOB,
        maintenance_schedule="lake_maintenance",
        broadcast_only_runs=False,
        state_budget=True,
    ),
    hooks=PipelineHooks(
        metadata=result_metadata,
        builder=build_from_config,
        run_config=MicroBatchRunConfig,
        run_metadata=run_totals,
        recovered_metadata=recovered_metadata,
        sensor_events=observe_events,
    ),
)
#: its Dagster definitions
ENRICHMENT_PIPELINE = declare_pipeline(ENRICHMENT_DECLARATION)
enrichment_microbatch = ENRICHMENT_PIPELINE.job
enrichment_microbatch_assets = ENRICHMENT_PIPELINE.assets
enrichment_continuous = ENRICHMENT_PIPELINE.continuous
assert enrichment_continuous.name == CONTINUOUS_JOB
lake_maintenance_job = ENRICHMENT_PIPELINE.maintenance.job
lake_maintenance = ENRICHMENT_PIPELINE.maintenance.schedule
_CHECKS = {spec.name: c for c in ENRICHMENT_PIPELINE.checks for spec in c.check_specs}
broadcast_versions_accepted = _CHECKS["broadcast_versions_accepted"]
state_budget = _CHECKS["state_budget"]


def main(argv: list[str] | None = None) -> int:
    """Run the pipeline without Dagster (used by the failure tests and for debugging)."""
    from lakecast.spark import get_spark

    parser = argparse.ArgumentParser(prog="python -m jobs.storefront.microbatch",
    description=__doc__)
    parser.add_argument("--max-batches", type=int, default=None)
    parser.add_argument("--max-versions-per-batch", type=int, default=None,
                        help="cap the events versions one batch reads")
    parser.add_argument("--parallelism", type=int, default=None,
                        help="tasks per batch and per checkpoint (a restart may change it)")
    parser.add_argument("--checkpoint-every", type=int, default=DEFAULT,
                        help="checkpoint the broadcast state every N batches (0: never; "
                             "default LAKECAST_CHECKPOINT_EVERY, else 10)")
    parser.add_argument("--keep-checkpoints", type=int, default=DEFAULT)
    args = parser.parse_args(argv)
    settings = get_settings()
    try:
        spark = get_spark(app_name="lakecast-microbatch",
                          session=f"pipeline:{ENRICHMENT.name}")
    except LakecastError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    pipeline = build_pipeline(spark, settings, args.max_versions_per_batch,
                              parallelism=args.parallelism,
                              checkpoint_every=args.checkpoint_every or None,
                              keep_checkpoints=args.keep_checkpoints)
    results = pipeline.run(
        max_batches=args.max_batches,
        on_batch=lambda r: print(f"batch {r.plan.batch_id}: {r.counts} "
                                 f"cold_tasks={r.cold_tasks}"
                                 + "".join(f"\n  refused {why}" for ref in r.refused_versions
                                           for why in ref["reasons"]), flush=True),
    )
    print(json.dumps(summarize(results), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
