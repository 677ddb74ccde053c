"""``broadcast_versions_sensor``: start a micro-batch when the events or broadcast tables move.

Each tick reads the newest Delta version of every watched table straight from
its ``_delta_log`` (a directory listing, no Spark, no scan). When any version
advanced past the cursor it requests ONE run of ``enrichment_microbatch`` with a
``run_key`` derived from those versions (so a re-evaluated tick never starts a
duplicate run) and stores the versions in the cursor. Nothing changed: no run.
A run of the job still queued or in progress: skip without advancing the cursor
(the instance's tag concurrency limit of 1 also guarantees no overlap).
"""


import hashlib
import json
import os

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from jobs.microbatch import ENRICHMENT, EXCLUSIVE_TAG, enrichment_microbatch
from lakecast.config import get_settings
from lakecast.delta import io as delta_io

SENSOR_INTERVAL_SECONDS = int(os.environ.get("LAKECAST_SENSOR_INTERVAL_SECONDS", "15"))
ACTIVE = [
    DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
]  # fmt: skip


def watched_versions() -> dict[str, int | None]:
    """Newest Delta version of the events table and each broadcast table (None: no table)."""
    settings = get_settings()
    tables = (ENRICHMENT.events_table, *ENRICHMENT.broadcast_tables)
    return {t: delta_io.latest_version(settings.table_path(t)) for t in tables}


def run_key_for(versions: dict[str, int | None]) -> str:
    """A stable run key for a vector of table versions."""
    canonical = json.dumps(versions, sort_keys=True, separators=(",", ":"))
    return "versions-" + hashlib.sha1(canonical.encode()).hexdigest()[:16]


@sensor(
    job=enrichment_microbatch,
    minimum_interval_seconds=SENSOR_INTERVAL_SECONDS,
    default_status=DefaultSensorStatus.RUNNING,
    description="Requests one enrichment micro-batch when the events or broadcast tables "
    "commit a new Delta version.",
)
def broadcast_versions_sensor(context: SensorEvaluationContext) -> SensorResult | SkipReason:
    versions = watched_versions()
    if versions.get(ENRICHMENT.events_table) is None:
        return SkipReason(f"no events table yet ({ENRICHMENT.events_table})")
    previous = json.loads(context.cursor) if context.cursor else {}
    if versions == previous:
        return SkipReason(f"no new Delta versions: {versions}")
    active = context.instance.get_run_records(
        RunsFilter(job_name=enrichment_microbatch.name, statuses=ACTIVE), limit=1
    )
    if active:
        return SkipReason(
            f"run {active[0].dagster_run.run_id} of {enrichment_microbatch.name} is still "
            "active; new versions will be picked up after it"
        )
    changed = sorted(k for k, v in versions.items() if previous.get(k) != v)
    tags = {
        EXCLUSIVE_TAG: enrichment_microbatch.name,
        "lakecast/versions": json.dumps(versions, sort_keys=True),
    }
    return SensorResult(
        run_requests=[RunRequest(run_key=run_key_for(versions), tags=tags)],
        cursor=json.dumps(versions, sort_keys=True),
        dynamic_partitions_requests=None,
    ) if changed else SkipReason("no change")
