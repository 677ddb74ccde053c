"""The storefront enrichment pipeline: its tables, how it is built, and run totals.

Shared by the enrichment's declaration (:mod:`jobs.storefront.microbatch`: the factory builds its
job, sensor and checks), the continuous job (:mod:`dagster_lakecast.continuous`), their metadata
(:mod:`jobs.storefront.batch_metadata`) and ``lakecast replay`` (:mod:`jobs.registry`).
"""

import json
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING

from assets.tables import DIM_PRODUCTS, EVENTS, USER_SEGMENTS
from jobs.storefront.enrichment import FEATURE_FLAGS, StorefrontEnrichment, validate_events
from lakecast.build import broadcast_pipeline
from lakecast.config import Settings
from lakecast.delta import io as delta_io
from lakecast.pipeline.dedup import DedupSpec
from lakecast.pipeline.micro_batch import (
    CROSS_BATCH_DUPLICATES,
    BatchResult,
    MicroBatchPipeline,
    PipelineSpec,
)
from lakecast.pipeline.progress import MAIN_COUNT
from lakecast.runtime.metrics import DEFAULT_STATE_BUDGET_BYTES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ENRICHED_EVENTS = "enriched_events"
ENRICHMENT_UNMATCHED = "enrichment_unmatched"
ENRICHMENT_REJECTED = "enrichment_rejected"
#: the events held until their product arrives (:mod:`lakecast.pipeline.held`)
ENRICHMENT_HELD = "enrichment_held"
#: the storefront's jobs that write its tables (one writer at a time)
MICROBATCH_JOB = "enrichment_microbatch"
CONTINUOUS_JOB = "enrichment_continuous"
MAINTENANCE_JOB = "lake_maintenance_job"
WRITER_JOBS = (MICROBATCH_JOB, CONTINUOUS_JOB, MAINTENANCE_JOB)
#: (asset, count key) of every output table, main output first
OUTPUTS = (
    (ENRICHED_EVENTS, MAIN_COUNT), (ENRICHMENT_UNMATCHED, "unmatched"),
    (ENRICHMENT_REJECTED, "rejected"),
)  # fmt: skip

#: checkpoint the broadcast state every N batches (Flink checkpoints by interval, too): a
#: checkpoint hashes every task's state and writes it, so it stays off most batches' path;
#: a cold start restores the newest one and applies the table versions since. The default
#: is ``Settings.checkpoint_every`` (``LAKECAST_CHECKPOINT_EVERY``, e.g. for a soak); so is
#: ``keep_checkpoints``'s (``LAKECAST_KEEP_CHECKPOINTS``)
DEFAULT = -1

ENRICHMENT = PipelineSpec(
    name="enrichment",
    events_table=EVENTS,
    broadcast_tables=(DIM_PRODUCTS, USER_SEGMENTS, FEATURE_FLAGS),
    output_table=ENRICHED_EVENTS,
    side_outputs={"unmatched": ENRICHMENT_UNMATCHED},
    rejected_table=ENRICHMENT_REJECTED,
    # exactly once per event_id across batches: a copy of an event an earlier batch
    # enriched (or sent to unmatched) is rejected as duplicate_event_id, within the
    # retention of event time (Settings.dedup_retention unless build_pipeline says)
    dedup=DedupSpec(key="event_id", time_column="event_ts", reason="duplicate_event_id"),
    # events whose product is not in dim_products yet are held and retried each batch,
    # until the product arrives or Settings.hold_timeout (by plan time) passes
    held_table=ENRICHMENT_HELD,
)


def build_pipeline(
    spark: "SparkSession",
    settings: Settings,
    max_versions_per_batch: int | None = None,
    *,
    parallelism: int | None = None,
    checkpoint_every: int | None = DEFAULT,
    keep_checkpoints: int | None = DEFAULT,
    function_id: str = "storefront-enrichment",
    dedup_retention: timedelta | None = None,
    state_budget_bytes: int = DEFAULT_STATE_BUDGET_BYTES,
    hold_timeout: timedelta | None = None,
) -> MicroBatchPipeline:
    """The enrichment pipeline over the lake of ``settings``, built whole
    (:func:`lakecast.build.broadcast_pipeline`).

    ``parallelism``: tasks per batch (events are repartitioned; default:
    ``settings.parallelism``, ``LAKECAST_PARALLELISM``, else as read) and per checkpoint.
    ``checkpoint_every``: checkpoint the broadcast state every N committed batches
    (``None``: never); ``keep_checkpoints``: retention. A cold start restores the state
    from the newest complete checkpoint (see ``docs/concepts/snapshots.md``).
    ``dedup_retention``: how long by event time an accepted ``event_id`` is remembered
    (default: ``settings.dedup_retention``, ``LAKECAST_DEDUP_RETENTION``).
    ``state_budget_bytes``: budget for the state x parallelism (reported per batch).
    ``hold_timeout``: how long by plan time an event whose product is unknown is retried
    before it goes to unmatched (default: ``settings.hold_timeout``,
    ``LAKECAST_HOLD_TIMEOUT``; 0: at once).
    """
    assert ENRICHMENT.dedup is not None
    retention = settings.dedup_retention if dedup_retention is None else dedup_retention
    spec = replace(ENRICHMENT, max_versions_per_batch=max_versions_per_batch,
                   dedup=replace(ENRICHMENT.dedup, retention=retention),
                   hold_timeout=settings.hold_timeout if hold_timeout is None
                   else hold_timeout)
    return broadcast_pipeline(
        spark, spec,
        StorefrontEnrichment(), table_path=settings.table_path,
        checkpoint_root=settings.checkpoint_root, validator=validate_events,
        parallelism=settings.parallelism if parallelism is None else parallelism,
        checkpoint_every=settings.checkpoint_every if checkpoint_every == DEFAULT
        else checkpoint_every,
        keep_checkpoints=settings.keep_checkpoints if keep_checkpoints == DEFAULT
        else keep_checkpoints, timestamp_column="event_ts",
        function_id=function_id, state_budget_bytes=state_budget_bytes,
    )


def summarize(results: list[BatchResult]) -> dict[str, float | int | str]:
    """Numeric totals of a run's batches (Dagster plots them over time)."""
    total: dict[str, float | int | str] = {
        "batches": len(results),
        "events_in": sum(r.counts["events_in"] for r in results),
        "enriched": sum(r.counts.get(MAIN_COUNT, 0) for r in results),
        "unmatched": sum(r.counts.get("unmatched", 0) for r in results),
        "rejected": sum(r.counts.get("rejected", 0) for r in results),
        CROSS_BATCH_DUPLICATES: sum(r.counts.get(CROSS_BATCH_DUPLICATES, 0) for r in results),
        "held_retried": sum(r.counts.get("held_retried", 0) for r in results),
        "held_expired": sum(r.counts.get("held_expired", 0) for r in results),
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
        total["held"] = last.counts.get("held", 0)  # held after the run
        total["state_version"] = json.dumps(last.state_version, sort_keys=True)
        total["state_bytes_per_task"] = last.state_bytes_per_task
        total["parallelism"] = last.parallelism
        total["last_batch_id"] = last.plan.batch_id
        total["events_version"] = last.plan.events_end
    return total


def refused_versions(results: list[BatchResult]) -> list[dict[str, object]]:
    """The broadcast versions refused during a run (each once), with their reasons."""
    seen: dict[tuple[str, int], dict[str, object]] = {}
    for r in results:
        for ref in r.refused_versions:
            seen.setdefault((ref["table"], ref["version"]), ref)
    return [seen[k] for k in sorted(seen)]


def pipeline_versions(settings: Settings) -> dict[str, int | None]:
    """Newest Delta version of the events table and of each broadcast table (``None``: no
    table yet), from their ``_delta_log`` listings (no Spark)."""
    tables = (ENRICHMENT.events_table, *ENRICHMENT.broadcast_tables)
    return {t: delta_io.latest_version(settings.table_path(t)) for t in tables}
