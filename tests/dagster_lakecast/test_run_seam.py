"""The run seam: a user's own ``@multi_asset`` runs a pipeline's batches with
:func:`dagster_lakecast.run_pipeline`, and a Component subclass overrides ``execute``;
both write what a pandas reference says, on tables written with pandas + ``deltalake``."""

from pathlib import Path

import dagster as dg
import pandas as pd
from dagster.components.testing import create_defs_folder_sandbox
from deltalake import DeltaTable, write_deltalake

from dagster_lakecast import (
    LakecastPipelineComponent,
    LakecastSparkResource,
    LakeResource,
    PipelineDeclaration,
    output_specs,
    run_pipeline,
)
from lakecast.config import Settings
from tests.newuser.project.fx import ToEur

RATES = {"USD": 0.9, "EUR": 1.0}


def write_inputs(lake: Settings, first: int) -> pd.DataFrame:
    """The user's tables: rates (overwritten) and four payments (appended)."""
    write_deltalake(lake.table_path("fx_rates"), pd.DataFrame(
        {"currency": list(RATES), "rate_to_eur": list(RATES.values())}), mode="overwrite")
    new = pd.DataFrame({"payment_id": [first + k for k in range(4)],
                        "currency": ["USD", "EUR", "CHF", "USD"],
                        "amount": [1.0, 2.0, 3.0, 4.5]})
    write_deltalake(lake.table_path("payments"), new, mode="append")
    return new


def reference(new: pd.DataFrame) -> pd.DataFrame:
    known = new[new.currency.isin(list(RATES))].copy()
    known["amount_eur"] = known.amount * known.currency.map(RATES)
    return known


def assert_output(lake: Settings, want: pd.DataFrame) -> None:
    got = DeltaTable(lake.table_path("payments_eur")).to_pandas()
    got = got.sort_values("payment_id").reset_index(drop=True)
    want = want.sort_values("payment_id").reset_index(drop=True)
    assert got.payment_id.tolist() == want.payment_id.tolist()
    assert got.amount_eur.round(9).tolist() == want.amount_eur.round(9).tolist()


def test_a_users_own_asset_runs_the_batches_through_the_seam(spark, lake: Settings) -> None:
    fx = PipelineDeclaration(name="fx", function=ToEur, events_table="payments",
                             broadcast_tables=("fx_rates",), output_table="payments_eur",
                             side_outputs={"unmatched": "payments_unmatched"}, parallelism=2)
    steps: list[str] = []

    @dg.multi_asset(specs=output_specs(fx), can_subset=False)
    def payments_in_eur(context: dg.AssetExecutionContext, pyspark: LakecastSparkResource,
                        lake: LakeResource):
        steps.append("before")
        results = list(run_pipeline(context, fx, pyspark, lake))
        steps.append(f"{len(results)} results")
        yield from results

    resources = {"pyspark": LakecastSparkResource(), "lake": LakeResource()}
    with dg.instance_for_test() as instance:
        # before the tables exist: said, nothing processed, the step succeeds
        first = dg.materialize([payments_in_eur], resources=resources, instance=instance)
        assert first.success and not Path(lake.table_path("payments_eur")).exists()
        new = write_inputs(lake, 0)
        second = dg.materialize([payments_in_eur], resources=resources, instance=instance)
        assert second.success
        keys = {e.asset_key for e in second.get_asset_materialization_events()}
        assert keys == {dg.AssetKey("payments_eur"), dg.AssetKey("payments_unmatched")}
    assert steps == ["before", "0 results", "before", "2 results"]
    assert_output(lake, reference(new))


class AuditedPipeline(LakecastPipelineComponent):
    """A Component subclass that adds a step around the batches."""

    def execute(self, context, decl, pyspark, lake, config=None):
        context.log.info(f"audit: {decl.name} starts")
        for result in super().execute(context, decl, pyspark, lake, config):
            yield dg.MaterializeResult(asset_key=result.asset_key,
                                       metadata={**(result.metadata or {}), "audited": True},
                                       data_version=result.data_version)


def test_a_component_subclass_overrides_execute(spark, lake: Settings) -> None:
    new = write_inputs(lake, 100)
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(AuditedPipeline, defs_yaml_contents={
            "type": f"{__name__}.AuditedPipeline",
            "attributes": {"name": "fx", "function": "tests.newuser.project.fx:ToEur",
                           "events_table": "payments", "broadcast_tables": ["fx_rates"],
                           "output_table": "payments_eur", "parallelism": 2,
                           "side_outputs": {"unmatched": "payments_unmatched"}}})
        with sandbox.load_component_and_build_defs(defs_path=path) as (_, defs), \
                dg.instance_for_test() as instance:
            result = defs.resolve_job_def("fx_microbatch").execute_in_process(
                instance=instance)
            assert result.success
            events = result.get_asset_materialization_events()
            assert len(events) == 2  # the main output and the side output
            assert all(e.materialization.metadata["audited"].value is True for e in events)
            # the batch names its state engine and why (ToEur overrides only transform:
            # its lookups in the executor JVM, its transform after them)
            meta = events[0].materialization.metadata
            assert meta["state_engine"].value == "jvm"
            assert "transform vectorized" in meta["state_engine_reason"].value
    assert_output(lake, reference(new))
