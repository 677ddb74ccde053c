"""Every micro-batch pipeline is visible through Dagster's GraphQL API (issue 17): its job,
the sensor that targets it, its output assets with their lineage to the events and
broadcast tables, and the asset checks of its main output.

The workspace is the real ``jobs/definitions.py`` (``workspace.yaml``'s target) loaded
in-process (no code server), queried with ``execute_dagster_graphql`` as the UI queries
its webserver. What GraphQL returns is compared with what is computed from the
``Definitions`` object directly (asset graph, jobs, sensors); the pipelines are named, not
how they are built (hand-wired or through the factory).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from dagster import AssetKey

#: job, its sensor, its main output and the events and broadcast tables it must depend on
PIPELINES = [
    ("enrichment_microbatch", "broadcast_versions_sensor", "enriched_events",
     {"events", "dim_products", "user_segments"}),
    ("fraud_microbatch", "fraud_sensor", "fraud_alerts", {"transactions", "fraud_rules"}),
    ("scoring_microbatch", "scoring_sensor", "predictions", {"scoring_events", "models"}),
]  # fmt: skip

QUERY = """
query {
  repositoriesOrError { ... on RepositoryConnection { nodes {
    name
    jobs { name }
    sensors { name targets { pipelineName } }
    assetNodes { assetKey { path } dependencyKeys { path } jobNames
                 assetChecksOrError { ... on AssetChecks { checks { name } } } }
  } } }
}
"""


@pytest.fixture(scope="module")
def repo() -> Iterator[dict[str, Any]]:
    """The repository of ``jobs.definitions:defs`` as GraphQL returns it."""
    from dagster import instance_for_test
    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
    from dagster_graphql.test.utils import execute_dagster_graphql

    from tests import ROOT as PROJECT_ROOT

    target = InProcessWorkspaceLoadTarget(InProcessCodeLocationOrigin(LoadableTargetOrigin(
        module_name="jobs.definitions", attribute="defs",
        working_directory=str(PROJECT_ROOT))))  # fmt: skip
    with instance_for_test() as instance, WorkspaceProcessContext(instance, target) as context:
        result = execute_dagster_graphql(context.create_request_context(), QUERY)
    assert not result.errors, result.errors
    (node,) = result.data["repositoriesOrError"]["nodes"]
    yield node


def _key(path: dict[str, list[str]]) -> str:
    return "/".join(path["path"])


@pytest.mark.parametrize(("job", "sensor", "main", "inputs"), PIPELINES,
                         ids=[p[0] for p in PIPELINES])  # fmt: skip
def test_graphql_shows_the_pipelines_job_sensor_assets_and_checks(
    repo: dict[str, Any], job: str, sensor: str, main: str, inputs: set[str]
) -> None:
    from jobs.definitions import defs

    graph = defs.resolve_asset_graph()
    selected = defs.resolve_job_def(job).asset_layer.selected_asset_keys
    outputs = {k.to_user_string() for k in selected}
    assert main in outputs, outputs
    deps = {o: {p.to_user_string() for p in graph.get(AssetKey(o)).parent_keys} for o in outputs}
    assert inputs <= deps[main], deps[main]  # lineage to the events and broadcast tables
    checks = {k.name for k in graph.asset_check_keys if k.asset_key == AssetKey(main)}
    assert "broadcast_versions_accepted" in checks, checks

    # the job, and the sensor that targets it
    assert job in {j["name"] for j in repo["jobs"]}
    sensors = {s["name"]: [t["pipelineName"] for t in s["targets"]] for s in repo["sensors"]}
    assert sensors.get(sensor) == [job], sensors
    # the output assets: each with the job, and the same dependencies as the definitions
    nodes = {_key(n["assetKey"]): n for n in repo["assetNodes"]}
    assert outputs <= set(nodes), sorted(outputs - set(nodes))
    for out in outputs:
        assert job in nodes[out]["jobNames"], (out, nodes[out]["jobNames"])
        got = {_key(k) for k in nodes[out]["dependencyKeys"]}
        assert got == deps[out], (out, got, deps[out])
        assert got <= set(nodes), f"{out}: a dependency is not an asset of the repository"
    # the main output's asset checks
    listed = {c["name"] for c in nodes[main]["assetChecksOrError"]["checks"]}
    assert listed == checks, (main, listed, checks)
