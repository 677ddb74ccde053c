"""Backfills of the segment assets from the command line open in the UI: the backfill
page's GraphQL query (the UI's BackfillDetailsQuery fields) returns no error, before and
after the daemon submitted its runs, for a one-day and a seven-day range."""

from __future__ import annotations

import logging

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    BACKFILL_ID_TAG,
)
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget
from dagster._daemon.backfill import execute_backfill_iteration
from dagster_graphql.test.utils import execute_dagster_graphql

from jobs.backfill import SEGMENT_ASSETS, WORKSPACE, launch_backfill, main
from lakecast.errors import LakecastError

BACKFILL_PAGE = """
query BackfillDetailsQuery($backfillId: String!) {
  partitionBackfillOrError(backfillId: $backfillId) {
    __typename
    ... on PythonError { message stack }
    ... on BackfillNotFoundError { message }
    ... on PartitionBackfill {
      id status timestamp endTimestamp numPartitions isAssetBackfill
      assetSelection { path }
      partitionSetName partitionNames
      error { message }
      hasCancelPermission hasResumePermission
      cancelableRuns { id runId status }
      runs { runId status tags { key value } }
      assetBackfillData {
        rootTargetedPartitions { partitionKeys ranges { start end } }
        assetBackfillStatuses {
          ... on AssetPartitionsStatusCounts {
            assetKey { path } numPartitionsTargeted numPartitionsInProgress
            numPartitionsMaterialized numPartitionsFailed
          }
        }
      }
      partitionStatuses { results { id partitionName runId runStatus } }
    }
  }
}
"""

RANGES = [("2026-01-03", "2026-01-03"), ("2026-01-01", "2026-01-07")]


def _page(context: WorkspaceProcessContext, backfill_id: str) -> dict:
    result = execute_dagster_graphql(
        context.create_request_context(), BACKFILL_PAGE, {"backfillId": backfill_id}
    )
    assert not result.errors, result.errors
    page = result.data["partitionBackfillOrError"]
    assert page["__typename"] == "PartitionBackfill", page
    return page


@pytest.mark.parametrize(("first", "last"), RANGES)
def test_cli_backfill_page_loads_and_follows_its_runs(lake, first, last):
    n_days = int(last[-2:]) - int(first[-2:]) + 1
    with DagsterInstance.get() as instance:  # the temp DAGSTER_HOME, with deploy's dagster.yaml
        assert main(["--from", first, "--to", last]) == 0
        backfills = instance.get_backfills()
        assert len(backfills) == 1
        backfill_id = backfills[0].backfill_id
        target = WorkspaceFileTarget(paths=[str(WORKSPACE)])
        with WorkspaceProcessContext(instance, target) as context:
            page = _page(context, backfill_id)
            assert page["isAssetBackfill"] and page["status"] == "REQUESTED"
            assert page["numPartitions"] == n_days
            assert sorted(p["path"][0] for p in page["assetSelection"]) == sorted(SEGMENT_ASSETS)
            assert page["runs"] == []

            # one daemon iteration: the single-run policy gives ONE run for the root asset's
            # range, with the range tags the UI reads; it waits in the queue (no run daemon)
            list(execute_backfill_iteration(context, logging.getLogger("test-backfill")))
            runs = instance.get_runs(RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}))
            assert len(runs) == 1
            assert runs[0].tags[ASSET_PARTITION_RANGE_START_TAG] == first
            assert runs[0].tags[ASSET_PARTITION_RANGE_END_TAG] == last
            assert runs[0].status == DagsterRunStatus.QUEUED
            page = _page(context, backfill_id)
            assert page["status"] == "REQUESTED", "not completed while its run waits"
            assert [r["runId"] for r in page["runs"]] == [runs[0].run_id]
            statuses = {tuple(s["assetKey"]["path"]): s
                        for s in page["assetBackfillData"]["assetBackfillStatuses"]}  # fmt: skip
            assert statuses[("user_features",)]["numPartitionsTargeted"] == n_days
            assert statuses[("user_features",)]["numPartitionsInProgress"] == n_days
            assert statuses[("user_segments",)]["numPartitionsMaterialized"] == 0


def test_bad_range_names_the_asset_and_the_fix(lake):
    with DagsterInstance.get() as instance, pytest.raises(LakecastError, match="user_segments"):
        launch_backfill(instance, "2026-01-07", "01/01/2026")
