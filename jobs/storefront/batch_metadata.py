"""The enrichment's own metadata of a committed micro-batch, for each output asset (the
enrichment declaration's ``metadata`` and ``recovered_metadata`` hooks,
:mod:`jobs.storefront.microbatch`; the factory adds its generic keys,
:mod:`dagster_lakecast.metadata`).

Both enrichment jobs record every batch they commit as a materialization of
``enriched_events``, ``enrichment_unmatched`` and ``enrichment_rejected`` while the
run is in progress, with that batch's metadata (so the UI plots per batch, and a run
killed after N batches still shows those N):

- ``batch_id``, ``events_start``/``events_end`` (the events versions ``(start, end]``),
  ``state_version`` (broadcast table → Delta version), ``batch_rows`` (rows this batch
  wrote to the asset) and the batch's ``events_in``/``enriched``/``unmatched``/``rejected``
  and ``cross_batch_duplicates`` (rejected events whose ``event_id`` an earlier batch
  accepted; the dedup's ``dedup_watermark``/``dedup_retained``/``dedup_keys_found`` too),
  ``too_late_to_deduplicate`` (valid events older than ``dedup_horizon``, rejected);
  ``held`` (events held after the batch), ``held_retried`` (held events it offered
  again) and ``held_expired`` (held events it sent to unmatched after the hold timeout);
- ``dagster/row_count``: rows in the table after the batch's commit (from the Delta
  log's file statistics, no scan);
- ``state_bytes_per_task``, ``state_bytes_total`` (x ``parallelism``),
``state_budget_bytes``
  and ``state_over_budget`` (the ``state_budget`` check reads them:
  :mod:`dagster_lakecast.state_budget`);
- ``broadcast_age_seconds``, ``broadcast_stale_seconds``, ``broadcast_versions_behind``
  and ``broadcast_age`` (per table): how old the applied broadcast versions are
  (:mod:`dagster_lakecast.broadcast_age`);
- ``batch_seconds`` and ``commit_to_output_seconds``: from the commit of the oldest
  events version in the batch to the commit of the batch's main output (and
  ``newest_commit_to_output_seconds`` from the newest one).

A batch committed by a run that died before recording it (``kill -9`` between the
commit and the event) is recorded by the next run, from the progress log, with
``recovered = true``: :func:`recovered_metadata`.
"""

from collections.abc import Mapping
from typing import Any

from dagster import MetadataValue

from jobs.storefront.pipeline import ENRICHED_EVENTS, ENRICHMENT, OUTPUTS
from lakecast.config import Settings
from lakecast.delta import io as delta_io
from lakecast.pipeline.held import HELD_COUNTS
from lakecast.pipeline.micro_batch import CROSS_BATCH_DUPLICATES, LATE_EVENTS, BatchResult
from lakecast.pipeline.progress import MAIN_COUNT, BatchCommit, BatchPlan


def batch_metadata(
    settings: Settings,
    plan: BatchPlan,
    counts: Mapping[str, int],
    output_versions: Mapping[str, int],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """Metadata of one committed batch, per output asset (see the module docstring)."""
    events_path = settings.table_path(ENRICHMENT.events_table)
    oldest = delta_io.commit_seconds(events_path, max(plan.events_start + 1, 0))
    newest = delta_io.commit_seconds(events_path, plan.events_end)
    main_version = output_versions.get(ENRICHED_EVENTS, -1)
    written = (delta_io.commit_seconds(settings.table_path(ENRICHED_EVENTS), main_version)
               if main_version >= 0 else None)
    common: dict[str, Any] = {
        "batch_id": plan.batch_id,
        "events_start": plan.events_start,
        "events_end": plan.events_end,
        "state_version": MetadataValue.json(dict(plan.broadcast_versions)),
        # the storefront says "enriched" for the engine's main-output count
        "enriched": int(counts.get(MAIN_COUNT, 0)),
        **{k: int(counts.get(k, 0)) for k in ("events_in", "unmatched", "rejected",
                                                CROSS_BATCH_DUPLICATES, LATE_EVENTS,
                                                *HELD_COUNTS)},
    }
    if written is not None and oldest is not None and newest is not None:
        common["commit_to_output_seconds"] = round(written - oldest, 3)
        common["newest_commit_to_output_seconds"] = round(written - newest, 3)
    common.update(extra or {})
    # the factory adds the generic keys (batch_rows, dagster/row_count, broadcast age,
    # state budget: dagster_lakecast's metadata)
    return {asset: dict(common) for asset, _ in OUTPUTS}


def result_metadata(settings: Settings, result: BatchResult) -> dict[str, dict[str, Any]]:
    """:func:`batch_metadata` of a batch this process just ran."""
    extra: dict[str, Any] = {
        "batch_seconds": round(result.seconds, 3),
        "redone": result.redone,
        "cold_tasks": result.cold_tasks,
        "parallelism": result.parallelism,
        "executors": MetadataValue.json(list(result.executors)),
        "state_bytes_per_task": result.state_bytes_per_task,
        "broadcast_updates_applied": result.updates_applied,
        "refused_versions_count": len(result.refused_versions),
        **{f"dedup_{k}": v for k, v in result.dedup.items() if v is not None},
    }
    if result.checkpoint:
        extra["checkpoint_id"] = result.checkpoint["checkpoint_id"]
        extra["checkpoint_stored_bytes"] = result.checkpoint["stored_bytes"]
    extra.update(result.state_check or {})  # state hashes verified; what a restore did
    return batch_metadata(settings, result.plan, result.counts, result.output_versions, extra)


def recovered_metadata(settings: Settings, plan: BatchPlan, commit: BatchCommit
                       ) -> dict[str, dict[str, Any]]:
    """:func:`batch_metadata` of a batch committed by a run that did not record it, with
    ``recovered = true`` (:func:`dagster_lakecast.metadata.record_missed` records it)."""
    return batch_metadata(settings, plan, commit.counts, commit.output_versions,
                          {"recovered": True})
