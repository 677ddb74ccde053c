"""The batch demo runs the named jobs of ``defs`` (not ``__ephemeral_asset_job__``)."""

from __future__ import annotations

from dagster import DagsterInstance

from jobs import demo
from lakecast.tables import USER_SEGMENTS
from tests.assets.conftest import SMALL


def test_demo_materializes_through_named_jobs(spark, lake):
    from lakecast.delta import io as delta_io
    from lakecast.tools import datagen

    datagen.generate(spark, lake, SMALL)
    with DagsterInstance.ephemeral() as instance:
        dims = demo.materialize_dimensions(instance)
        segs = demo.materialize_segments(instance, SMALL.day_keys[0], SMALL.day_keys[-1])
        assert dims.success and segs.success
        runs = {r.run_id: r for r in instance.get_runs()}
        assert runs[dims.run_id].job_name == "dimension_refresh_job"
        assert runs[segs.run_id].job_name == "daily_segment_refresh_job"
        assert {r.job_name for r in runs.values()} == {"dimension_refresh_job",
                                                       "daily_segment_refresh_job"}  # fmt: skip
        mats = dims.get_asset_materialization_events()
        assert {m.asset_key.to_user_string() for m in mats} == {
            "raw_users", "raw_products", "dim_users", "dim_products"}  # fmt: skip
        seg = segs.get_asset_materialization_events()  # one per asset and day of the range
        for asset in ("user_features", USER_SEGMENTS):
            days = [m.partition for m in seg if m.asset_key.to_user_string() == asset]
            assert sorted(days) == SMALL.day_keys, asset
        # every check of the selected assets ran in the named jobs, and passed
        assert dims.get_asset_check_evaluations() and segs.get_asset_check_evaluations()
    assert delta_io.latest_version(lake.table_path(USER_SEGMENTS)) is not None


def test_fraud_tour_runs_the_factory_job_over_two_rules_versions(spark, lake):
    """The demo's fraud section: a run per rules version, BLOCK alerts only while the demo's
    BLOCK rule is enabled; every line's figures are the outputs' rows of that batch."""
    import json

    from jobs.demo_pipelines import DISABLED_RULE, fraud_tour, reset_pipeline
    from jobs.fraud import FRAUD, FRAUD_ALERTS, FRAUD_REVIEW, FRAUD_RULES
    from lakecast.delta import io as delta_io

    assert reset_pipeline(lake, FRAUD) == []  # a fresh lake: nothing to remove
    with DagsterInstance.ephemeral() as instance:
        lines = fraud_tour(instance)
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"{FRAUD_RULES} v0 (all enabled): 200 transactions")
    assert lines[1].startswith(f"{FRAUD_RULES} v1 ({DISABLED_RULE} disabled): 200 transactions")
    counts = {}
    for table in (FRAUD_ALERTS, FRAUD_REVIEW):
        frame = delta_io.read(spark, lake.table_path(table)).toPandas()
        versions = frame["_state_version"].map(lambda s: json.loads(s)[FRAUD_RULES])
        counts[table] = versions.value_counts().to_dict()
    blocks = counts[FRAUD_ALERTS]
    assert blocks.get(0, 0) > 0 and blocks.get(1, 0) == 0, blocks
    for v, line in enumerate(lines):
        reviews = counts[FRAUD_REVIEW].get(v, 0)
        assert f"-> {blocks.get(v, 0)} BLOCK alerts, {reviews} REVIEW alerts" in line, line
    assert sorted(reset_pipeline(lake, FRAUD)) == sorted(
        [FRAUD.events_table, *FRAUD.broadcast_tables, *(t for t, _ in FRAUD.outputs),
         FRAUD.state_table])  # fmt: skip
