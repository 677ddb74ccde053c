"""Per-batch Dagster metadata of factory-built pipelines, and the versions a run processes.

Each committed batch is one materialization of every output asset with numbers the UI
plots per batch: ``events`` (read), ``outputs`` (main output rows), ``side_outputs``
(all side outputs; ``side_<name>`` each), ``rejected``, ``latency_seconds`` (commit of the
batch's oldest events version -> commit of its main output), ``lag_versions`` and
``lag_seconds`` (events versions committed after the batch's range when it was recorded,
and how long ago the oldest of them committed), ``batch_seconds`` and its phases
(``phase_<name>_seconds``: :attr:`~lakecast.pipeline.batch_result.BatchResult.phases`),
the age of the applied broadcast versions (``broadcast_age_seconds``, ``broadcast_stale_seconds``,
``broadcast_versions_behind``: :mod:`dagster_lakecast.broadcast_age`), ``state_bytes_per_task`` and
``state_bytes_total`` (x ``parallelism``), plus ``batch_rows`` and
``dagster/row_count`` per asset (from the Delta log's statistics, no scan). A declaration's
``metadata`` hook adds its own entries per output table; with ``state_budget`` the batch's
state total against its budget joins them (:mod:`dagster_lakecast.state_budget`).

Batches are recorded one by one while a run goes on (:func:`record_batch`); with a
``recovered_metadata`` hook, a batch committed by a run that died before recording it
(``kill -9`` between the commit and the event) is recorded by the next run, from the
progress log, with ``recovered = true`` (:func:`record_missed`).
"""

import json
import time
from collections.abc import Mapping
from typing import Any

from dagster import AssetKey, AssetMaterialization, MetadataValue, OpExecutionContext

from dagster_lakecast.broadcast_age import broadcast_age
from dagster_lakecast.handle import PipelineHandle
from dagster_lakecast.state_budget import state_budget_metadata
from dagster_lakecast.tags import VERSIONS_TAG
from lakecast.config import Settings
from lakecast.delta import io as delta_io
from lakecast.errors import LakecastError
from lakecast.pipeline.micro_batch import BatchResult
from lakecast.pipeline.progress import MAIN_COUNT, BatchCommit, BatchPlan, read_log

__all__ = [
    "batch_metadata", "log_batch", "output_metadata", "record_batch", "record_missed",
    "requested_versions", "table_versions",
]  # fmt: skip

#: engine counts copied into the metadata when present (keyed runtimes add changed_keys
#: and timers_fired; a dedup adds too_late_to_deduplicate)
EXTRA_COUNTS = ("processed", "changed_keys", "timers_fired", "too_late_to_deduplicate")


def table_versions(pipe: PipelineHandle, settings: Settings) -> dict[str, int | None]:
    """Newest Delta version of the events table and of each broadcast table (``None``: no
    table yet), from their ``_delta_log`` listings (no Spark)."""
    tables = (pipe.decl.events_table, *pipe.decl.broadcast_tables)
    return {t: delta_io.latest_version(settings.table_path(t)) for t in tables}


def requested_versions(
    pipe: PipelineHandle, tags: Mapping[str, str], settings: Settings
) -> dict[str, int | None]:
    """The versions in the run's ``lakecast/versions`` tag (set by the sensor), else the
    newest committed when the run starts."""
    raw = tags.get(VERSIONS_TAG)
    if not raw:
        return table_versions(pipe, settings)
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise LakecastError(
            f"run tag {VERSIONS_TAG}={raw!r} is not JSON: {e}; remove the tag "
            "to process what is committed now"
        ) from e
    if not isinstance(value, dict):
        raise LakecastError(
            f"run tag {VERSIONS_TAG}={raw!r} is not a JSON object (table -> version)"
        )
    return {str(t): None if v is None else int(v) for t, v in value.items()}


def lag(
    pipe: PipelineHandle, settings: Settings, events_end: int, now: float | None = None
) -> tuple[int, float]:
    """Events versions committed after ``events_end`` and the age in seconds of the oldest
    of them (``(0, 0.0)``: caught up)."""
    path = settings.table_path(pipe.decl.events_table)
    newest = delta_io.latest_version(path)
    behind = max(0, (newest if newest is not None else -1) - events_end)
    if not behind:
        return 0, 0.0
    first = delta_io.commit_seconds(path, events_end + 1)
    now = time.time() if now is None else now
    return behind, round(max(0.0, now - first), 3) if first is not None else 0.0


def batch_metadata(
    pipe: PipelineHandle, settings: Settings, result: BatchResult
) -> dict[str, dict[str, Any]]:
    """Metadata of one committed batch, per output asset (see the module docstring)."""
    plan, counts = result.plan, result.counts
    events_path = settings.table_path(pipe.decl.events_table)
    oldest = delta_io.commit_seconds(events_path, max(plan.events_start + 1, 0))
    written = delta_io.commit_seconds(
        settings.table_path(pipe.decl.output_table),
        result.output_versions.get(pipe.decl.output_table, -1)
    )
    lag_versions, lag_seconds = lag(pipe, settings, plan.events_end)
    sides = {f"side_{s}": int(counts.get(s, 0)) for s in pipe.decl.side_outputs}
    common: dict[str, Any] = {
        "batch_id": plan.batch_id,
        "events_start": plan.events_start,
        "events_end": plan.events_end,
        "state_version": MetadataValue.json(dict(plan.broadcast_versions)),
        "events": int(counts.get("events_in", 0)),
        "outputs": int(counts.get(MAIN_COUNT, 0)),
        "side_outputs": sum(sides.values()),
        **sides,
        "rejected": int(counts.get("rejected", 0)),
        **{k: int(counts[k]) for k in EXTRA_COUNTS if k in counts},
        "lag_versions": lag_versions,
        "lag_seconds": lag_seconds,
        "batch_seconds": round(result.seconds, 3),
        **{f"phase_{k}_seconds": round(v, 3) for k, v in result.phases.items()},
        "redone": result.redone,
        "parallelism": result.parallelism,
        "state_engine": result.state_engine,
        "state_engine_reason": result.state_engine_reason,
        "cold_tasks": result.cold_tasks,
        "cold_build_seconds": round(result.cold_build_seconds, 3),
        "state_evictions": result.state_evictions,
        "shards_per_task": result.shards_per_task,
        "rows_routed": result.rows_routed,
        "executors": len(result.executors),
        "state_bytes_per_task": result.state_bytes_per_task,
        "state_bytes_total": result.state_bytes_per_task * max(result.parallelism or 1, 1),
        "refused_versions": MetadataValue.json(list(result.refused_versions)),
    }
    if written is not None and oldest is not None:
        common["latency_seconds"] = round(written - oldest, 3)
    common.update(broadcast_age(settings.table_path, plan.broadcast_versions, written))
    if pipe.decl.dagster.state_budget:
        common.update(state_budget_metadata(result))
    hook = pipe.decl.hooks.metadata
    extra = hook(settings, result) if hook is not None else {}
    return {table: {**output_metadata(common, int(counts.get(key, 0)), settings.table_path(table),
                                      result.output_versions.get(table, -1)),
                    **extra.get(table, {})}
            for table, key in pipe.outputs}


def output_metadata(common: Mapping[str, Any], batch_rows: int, path: str,
                    version: int) -> dict[str, Any]:
    """One output table's materialization metadata: ``common``, the batch's rows under
    ``batch_rows`` and, when the batch committed ``version`` (>= 0), that version and the
    table's rows after it (``dagster/row_count``)."""
    meta = {**common, "batch_rows": batch_rows}
    if version >= 0:
        meta["delta_version"] = version
        rows = delta_io.row_count(path, version)
        if rows is not None:
            meta["dagster/row_count"] = rows
    return meta


def data_version_tags(meta: Mapping[str, Any]) -> dict[str, str]:
    """An output's data version: the Delta version its batch committed (none without)."""
    version = meta.get("delta_version")
    return {"dagster/data_version": str(version)} if version is not None else {}


def log_batch(log: Any, r: BatchResult) -> None:
    """One line per batch in the run's log (and one warning per refused version)."""
    log.info(
        f"batch {r.plan.batch_id}{' (redone)' if r.redone else ''}: events versions "
        f"({r.plan.events_start}, {r.plan.events_end}] state {r.state_version} "
        f"counts {r.counts} in {r.seconds:.1f}s"
        + (" (" + ", ".join(f"{k} {v:.2f}" for k, v in r.phases.items()) + ")"
           if r.phases else "")
    )
    for ref in r.refused_versions:
        log.warning(f"refused {ref['table']}@v{ref['version']}: " + "; ".join(ref["reasons"]))


def record_batch(
    context: OpExecutionContext, pipe: PipelineHandle, settings: Settings, result: BatchResult
) -> None:
    """Log one materialization per output asset for ``result`` (while the run goes on)."""
    for asset, meta in batch_metadata(pipe, settings, result).items():
        context.log_event(AssetMaterialization(asset_key=pipe.asset_key(asset), metadata=meta,
                                               tags=data_version_tags(meta)))


def last_recorded_batch(context: OpExecutionContext, asset: Any) -> int | None:
    """The ``batch_id`` of the newest materialization of ``asset`` (``None``: none, or one
    without a batch id)."""
    key = asset if isinstance(asset, AssetKey) else AssetKey(asset)
    event = context.instance.get_latest_materialization_event(key)
    mat = event.asset_materialization if event is not None else None
    value = mat.metadata.get("batch_id") if mat is not None else None
    return int(value.value) if value is not None else None


def recovered_batch_metadata(pipe: PipelineHandle, settings: Settings, plan: BatchPlan,
                             commit: BatchCommit) -> dict[str, dict[str, Any]]:
    """Metadata of a batch committed by a run that did not record it, from the progress
    log, per output table (``recovered = true``; the declaration's ``recovered_metadata``
    hook adds its own entries)."""
    counts = commit.counts
    events_path = settings.table_path(pipe.decl.events_table)
    oldest = delta_io.commit_seconds(events_path, max(plan.events_start + 1, 0))
    main = commit.output_versions.get(pipe.decl.output_table, -1)
    written = (delta_io.commit_seconds(settings.table_path(pipe.decl.output_table), main)
               if main >= 0 else None)
    common: dict[str, Any] = {
        "batch_id": plan.batch_id, "events_start": plan.events_start,
        "events_end": plan.events_end, "recovered": True,
        "state_version": MetadataValue.json(dict(plan.broadcast_versions)),
        "events": int(counts.get("events_in", 0)), "outputs": int(counts.get(MAIN_COUNT, 0)),
        "rejected": int(counts.get("rejected", 0)),
    }
    if written is not None and oldest is not None:
        common["latency_seconds"] = round(written - oldest, 3)
    common.update(broadcast_age(settings.table_path, plan.broadcast_versions, written))
    extra = (pipe.decl.hooks.recovered_metadata(settings, plan, commit)
             if pipe.decl.hooks.recovered_metadata is not None else {})
    return {table: {**output_metadata(common, int(counts.get(key, 0)),
                                      settings.table_path(table),
                                      commit.output_versions.get(table, -1)),
                    **extra.get(table, {})}
            for table, key in pipe.outputs}


def record_missed(
    context: OpExecutionContext, pipe: PipelineHandle, settings: Settings
) -> int:
    """Record, per output asset, the committed batches newer than the asset's last recorded
    one (a run killed after its commit and before its events, or between the events of two
    assets), with :func:`recovered_batch_metadata`; returns how many batches it recorded
    for at least one asset (0 before any recorded batch)."""
    main = last_recorded_batch(context, pipe.asset_key(pipe.decl.output_table))
    if main is None:
        return 0  # a fresh instance: the history before it is not this instance's
    lasts = {t: last_recorded_batch(context, pipe.asset_key(t)) for t, _ in pipe.outputs}
    lasts = {t: main if b is None else b for t, b in lasts.items()}
    try:
        plans, commits = read_log(pipe.locate(settings).progress)
    except delta_io.DirectReadUnsupported:
        return 0
    by_id = {p.batch_id: p for p in plans if not p.is_restore}
    oldest = min(lasts.values())
    missed: list[tuple[BatchPlan, BatchCommit]] = [
        (by_id[i], commits[i]) for i in sorted(commits) if i > oldest and i in by_id]
    for plan, commit in missed:
        for asset, meta in recovered_batch_metadata(pipe, settings, plan, commit).items():
            if plan.batch_id > lasts.get(asset, main):
                context.log_event(AssetMaterialization(asset_key=pipe.asset_key(asset),
                                                       metadata=dict(meta)))
    if missed:
        context.log.info(f"recorded {len(missed)} committed batch(es) that an earlier run "
                         f"did not record for every output: {[p.batch_id for p, _ in missed]}")
    return len(missed)
