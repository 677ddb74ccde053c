"""The Component loads from a ``defs.yaml`` in-process against a lake with no tables: the
asset graph has the user's input assets upstream of the outputs, and a sensor tick or a
run whose inputs do not exist yet says which table is missing and what creates it. No
Spark: nothing here reads a table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster.components.testing import create_defs_folder_sandbox
from deltalake import write_deltalake

from dagster_lakecast import LakecastPipelineComponent
from lakecast.config import Settings

ATTRIBUTES: dict[str, Any] = {
    "name": "fx", "function": "tests.newuser.project.fx:ToEur",
    "events_table": "payments", "broadcast_tables": ["fx_rates"],
    "output_table": "payments_eur", "side_outputs": {"unmatched": "payments_unmatched"},
    "parallelism": 2,
}


def load(attributes: dict[str, Any]) -> dg.Definitions:
    """The definitions of a Component whose ``defs.yaml`` holds ``attributes``, beside the
    user's own asset ``fx_rates`` (what a project's other defs hold)."""
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(
            LakecastPipelineComponent,
            defs_yaml_contents={"type": "dagster_lakecast.LakecastPipelineComponent",
                                "attributes": attributes})
        with sandbox.load_component_and_build_defs(defs_path=path) as (_, defs):
            return dg.Definitions.merge(defs, dg.Definitions(assets=[fx_rates]))


def load_error(attributes: dict[str, Any]) -> str:
    """What loading a Component with ``attributes`` fails with (the exception chain)."""
    with pytest.raises(Exception) as failed:  # Dagster wraps the Component's error
        load(attributes)
    chain, e = [], failed.value
    while e is not None:
        chain.append(str(e))
        e = e.__cause__ or e.__context__
    return "\n".join(chain)


@dg.asset
def fx_rates() -> None:
    """The user's asset that writes the broadcast table (never run here)."""


def test_it_loads_with_no_table_and_the_inputs_are_the_users_assets(lake: Settings) -> None:
    assert not Path(lake.lake_root, "payments").exists()
    defs = load(ATTRIBUTES)
    graph = defs.resolve_asset_graph()
    main = graph.get(dg.AssetKey("payments_eur"))
    assert main.parent_keys == {dg.AssetKey("payments"), dg.AssetKey("fx_rates")}
    # the user's asset is the one definition of fx_rates (no second one by the pipeline)
    assert graph.get(dg.AssetKey("fx_rates")).is_materializable
    assert not graph.get(dg.AssetKey("payments")).is_materializable  # a stub: nobody's
    assert defs.resolve_job_def("fx_microbatch") is not None
    sensor = defs.resolve_sensor_def("fx_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING


def test_asset_keys_per_table_and_observed_inputs(lake: Settings) -> None:
    defs = load({**ATTRIBUTES, "asset_keys": {"payments": "raw/payments"},
                 "observe": ["payments"], "observe_cron": "*/5 * * * *",
                 "automation_condition": "{{ automation_condition.eager() }}"})
    graph = defs.resolve_asset_graph()
    raw = dg.AssetKey(["raw", "payments"])
    assert graph.get(dg.AssetKey("payments_eur")).parent_keys == {raw, dg.AssetKey("fx_rates")}
    assert graph.get(raw).is_observable
    assert graph.get(raw).automation_condition is not None
    assert graph.get(dg.AssetKey("payments_eur")).automation_condition is not None
    # Declarative Automation instead of the sensor: the sensor is there, stopped
    sensor = defs.resolve_sensor_def("fx_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.STOPPED


def test_a_tick_and_a_run_before_the_tables_exist_say_what_is_missing(lake: Settings
                                                                      ) -> None:
    import pandas as pd

    defs = load(ATTRIBUTES)
    sensor = defs.resolve_sensor_def("fx_sensor")
    with dg.instance_for_test() as instance:
        tick = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
        said = tick.skip_message
        assert "'payments'" in said and "'fx_rates'" in said, said
        assert "dg launch --assets payments fx_rates" in said, said
        assert str(Path(lake.lake_root, "payments")) in said, said

        # a run with one input still missing: it says so and processes nothing
        write_deltalake(str(Path(lake.lake_root, "payments")),
                        pd.DataFrame({"payment_id": [1], "currency": ["USD"],
                                      "amount": [1.0]}))
        result = defs.resolve_job_def("fx_microbatch").execute_in_process(instance=instance)
        assert result.success
        logs = [r.user_message for r in instance.all_logs(result.run_id)]
        assert any("'fx_rates'" in m and "Nothing was processed" in m for m in logs), logs
        assert result.get_asset_materialization_events() == []
        assert not Path(lake.lake_root, "payments_eur").exists()


@pytest.mark.parametrize("yaml_field,value", [("parallelism", "two"), ("colour", "blue")])
def test_a_bad_field_fails_loading_naming_it(lake: Settings, yaml_field: str, value: str
                                              ) -> None:
    said = load_error({**ATTRIBUTES, yaml_field: value})
    assert yaml_field in said, said


def test_declarative_automation_runs_the_pipeline_when_an_observed_input_moves(
        lake: Settings) -> None:
    import pandas as pd

    defs = load({**ATTRIBUTES, "observe": ["payments", "fx_rates"],
                 "automation_condition": "{{ automation_condition.eager() }}"})
    # the pipeline's defs without the user's fx_rates asset: both inputs are observed
    defs = dg.Definitions(assets=[a for a in defs.assets or [] if a is not fx_rates],
                          asset_checks=defs.asset_checks, jobs=defs.jobs,
                          sensors=defs.sensors, schedules=defs.schedules,
                          resources=defs.resources)
    payments = str(Path(lake.lake_root, "payments"))
    write_deltalake(payments, pd.DataFrame({"payment_id": [1], "currency": ["USD"],
                                            "amount": [1.0]}))
    write_deltalake(str(Path(lake.lake_root, "fx_rates")),
                    pd.DataFrame({"currency": ["USD"], "rate_to_eur": [0.9]}))
    main = dg.AssetKey("payments_eur")
    observe = defs.resolve_implicit_global_asset_job_def()
    with dg.instance_for_test() as instance:
        def observed_then_evaluated(cursor):
            assert observe.execute_in_process(
                instance=instance, asset_selection=[dg.AssetKey("payments"),
                                                    dg.AssetKey("fx_rates")]).success
            return dg.evaluate_automation_conditions(defs=defs, instance=instance,
                                                     cursor=cursor)

        first = observed_then_evaluated(None)
        record = instance.get_latest_data_version_record(dg.AssetKey("payments"))
        assert record is not None and record.asset_observation.tags["dagster/data_version"] == "0"
        # a new Delta version of the events, observed: the output is requested
        write_deltalake(payments, pd.DataFrame({"payment_id": [2], "currency": ["USD"],
                                                "amount": [2.0]}), mode="append")
        second = observed_then_evaluated(first.cursor)
        record = instance.get_latest_data_version_record(dg.AssetKey("payments"))
        assert record.asset_observation.tags["dagster/data_version"] == "1"
        assert second.get_num_requested(main) == 1, (first.total_requested,
                                                     second.total_requested)
        # observed again, nothing moved: nothing requested
        third = observed_then_evaluated(second.cursor)
        assert third.get_num_requested(main) == 0


@pytest.mark.parametrize("yaml_field,value", [
    ("name", "../elsewhere"), ("name", "fx/sub"), ("events_table", "../payments"),
    ("output_table", "a/b"), ("broadcast_tables", ["..", "fx_rates"])])
def test_a_name_that_would_leave_its_folder_fails_loading_naming_it(
        lake: Settings, yaml_field: str, value: Any) -> None:
    said = load_error({**ATTRIBUTES, yaml_field: value})
    assert f"field {yaml_field!r}" in said and "defs.yaml" in said, said
    assert not any(Path(lake.checkpoint_root).parent.glob("elsewhere*"))


def test_a_continuous_run_waits_for_missing_inputs_and_ends_said(lake: Settings) -> None:
    """Before its tables exist, the continuous run says which are missing and what creates
    them, waits for them, and ends at its max_seconds with no batch (no Spark started)."""
    defs = load(ATTRIBUTES)
    job = defs.resolve_job_def("fx_continuous")
    config = {"ops": {"fx_continuous_loop": {"config": {"max_seconds": 1.5,
                                                        "poll_seconds": 0.5}}}}
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(run_config=config, instance=instance)
        assert result.success
        assert result.output_for_node("fx_continuous_loop")["batches"] == 0
        logs = [r.user_message for r in instance.all_logs(result.run_id)]
    assert any("'payments'" in m and "waits for them" in m for m in logs), logs
    assert any("never appeared" in m for m in logs), logs


def test_translation_sets_every_tables_spec_and_the_keys_deps_use(lake: Settings) -> None:
    """``translation`` (like the Components Dagster ships) applies to every table's spec,
    with ``table``/``role``/``pipeline`` in templates; deps follow the translated keys."""
    defs = load({**ATTRIBUTES, "translation": {
        "key_prefix": "lake", "group_name": "{{ pipeline }}_tables",
        "description": "{{ role }} table {{ table }}"}})
    graph = defs.resolve_asset_graph()
    main = dg.AssetKey(["lake", "payments_eur"])
    node = graph.get(main)
    assert node.parent_keys == {dg.AssetKey(["lake", "payments"]),
                                dg.AssetKey(["lake", "fx_rates"])}
    assert node.group_name == "fx_tables"
    assert graph.get(dg.AssetKey(["lake", "payments_unmatched"])).description == (
        "side table payments_unmatched")
    assert graph.get(dg.AssetKey(["lake", "fx_progress"])).group_name == "fx_tables"
    # once per key: no key prefixed twice
    assert not [k for k in graph.get_all_asset_keys() if k.path[:2] == ["lake", "lake"]]


def test_lake_and_pyspark_fields_set_the_resources(lake: Settings, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    defs = load({**ATTRIBUTES, "lake": {"lake_root": str(other)},
                 "pyspark": {"spark_config": {"spark.sql.shuffle.partitions": "3"}}})
    resources = defs.resources or {}
    assert resources["lake"].table_path("payments") == f"{other}/payments"
    assert resources["pyspark"].spark_config == {"spark.sql.shuffle.partitions": "3"}
