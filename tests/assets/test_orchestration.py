"""Definitions and the daily schedule (the CLI backfill is in test_batch_assets)."""

from __future__ import annotations

from datetime import UTC, datetime

from dagster import (
    BackfillPolicy,
    DagsterInstance,
    Definitions,
    build_schedule_context,
)

from jobs.definitions import defs
from lakecast.tables import USER_SEGMENTS
from tests.assets.conftest import SMALL


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
