"""broadcast_versions_sensor: ticks evaluated against a real lake and a real Dagster instance."""

from __future__ import annotations

import json

import pytest
from dagster import (
    AssetKey,
    DagsterInstance,
    DagsterRunStatus,
    SensorResult,
    SkipReason,
    build_sensor_context,
)
from dagster._core.storage.dagster_run import DagsterRun

from assets import flags
from assets.tables import EVENTS
from dagster_lakecast.sensor import parse_cursor, run_key_for
from jobs.storefront.microbatch import ENRICHMENT, EXCLUSIVE_TAG, enrichment_microbatch
from jobs.storefront.sensors import broadcast_versions_sensor, watched_tables, watched_versions
from lakecast.config import get_settings
from lakecast.pipeline.progress import BatchCommit
from tests.jobs import microbatch_lake as ml


def _tick(instance, cursor):
    return broadcast_versions_sensor(build_sensor_context(instance=instance, cursor=cursor))


def test_sensor_requests_one_run_per_new_versions(spark, lake):
    with DagsterInstance.ephemeral() as instance:
        skip = _tick(instance, None)
        # no input table yet: each named, with what creates it
        assert isinstance(skip, SkipReason)
        assert "events table 'events' (asset events) is not a Delta table" in skip.skip_message
        assert "dg launch --assets events" in skip.skip_message, skip.skip_message

        ml.build(spark, lake)
        first_events = ml.events(0, 10, seed=1)
        ml.write_events(spark, lake, first_events)
        first = _tick(instance, None)
        assert isinstance(first, SensorResult)
        (req,) = first.run_requests
        assert req.tags[EXCLUSIVE_TAG] == enrichment_microbatch.name
        cursor = json.loads(first.cursor)
        assert cursor[EVENTS] == 0 and cursor["user_segments"] == 0
        # the tick records an observation of the events source asset: data version = v0
        (seen,) = first.asset_events
        assert seen.asset_key == AssetKey(EVENTS) and seen.data_version == "0"
        assert seen.metadata["delta_version"].value == 0
        assert seen.metadata["dagster/row_count"].value == len(first_events)
        # run_key is stable for the same versions (a re-evaluated tick is deduplicated)
        assert _tick(instance, None).run_requests[0].run_key == req.run_key

        # nothing changed: no run, no observation
        same = _tick(instance, first.cursor)
        assert isinstance(same, SkipReason) and "no new Delta versions" in same.skip_message

        # a broadcast table moves: a new run with a new key, cursor advanced (no batch has
        # committed events v0 yet, so there is still work)
        flags.set_flag(spark, lake.table_path("feature_flags"), "vip_discount", "30")
        second = _tick(instance, first.cursor)
        assert isinstance(second, SensorResult)
        assert second.run_requests[0].run_key != req.run_key
        assert json.loads(second.cursor)["feature_flags"] == cursor["feature_flags"] + 1
        assert not second.asset_events, "events did not move"

        # the events table moves while a run is active: skip, cursor not advanced
        ml.write_events(spark, lake, ml.events(100, 10, seed=2))
        instance.add_run(DagsterRun(job_name=enrichment_microbatch.name,
                                    status=DagsterRunStatus.STARTED))  # fmt: skip
        busy = _tick(instance, second.cursor)
        assert not _runs(busy) and "still active" in ml.skip_message(busy)
        # the cursor stays, but events v1 is observed once (the daemon stores it)
        (seen,) = busy.asset_events
        assert seen.data_version == "1"
        instance.report_runless_asset_event(seen)
        again = _tick(instance, second.cursor)
        assert isinstance(again, SkipReason) and "still active" in again.skip_message


# --------------------------------------------------------------------------- progress log


def _log(spark, lake):
    from lakecast.pipeline.progress import ProgressLog, progress_path

    return ProgressLog(spark, progress_path(lake.checkpoint_root, ENRICHMENT.name),
                       ENRICHMENT.name)  # fmt: skip


def _commit_batch(spark, lake, batch_id, start, end, *, commit=True):
    """Log batch ``batch_id`` over events versions (start, end] at the tables' current
    versions, as the pipeline does (the plan, then — unless ``commit`` is False — its
    commit)."""
    from lakecast.pipeline.progress import BatchCommit, BatchPlan

    bvs = {t: v for t, v in watched_versions().items() if t != EVENTS and v is not None}
    log = _log(spark, lake)
    log.write_plan(BatchPlan(batch_id, start, end, bvs))
    if commit:
        log.write_commit(BatchCommit(batch_id, {"events_in": 1}))


def _runs(result):
    return result.run_requests if isinstance(result, SensorResult) else []


def test_first_tick_reads_the_progress_log_and_runs_only_for_work(spark, lake):
    ml.build(spark, lake)
    ml.write_events(spark, lake, ml.events(0, 10, seed=1))  # events v0
    with DagsterInstance.ephemeral() as instance:
        # no progress log yet: events v0 is work
        assert len(_runs(_tick(instance, None))) == 1

        # batch 0 committed events v0 (the state the last run left): no run, cursor stored
        _commit_batch(spark, lake, 0, -1, 0)
        idle = _tick(instance, None)
        assert isinstance(idle, SensorResult) and not idle.run_requests
        assert "no work" in ml.skip_message(idle)
        assert json.loads(idle.cursor) == watched_versions()
        assert "no new Delta versions" in ml.skip_message(_tick(instance, idle.cursor))

        # only a broadcast table moved: no new events, so no batch to run
        flags.set_flag(spark, lake.table_path("feature_flags"), "vip_discount", "30")
        bc = _tick(instance, idle.cursor)
        assert not _runs(bc) and "no work" in ml.skip_message(bc)
        flags_v = json.loads(idle.cursor)["feature_flags"]
        assert json.loads(bc.cursor)["feature_flags"] == flags_v + 1

        # the events table moves past the last committed batch: one run, for those versions
        ml.write_events(spark, lake, ml.events(100, 10, seed=2))  # events v1
        (req,) = _runs(_tick(instance, bc.cursor))
        assert req.run_key == run_key_for(watched_versions())
        assert json.loads(req.tags["lakecast/versions"])[EVENTS] == 1

        # a crash left batch 1 planned but not committed: a run redoes it, even without
        # new versions since (a cursor-less tick, as after a restart of the daemon)
        _commit_batch(spark, lake, 1, 0, 1, commit=False)
        assert len(_runs(_tick(instance, None))) == 1
        # ... and with the cursor unchanged (the run was killed, nothing committed since):
        # one redo run for that batch, its own run key, the cursor kept; none while a run
        # of the job is active
        versions = watched_versions()
        (redo,) = _runs(unchanged := _tick(instance, json.dumps(versions)))
        assert redo.run_key == f"{run_key_for(versions)}-redo-1" and unchanged.cursor is None
        assert json.loads(redo.tags["lakecast/versions"]) == versions
        run = DagsterRun(job_name=enrichment_microbatch.name, status=DagsterRunStatus.STARTED)
        instance.add_run(run)
        assert "no new Delta versions" in ml.skip_message(_tick(instance, json.dumps(versions)))
        instance.delete_run(run.run_id)
        _log(spark, lake).write_commit(BatchCommit(1, {"events_in": 1}))
        assert not _runs(_tick(instance, None))
        assert not _runs(_tick(instance, json.dumps(versions)))


@pytest.mark.parametrize(
    "cursor",
    [
        pytest.param(lambda v: {k: x for k, x in v.items() if k != "feature_flags"}, id="missing"),
        pytest.param(lambda v: {**v, "old_table": 3}, id="extra-key"),  # issue 21.8
        pytest.param(lambda v: {k: str(x) for k, x in v.items()}, id="string-versions"),
        pytest.param(lambda v: [v[EVENTS]], id="older-list-format"),
        pytest.param(lambda v: "not json {", id="garbage"),
    ],
)
def test_any_cursor_recovers_from_the_progress_log(spark, lake, cursor):
    ml.build(spark, lake)
    ml.write_events(spark, lake, ml.events(0, 10, seed=1))  # events v0
    _commit_batch(spark, lake, 0, -1, 0)
    ml.write_events(spark, lake, ml.events(100, 10, seed=2))  # events v1: work
    versions = watched_versions()
    bad = cursor(versions)
    bad = bad if isinstance(bad, str) else json.dumps(bad)
    with DagsterInstance.ephemeral() as instance:
        result = _tick(instance, bad)
        (req,) = _runs(result)  # never "no change" forever: the run is requested
        assert req.run_key == run_key_for(versions)
        assert json.loads(result.cursor) == versions  # and the cursor is valid again
        assert "no new Delta versions" in ml.skip_message(_tick(instance, result.cursor))

        # the same bad cursor when the progress log says everything is done: no run
        _commit_batch(spark, lake, 1, 0, 1)
        idle = _tick(instance, bad)
        assert not _runs(idle) and json.loads(idle.cursor) == versions


def test_parse_cursor_accepts_only_this_sensors_versions():
    tables = watched_tables()
    good = {t: i for i, t in enumerate(tables)}
    assert parse_cursor(json.dumps(good), tables) == good
    assert parse_cursor(json.dumps({**good, EVENTS: None}), tables) == {**good, EVENTS: None}
    for bad in (None, "", "[]", "null", "{", json.dumps({**good, "x": 1}),
                json.dumps({**good, EVENTS: True}), json.dumps({**good, EVENTS: 1.5})):
        assert parse_cursor(bad, tables) is None, bad


# --------------------------------------------------------------------------- the daemon


def _daemon_tick(ctx) -> None:
    """One iteration of Dagster's sensor daemon, synchronously."""
    import logging

    from dagster._daemon.sensor import execute_sensor_iteration

    list(execute_sensor_iteration(ctx, logging.getLogger("sensor-test"), None, None))


def _set_cursor(instance, remote_sensor, cursor: str | None) -> None:
    """Set the stored cursor as the UI's "set cursor" does, and move the last tick back by
    the sensor's interval (as if that interval had passed) so the next iteration ticks."""
    state = instance.get_instigator_state(remote_sensor.get_remote_origin_id(),
                                          remote_sensor.selector_id)  # fmt: skip
    data = state.instigator_data
    back = get_settings().sensor_interval_seconds + 1
    instance.update_instigator_state(state.with_data(data._replace(
        cursor=cursor,
        last_tick_timestamp=(data.last_tick_timestamp or 0) - back,
        last_tick_start_timestamp=(data.last_tick_start_timestamp or 0) - back,
    )))  # fmt: skip


def test_dagster_deduplicates_a_run_key_across_ticks(spark, lake):
    from dagster import instance_for_test
    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.test_utils import create_test_daemon_workspace_context, load_remote_repo
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget

    from tests import ROOT as PROJECT_ROOT

    ml.build(spark, lake)
    ml.write_events(spark, lake, ml.events(0, 10, seed=1))
    queued = {"run_coordinator": {"module": "dagster._core.run_coordinator",
                                  "class": "QueuedRunCoordinator"}}  # runs queue, none launch
    target = InProcessWorkspaceLoadTarget(InProcessCodeLocationOrigin(LoadableTargetOrigin(
        module_name="jobs.definitions", attribute="defs",
        working_directory=str(PROJECT_ROOT))))  # fmt: skip
    with (
        instance_for_test(overrides=queued) as instance,
        create_test_daemon_workspace_context(target, instance) as ctx,
    ):
        remote = load_remote_repo(ctx, "__repository__").get_sensor(broadcast_versions_sensor.name)
        _daemon_tick(ctx)
        (run,) = instance.get_runs()
        key = run_key_for(watched_versions())
        assert run.tags["dagster/run_key"] == key and run.status == DagsterRunStatus.QUEUED
        # the daemon stored the tick's observation of events: data version = its Delta version
        record = instance.get_latest_data_version_record(AssetKey(EVENTS), is_source=True)
        assert record.asset_observation.data_version == "0"

        # the run fails (nothing committed) and the cursor is lost: the sensor requests the
        # same versions again, and Dagster refuses a second run with that run_key
        instance.report_run_failed(run)
        _set_cursor(instance, remote, None)
        _daemon_tick(ctx)
        assert [r.run_id for r in instance.get_runs()] == [run.run_id]
        tick = instance.get_ticks(remote.get_remote_origin_id(), remote.selector_id, limit=1)[0]
        assert tick.run_keys == [key] and tick.run_ids == []

        # new events: a new key, a second run
        ml.write_events(spark, lake, ml.events(100, 10, seed=2))
        _set_cursor(instance, remote, tick.cursor)
        _daemon_tick(ctx)
        runs = instance.get_runs()
        assert len(runs) == 2 and runs[0].tags["dagster/run_key"] == run_key_for(watched_versions())
