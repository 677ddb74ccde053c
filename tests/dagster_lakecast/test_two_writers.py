"""Two runs of one pipeline running at once, on a persistent Dagster instance (a SQLite
``DAGSTER_HOME`` in the test's folder): the one that started first writes, a later one is
refused with a message naming the first run, before it writes anything, and a run that
started later never refuses the earlier one (before, two runs that saw each other both
stopped); the output holds every event exactly once (pandas count). The same holds
between the micro-batch job and the continuous job. The other run is a run of the
instance reported STARTED (its start event) as a second process would: two
``execute_in_process`` runs in threads of one process deadlock in Dagster itself."""

import time
from collections.abc import Callable
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
from deltalake import DeltaTable

from dagster_lakecast import (
    LakecastSparkResource,
    LakeResource,
    PipelineDeclaration,
    output_specs,
    run_pipeline,
)
from dagster_lakecast.continuous import declare_continuous
from dagster_lakecast.handle import PipelineHandle
from dagster_lakecast.runs import writing_before
from lakecast.config import Settings
from tests.dagster_lakecast.test_run_seam import reference, write_inputs
from tests.newuser.project.fx import ToEur

FX = PipelineDeclaration(name="fx", function=ToEur, events_table="payments",
                         broadcast_tables=("fx_rates",), output_table="payments_eur",
                         side_outputs={"unmatched": "payments_unmatched"}, parallelism=2)
FX_H = PipelineHandle.resolve(FX)


def _job(before: Callable[[dg.AssetExecutionContext], None] | None = None
         ) -> dg.JobDefinition:
    """The pipeline's micro-batch job (its own name, so its runs are the pipeline's
    writers); ``before`` runs in its step, the run STARTED, before the pipeline's."""

    @dg.multi_asset(specs=output_specs(FX), can_subset=False)
    def payments_in_eur(context: dg.AssetExecutionContext, pyspark: LakecastSparkResource,
                        lake: LakeResource):
        if before is not None:
            before(context)
        yield from run_pipeline(context, FX, pyspark, lake)

    defs = dg.Definitions(
        assets=[payments_in_eur],
        jobs=[dg.define_asset_job(FX_H.job_name, selection=[payments_in_eur])],
        resources={"pyspark": LakecastSparkResource(), "lake": LakeResource()})
    return defs.resolve_job_def(FX_H.job_name)


def _started(instance: dg.DagsterInstance, job: str, at: float) -> str:
    """A run of ``job`` that started at ``at`` (its RUN_START event), as another process
    running it reports; its run id."""
    run = instance.add_run(dg.DagsterRun(job_name=job, status=dg.DagsterRunStatus.NOT_STARTED))
    instance.report_dagster_event(
        dg.DagsterEvent(event_type_value=dg.DagsterEventType.RUN_START.value, job_name=job),
        run.run_id, timestamp=at)
    record = instance.get_run_record_by_id(run.run_id)
    assert record.dagster_run.status == dg.DagsterRunStatus.STARTED
    assert record.start_time == pytest.approx(at)
    return run.run_id


def _ended(instance: dg.DagsterInstance, run_id: str, job: str) -> None:
    instance.report_dagster_event(
        dg.DagsterEvent(event_type_value=dg.DagsterEventType.RUN_SUCCESS.value, job_name=job),
        run_id)


def _failure(result: dg.ExecuteInProcessResult) -> str:
    (event,) = [e for e in result.all_events if e.is_step_failure]
    data = event.step_failure_data
    return data.user_failure_data.description if data.user_failure_data else str(data.error)


def _materialized(result: dg.ExecuteInProcessResult) -> int:
    return len([e for e in result.all_events if e.is_step_materialization])


def _assert_once(lake: Settings, new: pd.DataFrame) -> None:
    got = DeltaTable(lake.table_path("payments_eur")).to_pandas()
    want = reference(new)
    assert (got.payment_id.value_counts() == 1).all(), got.payment_id.tolist()
    assert sorted(got.payment_id) == sorted(want.payment_id)
    unmatched = DeltaTable(lake.table_path("payments_unmatched")).to_pandas()
    assert len(got) + len(unmatched) == len(new)


def test_two_launches_the_first_started_writes_the_later_is_refused(spark, lake: Settings):
    new = write_inputs(lake, 0)
    with dg.DagsterInstance.get() as instance:  # the lake's DAGSTER_HOME (SQLite, on disk)
        assert not instance.is_ephemeral
        first = _started(instance, FX_H.job_name, time.time() - 5)
        refused = _job().execute_in_process(instance=instance, raise_on_error=False)
        assert not refused.success
        message = _failure(refused)
        assert f"run {first} of {FX_H.job_name}" in message and "one writer at a time" in message
        # refused before anything was written: no output, no progress log, no event of it
        assert _materialized(refused) == 0
        assert not Path(lake.table_path("payments_eur")).exists()
        assert not any(Path(lake.checkpoint_root).rglob("*.json"))
        _ended(instance, first, FX_H.job_name)
        # a run that started after this one is running too: it waits its turn, this one
        # writes (before, each of the two saw the other and both were refused)
        later = _started(instance, FX_H.job_name, time.time() + 3600)
        seen: list[list[str]] = []

        def check(context: dg.AssetExecutionContext) -> None:
            seen.append([r.run_id for r in writing_before(instance, later, FX_H.writers)])

        writer = _job(check).execute_in_process(instance=instance)
        assert writer.success and _materialized(writer) == 2
        assert seen == [[writer.run_id]]  # the later run would be refused naming it
        _ended(instance, later, FX_H.job_name)
    _assert_once(lake, new)
    with dg.DagsterInstance.get() as instance:  # a later launch: nothing new, still once
        assert _job().execute_in_process(instance=instance).success
    _assert_once(lake, new)


def test_the_continuous_job_and_the_micro_batch_job_are_exclusive(spark, lake: Settings):
    new = write_inputs(lake, 100)
    continuous = dg.Definitions(
        jobs=[declare_continuous(FX_H)],
        resources={"pyspark": LakecastSparkResource(), "lake": LakeResource()},
    ).resolve_job_def(FX_H.continuous_job_name)
    config = {"ops": {f"{FX.name}_continuous_loop": {"config": {"max_seconds": 5.0}}}}
    with dg.DagsterInstance.get() as instance:
        # the sensor's micro-batch run is writing: the continuous run is refused
        micro = _started(instance, FX_H.job_name, time.time() - 5)
        cont = continuous.execute_in_process(instance=instance, run_config=config,
                                             raise_on_error=False)
        assert not cont.success and _materialized(cont) == 0
        assert f"run {micro} of {FX_H.job_name}" in _failure(cont)
        _ended(instance, micro, FX_H.job_name)
        # the continuous job is running: a micro-batch launch is refused
        loop = _started(instance, FX_H.continuous_job_name, time.time() - 5)
        refused = _job().execute_in_process(instance=instance, raise_on_error=False)
        assert not refused.success
        assert f"run {loop} of {FX_H.continuous_job_name}" in _failure(refused)
        assert not Path(lake.table_path("payments_eur")).exists()
        _ended(instance, loop, FX_H.continuous_job_name)
        assert _job().execute_in_process(instance=instance).success
    _assert_once(lake, new)
