"""The resolved pipeline handle: made once from a declaration and a translator, it holds
every table's role and key and the Dagster names, and locates every path of one lake.
No Spark."""

from __future__ import annotations

import dagster as dg

from dagster_lakecast import (
    DagsterLakecastTranslator,
    DagsterNames,
    PipelineDeclaration,
    PipelineHandle,
    declare_pipeline,
)
from lakecast.config import Settings
from tests.newuser.project.fx import ToEur

FX = PipelineDeclaration(
    name="fx", function=ToEur, events_table="payments", broadcast_tables=("fx_rates",),
    output_table="payments_eur", side_outputs={"unmatched": "payments_unmatched"},
    dagster=DagsterNames(asset_keys={"payments": "raw/payments"}, writer_jobs=("loader",),
                         maintenance_job="lake_maintenance_job"))


class Prefixed(DagsterLakecastTranslator):
    def get_asset_key(self, decl: PipelineDeclaration, table: str, role: str) -> dg.AssetKey:
        return super().get_asset_key(decl, table, role).with_prefix("team")


def test_it_resolves_keys_and_names_once() -> None:
    pipe = PipelineHandle.resolve(FX, Prefixed())
    assert PipelineHandle.resolve(pipe) is pipe  # a handle is not resolved again
    assert pipe.asset_key("payments") == dg.AssetKey(["team", "raw", "payments"])
    assert pipe.asset_key("payments_eur") == dg.AssetKey(["team", "payments_eur"])
    assert pipe.roles == {"payments": "events", "fx_rates": "broadcast",
                          "payments_eur": "main", "payments_unmatched": "side",
                          "fx_progress": "progress", "fx_snapshots": "snapshots"}
    assert pipe.inputs == ("payments", "fx_rates")
    assert (pipe.job_name, pipe.sensor_name, pipe.maintenance_job_name) == (
        "fx_microbatch", "fx_sensor", "lake_maintenance_job")
    assert pipe.writers == ("fx_microbatch", "fx_continuous", "loader", "lake_maintenance_job")
    # the factory passes that handle to every definition: the job's outputs carry its keys
    made = declare_pipeline(FX, Prefixed())
    assert made.handle == pipe
    assert set(made.assets.keys) == {dg.AssetKey(["team", "payments_eur"]),
                                     dg.AssetKey(["team", "payments_unmatched"])}
    deps = {d for s in made.assets.specs for d in (x.asset_key for x in s.deps)}
    assert dg.AssetKey(["team", "raw", "payments"]) in deps


def test_it_locates_every_path_of_a_lake(lake: Settings) -> None:
    where = PipelineHandle.resolve(FX).locate(lake)
    assert where.table("payments") == f"{lake.lake_root}/payments"
    assert where.table("payments_unmatched") == f"{lake.lake_root}/payments_unmatched"
    assert where.progress == f"{lake.checkpoint_root}/fx/progress"
    assert where.snapshots == f"{lake.checkpoint_root}/fx/snapshots"
    assert where.table("fx_progress") == where.progress  # the internal tables' assets
    assert lake.pipeline_paths("fx") == where.paths
