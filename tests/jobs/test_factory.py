"""The pipeline factory without Spark: what a declaration produces (broadcast and keyed),
the sensor's work decision, and the fraud rules contract on bad rules versions."""

from __future__ import annotations

import pyarrow as pa
import pytest
from dagster import AssetKey

from dagster_lakecast.declaration import PipelineDeclaration
from dagster_lakecast.factory import declare_pipeline, output_specs
from dagster_lakecast.handle import PipelineHandle
from dagster_lakecast.sensor import pending_work
from jobs.fraud.defs import FRAUD, RULES_CONTRACT, FraudRules
from lakecast.api.contracts import TableContract, check_version
from lakecast.api.enrich import Lookup, enrich
from lakecast.build import keyed_pipeline
from lakecast.pipeline.progress import BatchPlan


def storefront_lookup():
    return enrich(Lookup("dim_products", key="product_id", columns=["category"]))


BROADCAST = PipelineDeclaration(
    name="shop",
    function=storefront_lookup,
    events_table="clicks",
    broadcast_tables=("dim_products",),
    output_table="shop_enriched",
    side_outputs={"unmatched": "shop_unmatched"},
)

FRAUD_H = PipelineHandle.resolve(FRAUD)


def test_a_broadcast_declaration_gives_job_assets_sensor_and_checks():
    assert not BROADCAST.keyed and BROADCAST.state_table is None
    assert BROADCAST.spec().output_tables == ["shop_enriched", "shop_unmatched"]
    made = declare_pipeline(BROADCAST)
    assert (made.job.name, made.sensor.name) == ("shop_microbatch", "shop_sensor")
    assert made.sensor.job_name == "shop_microbatch"
    deps = {
        s.key.to_user_string(): {d.asset_key.to_user_string() for d in s.deps}
        for s in output_specs(BROADCAST)
    }
    assert deps == {
        "shop_enriched": {"clicks", "dim_products"},
        "shop_unmatched": {"clicks", "dim_products"},
    }
    assert set(made.assets.keys) == {AssetKey("shop_enriched"), AssetKey("shop_unmatched")}
    assert {c.name for checks in made.checks for c in checks.check_specs} == {
        "counts_reconcile",
        "broadcast_versions_accepted",
        "events_fresh",
        "output_sample_recomputed",
    }
    # the job runs every check of its outputs after a run but the on-request recomputation
    from dagster import Definitions

    from dagster_lakecast.resources import LakecastSparkResource, LakeResource

    job = Definitions(assets=[made.assets], asset_checks=made.checks, jobs=[made.job],
                      resources={"pyspark": LakecastSparkResource(), "lake": LakeResource()},
                      ).resolve_job_def("shop_microbatch")
    assert {k.name for k in job.asset_layer.asset_graph.asset_check_keys} == {
        "counts_reconcile", "broadcast_versions_accepted", "events_fresh"}


def test_the_fraud_declaration_is_keyed_with_a_state_table():
    assert FRAUD.keyed and FRAUD.state_table == "fraud_keyed_state"
    spec = FRAUD.spec()
    assert spec.output_tables == ["fraud_alerts", "fraud_review", "fraud_rejected",
                                  "fraud_keyed_state"]  # fmt: skip
    assert FRAUD.outputs == [
        ("fraud_alerts", "output"),
        ("fraud_review", "review"),
        ("fraud_rejected", "rejected"),
    ]


def test_a_keyed_pipeline_refuses_contracts_it_cannot_honour():
    class Lenient(FraudRules):
        def table_contracts(self):
            return [TableContract("fraud_rules", ("rule_id",))]  # refuse_and_continue

    with pytest.raises(ValueError, match="on_invalid='fail'"):
        keyed_pipeline(None, FRAUD.spec(), Lenient(), table_path=str, checkpoint_root="/x")


def plan(batch_id: int, end: int, rules: int) -> BatchPlan:
    return BatchPlan(batch_id, end - 1, end, {"fraud_rules": rules})


def test_sensor_work_new_events_new_rules_version_redo_or_nothing():
    last = plan(0, 3, 1)
    versions = {"transactions": 3, "fraud_rules": 1}
    assert pending_work(FRAUD_H, versions, (None, last, None)) is None
    moved = pending_work(FRAUD_H, {**versions, "fraud_rules": 2}, (None, last, None))
    assert moved is not None and "fraud_rules" in moved
    events = pending_work(FRAUD_H, {**versions, "transactions": 4}, (None, last, None))
    assert events is not None and "transactions is at v4" in events
    redo = pending_work(FRAUD_H, versions, (plan(1, 4, 1), last, None))
    assert redo is not None and "batch 1" in redo
    assert pending_work(FRAUD_H, versions, (None, None, None)) is not None  # nothing run yet


def test_the_enrichment_job_sensor_and_checks_come_from_the_factory():
    """``jobs/definitions.py`` declares the enrichment through the factory: its job, assets,
    sensor and checks in ``defs`` are the ones :func:`declare_pipeline` made from
    ``ENRICHMENT_DECLARATION``, under the names they always had."""
    from jobs.definitions import PIPELINES, defs
    from jobs.fraud.defs import FRAUD_PIPELINE
    from jobs.scoring.pipeline import SCORING_PIPELINE
    from jobs.storefront import microbatch, sensors
    from jobs.storefront.pipeline import WRITER_JOBS

    made = microbatch.ENRICHMENT_PIPELINE
    assert made.declaration is microbatch.ENRICHMENT_DECLARATION
    assert (made, FRAUD_PIPELINE, SCORING_PIPELINE) == PIPELINES
    # the job: the factory's asset job, the one defs serves
    assert made.job is microbatch.enrichment_microbatch and made.job.name == "enrichment_microbatch"
    assert any(j is made.job for j in defs.jobs)
    resolved = defs.resolve_job_def("enrichment_microbatch")
    assert {k.to_user_string() for k in resolved.asset_layer.selected_asset_keys} == {
        "enriched_events", "enrichment_unmatched", "enrichment_rejected"}
    fields = resolved.run_config_schema.config_type.fields["ops"].config_type.fields[
        "enrichment_microbatch_assets"].config_type.fields["config"].config_type.fields
    assert {"checkpoint_every", "state_budget_bytes", "max_batches", "follow"} <= set(fields)
    # the assets: today's keys, deps and group
    assert made.assets is microbatch.enrichment_microbatch_assets
    assert made.assets.node_def.name == "enrichment_microbatch_assets"
    graph = defs.resolve_asset_graph()
    deps = {k: {p.to_user_string() for p in graph.get(AssetKey(k)).parent_keys}
            for k in ("enriched_events", "enrichment_unmatched", "enrichment_rejected")}
    assert deps == {"enriched_events": {"events", "dim_products", "user_segments"},
                    "enrichment_unmatched": {"events", "dim_products"},
                    "enrichment_rejected": {"events"}}
    assert {graph.get(AssetKey(k)).group_name for k in deps} == {"microbatch"}
    # the sensor: broadcast_versions_sensor, targeting the factory's job
    sensor = defs.resolve_sensor_def("broadcast_versions_sensor")
    assert sensor is made.sensor and sensors.broadcast_versions_sensor is made.sensor
    assert sensor.job_name == "enrichment_microbatch"
    assert "enrichment_sensor" not in {s.name for s in defs.sensors}
    # the checks on enriched_events: the factory's, state_budget included
    names = {c.name: c for checks in made.checks for c in checks.check_specs}
    assert set(names) == {"counts_reconcile", "broadcast_versions_accepted", "events_fresh",
                          "state_budget", "output_sample_recomputed"}
    assert {n.asset_key for n in names.values()} == {AssetKey("enriched_events")}
    on_enriched = {k.name for k in graph.asset_check_keys
                   if k.asset_key == AssetKey("enriched_events")}
    assert on_enriched == set(names)
    for checks in made.checks:
        assert any(c is checks for c in defs.asset_checks)
    assert microbatch.broadcast_versions_accepted in made.checks
    assert microbatch.state_budget in made.checks
    # the factory's maintenance, under the names lake_maintenance_job / lake_maintenance;
    # its continuous job is enrichment_continuous; the writers are those three jobs
    assert made.maintenance.job.name == "lake_maintenance_job"
    assert made.maintenance.schedule.name == "lake_maintenance"
    assert made.continuous.name == "enrichment_continuous"
    assert made.handle.maintenance_job_name == "lake_maintenance_job"
    job_names = {j.name for j in defs.resolve_all_job_defs()}
    assert "lake_maintenance_job" in job_names and "enrichment_maintenance_job" not in job_names
    assert made.handle.writers == WRITER_JOBS


def test_a_declaration_can_leave_broadcast_only_changes_to_the_next_events():
    """``broadcast_only_runs=False`` (the enrichment): a new broadcast version alone is no
    work; new events, a redo and a first batch still are."""
    from dataclasses import replace

    lazy = PipelineHandle.resolve(
        replace(FRAUD, dagster=replace(FRAUD.dagster, broadcast_only_runs=False)))
    last = plan(0, 3, 1)
    versions = {"transactions": 3, "fraud_rules": 1}
    assert pending_work(lazy, {**versions, "fraud_rules": 2}, (None, last, None)) is None
    assert pending_work(FRAUD_H, {**versions, "fraud_rules": 2}, (None, last, None)) is not None
    events = pending_work(lazy, {**versions, "transactions": 4}, (None, last, None))
    assert events is not None and "transactions is at v4" in events
    assert pending_work(lazy, versions, (plan(1, 4, 1), last, None)) is not None
    assert pending_work(lazy, versions, (None, None, None)) is not None


RULE = {"rule_id": "r1", "small_below": 1.0, "large_above": 500.0, "window_ms": 60_000,
        "action": "BLOCK", "enabled": True}  # fmt: skip


def reasons(rows: list[dict], version: int = 7) -> list[str]:
    table = pa.Table.from_pylist(rows)
    return check_version(RULES_CONTRACT, table, table.schema, version)


def test_bad_rules_versions_are_refused_naming_table_version_and_key():
    assert reasons([RULE, {**RULE, "rule_id": "r2", "action": "REVIEW"}]) == []
    (dup,) = reasons([RULE, RULE])
    assert "fraud_rules@v7" in dup and "rule_id='r1'" in dup
    (null,) = reasons([RULE, {**RULE, "rule_id": None}])
    assert "fraud_rules@v7" in null and "null key (rule_id)" in null
    (action,) = reasons([{**RULE, "action": "ALLOW"}])
    assert "rule_id='r1'" in action and "action='ALLOW'" in action
    (window,) = reasons([{**RULE, "window_ms": 0, "enabled": None}])
    assert "window_ms=0" in window and "enabled" in window
    missing = {k: v for k, v in RULE.items() if k != "enabled"}
    (gone,) = reasons([missing])
    assert "fraud_rules@v7" in gone and "'enabled'" in gone
