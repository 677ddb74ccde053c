"""``python -m jobs.backfill --from D1 --to D2``: a backfill of the segment assets, the UI's way.

``dagster job backfill -j daily_segment_refresh_job`` launches one run per partition
itself and marks the backfill completed at once, while the job's assets declare
``BackfillPolicy.single_run()``: the UI then reads the backfill as ranged and its page
fails (``KeyError: 'dagster/asset_partition_range_start'`` in dagster_graphql). This
command submits an *asset* backfill through Dagster's GraphQL ``launchPartitionBackfill``
mutation — what the UI's "Materialize" dialog sends — against the workspace in
``workspace.yaml``: the daemon then launches ranged runs (one run for the range, with the
range tags), and the backfill's status follows them. Needs ``dagster-daemon`` (``make ui``
/ ``dagster dev`` run it) to make progress.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, PartitionKeyRange

from assets.features import DAILY_PARTITIONS
from assets.tables import USER_FEATURES, USER_SEGMENTS
from jobs.instance import ensure_instance
from lakecast.config import get_settings
from lakecast.errors import LakecastError

#: this example project's folder (its workspace.yaml)
PROJECT_ROOT = Path(__file__).resolve().parents[1]

SEGMENT_ASSETS = (USER_FEATURES, USER_SEGMENTS)
WORKSPACE = PROJECT_ROOT / "workspace.yaml"

LAUNCH_BACKFILL = """
mutation LaunchBackfill($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack }
    ... on PartitionKeysNotFoundError { message }
    ... on UnauthorizedError { message }
    ... on InvalidSubsetError { message }
    ... on InvalidStepError { invalidStepKey }
    ... on InvalidOutputError { invalidOutputName }
  }
}
"""


def partition_keys(first: str, last: str) -> list[str]:
    """The daily partition keys ``first``..``last`` (inclusive), checked against the asset."""
    try:
        keys = DAILY_PARTITIONS.get_partition_keys_in_range(PartitionKeyRange(first, last))
    except Exception as e:
        raise LakecastError(
            f"backfill range {first}..{last}: not daily partitions of {USER_SEGMENTS} "
            f"(from {DAILY_PARTITIONS.start.date().isoformat()}, yyyy-mm-dd, first <= last): {e}"
        ) from e
    if not keys:
        raise LakecastError(f"backfill range {first}..{last} holds no partition (first > last?)")
    return list(keys)


def launch_backfill(
    instance: DagsterInstance,
    first: str,
    last: str,
    assets: Sequence[str] = SEGMENT_ASSETS,
    workspace: Path = WORKSPACE,
) -> str:
    """Submit an asset backfill of ``assets`` over ``first``..``last``; returns its id."""
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget
    from dagster_graphql.cli import execute_query

    params: dict[str, Any] = {
        "partitionNames": partition_keys(first, last),
        "assetSelection": [{"path": [a]} for a in assets],
        "title": f"{', '.join(assets)} {first}..{last}",
    }
    target = WorkspaceFileTarget(paths=[str(workspace)])
    with WorkspaceProcessContext(instance, target) as context:
        result = execute_query(context, LAUNCH_BACKFILL, {"params": params})
    if result.get("errors"):
        raise LakecastError(f"launchPartitionBackfill failed: {result['errors']}")
    out = result["data"]["launchPartitionBackfill"]
    if out["__typename"] != "LaunchBackfillSuccess":
        raise LakecastError(f"launchPartitionBackfill for {first}..{last}: {out}")
    return str(out["backfillId"])


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m jobs.backfill", description="Backfill user_features and user_segments."
    )
    parser.add_argument("--from", dest="first", required=True, help="first day, yyyy-mm-dd")
    parser.add_argument("--to", dest="last", required=True, help="last day, yyyy-mm-dd (inclusive)")
    args = parser.parse_args(argv)
    settings = get_settings()
    ensure_instance(settings)  # DAGSTER_HOME and its dagster.yaml (deploy/dagster)
    os.environ["DAGSTER_HOME"] = settings.dagster_home
    with DagsterInstance.get() as instance:
        backfill_id = launch_backfill(instance, args.first, args.last)
    print(f"backfill {backfill_id}: {', '.join(SEGMENT_ASSETS)} {args.first}..{args.last} "
          "(the daemon launches its runs; see Runs > Backfills in the UI)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
