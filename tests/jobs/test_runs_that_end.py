"""Runs that end: a sensor-requested run processes the versions it was requested for,
records one materialization per committed batch while it runs, and the continuous job
enriches each commit as it lands and stops when terminated. One writer at a time."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    DagsterInstance,
    DagsterRunStatus,
    build_sensor_context,
    materialize,
)

from assets.tables import EVENTS
from dagster_lakecast.handle import PipelineHandle
from dagster_lakecast.metadata import recovered_batch_metadata
from dagster_lakecast.resources import LakecastSparkResource, LakeResource
from jobs.storefront.microbatch import (
    ENRICHED_EVENTS,
    ENRICHMENT,
    ENRICHMENT_DECLARATION,
    ENRICHMENT_REJECTED,
    ENRICHMENT_UNMATCHED,
    VERSIONS_TAG,
    build_pipeline,
    enrichment_continuous,
    enrichment_microbatch_assets,
)
from jobs.storefront.pipeline import CONTINUOUS_JOB, MICROBATCH_JOB
from jobs.storefront.sensors import broadcast_versions_sensor
from lakecast.delta import io as delta_io
from lakecast.pipeline.progress import progress_path, read_log
from lakecast.snapshots.checkpointer import snapshot_path
from tests.jobs import microbatch_lake as ml

ENRICHMENT_DECLARATION_H = PipelineHandle.resolve(ENRICHMENT_DECLARATION)

OUTPUTS = {ENRICHED_EVENTS: "enriched", ENRICHMENT_UNMATCHED: "unmatched",
           ENRICHMENT_REJECTED: "rejected"}
RESOURCES = {"pyspark": LakecastSparkResource(), "lake": LakeResource()}


def _versions(lake, events: int) -> str:
    tables = (ENRICHMENT.events_table, *ENRICHMENT.broadcast_tables)
    vs = {t: delta_io.latest_version(lake.table_path(t)) for t in tables}
    return json.dumps({**vs, EVENTS: events}, sort_keys=True)


def _batch_materializations(instance, asset: str) -> list[dict]:
    records = instance.fetch_materializations(AssetKey(asset), limit=100).records
    metas = [{k: v.value for k, v in r.asset_materialization.metadata.items()}
             for r in records]
    return sorted(metas, key=lambda m: m["batch_id"])


def _committed(lake) -> list[int]:
    _, commits = read_log(progress_path(lake.checkpoint_root, ENRICHMENT.name))
    return sorted(commits)


def _commit_ms(lake, table: str, version: int) -> int:
    """The commit time of ``table@version`` from its Delta log file's commitInfo."""
    log = Path(lake.table_path(table)) / "_delta_log" / f"{version:020d}.json"
    for line in log.read_text().splitlines():
        info = json.loads(line).get("commitInfo")
        if info is not None:
            return int(info.get("inCommitTimestamp", info["timestamp"]))
    raise AssertionError(f"{log} has no commitInfo")


def test_a_run_ends_at_its_versions_and_records_each_batch(spark, lake):
    ml.build(spark, lake)
    frames = [ml.events(1000 * i, 30, seed=i) for i in range(4)]
    for f in frames[:3]:
        ml.write_events(spark, lake, f)  # events v0, v1, v2

    with DagsterInstance.ephemeral() as instance:
        # requested for events v1 (the sensor's tag), one version per batch: two batches,
        # and v2 (committed before the run started) is left to the next run
        res = materialize([enrichment_microbatch_assets], resources=RESOURCES,
                          instance=instance, tags={VERSIONS_TAG: _versions(lake, 1)},
                          run_config={"ops": {"enrichment_microbatch_assets": {"config": {
                              "max_versions_per_batch": 1}}}})
        assert res.success
        assert _committed(lake) == [0, 1]
        ml.assert_exact(spark, lake, frames[:2])

        # one materialization per committed batch and output, while the run went on
        for asset, count_key in OUTPUTS.items():
            metas = _batch_materializations(instance, asset)
            assert [m["batch_id"] for m in metas] == [0, 1]
            want = [ml.expected(f, ml.segments_v1(), 10.0)[count_key] for f in frames[:2]]
            assert [m["batch_rows"] for m in metas] == [len(w) for w in want]
            # dagster/row_count: the table's rows after each batch (not the batch's)
            assert [m["dagster/row_count"] for m in metas] == [len(want[0]),
                                                               len(want[0]) + len(want[1])]
            assert [m["events_end"] for m in metas] == [0, 1]
            # from the commit of the batch's first events version to its main output's
            # commit, read from the two Delta logs here
            assert [m["commit_to_output_seconds"] for m in metas] == [
                round(_commit_ms(lake, ENRICHED_EVENTS, main["delta_version"]) / 1000
                      - _commit_ms(lake, EVENTS, m["events_start"] + 1) / 1000, 3)
                for m, main in zip(metas, _batch_materializations(instance, ENRICHED_EVENTS),
                                   strict=True)]
        # the run's totals ride on its last batch's materialization only
        last = _batch_materializations(instance, ENRICHED_EVENTS)[-1]
        assert last["run_batches"] == 2 and last["run_events_in"] == 62

        # a run with no versions tag processes what was committed when it started,
        # while a producer keeps committing: it ends, the rest is left to the next run
        stop = threading.Event()
        produced: list[pd.DataFrame] = [frames[3]]
        ml.write_events(spark, lake, frames[3])  # v3
        at_start = delta_io.latest_version(lake.table_path(EVENTS))

        def produce() -> None:
            i = 10
            while not stop.is_set() and i < 40:
                f = ml.events(1000 * i, 20, seed=i)
                ml.write_events(spark, lake, f)
                produced.append(f)
                i += 1
                time.sleep(0.3)

        producer = threading.Thread(target=produce)
        producer.start()
        try:
            res = materialize([enrichment_microbatch_assets], resources=RESOURCES,
                              instance=instance)
            assert res.success
            plans, _ = read_log(progress_path(lake.checkpoint_root, ENRICHMENT.name))
            planned = max(p.events_end for p in plans)
            # it ended short of the producer, which was still committing
            assert at_start <= planned < delta_io.latest_version(lake.table_path(EVENTS))
            assert producer.is_alive()
        finally:
            stop.set()
            producer.join()
        # the next run (follow: until caught up) takes the rest, exactly once
        res = materialize([enrichment_microbatch_assets], resources=RESOURCES,
                          instance=instance, run_config={"ops": {
                              "enrichment_microbatch_assets": {"config": {"follow": True}}}})
        assert res.success
        ml.assert_exact(spark, lake, [frames[0], frames[1], frames[2], *produced])
        ids = [m["batch_id"] for m in _batch_materializations(instance, ENRICHED_EVENTS)]
        assert ids == _committed(lake)  # every committed batch, once


@pytest.mark.parametrize("recorded", [(), (ENRICHED_EVENTS,)], ids=["none", "main-only"])
def test_a_batch_committed_but_not_recorded_is_recorded_by_the_next_run(spark, lake, recorded):
    """A batch committed with no Dagster event (a run killed between its commit and its
    event; here the pipeline run without Dagster) is recorded by the next run, from the
    progress log, with ``recovered = true`` and the batch's own numbers, before its own.
    Killed between the events of two assets (``main-only``: the main output's event was
    logged), the next run records the batch for the other assets only: once each."""
    ml.build(spark, lake)
    frames = [ml.events(1000 * i, 30, seed=20 + i) for i in range(3)]
    with DagsterInstance.ephemeral() as instance:
        ml.write_events(spark, lake, frames[0])
        assert materialize([enrichment_microbatch_assets], resources=RESOURCES,
                           instance=instance).success  # batch 0, recorded
        ml.write_events(spark, lake, frames[1])
        (unrecorded,) = build_pipeline(spark, lake).run()  # batch 1: committed only
        assert unrecorded.plan.batch_id == 1
        plans, commits = read_log(progress_path(lake.checkpoint_root, ENRICHMENT.name))
        (plan,) = [p for p in plans if p.batch_id == 1 and not p.is_restore]
        logged = recovered_batch_metadata(ENRICHMENT_DECLARATION_H, lake, plan, commits[1])
        for asset in recorded:  # what the killed run logged before it died
            instance.report_runless_asset_event(AssetMaterialization(
                asset_key=asset, metadata={**logged[asset], "recovered": False}))
        ml.write_events(spark, lake, frames[2])
        assert materialize([enrichment_microbatch_assets], resources=RESOURCES,
                           instance=instance).success  # records batch 1, then runs batch 2
        for asset, count_key in OUTPUTS.items():
            metas = _batch_materializations(instance, asset)
            assert [m["batch_id"] for m in metas] == [0, 1, 2]
            assert [m.get("recovered", False) for m in metas] == [
                False, asset not in recorded, False]
            want = [ml.expected(f, ml.segments_v1(), 10.0)[count_key] for f in frames]
            assert [m["batch_rows"] for m in metas] == [len(w) for w in want]
            assert [m["events_in"] for m in metas] == [len(f) for f in frames]
            assert [m["events_end"] for m in metas] == [0, 1, 2]
    ml.assert_exact(spark, lake, frames)


def test_continuous_enriches_each_commit_and_stops_when_terminated(spark, lake):
    ml.build(spark, lake)
    frames = [ml.events(1000 * i, 25, seed=20 + i) for i in range(3)]
    ml.write_events(spark, lake, frames[0])
    events_path = lake.table_path(EVENTS)
    log_path = progress_path(lake.checkpoint_root, ENRICHMENT.name)
    seen: dict[str, object] = {}

    def produce_then_terminate(instance: DagsterInstance) -> None:
        deadline = time.monotonic() + 120
        runs = []
        while not runs and time.monotonic() < deadline:
            runs = instance.get_runs()
            time.sleep(0.2)
        for f in frames[1:]:  # each commit lands while the run watches
            ml.write_events(spark, lake, f)
            target = delta_io.latest_version(events_path)
            while time.monotonic() < deadline:
                plans, commits = read_log(log_path) if delta_io.latest_version(
                    log_path) is not None else ([], {})
                if any(p.events_end >= target and p.batch_id in commits for p in plans):
                    break
                time.sleep(0.1)
        # the sensor requests nothing while the continuous run is active
        seen["sensor"] = broadcast_versions_sensor(
            build_sensor_context(instance=instance, cursor=None))
        instance.report_run_canceling(runs[0], message="terminated by the test")

    with DagsterInstance.ephemeral() as instance:
        helper = threading.Thread(target=produce_then_terminate, args=(instance,))
        helper.start()
        res = enrichment_continuous.execute_in_process(
            instance=instance, resources=RESOURCES,
            run_config={"ops": {"enrichment_continuous_loop": {"config": {
                "max_seconds": 150, "poll_seconds": 0.1}}}})
        helper.join()
        assert res.success
        tick = seen["sensor"]  # a skip (with the observation of events, if it moved)
        assert not getattr(tick, "run_requests", None)
        message = ml.skip_message(tick)
        assert CONTINUOUS_JOB in message and "still active" in message
        ml.assert_exact(spark, lake, frames)
        committed = _committed(lake)
        assert len(committed) >= 2  # the later commits were batches of their own
        for asset in OUTPUTS:
            assert [m["batch_id"] for m in _batch_materializations(instance, asset)] == committed
        totals = res.output_for_node("enrichment_continuous_loop")
        assert totals["events_in"] == sum(len(f) for f in frames)


def test_a_table_of_another_schema_at_the_snapshot_path_fails_the_run_clearly(spark, lake):
    """A Delta table that is not a snapshot table where the pipeline keeps its snapshots:
    the continuous run fails with a SnapshotError naming the table, the missing columns and
    the fix (not a raw KeyError), and nothing is written or committed."""
    ml.build(spark, lake)
    ml.write_events(spark, lake, ml.events(0, 30, seed=41))
    snapshots = snapshot_path(lake, ENRICHMENT.name)
    spark.range(3).selectExpr("id AS other").write.format("delta").save(snapshots)
    with DagsterInstance.ephemeral() as instance:
        res = enrichment_continuous.execute_in_process(
            instance=instance, resources=RESOURCES, raise_on_error=False,
            run_config={"ops": {"enrichment_continuous_loop": {"config": {
                "max_seconds": 120, "poll_seconds": 0.1, "max_batches": 1}}}})
        assert not res.success
        (failure,) = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"]
        data = failure.step_failure_data.user_failure_data
        assert data is not None, failure.step_failure_data.error  # a Failure, not a crash
        message = data.description
        assert snapshots in message and "not a snapshot table" in message, message
        assert "'checkpoint_id'" in message and "'other'" in message, message
        assert "Move it aside" in message, message
        assert not instance.fetch_materializations(AssetKey(ENRICHED_EVENTS), limit=1).records
    assert _committed(lake) == []
    assert delta_io.latest_version(lake.table_path(ENRICHED_EVENTS)) is None


@pytest.mark.parametrize("active_job, job", [(MICROBATCH_JOB, CONTINUOUS_JOB),
                                             (CONTINUOUS_JOB, MICROBATCH_JOB)])
def test_a_second_writer_is_refused_naming_the_active_run(lake, active_job, job):
    from dagster._core.storage.dagster_run import DagsterRun

    with DagsterInstance.ephemeral() as instance:
        other = instance.add_run(DagsterRun(job_name=active_job, status=DagsterRunStatus.STARTED))
        if job == CONTINUOUS_JOB:
            res = enrichment_continuous.execute_in_process(
                instance=instance, resources=RESOURCES, raise_on_error=False)
        else:
            res = materialize([enrichment_microbatch_assets], resources=RESOURCES,
                              instance=instance, raise_on_error=False)
        assert not res.success
        (failure,) = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"]
        message = failure.step_failure_data.user_failure_data.description
        assert other.run_id in message and active_job in message and "one writer" in message
        assert not (lake.checkpoint_root and delta_io.table_exists(
            progress_path(lake.checkpoint_root, ENRICHMENT.name)))


def test_a_malformed_versions_tag_is_a_clear_error_and_nothing_is_written(lake):
    with DagsterInstance.ephemeral() as instance:
        res = materialize([enrichment_microbatch_assets], resources=RESOURCES,
                          instance=instance, tags={VERSIONS_TAG: "{not json"},
                          raise_on_error=False)
        assert not res.success
        (failure,) = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"]
        message = failure.step_failure_data.user_failure_data.description
        assert VERSIONS_TAG in message and "is not JSON" in message
        assert "remove the tag" in message
        assert not delta_io.table_exists(progress_path(lake.checkpoint_root, ENRICHMENT.name))
