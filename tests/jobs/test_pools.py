"""One writer per Delta table, whatever launched the run: two runs materializing
``user_segments`` — both launched the way the UI does (GraphQL ``launchRun`` of
``__ASSET_JOB``, which carries no ``lakecast/exclusive`` tag) — are dequeued by the
run-queue daemon; the pool ``lakecast_delta_user_segments`` (limit 1, deploy's
dagster.yaml) makes the second wait: its step never runs beside the first's."""

from __future__ import annotations

import time

from dagster import AssetSelection, DagsterEventType, DagsterInstance, DagsterRunStatus
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
    QueuedRunCoordinatorDaemon,
)
from dagster_graphql.test.utils import execute_dagster_graphql, infer_repository_selector

from assets.common import table_pool
from assets.tables import USER_SEGMENTS
from jobs.backfill import WORKSPACE
from jobs.definitions import defs
from lakecast.delta import io as delta_io
from tests.assets.conftest import DIMS, SMALL, run_assets

LAUNCH_RUN = """
mutation LaunchRun($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId status } }
    ... on PythonError { message stack }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""
DONE = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}


def _launch_asset_job(context: WorkspaceProcessContext, day: str) -> str:
    request = context.create_request_context()
    selector = {**infer_repository_selector(request), "pipelineName": "__ASSET_JOB",
                "assetSelection": [{"path": [USER_SEGMENTS]}]}  # fmt: skip
    tags = [{"key": "dagster/partition", "value": day}]
    params = {"selector": selector, "mode": "default", "executionMetadata": {"tags": tags}}
    result = execute_dagster_graphql(request, LAUNCH_RUN, {"params": params})
    out = result.data["launchRun"]
    assert out["__typename"] == "LaunchRunSuccess", out
    return out["run"]["runId"]


def _step_window(instance: DagsterInstance, run_id: str) -> tuple[float, float]:
    """(start, end) of the run's user_segments step."""
    records = instance.all_logs(
        run_id, of_type={DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS}
    )
    steps = [r for r in records if r.step_key == USER_SEGMENTS]
    start = min(r.timestamp for r in steps if r.dagster_event_type == DagsterEventType.STEP_START)
    end = max(r.timestamp for r in steps if r.dagster_event_type == DagsterEventType.STEP_SUCCESS)
    return start, end


def test_two_ui_launches_of_user_segments_never_write_at_once(
    spark, lake, server_url, monkeypatch
):
    from assets import datagen

    datagen.generate(spark, lake, SMALL)
    run_assets(DIMS)
    day = SMALL.day_keys[0]
    run_assets(AssetSelection.assets("user_features"), partition_key=day)
    assert defs.resolve_assets_def(USER_SEGMENTS).op.pool == table_pool(USER_SEGMENTS)
    with DagsterInstance.get() as instance:  # temp DAGSTER_HOME with deploy's dagster.yaml
        assert instance.get_concurrency_config().pool_config.default_pool_limit == 1
        # the code server and the runs it launches (subprocesses of this process) attach to
        # the test run's Spark server, as under `make ui`; this process runs no Spark now
        monkeypatch.setenv("LAKECAST_SPARK_REMOTE", server_url)
        target = WorkspaceFileTarget(paths=[str(WORKSPACE)])
        with WorkspaceProcessContext(instance, target) as context:
            first, second = _launch_asset_job(context, day), _launch_asset_job(context, day)
            for run_id in (first, second):
                run = instance.get_run_by_id(run_id)
                assert run.status == DagsterRunStatus.QUEUED
                assert "lakecast/exclusive" not in run.tags  # the UI path sets no run tag
            daemon = QueuedRunCoordinatorDaemon(interval_seconds=1)
            deadline = time.monotonic() + 420
            while time.monotonic() < deadline:
                list(daemon.run_iteration(context))
                runs = [instance.get_run_by_id(r) for r in (first, second)]
                if all(r.status in DONE for r in runs):
                    break
                time.sleep(1)
            assert [r.status for r in runs] == [DagsterRunStatus.SUCCESS] * 2, [
                (r.run_id, r.status) for r in runs
            ]
            (a_start, a_end, _), (b_start, _, b_id) = sorted(
                (*_step_window(instance, r), r) for r in (first, second)
            )
            assert a_end <= b_start, f"user_segments steps overlapped: {a_start, a_end, b_start}"
            # the run-queue daemon launched both at once (the UI path has no run tag that
            # would queue the second): the later run's step waited for the pool's one slot
            pool = table_pool(USER_SEGMENTS)
            messages = [(e.dagster_event.message if e.dagster_event else e.user_message) or ""
                        for e in instance.all_logs(b_id)]  # fmt: skip
            blocked = [m for m in messages if f"blocked by limit for pool {pool}" in m]
            print(f"\nsecond run: {len(blocked)} messages 'blocked by limit for pool {pool}'")
            assert blocked, "the later run's step never waited for the pool"
    assert delta_io.latest_version(lake.table_path(USER_SEGMENTS)) == 0, "one write, one no-op"
