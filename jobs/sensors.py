"""``broadcast_versions_sensor``: start a micro-batch when there is work for one.

Each tick reads the newest Delta version of every watched table straight from
its ``_delta_log`` (a directory listing, no Spark, no scan). The cursor holds the
versions seen at the last evaluation; when they are unchanged the tick skips.
Otherwise — and whenever the cursor is missing, from another format, or names
other tables — the sensor reads the pipeline's progress log (without Spark,
:func:`lakecast.pipeline.progress.read_position`) and requests ONE run of
``enrichment_microbatch`` only if there is work:

- a batch was planned and not committed (a crashed run: it must be redone), or
- the events table moved past the last committed batch's ``events_end``.

A batch left planned by a killed run is redone even when no table moves afterwards: with
no run active, an unchanged tick still reads the progress log's position and requests one
redo run for that batch (run key ``<versions key>-redo-<batch id>``).

A broadcast table that changed while no new event arrived is no work: the pipeline
plans batches from new events only (it would log "no new events" and stop), so the
new version is applied with the next events. The run's ``run_key`` is derived from
the version vector, so Dagster never starts two runs for the same versions. A run
of the job still queued or in progress, or an active ``enrichment_continuous`` run
(continuous mode, :mod:`jobs.continuous`): skip without advancing the cursor (the
instance's tag concurrency limit of 1 also guarantees no overlap). A requested run
processes the versions in its ``lakecast/versions`` tag and ends.

When the events table's version moved (since the cursor and since the newest recorded
observation) the tick also records an observation of the ``events`` source asset whose
data version is that Delta version (:func:`assets.raw.events_observation`), run or not.
"""


import hashlib
import json
import os
from collections.abc import Iterable, Mapping

from dagster import (
    AssetKey,
    AssetObservation,
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.raw import events_observation
from jobs.enrichment_pipeline import pipeline_versions
from jobs.microbatch import ENRICHMENT, EXCLUSIVE_TAG, VERSIONS_TAG, enrichment_microbatch
from jobs.runs import WRITER_JOBS, active_runs
from lakecast.config import get_settings
from lakecast.delta import io as delta_io
from lakecast.pipeline.progress import BatchCommit, BatchPlan, progress_path, read_position

SENSOR_INTERVAL_SECONDS = int(os.environ.get("LAKECAST_SENSOR_INTERVAL_SECONDS", "15"))

Versions = dict[str, int | None]
Position = tuple[BatchPlan | None, BatchPlan | None, BatchCommit | None]


def watched_tables() -> tuple[str, ...]:
    """The events table and the broadcast tables, in the pipeline's order."""
    return (ENRICHMENT.events_table, *ENRICHMENT.broadcast_tables)


def watched_versions() -> Versions:
    """Newest Delta version of the events table and each broadcast table (None: no table)."""
    return pipeline_versions(get_settings())


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


def pending_work(versions: Mapping[str, int | None], position: Position) -> str | None:
    """Why a run has work to do given the tables' ``versions`` and the pipeline's progress
    log ``position`` (pending plan, last committed plan, its commit); ``None``: no work."""
    pending, last, _ = position
    if pending is not None:
        return f"batch {pending.batch_id} was planned but not committed: redo it"
    events = versions.get(ENRICHMENT.events_table)
    if events is None:
        return None
    done = last.events_end if last is not None else -1
    if events > done:
        since = f"batch {last.batch_id} (v{done})" if last is not None else "no batch yet"
        return f"{ENRICHMENT.events_table} is at v{events}; last committed: {since}"
    return None


def _cursor(versions: Mapping[str, int | None]) -> str:
    return json.dumps(versions, sort_keys=True)


def _events_moved(context: SensorEvaluationContext, previous: Versions | None,
                  versions: Versions) -> bool:
    """The events table is at a version neither the cursor nor the newest recorded
    observation of ``events`` has (a skipped tick does not advance the cursor)."""
    current = versions.get(ENRICHMENT.events_table)
    if previous is not None and previous.get(ENRICHMENT.events_table) == current:
        return False
    record = context.instance.get_latest_data_version_record(
        AssetKey(ENRICHMENT.events_table), is_source=True)
    observation = record.asset_observation if record is not None else None
    return observation is None or observation.data_version != str(current)


def _skip(reason: str, observed: list[AssetObservation], cursor: str | None = None
          ) -> SensorResult | SkipReason:
    """Skip the tick, still recording the observation of ``events`` (if any)."""
    if not observed and cursor is None:
        return SkipReason(reason)
    return SensorResult(skip_reason=reason, cursor=cursor, asset_events=observed)


@sensor(
    job=enrichment_microbatch,
    minimum_interval_seconds=SENSOR_INTERVAL_SECONDS,
    default_status=DefaultSensorStatus.RUNNING,
    description="Requests one enrichment micro-batch when the events table moved past the "
    "last committed batch (or a crashed batch must be redone).",
)
def broadcast_versions_sensor(context: SensorEvaluationContext) -> SensorResult | SkipReason:
    versions = watched_versions()
    if versions.get(ENRICHMENT.events_table) is None:
        return SkipReason(f"no events table yet ({ENRICHMENT.events_table})")
    previous = parse_cursor(context.cursor, versions)
    unchanged = previous == versions
    settings = get_settings()
    observed = [events_observation(settings)] if _events_moved(context, previous,
                                                               versions) else []
    active = active_runs(context.instance, WRITER_JOBS)
    if active:
        if unchanged:
            return SkipReason(f"no new Delta versions: {versions}")
        return _skip(
            f"run {active[0].run_id} of {active[0].job_name} is still active; new versions "
            "will be picked up by it or after it", observed)
    log_path = progress_path(settings.checkpoint_root, ENRICHMENT.name)
    tags = {EXCLUSIVE_TAG: enrichment_microbatch.name, VERSIONS_TAG: _cursor(versions)}
    if unchanged:  # no table moved; a run killed mid-batch still needs its batch redone
        try:
            pending = read_position(log_path)[0]
        except delta_io.DirectReadUnsupported:
            pending = None
        if pending is None:
            return SkipReason(f"no new Delta versions: {versions}")
        # one redo run per crashed batch (its own run key); if that one dies too, the next
        # new version requests the next run
        return SensorResult(run_requests=[RunRequest(
            run_key=f"{run_key_for(versions)}-redo-{pending.batch_id}", tags=tags)],
            asset_events=observed)
    try:
        reason = pending_work(versions, read_position(log_path))
    except delta_io.DirectReadUnsupported as e:  # e.g. an object-store lake: let the run decide
        reason = f"progress log {log_path} not readable without Spark ({e})"
    if reason is None:
        return _skip(f"no work: the last committed batch covers {versions}", observed,
                     _cursor(versions))
    return SensorResult(
        run_requests=[RunRequest(run_key=run_key_for(versions), tags=tags)],
        cursor=_cursor(versions),
        asset_events=observed,
    )
