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
