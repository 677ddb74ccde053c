"""``<name>_maintenance_job`` of a factory pipeline (jobs/factory_maintenance.py) on the keyed
fraud pipeline: compaction, VACUUM and log checkpoints of its outputs, progress log and
keyed state table, without breaking rewinds nor exactly-once output.

A variant of the fraud declaration compacts its keyed state every 2 batches and keeps the
newest 2 committed batches rewindable; three batches leave a small file per batch in each
output, and a compaction in the state table that removed the first two batches' files.
The job runs through Dagster with a VACUUM retention of 0 hours. Then, checked from the
Delta logs and the files on disk: outputs unchanged row for row, fewer files, a log
checkpoint, the state table's old files gone (fewer bytes on disk) but those of the
rewindable batches kept (time travel to them, what a rewind's RESTORE reads, gives the same
rows), and a later batch continues exactly (every alert equals the plain-Python reference).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
from dagster import DagsterInstance, DagsterRunStatus

from dagster_lakecast import EXCLUSIVE_TAG
from dagster_lakecast.declaration import CheckpointPolicy
from dagster_lakecast.handle import PipelineHandle
from dagster_lakecast.maintenance import declare_maintenance, factory_tables
from dagster_lakecast.resources import LakecastSparkResource, LakeResource
from examples.common import sorted_rows
from jobs.definitions import defs
from jobs.fraud.defs import (
    FRAUD,
    FRAUD_ALERTS,
    FRAUD_REJECTED,
    FRAUD_REVIEW,
    FRAUD_RULES,
    TRANSACTIONS,
)
from jobs.fraud.tables import append_transactions, write_rules
from lakecast.delta import io as delta_io
from lakecast.pipeline.progress import progress_path, read_log
from lakecast.runtime.executor import VERSION_COLUMN
from tests.jobs.test_fraud_pipeline import CARD_TEST, PROBE, batch_events, expected

FRAUD_H = PipelineHandle.resolve(FRAUD)

DECL = replace(FRAUD, name="fraudm", checkpoint=CheckpointPolicy(every=2, keep=2))
DECL_H = PipelineHandle.resolve(DECL)
OUTPUTS = (FRAUD_ALERTS, FRAUD_REVIEW, FRAUD_REJECTED)
OP = "maintain_fraudm_tables"
RULES = [CARD_TEST, PROBE]
STATE = "fraudm_keyed_state"


def _transactions(i: int) -> list[dict]:
    """Batch ``i``'s transactions: the fraud pipeline test's, and one invalid (rejected)."""
    bad = {"tx_id": 90_000 + i, "user_id": "u1", "amount": -1.0, "merchant": "m1",
           "ts": i * 600_000}
    return [*batch_events(i), bad]


def _outputs(spark, lake) -> dict[str, pd.DataFrame]:
    out = {}
    for t in OUTPUTS:
        df = delta_io.read(spark, lake.table_path(t)).toPandas()
        out[t] = df[sorted(df.columns)].sort_values(sorted(df.columns)).reset_index(drop=True)
    return out


def _data_files(path: str) -> list[Path]:
    """Parquet data files on disk (not the log)."""
    return [f for f in Path(path).rglob("*.parquet") if "_delta_log" not in f.parts]


def _state_rows(spark, path: str, version: int) -> list[tuple]:
    return sorted(tuple(r) for r in delta_io.read(spark, path, version=version).collect())


def _alerts(spark, lake) -> dict[str, list[dict]]:
    got = {}
    for name, t in (("block", FRAUD_ALERTS), ("review", FRAUD_REVIEW)):
        rows = [r.asDict() for r in delta_io.read(spark, lake.table_path(t)).collect()]
        for r in rows:
            r.pop(VERSION_COLUMN)
        got[name] = sorted_rows(rows)
    return got


def test_fraud_maintenance_compacts_vacuums_and_keeps_rewinds(spark, lake):
    write_rules(spark, lake.table_path(FRAUD_RULES), RULES)
    pipeline = DECL.build(spark, lake)
    batches = []
    for i in range(3):
        txs = _transactions(i)
        append_transactions(spark, lake.table_path(TRANSACTIONS), txs)
        batches.append((RULES, txs))
        (r,) = pipeline.run()
        assert r.plan.batch_id == i
    assert DECL.state_table == STATE
    state = lake.table_path(STATE)
    log_path = progress_path(lake.checkpoint_root, DECL.name)
    _, commits = read_log(log_path)
    kept = {b: commits[b].output_versions for b in (1, 2)}  # the 2 rewindable batches
    ops = [delta_io.commit_info(state, v).operation for v in range(kept[2][STATE] + 1)]
    assert len(ops) == 4, ops  # 3 appends, a compaction after the second
    want = _outputs(spark, lake)
    state_at = {b: _state_rows(spark, state, v[STATE]) for b, v in kept.items()}
    tables = factory_tables(DECL_H)
    files_before = {t.name: len(_data_files(t.path(lake))) for t in tables}
    state_bytes = sum(f.stat().st_size for f in _data_files(state))
    assert all(files_before[t] >= 3 for t in OUTPUTS), files_before  # a file per batch

    maintenance = declare_maintenance(DECL_H)
    assert maintenance.job.tags[EXCLUSIVE_TAG] == DECL_H.job_name
    with DagsterInstance.ephemeral() as instance:
        res = maintenance.job.execute_in_process(
            instance=instance, run_config={"ops": {OP: {"config": {"retention_hours": 0}}}},
            resources={"pyspark": LakecastSparkResource(), "lake": LakeResource()})
        assert res.success
        logs = [e.user_message or "" for e in instance.all_logs(res.run_id)]
    obs = {e.asset_observation_data.asset_observation.asset_key.to_user_string():
           e.asset_observation_data.asset_observation.metadata
           for e in res.all_events if e.event_type_value == "ASSET_OBSERVATION"}
    assert set(obs) == {t.name for t in tables} == {*OUTPUTS, "fraudm_keyed_state",
                                                    "fraudm_progress"}

    # outputs unchanged row for row; fewer files; a log checkpoint at the newest version
    for t in OUTPUTS:
        pd.testing.assert_frame_equal(_outputs(spark, lake)[t], want[t], check_dtype=False)
    for t in tables:
        path = t.path(lake)
        version = delta_io.latest_version(path)
        assert obs[t.name]["log_checkpoint_version"].value == version
        assert (Path(path) / "_delta_log" / f"{version:020d}.checkpoint.parquet").exists()
        live = len(delta_io.file_sizes(path, version))
        if t.name != DECL.state_table:  # small files compacted (the state table: compacted)
            assert live < files_before[t.name], (t.name, files_before[t.name], live)
    # the progress log is never rolled back: vacuumed at 0 h
    assert obs["fraudm_progress"]["files_vacuumed"].value > 0
    assert len(_data_files(log_path)) < files_before["fraudm_progress"]

    # the keyed state table: the files its compaction removed gone, the rewindable batches' kept
    meta = obs[DECL.state_table]
    assert meta["retention_clamped"].value is True and meta["retention_hours"].value == 0
    assert meta["files_vacuumed"].value >= 2  # batches 0 and 1's appends
    assert "every version since" in meta["retention"].value and "batch 1" in meta["retention"].value
    assert any(DECL.state_table in m and "shorter than rewinds need" in m for m in logs), logs
    assert sum(f.stat().st_size for f in _data_files(state)) < state_bytes
    for b, versions in kept.items():
        for f in delta_io.file_sizes(state, versions[STATE]):
            assert (Path(state) / f).exists(), (b, f)
        assert _state_rows(spark, state, versions[STATE]) == state_at[b]
        for t in OUTPUTS:  # the outputs' versions of those batches read too
            if t in versions:
                delta_io.read(spark, lake.table_path(t), version=versions[t]).count()

    # a later batch continues exactly: every alert equals the reference
    txs = _transactions(3)
    append_transactions(spark, lake.table_path(TRANSACTIONS), txs)
    batches.append((RULES, txs))
    (r,) = pipeline.run()
    assert r.plan.batch_id == 3
    plans, _ = read_log(log_path)
    reference = expected(batches, [p.planned_at_ms for p in plans])
    assert reference["block"] and reference["review"]
    assert _alerts(spark, lake) == {k: sorted_rows(v) for k, v in reference.items()
                                    if k in ("block", "review")}


def test_factory_maintenance_is_defined_and_takes_turns(lake, monkeypatch):
    """Every factory pipeline has a maintenance job and schedule with its micro-batch
    job's tag (the scheduled retention from LAKECAST_MAINTENANCE_RETENTION_HOURS); the job
    refuses to start while a micro-batch run of the pipeline writes."""
    from dagster import build_schedule_context
    from dagster._core.storage.dagster_run import DagsterRun

    job = defs.resolve_job_def(FRAUD_H.maintenance_job_name)
    assert job.tags[EXCLUSIVE_TAG] == FRAUD_H.job_name
    schedule = defs.resolve_schedule_def("fraud_maintenance")
    assert schedule.job_name == FRAUD_H.maintenance_job_name
    monkeypatch.setenv("LAKECAST_MAINTENANCE_RETENTION_HOURS", "5")
    (request,) = schedule.evaluate_tick(build_schedule_context()).run_requests
    assert request.run_config == {
        "ops": {"maintain_fraud_tables": {"config": {"retention_hours": 5}}}}
    with DagsterInstance.ephemeral() as instance:
        other = instance.add_run(DagsterRun(job_name=FRAUD_H.job_name,
                                            status=DagsterRunStatus.STARTED))
        res = job.execute_in_process(instance=instance, raise_on_error=False)
        assert not res.success
        (failure,) = [e for e in res.all_events if e.event_type_value == "STEP_FAILURE"]
        message = failure.step_failure_data.user_failure_data.description
        assert other.run_id in message and "one writer" in message
