"""``enrichment_microbatch``: enrich new events with the current broadcast state, exactly once.

The job is a Dagster asset job over three assets — ``enriched_events`` and its
side outputs ``enrichment_unmatched`` and ``enrichment_rejected`` — that depend
on the events table and the broadcast tables, so lineage shows in the UI. Each
run processes everything committed since the last batch (see
:mod:`lakecast.pipeline`); ``broadcast_versions_sensor`` starts it.

The same pipeline runs without Dagster: ``python -m jobs.microbatch [--max-batches N]``.
"""


import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from dagster import (
    AssetCheckResult,
    AssetExecutionContext,
    AssetSpec,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset_check,
    define_asset_job,
    multi_asset,
)
from pydantic import Field

from assets.columns import column_metadata
from assets.resources import LakecastSparkResource, LakeResource
from jobs.batch_metadata import record_batch, record_missed, result_metadata
from jobs.enrichment import StorefrontEnrichment
from jobs.enrichment_pipeline import (
    DEFAULT_CHECKPOINT_EVERY,
    DEFAULT_KEEP_CHECKPOINTS,
    ENRICHED_EVENTS,
    ENRICHMENT,
    ENRICHMENT_REJECTED,
    ENRICHMENT_UNMATCHED,
    EXCLUSIVE_TAG,
    VERSIONS_TAG,
    build_pipeline,
    pipeline_versions,
    refused_versions,
    summarize,
)
from jobs.runs import MICROBATCH_JOB, QUIET_RUN_LOGS, refuse_second_writer
from jobs.state_budget import reported_by_check
from lakecast.config import Settings, get_settings
from lakecast.delta.source import latest_versions
from lakecast.delta.validation import VersionGate
from lakecast.errors import LakecastError
from lakecast.pipeline.micro_batch import BatchResult
from lakecast.pipeline.progress import BatchPlan
from lakecast.runtime.metrics import DEFAULT_STATE_BUDGET_BYTES
from lakecast.tables import DIM_PRODUCTS, EVENTS, USER_SEGMENTS

__all__ = [
    "ENRICHED_EVENTS", "ENRICHMENT", "ENRICHMENT_REJECTED", "ENRICHMENT_UNMATCHED",
    "EXCLUSIVE_TAG", "VERSIONS_TAG", "broadcast_versions_accepted", "build_pipeline",
    "enrichment_microbatch", "enrichment_microbatch_assets", "main", "summarize",
]  # fmt: skip

_SPECS = [
    AssetSpec(ENRICHED_EVENTS, deps=[EVENTS, DIM_PRODUCTS, USER_SEGMENTS], skippable=True,
              group_name="microbatch", kinds={"spark", "delta"},
              description="Events enriched with product, segment and feature-flag broadcast "
                          "state; _state_version says which Delta versions enriched each row."),
    AssetSpec(ENRICHMENT_UNMATCHED, deps=[EVENTS, DIM_PRODUCTS], skippable=True,
              group_name="microbatch", kinds={"spark", "delta"},
              description="Side output: valid events whose product is not in dim_products."),
    AssetSpec(ENRICHMENT_REJECTED, deps=[EVENTS], skippable=True, group_name="microbatch",
              kinds={"spark", "delta"},
              description="Side output: malformed events and duplicate event_ids (within "
                          "a batch, or of an event an earlier batch accepted), with the "
                          "reason."),
]  # fmt: skip
_SPECS = [s.merge_attributes(metadata=column_metadata(s.key.to_user_string())) for s in _SPECS]


class MicroBatchRunConfig(Config):
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
        default=DEFAULT_CHECKPOINT_EVERY, description="Checkpoint the broadcast state every "
        "N batches (counted across runs; a cold start restores the newest checkpoint and "
        "applies the table versions since).")
    follow: bool = Field(
        default=False, description="Also process what commits while the run is going "
        "(until caught up); by default a run processes the versions it was requested for.")
    state_budget_bytes: int = Field(
        default=DEFAULT_STATE_BUDGET_BYTES, description="Budget for the broadcast state x "
        "parallelism: a batch over it makes the state_budget check WARN (with the numbers).")


def requested_versions(tags: Mapping[str, str], settings: Settings) -> dict[str, int | None]:
    """The table versions a run processes: those in its ``lakecast/versions`` tag (set by
    the sensor), else the newest committed when it starts (read from the Delta logs)."""
    raw = tags.get(VERSIONS_TAG)
    if raw:
        try:
            value = json.loads(raw)
        except ValueError as e:
            raise LakecastError(f"run tag {VERSIONS_TAG}={raw!r} is not JSON: {e}; remove "
                                f"the tag to process what is committed now") from e
        if isinstance(value, dict):
            return {str(t): None if v is None else int(v) for t, v in value.items()}
    return pipeline_versions(settings)


@multi_asset(specs=_SPECS, name="enrichment_microbatch_assets", can_subset=False)
def enrichment_microbatch_assets(
    context: AssetExecutionContext, config: MicroBatchRunConfig,
    pyspark: LakecastSparkResource, lake: LakeResource,
) -> Iterator[MaterializeResult]:
    """Run the micro-batches for the versions the run was requested for, then end.

    Every committed batch is recorded as a materialization of the three outputs as soon as
    the next one starts (:mod:`jobs.batch_metadata`); the last one is the step's result,
    with the run's totals (``run_*``)."""
    refuse_second_writer(context.instance, context.run.run_id, MICROBATCH_JOB)
    settings = lake.settings()
    record_missed(context, settings)
    try:
        until = None if config.follow else requested_versions(context.run.tags, settings)
    except LakecastError as e:  # the reason as the step's failure, not a chained traceback
        raise Failure(description=str(e)) from e
    pipeline = build_pipeline(pyspark.session_for(ENRICHMENT.name), settings,
                              config.max_versions_per_batch,
                              parallelism=config.parallelism,
                              checkpoint_every=config.checkpoint_every,
                              state_budget_bytes=config.state_budget_bytes)
    held: list[BatchResult] = []

    def before_batch(plan: BatchPlan) -> None:
        if held:  # the previous batch is committed: show it now
            record_batch(context, settings, held.pop())

    def on_batch(r: BatchResult) -> None:
        log_batch(context.log, r)
        held.append(r)

    with reported_by_check():
        results = pipeline.run(max_batches=config.max_batches, max_seconds=config.max_seconds,
                               until=until, on_batch=on_batch, before_batch=before_batch)
    if not results:
        context.log.info(f"no new events since the last committed batch (up to {until})")
        return
    totals = {f"run_{k}": v for k, v in summarize(results).items()}
    for asset, meta in result_metadata(settings, held.pop()).items():
        meta.update(totals)
        meta["refused_versions"] = MetadataValue.json(refused_versions(results))
        meta["full_reloads"] = MetadataValue.json([f for r in results for f in r.full_reloads])
        yield MaterializeResult(asset_key=asset, metadata=meta)


def log_batch(log: Any, r: BatchResult) -> None:
    """One line per batch in the run's log (and one warning per refused version)."""
    log.info(
        f"batch {r.plan.batch_id}{' (redone)' if r.redone else ''}: events versions "
        f"({r.plan.events_start}, {r.plan.events_end}] state {r.state_version} "
        f"counts {r.counts} in {r.seconds:.1f}s"
    )
    for ref in r.refused_versions:
        log.warning(f"refused {ref['table']}@v{ref['version']}: " + "; ".join(ref["reasons"]))


@asset_check(
    asset=ENRICHED_EVENTS,
    name="broadcast_versions_accepted",
    description="The newest version of every broadcast table passes the enrichment's table "
                "contracts (fails while one is refused: the state is at an older version).",
)
def broadcast_versions_accepted(pyspark: LakecastSparkResource, lake: LakeResource
                                ) -> AssetCheckResult:
    """Check the newest version of each broadcast table against the function's contracts."""
    spark = pyspark.spark_session
    settings = lake.settings()
    tables = {t: settings.table_path(t) for t in ENRICHMENT.broadcast_tables}
    gate = VersionGate(spark, tables, StorefrontEnrichment().table_contracts())
    newest = {t: v for t, v in latest_versions(tables, spark).items() if v is not None}
    refused = [{"table": t, "version": v, "reasons": list(gate.reasons(t, v))}
               for t, v in sorted(newest.items()) if gate.reasons(t, v)]
    return AssetCheckResult(
        passed=not refused,
        metadata={"newest_versions": MetadataValue.json(newest),
                  "refused_versions": MetadataValue.json(refused)},
        description="; ".join(why for r in refused for why in r["reasons"]) or None,
    )


enrichment_microbatch = define_asset_job(
    MICROBATCH_JOB,
    selection=[s.key for s in _SPECS],
    tags={EXCLUSIVE_TAG: "enrichment_microbatch"},
    config=QUIET_RUN_LOGS,
    description="Enrich new events with the current broadcast state, exactly once.",
)


def main(argv: list[str] | None = None) -> int:
    """Run the pipeline without Dagster (used by the failure tests and for debugging)."""
    from lakecast.spark import get_spark

    parser = argparse.ArgumentParser(prog="python -m jobs.microbatch", description=__doc__)
    parser.add_argument("--max-batches", type=int, default=None)
    parser.add_argument("--max-versions-per-batch", type=int, default=None,
                        help="cap the events versions one batch reads")
    parser.add_argument("--parallelism", type=int, default=None,
                        help="tasks per batch and per checkpoint (a restart may change it)")
    parser.add_argument("--checkpoint-every", type=int, default=DEFAULT_CHECKPOINT_EVERY,
                        help="checkpoint the broadcast state every N batches (0: never)")
    parser.add_argument("--keep-checkpoints", type=int, default=DEFAULT_KEEP_CHECKPOINTS)
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
