"""broadcast_versions_sensor: ticks evaluated against a real lake and a real Dagster instance."""

from __future__ import annotations

import json

from dagster import (
    DagsterInstance,
    DagsterRunStatus,
    SensorResult,
    SkipReason,
    build_sensor_context,
)
from dagster._core.storage.dagster_run import DagsterRun

from jobs.microbatch import EXCLUSIVE_TAG, enrichment_microbatch
from jobs.sensors import broadcast_versions_sensor
from lakecast.tables import EVENTS
from lakecast.tools import flags
from tests.jobs import microbatch_lake as ml


def _tick(instance, cursor):
    return broadcast_versions_sensor(build_sensor_context(instance=instance, cursor=cursor))


def test_sensor_requests_one_run_per_new_versions(spark, lake):
    with DagsterInstance.ephemeral() as instance:
        skip = _tick(instance, None)
        assert isinstance(skip, SkipReason) and "no events table" in skip.skip_message

        ml.build(spark, lake)
        ml.write_events(spark, lake, ml.events(0, 10, seed=1))
        first = _tick(instance, None)
        assert isinstance(first, SensorResult)
        (req,) = first.run_requests
        assert req.tags[EXCLUSIVE_TAG] == enrichment_microbatch.name
        cursor = json.loads(first.cursor)
        assert cursor[EVENTS] == 0 and cursor["user_segments"] == 0
        # run_key is stable for the same versions (a re-evaluated tick is deduplicated)
        assert _tick(instance, None).run_requests[0].run_key == req.run_key

        # nothing changed: no run
        same = _tick(instance, first.cursor)
        assert isinstance(same, SkipReason) and "no new Delta versions" in same.skip_message

        # a broadcast table moves: a new run with a new key, cursor advanced
        flags.set_flag(spark, lake.table_path("feature_flags"), "vip_discount", "30")
        second = _tick(instance, first.cursor)
        assert isinstance(second, SensorResult)
        assert second.run_requests[0].run_key != req.run_key
        assert json.loads(second.cursor)["feature_flags"] == cursor["feature_flags"] + 1

        # the events table moves while a run is active: skip, cursor not advanced
        ml.write_events(spark, lake, ml.events(100, 10, seed=2))
        instance.add_run(DagsterRun(job_name=enrichment_microbatch.name,
                                    status=DagsterRunStatus.STARTED))  # fmt: skip
        busy = _tick(instance, second.cursor)
        assert isinstance(busy, SkipReason) and "still active" in busy.skip_message
