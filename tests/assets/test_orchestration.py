"""Definitions and the daily schedule (the CLI backfill is in test_batch_assets)."""

from __future__ import annotations

from datetime import UTC, datetime

from dagster import (
    BackfillPolicy,
    DagsterInstance,
    Definitions,
    build_schedule_context,
)

from assets.tables import USER_SEGMENTS
from jobs.definitions import defs
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


def test_events_is_an_observable_source_at_its_delta_version(spark, lake):
    """Observing ``events`` (what the UI's "Observe" runs) records its Delta version as the
    data version; lineage goes from it to the micro-batch outputs."""
    from dagster import AssetKey, define_asset_job

    from assets.raw import NO_TABLE, events
    from dagster_lakecast.resources import LakeResource
    from tests.jobs import microbatch_lake as ml

    graph = defs.resolve_asset_graph()
    assert graph.get(AssetKey("events")).is_observable
    assert not graph.get(AssetKey("events")).is_materializable
    for output in ("enriched_events", "enrichment_unmatched", "enrichment_rejected"):
        assert AssetKey("events") in graph.get(AssetKey(output)).parent_keys

    job = Definitions(assets=[events], jobs=[define_asset_job("observe", [events.key])],
                      resources={"lake": LakeResource()}).resolve_job_def("observe")

    def observed(instance: DagsterInstance) -> tuple[str, dict]:
        assert job.execute_in_process(instance=instance).success
        record = instance.get_latest_data_version_record(AssetKey("events"), is_source=True)
        obs = record.asset_observation
        return obs.data_version, {k: v.value for k, v in obs.metadata.items()}

    with DagsterInstance.ephemeral() as instance:
        assert observed(instance)[0] == NO_TABLE
        frames = [ml.events(0, 10, seed=1), ml.events(100, 10, seed=2)]
        for frame in frames:
            ml.write_events(spark, lake, frame)
        version, meta = observed(instance)
        assert version == "1" and meta["delta_version"] == 1
        assert meta["dagster/row_count"] == sum(len(f) for f in frames) and meta["operation"]
