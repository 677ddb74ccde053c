"""Two runs of one pipeline started at once, on a persistent Dagster instance (a SQLite
``DAGSTER_HOME`` in the test's folder): both are running when they reach the pipeline,
the one that started first writes, the other is refused with a message naming the first
run, before it writes anything; the output holds every event exactly once (pandas count).
The same holds between the micro-batch job and the continuous job."""

import threading
import time

import dagster as dg
import pandas as pd
from deltalake import DeltaTable

from dagster_lakecast import (
    LakecastSparkResource,
    LakeResource,
    PipelineDeclaration,
    output_specs,
    run_pipeline,
)
from dagster_lakecast.continuous import declare_continuous
from lakecast.config import Settings
from tests.dagster_lakecast.test_run_seam import reference, write_inputs
from tests.newuser.project.fx import ToEur

FX = PipelineDeclaration(name="fx", function=ToEur, events_table="payments",
                         broadcast_tables=("fx_rates",), output_table="payments_eur",
                         side_outputs={"unmatched": "payments_unmatched"}, parallelism=2)


def _job(gate: threading.Barrier | threading.Event | None) -> dg.JobDefinition:
    """The pipeline's micro-batch job (its own name, so the runs are its writers'); with
    ``gate``, each run waits there, already STARTED (for a barrier: until the other run
    is too; for an event: until it is set)."""

    @dg.multi_asset(specs=output_specs(FX), can_subset=False)
    def payments_in_eur(context: dg.AssetExecutionContext, pyspark: LakecastSparkResource,
                        lake: LakeResource):
        if gate is not None:
            gate.wait(timeout=120)
        yield from run_pipeline(context, FX, pyspark, lake)

    defs = dg.Definitions(
        assets=[payments_in_eur],
        jobs=[dg.define_asset_job(FX.job_name, selection=[payments_in_eur])],
        resources={"pyspark": LakecastSparkResource(), "lake": LakeResource()})
    return defs.resolve_job_def(FX.job_name)


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


def test_two_launches_at_once_one_writes_the_other_is_refused(spark, lake: Settings):
    new = write_inputs(lake, 0)
    job = _job(threading.Barrier(2))
    results: dict[int, dg.ExecuteInProcessResult] = {}
    errors: list[BaseException] = []
    with dg.DagsterInstance.get() as instance:  # the lake's DAGSTER_HOME (SQLite, on disk)
        assert not instance.is_ephemeral

        def launch(i: int) -> None:
            try:
                results[i] = job.execute_in_process(instance=instance, raise_on_error=False)
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=launch, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors and len(results) == 2, errors
        ok = [r for r in results.values() if r.success]
        refused = [r for r in results.values() if not r.success]
        assert len(ok) == 1 and len(refused) == 1, [r.success for r in results.values()]
        winner, loser = ok[0], refused[0]
        # the first to start is the writer; the later one names it
        start = {r.run_id: instance.get_run_record_by_id(r.run_id).start_time
                 for r in (winner, loser)}
        assert start[winner.run_id] <= start[loser.run_id]
        message = _failure(loser)
        assert f"run {winner.run_id} of {FX.job_name}" in message, message
        assert "one writer at a time" in message
        assert _materialized(loser) == 0 and _materialized(winner) == 2
    _assert_once(lake, new)
    # a later launch finds nothing new: still exactly once
    with dg.DagsterInstance.get() as instance:
        assert _job(None).execute_in_process(instance=instance).success
    _assert_once(lake, new)


def test_the_continuous_job_and_the_micro_batch_job_are_exclusive(spark, lake: Settings):
    new = write_inputs(lake, 100)
    go = threading.Event()
    continuous = dg.Definitions(
        jobs=[declare_continuous(FX)],
        resources={"pyspark": LakecastSparkResource(), "lake": LakeResource()},
    ).resolve_job_def(FX.continuous_job_name)
    out: dict[str, dg.ExecuteInProcessResult] = {}
    with dg.DagsterInstance.get() as instance:

        def micro() -> None:  # held, already running, until the continuous run ended
            out["micro"] = _job(go).execute_in_process(instance=instance,
                                                       raise_on_error=False)

        thread = threading.Thread(target=micro)
        thread.start()
        deadline = time.monotonic() + 120
        while not instance.get_runs(dg.RunsFilter(job_name=FX.job_name,
                                                  statuses=[dg.DagsterRunStatus.STARTED])):
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.05)
        config = {"ops": {f"{FX.name}_continuous_loop": {"config": {"max_seconds": 20.0}}}}
        try:
            out["cont"] = continuous.execute_in_process(instance=instance, run_config=config,
                                                        raise_on_error=False)
        finally:
            go.set()
            thread.join(timeout=300)
        micro_run, cont_run = out["micro"], out["cont"]
        assert micro_run.success
        assert not cont_run.success and _materialized(cont_run) == 0
        message = _failure(cont_run)
        assert f"run {micro_run.run_id} of {FX.job_name}" in message, message
    _assert_once(lake, new)
