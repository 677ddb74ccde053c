"""The Definitions object loads, in-process and through the CLI from the repo root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dagster import Definitions

from lakecast.config import PROJECT_ROOT


def test_defs_validate_loadable():
    from jobs.definitions import defs

    Definitions.validate_loadable(defs)
    assert {"pyspark", "lake"} <= set(defs.resources)


def test_workspace_yaml_loads_defs_from_repo_root(tmp_path):
    dagster = Path(sys.executable).parent / "dagster"
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    proc = subprocess.run(
        [str(dagster), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Validation successful for code location jobs.definitions" in proc.stderr + proc.stdout


def test_instance_config_allows_one_run_per_exclusive_tag(tmp_path, monkeypatch):
    import shutil

    from dagster import DagsterInstance

    from jobs.microbatch import EXCLUSIVE_TAG, enrichment_microbatch

    shutil.copy(PROJECT_ROOT / "deploy" / "dagster" / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with DagsterInstance.get() as instance:
        limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
    assert {"key": EXCLUSIVE_TAG, "value": {"applyLimitPerUniqueValue": True}, "limit": 1} in limits
    assert enrichment_microbatch.tags[EXCLUSIVE_TAG] == "enrichment_microbatch"
