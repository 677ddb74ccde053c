"""Definitions, the daily schedule, and a 3-day backfill through the Dagster CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from dagster import (
    AssetKey,
    BackfillPolicy,
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    Definitions,
    EventRecordsFilter,
    build_schedule_context,
)
from lakecast import delta_io
from lakecast.config import PROJECT_ROOT
from lakecast.tables import QUARANTINE, USER_SEGMENTS

from jobs.definitions import defs
from tests.assets.conftest import DIMS, SMALL, run_assets


def test_definitions_load_with_batch_assets_checks_job_and_schedule():
    Definitions.validate_loadable(defs)
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"raw_users", "raw_products", "events", "dim_users", "dim_products",
            "user_segments"} <= keys  # fmt: skip
    segments = defs.resolve_assets_def(USER_SEGMENTS)
    assert segments.backfill_policy == BackfillPolicy.single_run()
    assert segments.partitions_def.start.date().isoformat() == SMALL.day_keys[0]
    check_names = {k.name for k in defs.resolve_asset_graph().asset_check_keys}
    assert {"unique_non_null_keys", "segment_domain", "counts_reconcile"} <= check_names
    assert defs.resolve_job_def("daily_segment_refresh_job").partitions_def is not None


def test_schedule_requests_the_day_that_just_ended(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    schedule = defs.resolve_schedule_def("daily_segment_refresh")
    assert schedule.job_name == "daily_segment_refresh_job"
    assert schedule.cron_schedule == "0 1 * * *"
    with DagsterInstance.get() as instance:
        context = build_schedule_context(
            instance=instance, scheduled_execution_time=datetime(2026, 1, 4, 1, 0, tzinfo=UTC)
        )
        data = schedule.evaluate_tick(context)
    assert [r.partition_key for r in data.run_requests] == ["2026-01-03"]


@pytest.mark.slow
def test_cli_backfill_of_three_days_is_one_run(spark, small_lake):
    lake = small_lake
    run_assets(DIMS)  # dimensions in-process; segments through the CLI
    first, last = SMALL.day_keys[0], SMALL.day_keys[-1]
    dagster = Path(sys.executable).parent / "dagster"
    cmd = [
        str(dagster), "asset", "materialize", "-m", "jobs.definitions",
        "--select", USER_SEGMENTS, "--partition-range", f"{first}...{last}",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=PROJECT_ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    with DagsterInstance.get() as instance:  # DAGSTER_HOME is the temp lake's
        runs = instance.get_runs()
        assert len(runs) == 1 and runs[0].status == DagsterRunStatus.SUCCESS
        records = instance.get_event_records(
            EventRecordsFilter(DagsterEventType.ASSET_MATERIALIZATION, AssetKey(USER_SEGMENTS))
        )
        assert sorted(r.partition_key for r in records) == SMALL.day_keys
        assert {r.run_id for r in records} == {runs[0].run_id}
        checks = instance.event_log_storage.get_latest_asset_check_execution_by_key(
            list(defs.resolve_asset_graph().asset_check_keys)
        )
        segment_checks = {
            k.name: v for k, v in checks.items() if k.asset_key == AssetKey(USER_SEGMENTS)
        }
        assert len(segment_checks) == 3
        assert all(v.run_id == runs[0].run_id for v in segment_checks.values())

    table = delta_io.read(spark, lake.table_path(USER_SEGMENTS)).toPandas()
    assert len(table) > 0 and table["user_id"].is_unique
    assert str(table["updated_day"].max()) == last
    # the subprocess wrote one version per day, in order: create, then MERGEs
    history = delta_io.history(spark, lake.table_path(USER_SEGMENTS))
    ops = [h["operation"] for h in reversed(history)]
    assert len(ops) == 3 and ops[1:] == ["MERGE", "MERGE"]
    quarantine = delta_io.read(spark, lake.table_path(QUARANTINE)).toPandas()
    assert set(quarantine.loc[quarantine["asset"] == USER_SEGMENTS, "partition_key"]) == set(
        SMALL.day_keys
    )
