"""The enrichment micro-batch job: end to end across two broadcast versions, exactly once."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from dagster import materialize

from assets import flags
from assets.tables import USER_SEGMENTS
from dagster_lakecast.handle import PipelineHandle
from dagster_lakecast.recompute import recompute_sample
from dagster_lakecast.resources import LakecastSparkResource, LakeResource
from jobs.storefront.enrichment import StorefrontEnrichment
from jobs.storefront.microbatch import (
    ENRICHED_EVENTS,
    ENRICHMENT_DECLARATION,
    ENRICHMENT_REJECTED,
    ENRICHMENT_UNMATCHED,
    build_pipeline,
    enrichment_microbatch_assets,
)
from jobs.storefront.pipeline import ENRICHMENT
from lakecast import BroadcastTestHarness, read_broadcast_elements
from lakecast.delta import io as delta_io
from lakecast.pipeline.micro_batch import ReconciliationError
from lakecast.snapshots.checkpointer import snapshot_path
from tests.jobs import microbatch_lake as ml

ENRICHMENT_DECLARATION_H = PipelineHandle.resolve(ENRICHMENT_DECLARATION)


def _read(spark, lake, table: str) -> pd.DataFrame:
    return delta_io.read(spark, lake.table_path(table)).toPandas()


def _check(got: pd.DataFrame, want: pd.DataFrame, cols: list[str]) -> None:
    g = got[cols].sort_values("event_id").reset_index(drop=True)
    w = want[cols].sort_values("event_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(g, w, check_dtype=False)


#: a batch's phases, in order (BatchResult.phases)
PHASES = ("plan", "read", "state", "job", "check", "write", "commit", "after_commit")


def test_end_to_end_across_two_broadcast_versions(spark, lake):
    ml.build(spark, lake)
    batch1 = ml.events(0, 60, seed=1)
    ml.write_events(spark, lake, batch1)

    # batch 0 through Dagster: the job's assets, materialized for real
    res = materialize(
        [enrichment_microbatch_assets],
        resources={"pyspark": LakecastSparkResource(), "lake": LakeResource()},
    )
    assert res.success
    mats = res.get_asset_materialization_events()
    meta = {m.asset_key.to_user_string(): m.materialization.metadata for m in mats}
    assert set(meta) == {ENRICHED_EVENTS, ENRICHMENT_UNMATCHED, ENRICHMENT_REJECTED}
    want1 = ml.expected(batch1, ml.segments_v1(), 10.0)
    assert meta[ENRICHED_EVENTS]["events_in"].value == len(batch1)
    assert meta[ENRICHED_EVENTS]["dagster/row_count"].value == len(want1["enriched"])
    assert meta[ENRICHMENT_REJECTED]["dagster/row_count"].value == len(want1["rejected"])
    assert meta[ENRICHED_EVENTS]["state_budget_bytes"].value == 100 * 1024 * 1024
    assert meta[ENRICHED_EVENTS]["state_over_budget"].value is False
    # the batch's time, phase by phase: each phase timed once, in order, adding up to it
    phases = {k[len("phase_"):-len("_seconds")]: v.value for k, v in meta[ENRICHED_EVENTS].items()
              if k.startswith("phase_")}
    assert list(phases) == list(PHASES) and min(phases.values()) >= 0
    assert abs(meta[ENRICHED_EVENTS]["batch_seconds"].value - sum(
        v for k, v in phases.items() if k != "after_commit")) < 0.01
    # the batch's state metadata, each against what it describes
    m = {k: v.value for k, v in meta[ENRICHED_EVENTS].items()}
    tables = {t: lake.table_path(t) for t in ENRICHMENT.broadcast_tables}
    # the state version: the broadcast tables' Delta versions (all at their first one)
    assert m["state_version"] == {t: delta_io.latest_version(p) for t, p in tables.items()} \
        == {"dim_products": 0, "user_segments": 0, "feature_flags": 0}
    # a new pipeline: a cold task applies one full element per table (a task that follows
    # one in the same Python worker finds the state there and applies nothing)
    assert 1 <= m["cold_tasks"] <= m["parallelism"]
    assert m["broadcast_updates_applied"] == len(tables) * m["cold_tasks"]
    # state bytes per task: the same three versions applied in this process
    elements = read_broadcast_elements(spark, tables, {})
    harness = BroadcastTestHarness(StorefrontEnrichment(),
                                   table_schemas={e.table: e.schema for e in elements})
    harness.process_broadcast_elements(elements)
    assert harness.state_version == m["state_version"]
    assert m["state_bytes_per_task"] == harness.executor.store.nbytes() > 0
    # the first batch of a pipeline is checkpointed: its bytes are its files' sizes on disk
    assert m["checkpoint_id"] == 0
    files = list(Path(snapshot_path(lake, ENRICHMENT.name)).glob("checkpoint_id=0/*.parquet"))
    assert files and m["checkpoint_stored_bytes"] == sum(f.stat().st_size for f in files)

    # broadcast side changes: segments v2 (user 1 VIP -> CHURNING, user 5 appears), flag 25%
    segs2 = pd.DataFrame({"user_id": [1, 5], "segment": ["CHURNING", "VIP"]})
    delta_io.merge_upsert(spark, spark.createDataFrame(segs2), lake.table_path(USER_SEGMENTS),
                          keys=["user_id"])  # fmt: skip
    flags.set_flag(spark, lake.table_path("feature_flags"), "vip_discount", "25")
    batch2 = ml.events(1000, 50, seed=2)
    ml.write_events(spark, lake, batch2)

    pipeline = build_pipeline(spark, lake)
    # batch 0 was small: collected and written with delta-rs; batch 1 takes the path of a
    # large batch (Spark counts and writes): both must give the pandas reference
    pipeline.collect_max_rows = 0
    results = pipeline.run()
    assert [r.plan.batch_id for r in results] == [1]
    r = results[0]
    assert r.state_version == {"dim_products": 0, "user_segments": 1, "feature_flags": 1}
    assert list(r.phases) == list(PHASES)  # the Spark path times the same phases
    assert abs(r.seconds - sum(v for k, v in r.phases.items() if k != "after_commit")) < 0.01
    assert r.counts["events_in"] == len(batch2)
    assert r.counts["events_in"] == r.counts["output"] + r.counts["unmatched"] + r.counts[
        "rejected"]
    assert pipeline.run() == []  # caught up: nothing runs twice

    segs_v2 = pd.concat([ml.segments_v1()[lambda d: d.user_id != 1], segs2])
    want2 = ml.expected(batch2, segs_v2, 25.0)
    enriched = _read(spark, lake, ENRICHED_EVENTS)
    enriched["v"] = enriched["_state_version"].map(ml.versions)
    first = enriched[enriched.event_id < 1000]
    second = enriched[enriched.event_id >= 1000]
    # lineage: earlier events keep v1, later ones were enriched with v2
    assert {tuple(sorted(v.items())) for v in first.v} == {
        (("dim_products", 0), ("feature_flags", 0), ("user_segments", 0))}
    assert {v["user_segments"] for v in second.v} == {1}
    cols = ["event_id", "user_id", "product_category", "product_price", "segment",
            "vip_discount_pct"]
    _check(first, want1["enriched"], cols)
    _check(second, want2["enriched"], cols)
    unmatched = _read(spark, lake, ENRICHMENT_UNMATCHED)
    assert sorted(unmatched.event_id) == sorted(
        pd.concat([want1["unmatched"], want2["unmatched"]]).event_id)
    rejected = _read(spark, lake, ENRICHMENT_REJECTED)
    want_rej = pd.concat([want1["rejected"], want2["rejected"]])
    got_rej = rejected.assign(event_id=rejected.raw_record.map(
        lambda s: pd.read_json(__import__("io").StringIO(f"[{s}]")).event_id[0]))
    _check(got_rej, want_rej, ["event_id", "reason"])
    # each raw record is the event as validated: its non-null fields in the events' column
    # order, then the parsed time; never the reason column
    order = [*ml.EVENT_COLUMNS, "event_ts"]
    for raw in rejected.raw_record:
        keys = list(json.loads(raw))
        assert keys == [c for c in order if c in keys] and "event_id" in keys, raw
    # every input row is in exactly one output
    assert len(enriched) + len(unmatched) + len(rejected) == len(batch1) + len(batch2)
    assert enriched.event_id.is_unique

    # output_sample_recomputed on the enrichment: every row (fewer than the bound) of both
    # batches recomputes in the harness at its batch's versions; one row changed on disk fails
    sample = recompute_sample(ENRICHMENT_DECLARATION_H, spark, lake)
    assert sample.passed, sample.description
    assert sample.metadata["rows_matched"] == sample.metadata["rows_sampled"] == len(enriched)
    assert sample.metadata["batches_covered"].value == [0, 1]
    changed = int(second.event_id.iloc[0])
    spark.sql(f"UPDATE delta.`{lake.table_path(ENRICHED_EVENTS)}` SET segment = 'X' "
              f"WHERE event_id = {changed}")
    bad = recompute_sample(ENRICHMENT_DECLARATION_H, spark, lake)
    assert not bad.passed and [(m.batch_id, m.column, m.actual) for m in bad.mismatches] == [
        (1, "segment", "X")]
    assert f"event_id={changed}" in bad.description, bad.description


def test_failed_batch_writes_nothing_and_is_redone_with_its_plan(spark, lake, monkeypatch):
    ml.build(spark, lake)
    ml.write_events(spark, lake, ml.events(0, 30, seed=3))
    pipeline = build_pipeline(spark, lake)

    def broken(events, plan):
        raise RuntimeError("task failure")

    monkeypatch.setattr(pipeline.runtime, "process_batch", broken)
    with pytest.raises(RuntimeError, match="task failure"):
        pipeline.run()
    assert delta_io.latest_version(lake.table_path(ENRICHED_EVENTS)) is None
    plan = pipeline.log.pending()
    assert plan is not None and plan.batch_id == 0

    # more events arrive meanwhile; the redo keeps its plan, the new events get the next batch
    ml.write_events(spark, lake, ml.events(500, 20, seed=4))
    monkeypatch.undo()
    results = pipeline.run()
    assert [(r.plan.batch_id, r.redone) for r in results] == [(0, True), (1, False)]
    assert results[0].plan == plan
    assert results[0].counts["events_in"] == 31 and results[1].counts["events_in"] == 21
    enriched = _read(spark, lake, ENRICHED_EVENTS)
    assert enriched.event_id.is_unique


def test_counts_must_reconcile(spark, lake, monkeypatch):
    ml.build(spark, lake)
    ml.write_events(spark, lake, ml.events(0, 20, seed=5))
    pipeline = build_pipeline(spark, lake)
    real = pipeline.runtime.process_batch

    def lossy(events, plan):
        return real(events.limit(3), plan)  # silently drops rows: must not commit

    monkeypatch.setattr(pipeline.runtime, "process_batch", lossy)
    with pytest.raises(ReconciliationError, match="nothing was written"):
        pipeline.run()
    assert pipeline.log.pending() is not None
    for table in (ENRICHED_EVENTS, ENRICHMENT_UNMATCHED, ENRICHMENT_REJECTED):
        assert delta_io.latest_version(lake.table_path(table)) is None
    monkeypatch.undo()  # the redo writes everything, once
    (result,) = pipeline.run()
    assert result.redone and result.counts["events_in"] == 21
    total = sum(delta_io.read(spark, lake.table_path(t)).count()
                for t in (ENRICHED_EVENTS, ENRICHMENT_UNMATCHED, ENRICHMENT_REJECTED))
    assert total == 21


def test_a_second_process_planning_the_same_batch_is_refused(spark, lake):
    from lakecast.pipeline.micro_batch import ConcurrentRunError
    from lakecast.pipeline.progress import BatchPlan

    ml.build(spark, lake)
    ml.write_events(spark, lake, ml.events(0, 10, seed=6))
    other = build_pipeline(spark, lake)
    # another process already logged batch 0 with a different plan (an older events version)
    other.log.write_plan(BatchPlan(0, -1, 0, {"dim_products": 0}))
    ml.write_events(spark, lake, ml.events(100, 10, seed=7))
    mine = build_pipeline(spark, lake)
    with pytest.raises(ConcurrentRunError, match="planned by another process"):
        mine.run_batch(BatchPlan(0, -1, 1, {"dim_products": 0}))
    assert delta_io.latest_version(lake.table_path(ENRICHED_EVENTS)) is None


def test_rewritten_events_table_is_a_clear_error_not_duplicates(spark, lake):
    from assets.tables import EVENTS
    from lakecast.pipeline.micro_batch import AppendOnlyError

    ml.build(spark, lake)
    ml.write_events(spark, lake, ml.events(0, 10, seed=8))
    pipeline = build_pipeline(spark, lake)
    assert len(pipeline.run()) == 1
    events = delta_io.read(spark, lake.table_path(EVENTS))
    delta_io.write(events, lake.table_path(EVENTS), mode="overwrite")  # a rewrite, not an append
    for _ in range(2):  # the error, and again on a retry: nothing is written either time
        with pytest.raises(AppendOnlyError, match="append-only"):
            pipeline.run()
    # the outputs are exactly batch 0's: the rewritten rows are in no output a second time
    want = ml.expected(ml.events(0, 10, seed=8), ml.segments_v1(), 10.0)
    enriched = _read(spark, lake, ENRICHED_EVENTS)
    assert enriched.event_id.is_unique
    v0 = {"dim_products": 0, "feature_flags": 0, "user_segments": 0}
    assert all(ml.versions(v) == v0 for v in enriched["_state_version"])
    _check(enriched, want["enriched"], ["event_id", "user_id", "product_category",
                                        "product_price", "segment", "vip_discount_pct"])
    assert want["unmatched"].empty  # (no unknown product in these events)
    unmatched = (_read(spark, lake, ENRICHMENT_UNMATCHED)
                 if delta_io.latest_version(lake.table_path(ENRICHMENT_UNMATCHED)) is not None
                 else want["unmatched"])
    assert unmatched.empty
    rejected = _read(spark, lake, ENRICHMENT_REJECTED)
    got_rej = rejected.assign(event_id=rejected.raw_record.map(
        lambda s: pd.read_json(__import__("io").StringIO(f"[{s}]")).event_id[0]))
    key = ["event_id", "reason"]
    pd.testing.assert_frame_equal(got_rej[key].sort_values(key).reset_index(drop=True),
                                  want["rejected"][key].sort_values(key).reset_index(drop=True),
                                  check_dtype=False)
    assert len(enriched) + len(unmatched) + len(got_rej) == 11


def test_state_over_budget_is_a_warning_check_not_a_warning_per_batch(spark, lake):
    """A run over its state budget: every batch's metadata says so, and the state_budget
    check WARNs with the numbers and the fix; no Python warning reaches the terminal."""
    import warnings

    from dagster import AssetCheckSeverity

    from jobs.storefront.microbatch import state_budget
    from lakecast.runtime.metrics import StateBudgetWarning, reset_budget_warnings

    reset_budget_warnings()
    ml.build(spark, lake)
    for i in range(3):  # three events versions, one batch each
        ml.write_events(spark, lake, ml.events(100 * i, 20, seed=i))
    config = {"ops": {"enrichment_microbatch_assets": {"config": {
        "state_budget_bytes": 1, "max_versions_per_batch": 1}}}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = materialize(
            [enrichment_microbatch_assets, state_budget], run_config=config,
            resources={"pyspark": LakecastSparkResource(), "lake": LakeResource()},
        )
    assert res.success
    batches = [m.materialization.metadata for m in res.get_asset_materialization_events()
               if m.asset_key.to_user_string() == ENRICHED_EVENTS]
    assert len(batches) == 3, batches
    assert all(b["state_over_budget"].value for b in batches), [
        {k: b[k].value for k in ("state_bytes_per_task", "parallelism", "state_budget_bytes")}
        for b in batches]
    (check,) = res.get_asset_check_evaluations()
    assert check.check_name == "state_budget" and not check.passed
    assert check.severity == AssetCheckSeverity.WARN
    figures = {k: v.value for k, v in check.metadata.items()}
    assert figures["state_budget_bytes"] == 1 and figures["parallelism"] >= 1
    assert figures["state_bytes_total"] == figures["state_bytes_per_task"] * figures[
        "parallelism"] > 1
    assert figures["batch_id"] == 2
    assert "exceeds the budget" in check.description and "lower the parallelism" in (
        check.description)
    budget_warnings = [str(w.message) for w in caught
                       if issubclass(w.category, StateBudgetWarning)]
    # the run leaves the budget to the check: no Python warning at all (the engine alone
    # warns once per process: tests/lakecast/test_engine_spark.py)
    assert not budget_warnings, budget_warnings
