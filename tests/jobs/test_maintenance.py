"""``lake_maintenance_job``: compaction, VACUUM and log checkpoints of the enrichment
pipeline's Delta tables, without breaking exactly-once output nor restore-to-checkpoint.

Five micro-batches (a checkpoint after each, two kept) leave one small file per batch in
each output table; the job runs through Dagster with a VACUUM retention of 0 hours, which
the output tables raise to what rewinds need. Then, checked independently of the job:
outputs unchanged, fewer files, a log checkpoint, OPTIMIZE commits that change no data
(Change Data Feed), and a rewind to the oldest retained checkpoint whose re-run gives the
same outputs again.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from dagster import DagsterInstance, DagsterRunStatus

from assets.tables import USER_SEGMENTS
from dagster_lakecast import EXCLUSIVE_TAG
from dagster_lakecast.handle import PipelineHandle
from dagster_lakecast.maintenance import factory_tables
from dagster_lakecast.maintenance_tables import MaintainedTable
from jobs.definitions import defs
from jobs.storefront.microbatch import (
    ENRICHED_EVENTS,
    ENRICHMENT,
    ENRICHMENT_DECLARATION,
    ENRICHMENT_REJECTED,
    ENRICHMENT_UNMATCHED,
    build_pipeline,
)
from jobs.storefront.pipeline import MAINTENANCE_JOB, MICROBATCH_JOB, WRITER_JOBS
from lakecast.delta import io as delta_io
from lakecast.delta.maintenance import (
    default_retention_hours,
    parse_interval_hours,
    vacuum_retention,
)
from lakecast.errors import LakecastError
from lakecast.snapshots.checkpointer import snapshot_path
from lakecast.snapshots.store import SnapshotStore
from lakecast.tools import cli
from tests.jobs import microbatch_lake as ml

ENRICHMENT_DECLARATION_H = PipelineHandle.resolve(ENRICHMENT_DECLARATION)

OUTPUTS = (ENRICHED_EVENTS, ENRICHMENT_UNMATCHED, ENRICHMENT_REJECTED)
TABLES = factory_tables(ENRICHMENT_DECLARATION_H)
OP = "maintain_enrichment_tables"


def _step(spark, lake, step: int) -> pd.DataFrame:
    """Inputs of batch ``step``: the lake and 30 events, then a segment change and 12
    events (ids ``100 * step ...``) per step. Returns the events."""
    if step == 0:
        ml.build(spark, lake)
        events = ml.events(0, 30, seed=1)
    else:
        segs = pd.DataFrame({"user_id": [step % 6 + 1], "segment": ["VIP" if step % 2 else "NEW"]})
        delta_io.merge_upsert(spark, spark.createDataFrame(segs),
                              lake.table_path(USER_SEGMENTS), keys=["user_id"])
        events = ml.events(100 * step, 12, seed=step)
    ml.write_events(spark, lake, events)
    return events


def _outputs(spark, lake) -> dict[str, pd.DataFrame]:
    out = {}
    for t in OUTPUTS:
        df = delta_io.read(spark, lake.table_path(t)).toPandas()
        key = "raw_record" if t == ENRICHMENT_REJECTED else "event_id"
        if t == ENRICHMENT_REJECTED:  # records the writing batch's id (new ids after a rewind)
            df = df.drop(columns=["batch_id"])
        out[t] = df[sorted(df.columns)].sort_values(key).reset_index(drop=True)
    return out


def _assert_same(got: dict[str, pd.DataFrame], want: dict[str, pd.DataFrame]) -> None:
    for t in OUTPUTS:
        pd.testing.assert_frame_equal(got[t], want[t], check_dtype=False)
    assert got[ENRICHED_EVENTS].event_id.is_unique


def _data_files(path: str) -> int:
    """Data files of the table's newest version (from its log, not from the job)."""
    return len(delta_io.file_sizes(path, delta_io.latest_version(path)))


def _path(lake, name: str) -> str:
    table: MaintainedTable = next(t for t in TABLES if t.name == name)
    return table.path(lake)


def test_maintenance_compacts_keeps_outputs_and_rewinds(spark, lake):
    pipeline = build_pipeline(spark, lake, 1, parallelism=2, checkpoint_every=1,
                              keep_checkpoints=2, function_id="maint")
    frames = []
    for step in range(5):
        frames.append(_step(spark, lake, step))
        (r,) = pipeline.run()
        assert r.plan.batch_id == step and r.checkpoint["checkpoint_id"] == step
    store = SnapshotStore(spark, snapshot_path(lake, ENRICHMENT.name), ENRICHMENT.name)
    assert [h.checkpoint_id for h in store.headers()] == [3, 4]  # two kept
    want = _outputs(spark, lake)
    # an independent pandas model says which events land where
    model = [ml.expected(f, ml.segments_v1(), 10.0) for f in frames]
    for t, part in ((ENRICHED_EVENTS, "enriched"), (ENRICHMENT_UNMATCHED, "unmatched")):
        ids = sorted(i for m in model for i in m[part].event_id)
        assert sorted(want[t].event_id) == ids
    assert len(want[ENRICHMENT_REJECTED]) == sum(len(m["rejected"]) for m in model)
    files_before = {t.name: _data_files(_path(lake, t.name)) for t in TABLES}
    assert files_before[ENRICHED_EVENTS] >= 5, files_before  # a file per batch
    assert all(files_before[t] >= 2 for t in OUTPUTS), files_before

    with DagsterInstance.ephemeral() as instance:
        job = defs.resolve_job_def(MAINTENANCE_JOB)
        res = job.execute_in_process(
            instance=instance, run_config={"ops": {OP: {"config": {"retention_hours": 0}}}})
        assert res.success
        logs = [e.user_message or "" for e in instance.all_logs(res.run_id)]
    obs = {e.asset_observation_data.asset_observation.asset_key.to_user_string():
           e.asset_observation_data.asset_observation.metadata
           for e in res.all_events if e.event_type_value == "ASSET_OBSERVATION"}
    assert set(obs) == {t.name for t in TABLES}

    # contents unchanged, fewer files, a log checkpoint at the newest version
    _assert_same(_outputs(spark, lake), want)
    for t in TABLES:
        path, meta = _path(lake, t.name), obs[t.name]
        after = _data_files(path)
        if t.kind == "snapshots":  # a checkpoint's partition may hold one file already
            assert after <= files_before[t.name], (t.name, files_before[t.name], after)
        else:  # a file per batch (and two per batch in the progress log) compacted
            assert after < files_before[t.name], (t.name, files_before[t.name], after)
        assert (meta["files_before"].value, meta["files_after"].value) == (
            files_before[t.name], after)
        version = delta_io.latest_version(path)
        assert meta["log_checkpoint_version"].value == meta["version_after"].value == version
        assert (Path(path) / "_delta_log" / f"{version:020d}.checkpoint.parquet").exists()
        assert (Path(path) / "_delta_log" / "_last_checkpoint").exists()
        # OPTIMIZE changed no data: dataChange=false, and its change feed is empty
        optimize = [v for v in range(version + 1)
                    if delta_io.commit_info(path, v).operation == "OPTIMIZE"]
        assert len(optimize) == 1, optimize
        for action in delta_io.commit_actions(path, optimize[0]):
            for kind in ("add", "remove"):
                if kind in action:
                    assert action[kind]["dataChange"] is False
        assert delta_io.read_changes(spark, path, optimize[0], optimize[0]).count() == 0
        if t.kind != "snapshots":  # the Spark-free feed reader (unpartitioned tables)
            changes = delta_io.read_changes_from_log(path, optimize[0], version)
            assert changes is not None and changes[optimize[0]].num_rows == 0

    # the output tables' retention was raised to what rewinds need (0 h asked), the
    # progress log and snapshot table (never rolled back) were vacuumed at 0 h
    for t in OUTPUTS:
        meta = obs[t]
        assert meta["retention_clamped"].value is True
        assert meta["retention_hours"].value == meta["retention_needed_hours"].value >= 1
        assert meta["kept_versions"].value, t
        assert meta["files_vacuumed"].value == 0
        assert "raised to" in meta["retention"].value and "checkpoint 3" in meta["retention"].value
        assert any(t in m and "is shorter than rewinds" in m for m in logs), logs
        # the feed of every version still reads: OPTIMIZE added no change rows
        cdf = delta_io.read_changes(spark, lake.table_path(t), 0).toPandas()
        assert set(cdf["_change_type"]) == {"insert"} and len(cdf) == len(want[t])
    for name in (f"{ENRICHMENT.name}_progress", f"{ENRICHMENT.name}_snapshots"):
        assert obs[name]["retention_hours"].value == 0
        assert obs[name]["files_vacuumed"].value > 0, name
    # the checkpoints retention dropped left nothing behind: files, Spark's .crc, folders
    snapshots = Path(store.path)
    assert sorted(p.name for p in snapshots.glob("checkpoint_id=*")) == [
        "checkpoint_id=3", "checkpoint_id=4"]
    live = {Path(f).name for f in delta_io.file_sizes(store.path, delta_io.latest_version(
        store.path))}
    for f in snapshots.glob("checkpoint_id=*/*"):
        if f.name.endswith(".crc"):  # a checksum of a live file only
            assert (f.parent / f.name[1:-len(".crc")]).exists(), f
        else:
            assert f.name in live, f

    # a rewind to the oldest retained checkpoint, then a re-run: the same outputs again
    assert cli.main(["snapshots", "restore", "3"]) == 0
    enriched = delta_io.read(spark, lake.table_path(ENRICHED_EVENTS)).toPandas()
    assert enriched.event_id.max() < 400  # batch 4's events are rolled back
    again = build_pipeline(spark, lake, 1, parallelism=2, checkpoint_every=1,
                           keep_checkpoints=2, function_id="maint-again")
    (r,) = again.run()
    assert r.plan.events_start == 3 and again.runtime.restored.header.checkpoint_id == 3
    _assert_same(_outputs(spark, lake), want)
    assert again.run() == []


def test_vacuum_retention_is_raised_to_what_rewinds_need():
    default = vacuum_retention(None, 30, 168, "checkpoint 7 needs v12")
    assert (default.hours, default.clamped, default.enforce) == (168, False, True)
    long = vacuum_retention(None, 400, 168, "checkpoint 7 needs v12")
    assert (long.hours, long.clamped) == (400, False) and "checkpoint 7" in long.reason
    short = vacuum_retention(24, 30, 168, "checkpoint 7 needs v12")
    assert (short.hours, short.clamped, short.enforce) == (30, True, False)
    assert "24 h is shorter than rewinds" in short.reason and "raised to 30 h" in short.reason
    with pytest.raises(LakecastError, match=">= 0 hours"):
        vacuum_retention(-1, 0, 168)
    # the table's own default: delta.deletedFileRetentionDuration, else 7 days
    assert parse_interval_hours("interval 7 days") == parse_interval_hours("1 week") == 168
    assert parse_interval_hours("interval 36 hours") == 36
    assert default_retention_hours({}) == 168
    assert default_retention_hours({"delta.deletedFileRetentionDuration": "interval 2 days"}) == 48
    with pytest.raises(LakecastError, match="cannot read the Delta interval"):
        parse_interval_hours("soon")


@pytest.mark.parametrize("active_job", [MICROBATCH_JOB, MAINTENANCE_JOB])
def test_maintenance_and_micro_batches_take_turns(lake, active_job):
    """The job shares the micro-batch job's run tag (the queue runs one at a time) and is a
    writer of the pipeline: it refuses to start beside a running micro-batch, and a
    micro-batch refuses to start beside it."""
    from dagster import materialize
    from dagster._core.storage.dagster_run import DagsterRun

    from dagster_lakecast.resources import LakecastSparkResource, LakeResource
    from jobs.storefront.microbatch import enrichment_microbatch, enrichment_microbatch_assets

    job = defs.resolve_job_def(MAINTENANCE_JOB)
    assert job.tags[EXCLUSIVE_TAG] == enrichment_microbatch.tags[EXCLUSIVE_TAG]
    assert MAINTENANCE_JOB in WRITER_JOBS
    with DagsterInstance.ephemeral() as instance:
        other = instance.add_run(DagsterRun(job_name=active_job, status=DagsterRunStatus.STARTED))
        if active_job == MICROBATCH_JOB:
            res = job.execute_in_process(instance=instance, raise_on_error=False)
        else:
            res = materialize([enrichment_microbatch_assets], instance=instance,
                              resources={"pyspark": LakecastSparkResource(),
                                         "lake": LakeResource()}, raise_on_error=False)
        assert not res.success
        (failure,) = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"]
        message = failure.step_failure_data.user_failure_data.description
        assert other.run_id in message and active_job in message and "one writer" in message
