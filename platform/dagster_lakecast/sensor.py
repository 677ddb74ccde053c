"""``<name>_sensor``: one run of a factory-built job per new vector of table versions
(or the name the declaration gives).

Each tick reads the newest Delta version of the events table and of every
broadcast table from their ``_delta_log`` listings (no Spark). The cursor holds the
versions of the last evaluation. When they moved (or the cursor is unusable) the tick
reads the pipeline's progress log (pyarrow, no Spark) and requests one run — run key
derived from the versions, tags ``lakecast/versions`` (what the run processes) and
``lakecast/exclusive`` — when there is work:

* a batch was planned and not committed (it is redone), or
* the events table moved past the last committed batch, or
* a broadcast table has a version newer than the last committed batch applied: the run
  checks it against the function's table contracts at once (a bad version fails the run,
  naming table, version and key) and it applies with the next events. (A declaration with
  ``broadcast_only_runs=False`` skips this: the new version applies with the next events.)

Every tick that sees an input table at a new Delta version records an observation of its
asset whose data version is that Delta version (unless the declaration's ``sensor_events``
hook records its own). Nothing new: skip. A run of one of the pipeline's writers (its job,
its continuous job, the declaration's ``writer_jobs``, its maintenance job) still active: skip
without advancing the cursor. An unchanged tick with a planned, uncommitted batch and no
run active requests one redo run (``<versions key>-redo-<batch id>``). A declaration's
``sensor_events`` hook adds asset events to every tick, run or skip (the enrichment
records an observation of the ``events`` source asset when its version moved).

The cursor is the JSON of the versions; one that cannot be trusted (absent, not JSON,
other tables, a version that is not an int) makes the tick re-derive its decision from the
progress log (:func:`parse_cursor`). Run keys derive from the version vector
(:func:`run_key_for`), so Dagster never starts two runs for the same versions.
"""

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from dagster import (
    AssetObservation,
    DefaultSensorStatus,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from dagster_lakecast.handle import PipelineHandle
from dagster_lakecast.inputs import missing_message
from dagster_lakecast.metadata import table_versions
from dagster_lakecast.runs import active_runs
from dagster_lakecast.tags import EXCLUSIVE_TAG, VERSIONS_TAG
from lakecast.config import Settings, get_settings
from lakecast.delta import io as delta_io
from lakecast.pipeline.progress import BatchCommit, BatchPlan, read_position

#: the tag under which Dagster records an observation's data version
DATA_VERSION_TAG = "dagster/data_version"

__all__ = [
    "evaluate", "input_observations", "parse_cursor", "pending_work", "pipeline_sensor",
    "run_key_for",
]  # fmt: skip


Versions = dict[str, int | None]
Position = tuple[BatchPlan | None, BatchPlan | None, BatchCommit | None]


def run_key_for(versions: Mapping[str, int | None]) -> str:
    """A stable run key for a vector of table versions."""
    canonical = json.dumps(versions, sort_keys=True, separators=(",", ":"))
    return "versions-" + hashlib.sha1(canonical.encode()).hexdigest()[:16]


def parse_cursor(cursor: str | None, tables: Iterable[str]) -> Versions | None:
    """The versions stored in ``cursor``, or ``None`` when it cannot be trusted: absent,
    not JSON, not an object, tables missing or extra, or a version that is not an int
    (or null). An untrusted cursor makes the sensor re-derive its decision from the
    progress log instead of comparing against it."""
    if not cursor:
        return None
    try:
        value = json.loads(cursor)
    except ValueError:
        return None
    if not isinstance(value, dict) or set(value) != set(tables):
        return None
    ok = all(v is None or (isinstance(v, int) and not isinstance(v, bool))
             for v in value.values())  # fmt: skip
    return value if ok else None


def pending_work(
    pipe: PipelineHandle, versions: Mapping[str, int | None], position: Position
) -> str | None:
    """Why a run has work given the tables' ``versions`` and the progress log ``position``
    (pending plan, last committed plan, its commit); ``None``: none."""
    pending, last, _ = position
    if pending is not None:
        return f"batch {pending.batch_id} was planned but not committed: redo it"
    events = versions.get(pipe.decl.events_table)
    done = last.events_end if last is not None else -1
    if events is not None and events > done:
        since = f"batch {last.batch_id} (v{done})" if last is not None else "no batch yet"
        return f"{pipe.decl.events_table} is at v{events}; last committed: {since}"
    if not pipe.decl.dagster.broadcast_only_runs:  # a broadcast version applies with events
        return None
    applied = last.broadcast_versions if last is not None else {}
    moved = {
        t: v
        for t in pipe.decl.broadcast_tables
        if (v := versions.get(t)) is not None and v > applied.get(t, -1)
    }
    if moved:
        return (
            f"new broadcast version(s) {moved} (applied: {applied}): checked now, "
            "applied with the next events"
        )
    return None


def input_observations(pipe: PipelineHandle, previous: Mapping[str, int | None] | None,
                       versions: Mapping[str, int | None]) -> list[AssetObservation]:
    """An observation of each input table (events, broadcast) whose Delta version moved
    since the cursor: its data version is that Delta version, so the UI shows which
    version of a broadcast table each output was computed from."""
    out = []
    for table, version in versions.items():
        if version is None or (previous is not None and previous.get(table) == version):
            continue
        out.append(AssetObservation(
            asset_key=pipe.asset_key(table), metadata={"delta_version": version},
            tags={DATA_VERSION_TAG: str(version)}))
    return out


def _cursor(versions: Mapping[str, int | None]) -> str:
    return json.dumps(versions, sort_keys=True)


def _skip(reason: str, observed: list[AssetObservation], cursor: str | None = None
          ) -> SensorResult | SkipReason:
    """Skip the tick, still recording the hook's asset events (if any)."""
    if not observed and cursor is None:
        return SkipReason(reason)
    return SensorResult(skip_reason=reason, cursor=cursor, asset_events=observed)


def evaluate(
    pipe: PipelineHandle,
    job_name: str,
    context: SensorEvaluationContext,
    settings: Settings | None = None,
) -> SensorResult | SkipReason:
    """One tick of the pipeline's sensor (see the module docstring)."""
    settings = settings or get_settings()
    versions = table_versions(pipe, settings)
    missing = [t for t, v in versions.items() if v is None]
    if missing:
        return SkipReason(missing_message(pipe, settings, missing))
    previous = parse_cursor(context.cursor, versions)
    unchanged = previous == versions
    observed = (list(pipe.decl.hooks.sensor_events(context, previous, versions, settings))
                if pipe.decl.hooks.sensor_events is not None
                else input_observations(pipe, previous, versions))
    # a micro-batch run, another writer, or a maintenance run rewriting the tables
    active = active_runs(context.instance, (job_name, *pipe.writers[1:]))
    if active:
        if unchanged:
            return SkipReason(f"no new Delta versions: {versions}")
        return _skip(
            f"run {active[0].run_id} of {active[0].job_name} is still active; new "
            "versions will be picked up by it or after it", observed)
    log_path = pipe.locate(settings).progress
    tags = {EXCLUSIVE_TAG: job_name, VERSIONS_TAG: _cursor(versions)}
    try:
        position: Position | None = read_position(log_path)
    except delta_io.DirectReadUnsupported:
        position = None
    if unchanged:  # no table moved; a run killed mid-batch still needs its batch redone
        pending = position[0] if position is not None else None
        if pending is None:
            return SkipReason(f"no new Delta versions: {versions}")
        # one redo run per crashed batch (its own run key); if that one dies too, the next
        # new version requests the next run
        return SensorResult(
            run_requests=[
                RunRequest(run_key=f"{run_key_for(versions)}-redo-{pending.batch_id}", tags=tags)
            ],
            asset_events=observed,
        )
    reason = (
        f"progress log {log_path} not readable without Spark"
        if position is None
        else pending_work(pipe, versions, position)
    )
    if reason is None:
        return _skip(f"no work: the last committed batch covers {versions}", observed,
                     _cursor(versions))
    context.log.info(f"{job_name}: {reason}")
    return SensorResult(
        run_requests=[RunRequest(run_key=run_key_for(versions), tags=tags)],
        cursor=_cursor(versions),
        asset_events=observed,
    )


def pipeline_sensor(pipe: PipelineHandle, job: Any) -> SensorDefinition:
    """The sensor that starts ``job`` (the pipeline's micro-batch job)."""

    @sensor(
        name=pipe.sensor_name,
        job=job,
        minimum_interval_seconds=get_settings().sensor_interval_seconds,
        # Declarative Automation on the outputs instead: the sensor is there, stopped
        default_status=DefaultSensorStatus.STOPPED
        if pipe.decl.dagster.automation_condition is not None else DefaultSensorStatus.RUNNING,
        description=pipe.decl.dagster.sensor_description
        or f"Requests one {job.name} run when {pipe.decl.events_table} or a broadcast "
        f"table ({', '.join(pipe.decl.broadcast_tables)}) has a new Delta version "
        "(or a crashed batch must be redone).",
    )
    def pipeline_versions_sensor(context: SensorEvaluationContext) -> SensorResult | SkipReason:
        return evaluate(pipe, job.name, context)

    return pipeline_versions_sensor
