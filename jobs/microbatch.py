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
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from dagster import (
    AssetCheckResult,
    AssetExecutionContext,
    AssetSpec,
    MaterializeResult,
    MetadataValue,
    asset_check,
    define_asset_job,
    multi_asset,
)

from assets.columns import column_metadata
from assets.resources import LakecastSparkResource, LakeResource
from jobs.enrichment import FEATURE_FLAGS, StorefrontEnrichment, validate_events
from lakecast.build import broadcast_pipeline
from lakecast.config import Settings, get_settings
from lakecast.delta.source import latest_versions
from lakecast.delta.validation import VersionGate
from lakecast.errors import LakecastError
from lakecast.pipeline.micro_batch import BatchResult, MicroBatchPipeline, PipelineSpec
from lakecast.tables import DIM_PRODUCTS, EVENTS, USER_SEGMENTS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ENRICHED_EVENTS = "enriched_events"
ENRICHMENT_UNMATCHED = "enrichment_unmatched"
ENRICHMENT_REJECTED = "enrichment_rejected"
EXCLUSIVE_TAG = "lakecast/exclusive"

ENRICHMENT = PipelineSpec(
    name="enrichment",
    events_table=EVENTS,
    broadcast_tables=(DIM_PRODUCTS, USER_SEGMENTS, FEATURE_FLAGS),
    output_table=ENRICHED_EVENTS,
    side_outputs={"unmatched": ENRICHMENT_UNMATCHED},
    rejected_table=ENRICHMENT_REJECTED,
)


def build_pipeline(
    spark: "SparkSession",
    settings: Settings,
    max_versions_per_batch: int | None = None,
    *,
    parallelism: int | None = None,
    checkpoint_every: int | None = 1,
    keep_checkpoints: int | None = 10,
    function_id: str = "storefront-enrichment",
) -> MicroBatchPipeline:
    """The enrichment pipeline over the lake of ``settings``, built whole
    (:func:`lakecast.build.broadcast_pipeline`).

    ``parallelism``: tasks per batch (events are repartitioned; default: as read) and per
    checkpoint. ``checkpoint_every``: checkpoint the broadcast state every N committed
    batches (``None``: never); ``keep_checkpoints``: retention. A cold start restores the
    state from the newest complete checkpoint (see ``docs/snapshots.md``).
    """
    return broadcast_pipeline(
        spark, replace(ENRICHMENT, max_versions_per_batch=max_versions_per_batch),
        StorefrontEnrichment(), table_path=settings.table_path,
        checkpoint_root=settings.checkpoint_root, validator=validate_events,
        parallelism=parallelism, checkpoint_every=checkpoint_every,
        keep_checkpoints=keep_checkpoints, timestamp_column="event_ts",
        function_id=function_id,
    )


def summarize(results: list[BatchResult]) -> dict[str, float | int | str]:
    """Numeric totals of a run's batches (Dagster plots them over time)."""
    total: dict[str, float | int | str] = {
        "batches": len(results),
        "events_in": sum(r.counts["events_in"] for r in results),
        "enriched": sum(r.counts.get("enriched", 0) for r in results),
        "unmatched": sum(r.counts.get("unmatched", 0) for r in results),
        "rejected": sum(r.counts.get("rejected", 0) for r in results),
        "broadcast_elements": sum(r.broadcast_elements for r in results),
        "broadcast_rows": sum(r.broadcast_rows for r in results),
        "broadcast_updates_applied": sum(r.updates_applied for r in results),
        "batch_seconds_max": round(max((r.seconds for r in results), default=0.0), 3),
        # tasks that built their state from scratch (0 in a run whose state stayed warm)
        "first_batch_cold_tasks": results[0].cold_tasks if results else 0,
        "cold_tasks": sum(r.cold_tasks for r in results),
        "refused_versions_count": len(refused_versions(results)),
        "full_reloads_count": sum(len(r.full_reloads) for r in results),
    }
    if results:
        last = results[-1]
        total["state_version"] = json.dumps(last.state_version, sort_keys=True)
        total["state_bytes_per_task"] = last.state_bytes_per_task
        total["parallelism"] = last.parallelism
        total["last_batch_id"] = last.plan.batch_id
        total["events_version"] = last.plan.events_end
    return total


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
              description="Side output: malformed events, with the reason."),
]  # fmt: skip
_SPECS = [s.merge_attributes(metadata=column_metadata(s.key.to_user_string())) for s in _SPECS]


@multi_asset(specs=_SPECS, name="enrichment_microbatch_assets", can_subset=False)
def enrichment_microbatch_assets(
    context: AssetExecutionContext, pyspark: LakecastSparkResource, lake: LakeResource
) -> Iterator[MaterializeResult]:
    """Run micro-batches until caught up with the events table."""
    settings = lake.settings()
    pipeline = build_pipeline(pyspark.session_for(ENRICHMENT.name), settings)

    def log(r: BatchResult) -> None:
        context.log.info(
            f"batch {r.plan.batch_id}{' (redone)' if r.redone else ''}: events versions "
            f"({r.plan.events_start}, {r.plan.events_end}] state {r.state_version} "
            f"counts {r.counts} in {r.seconds:.1f}s"
        )
        for ref in r.refused_versions:
            context.log.warning(f"refused {ref['table']}@v{ref['version']}: "
                                + "; ".join(ref["reasons"]))

    results = pipeline.run(on_batch=log)
    if not results:
        context.log.info("no new events since the last committed batch")
        return
    totals = summarize(results)
    checkpoints = [r.checkpoint for r in results if r.checkpoint]
    if checkpoints:
        last = checkpoints[-1]
        totals["last_checkpoint_id"] = last["checkpoint_id"]
        totals["checkpoint_stored_bytes"] = last["stored_bytes"]
        totals["checkpoint_p_x_state_bytes"] = last["p_x_state_bytes"]
    for check in (r.state_check for r in results if r.state_check):
        totals.update(check)  # state hashes verified; what a cold start restored / skipped
    for key, count_key in (
        (ENRICHED_EVENTS, "enriched"), (ENRICHMENT_UNMATCHED, "unmatched"),
        (ENRICHMENT_REJECTED, "rejected"),
    ):  # fmt: skip
        meta: dict[str, object] = {k: v for k, v in totals.items()}
        meta["dagster/row_count"] = int(totals[count_key])
        meta["state_version"] = MetadataValue.json(results[-1].state_version)
        meta["refused_versions"] = MetadataValue.json(refused_versions(results))
        meta["full_reloads"] = MetadataValue.json(
            [f for r in results for f in r.full_reloads])
        yield MaterializeResult(asset_key=key, metadata=meta)


def refused_versions(results: list[BatchResult]) -> list[dict[str, object]]:
    """The broadcast versions refused during a run (each once), with their reasons."""
    seen: dict[tuple[str, int], dict[str, object]] = {}
    for r in results:
        for ref in r.refused_versions:
            seen.setdefault((ref["table"], ref["version"]), ref)
    return [seen[k] for k in sorted(seen)]


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
    "enrichment_microbatch",
    selection=[s.key for s in _SPECS],
    tags={EXCLUSIVE_TAG: "enrichment_microbatch"},
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
    parser.add_argument("--checkpoint-every", type=int, default=1,
                        help="checkpoint the broadcast state every N batches (0: never)")
    parser.add_argument("--keep-checkpoints", type=int, default=10)
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
