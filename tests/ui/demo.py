"""The smallest demo the browser test needs, and a ``dagster-webserver`` over it.

:func:`build` fills the test's lake and Dagster instance the way an operator's would be:
raw tables, dimensions, three days of segments (one ranged run), one micro-batch of
``enriched_events`` (with its checks), an observation of ``events`` and a backfill made
with the README's CLI (``python -m jobs.backfill``). :func:`webserver` serves it on a free
port of 127.0.0.1 and stops it (its whole process group) at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagster import AssetKey, DagsterInstance, materialize
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
)

from assets import BATCH_ASSETS, datagen, flags
from assets.raw import events_observation
from assets.tables import USER_SEGMENTS
from dagster_lakecast.resources import LakecastSparkResource, LakeResource
from jobs import backfill
from jobs.storefront.microbatch import ENRICHED_EVENTS, enrichment_microbatch_assets, state_budget
from lakecast.config import Settings
from tests import ROOT as PROJECT_ROOT
from tests.assets.conftest import DIMS, QUIET, SEGMENTS

#: ~100 users, ~10 products, ~3.5k event draws over 2026-01-01..02: the smallest demo
SPEC = datagen.GenSpec(scale=0.05, seed=11, days=2)

#: the code location of workspace.yaml, as the UI's URLs name it
REPO_PATH = "__repository__@jobs.definitions"
REPOSITORIES = "{ repositoriesOrError { ... on RepositoryConnection { nodes { name } } } }"


@dataclass(frozen=True)
class Demo:
    """What the pages must show."""

    backfill_id: str
    days: tuple[str, ...]
    segments_day: str  # the partition of the newest user_segments materialization
    segments: dict[str, Any]  # its metadata
    batch: dict[str, Any]  # the micro-batch's enriched_events metadata
    events_version: str


def _values(metadata: dict[str, Any]) -> dict[str, Any]:
    return {k: getattr(v, "value", v) for k, v in metadata.items()}


def build(spark: Any, lake: Settings) -> Demo:
    """Fill ``lake`` and its Dagster instance (``DAGSTER_HOME``): see the module doc. The
    batch assets run without their checks (other tests cover them): fewer Spark jobs."""
    datagen.generate(spark, lake, SPEC)
    resources = {"pyspark": LakecastSparkResource(), "lake": LakeResource()}
    with DagsterInstance.get() as instance:
        for selection, keys in ((DIMS, None), (SEGMENTS, (SPEC.day_keys[0], SPEC.day_keys[-1]))):
            tags = None if keys is None else {ASSET_PARTITION_RANGE_START_TAG: keys[0],
                                              ASSET_PARTITION_RANGE_END_TAG: keys[1]}
            assert materialize(BATCH_ASSETS, selection=selection, resources=resources,
                               instance=instance, tags=tags, run_config=QUIET).success
        newest = instance.get_latest_materialization_event(
            AssetKey(USER_SEGMENTS)).asset_materialization
        flags.set_flag(spark, lake.table_path("feature_flags"), "vip_discount", "10")
        batch = materialize([enrichment_microbatch_assets, state_budget], instance=instance,
                            resources=resources, run_config=QUIET)
        assert batch.success
        enriched = [e.materialization for e in batch.get_asset_materialization_events()
                    if e.asset_key.to_user_string() == ENRICHED_EVENTS]
        observation = events_observation(lake)  # as broadcast_versions_sensor records it
        instance.report_runless_asset_event(observation)
    assert backfill.main(["--from", SPEC.day_keys[0], "--to", SPEC.day_keys[-1]]) == 0
    with DagsterInstance.get() as instance:
        (made,) = instance.get_backfills()
    return Demo(made.backfill_id, tuple(SPEC.day_keys), newest.partition or "",
                _values(newest.metadata), _values(enriched[-1].metadata),
                str(observation.data_version))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _graphql(url: str, query: str) -> dict[str, Any]:
    request = urllib.request.Request(f"{url}/graphql", data=json.dumps(
        {"query": query}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


def _loaded(url: str) -> bool:
    """The webserver answers GraphQL with the code location's repository."""
    try:
        body = _graphql(url, REPOSITORIES)
    except OSError:
        return False
    nodes = (body.get("data") or {}).get("repositoriesOrError", {}).get("nodes") or []
    return bool(nodes)


@dataclass
class Webserver:
    """A started ``dagster-webserver``."""

    url: str
    proc: subprocess.Popen
    log: Path

    def wait_serving(self, timeout: float = 90.0) -> str:
        """Wait until it serves the code location; mark Dagster's "join the community"
        notice seen, as an operator dismisses it (a modal over every page otherwise); its
        URL."""
        deadline = time.monotonic() + timeout
        while not _loaded(self.url):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dagster-webserver did not serve: {self.log.read_text()}")
            time.sleep(0.5)
        _graphql(self.url, "mutation { setNuxSeen }")
        return self.url


@contextlib.contextmanager
def webserver(log: Path) -> Iterator[Webserver]:
    """``dagster-webserver`` for ``workspace.yaml`` on a free port of 127.0.0.1, started at
    once (it loads the code location while the caller builds the lake); stopped, with its
    whole process group, at the end."""
    from dagster import DagsterInstance

    # the instance's storage is created here, once: the webserver and the backfill CLI
    # creating the same SQLite schema at once race (alembic: "more than one head")
    with DagsterInstance.get():
        pass
    port = _free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dagster_webserver", "-h", "127.0.0.1", "-p", str(port),
             "-w", str(backfill.WORKSPACE)],
            cwd=PROJECT_ROOT, env=dict(os.environ), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    try:
        yield Webserver(f"http://127.0.0.1:{port}", proc, log)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):  # what is left of the group
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
