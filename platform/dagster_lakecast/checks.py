"""Asset checks of factory-built pipelines (read from Delta logs and the progress log, no
Spark):

* ``counts_reconcile`` (on the main output): every committed batch consumed what it read
  (events in + held events re-offered = processed + rejected); the events table holds as
  many rows up to the last committed batch as the batches read; and each output table
  (main, side outputs, rejected) holds exactly the rows its batches reported, at the
  versions the last batch committed;
* ``broadcast_versions_accepted`` (on the main output): the newest version of every
  broadcast table passes the function's table contracts;
* ``events_fresh`` (on the main output): no events version committed more than the
  declaration's ``freshness_seconds`` ago is left unprocessed;
* ``output_sample_recomputed`` (on the main output, with Spark): a sample of output rows
  recomputed from the events and the broadcast tables at their batches' versions
  (:mod:`dagster_lakecast.recompute`); not part of the job's runs (its cost grows with a
  keyed pipeline's history): run it from the asset's Checks tab or a schedule;
* ``state_budget`` (declarations with ``state_budget=True``): the newest batch's broadcast
  state x parallelism is within its budget (WARN, :mod:`dagster_lakecast.state_budget`).

``broadcast_versions_accepted`` reads the broadcast tables' files directly; on a lake that
cannot be read without Spark (an object store) it uses the run's Spark session.
"""

import time
from typing import Any

from dagster import (
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    MetadataValue,
    asset_check,
)

from dagster_lakecast.handle import PipelineHandle
from dagster_lakecast.metadata import lag
from dagster_lakecast.recompute import CHECK_NAME as RECOMPUTE_CHECK
from dagster_lakecast.recompute import recompute_check
from dagster_lakecast.resources import LakecastSparkResource, LakeResource
from dagster_lakecast.state_budget import state_budget_check
from lakecast.config import Settings
from lakecast.delta import io as delta_io
from lakecast.delta.validation import VersionGate
from lakecast.pipeline.progress import BatchCommit, BatchPlan, read_log

__all__ = ["ON_REQUEST_CHECKS", "counts_reconcile", "events_freshness", "newest_versions_refused",
           "pipeline_checks"]

#: checks that a pipeline's job does not run after each run (run from the UI or a schedule)
ON_REQUEST_CHECKS = frozenset({RECOMPUTE_CHECK})


def surviving_batches(
    plans: list[BatchPlan], commits: dict[int, BatchCommit]
) -> list[tuple[BatchPlan, BatchCommit]]:
    """Committed batches that are part of the current history (not undone by a rewind)."""
    undone: set[int] = set()
    for r in (p for p in plans if p.is_restore):
        undone |= {
            p.batch_id
            for p in plans
            if r.restore_of is not None and r.restore_of < p.batch_id < r.batch_id
        }
    return [
        (p, commits[p.batch_id])
        for p in plans
        if not p.is_restore and p.batch_id in commits and p.batch_id not in undone
    ]


def counts_reconcile(
    pipe: PipelineHandle, settings: Settings
) -> tuple[bool, list[str], dict[str, Any]]:
    """``(passed, problems, metadata)`` of the reconciliation (see the module docstring)."""
    plans, commits = read_log(pipe.locate(settings).progress)
    batches = surviving_batches(plans, commits)
    if not batches:
        return True, [], {"batches": 0}
    problems = []
    for plan, commit in batches:
        c = commit.counts
        offered = c.get("events_in", 0) + c.get("held_retried", 0)
        if offered != c.get("processed", 0) + c.get("rejected", 0):
            retried = f" + held_retried {c['held_retried']}" if "held_retried" in c else ""
            problems.append(
                f"batch {plan.batch_id}: events_in {c.get('events_in')}{retried} != "
                f"processed {c.get('processed')} + rejected {c.get('rejected')}"
            )
    total = {
        key: sum(int(c.counts.get(key, 0)) for _, c in batches)
        for key in ("events_in", "processed", "rejected")
    }
    last_plan, last_commit = batches[-1]
    events = delta_io.row_count(settings.table_path(pipe.decl.events_table), last_plan.events_end)
    if events != total["events_in"]:
        problems.append(
            f"{pipe.decl.events_table}@v{last_plan.events_end} holds {events} rows; "
            f"the batches read {total['events_in']}"
        )
    tables: dict[str, Any] = {}
    for table, key in pipe.outputs:
        want = sum(int(c.counts.get(key, 0)) for _, c in batches)
        version = last_commit.output_versions.get(table, -1)
        have = delta_io.row_count(settings.table_path(table), version) if version >= 0 else 0
        tables[table] = {"version": version, "rows": have, "batches_reported": want}
        if have != want:
            problems.append(
                f"{table}@v{version} holds {have} rows; the batches reported {want} ({key})"
            )
    meta = {
        "batches": len(batches),
        "last_batch_id": last_plan.batch_id,
        "events_rows": events if events is not None else -1,
        **total,
        "tables": MetadataValue.json(tables),
    }
    return not problems, problems, meta


def newest_versions_refused(
    pipe: PipelineHandle, settings: Settings, spark: Any = None
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """The newest version of each broadcast table and those its contracts refuse (read
    without Spark unless ``spark`` is given)."""
    tables = {t: settings.table_path(t) for t in pipe.decl.broadcast_tables}
    gate = VersionGate(spark, tables, pipe.decl.function().table_contracts())
    newest = {
        t: v for t, p in tables.items() if (v := delta_io.latest_version(p, spark)) is not None
    }
    refused = [
        {"table": t, "version": v, "reasons": list(gate.reasons(t, v))}
        for t, v in sorted(newest.items())
        if gate.reasons(t, v)
    ]
    return newest, refused


def events_freshness(
    pipe: PipelineHandle, settings: Settings, now: float | None = None
) -> tuple[bool, str | None, dict[str, Any]]:
    """``(passed, problem, metadata)``: whether every events version committed more than
    ``pipe.decl.dagster.freshness_seconds`` before ``now`` is processed by a committed batch."""
    plans, commits = read_log(pipe.locate(settings).progress)
    batches = surviving_batches(plans, commits)
    end = batches[-1][0].events_end if batches else -1
    now = time.time() if now is None else now
    behind, age = lag(pipe, settings, end, now)
    meta = {
        "processed_through_version": end,
        "unprocessed_versions": behind,
        "oldest_unprocessed_seconds": age,
        "bound_seconds": pipe.decl.dagster.freshness_seconds,
    }
    if age <= pipe.decl.dagster.freshness_seconds:
        return True, None, meta
    return False, (
        f"{pipe.decl.events_table}: {behind} version(s) after v{end} unprocessed, the oldest "
        f"committed {age:.0f} s ago (bound {pipe.decl.dagster.freshness_seconds:.0f} s): start the "
        f"{pipe.sensor_name} sensor or run {pipe.job_name}"
    ), meta


def pipeline_checks(pipe: PipelineHandle) -> list[AssetChecksDefinition]:
    """The pipeline's asset checks, on its main output asset."""

    @asset_check(
        asset=pipe.asset_key(pipe.decl.output_table),
        name="counts_reconcile",
        description=f"Events of {pipe.decl.events_table} read = processed + rejected, "
        "and every output table holds the rows its batches reported.",
    )
    def check_counts(lake: LakeResource) -> AssetCheckResult:
        passed, problems, meta = counts_reconcile(pipe, lake.settings())
        return AssetCheckResult(
            passed=passed, metadata=meta, description="; ".join(problems) or None
        )

    @asset_check(
        asset=pipe.asset_key(pipe.decl.output_table),
        name="broadcast_versions_accepted",
        description="The newest version of every broadcast table passes the "
        "function's table contracts. Blocking: a refused version of a contract whose policy "
        "is 'fail' is an ERROR, and assets downstream of the output are not materialized; "
        "a refused version the pipeline continues past (refuse_and_continue) is a WARN.",
        blocking=True,
    )
    def check_versions(pyspark: LakecastSparkResource, lake: LakeResource) -> AssetCheckResult:
        settings = lake.settings()
        try:
            newest, refused = newest_versions_refused(pipe, settings)
        except delta_io.DirectReadUnsupported:  # e.g. an object-store lake: read with Spark
            newest, refused = newest_versions_refused(pipe, settings, pyspark.spark_session)
        policies = {c.table: c.on_invalid for c in pipe.decl.function().table_contracts()}
        fatal = any(policies.get(r["table"]) == "fail" for r in refused)
        return AssetCheckResult(
            passed=not refused,
            severity=AssetCheckSeverity.ERROR if fatal else AssetCheckSeverity.WARN,
            metadata={
                "newest_versions": MetadataValue.json(newest),
                "refused_versions": MetadataValue.json(refused),
            },
            description="; ".join(why for r in refused for why in r["reasons"]) or None,
        )

    @asset_check(
        asset=pipe.asset_key(pipe.decl.output_table),
        name="events_fresh",
        description=f"No version of {pipe.decl.events_table} committed more than "
        f"{pipe.decl.dagster.freshness_seconds:.0f} s ago is left unprocessed.",
    )
    def check_fresh(lake: LakeResource) -> AssetCheckResult:
        passed, problem, meta = events_freshness(pipe, lake.settings())
        return AssetCheckResult(passed=passed, metadata=meta, description=problem)

    checks = [check_counts, check_versions, check_fresh, recompute_check(pipe)]
    if pipe.decl.dagster.state_budget:
        checks.append(state_budget_check(pipe.asset_key(pipe.decl.output_table)))
    return checks
