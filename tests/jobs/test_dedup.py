"""Exactly once per ``event_id`` across micro-batches (issue 18), against the pandas model.

A valid event whose ``event_id`` an earlier committed batch accepted (enriched or
unmatched) within the retention goes to ``enrichment_rejected`` as ``duplicate_event_id``
(:mod:`lakecast.pipeline.dedup`); on both write paths, with the Spark lookup, across a
crash and its redo, and in the Dagster job's metadata.
"""

from __future__ import annotations

import json
import signal
from dataclasses import replace
from datetime import timedelta

import pandas as pd
import pytest
from dagster import materialize

from dagster_lakecast.resources import LakecastSparkResource, LakeResource
from jobs.storefront.batch_metadata import result_metadata
from jobs.storefront.microbatch import enrichment_microbatch_assets
from jobs.storefront.pipeline import (
    ENRICHED_EVENTS,
    ENRICHMENT_REJECTED,
    ENRICHMENT_UNMATCHED,
    build_pipeline,
)
from lakecast.config import get_settings
from lakecast.delta import io as delta_io
from lakecast.pipeline.dedup import DedupLookup
from tests.jobs import microbatch_lake as ml

ENRICH = ["event_id", "user_id", "product_category", "product_price", "segment",
          "vip_discount_pct"]


def _outputs(spark, lake) -> dict[str, pd.DataFrame]:
    """The three output tables (a table no batch wrote to: empty)."""
    got = {t: delta_io.read(spark, lake.table_path(t)).toPandas()
           if delta_io.table_exists(lake.table_path(t))
           else pd.DataFrame({"event_id": [], "reason": [], "raw_record": [], "batch_id": []})
           for t in (ENRICHED_EVENTS, ENRICHMENT_UNMATCHED, ENRICHMENT_REJECTED)}
    rej = got[ENRICHMENT_REJECTED]
    rej["event_id"] = [json.loads(r)["event_id"] for r in rej.raw_record]
    return got


def _sorted(df: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    return df[cols].sort_values(cols).reset_index(drop=True)


def _assert_outputs(got: dict[str, pd.DataFrame], want: dict[str, pd.DataFrame],
                    unique: bool = True) -> None:
    """Every output equals the pandas model; each event is in exactly one output
    (``unique=False``: an id may be accepted again once its first copy left the
    retention)."""
    pd.testing.assert_frame_equal(_sorted(got[ENRICHED_EVENTS], ENRICH),
                                  _sorted(want["enriched"], ENRICH), check_dtype=False)
    assert sorted(got[ENRICHMENT_UNMATCHED].event_id) == sorted(want["unmatched"].event_id)
    pd.testing.assert_frame_equal(
        _sorted(got[ENRICHMENT_REJECTED], ["event_id", "reason"]),
        _sorted(want["rejected"], ["event_id", "reason"]), check_dtype=False)
    accepted = pd.concat([got[ENRICHED_EVENTS].event_id, got[ENRICHMENT_UNMATCHED].event_id])
    assert accepted.is_unique or not unique
    assert sorted(accepted) == sorted(want["accepted"].event_id)


def _frame(rows: list[tuple[int, str]], user: int = 2, product: int = 1) -> pd.DataFrame:
    """Valid events ``(event_id, event_time)`` of one user and product."""
    return pd.DataFrame({
        "event_id": [e for e, _ in rows], "user_id": float(user), "product_id": product,
        "event_type": "view", "amount": 5.0, "event_time": [t for _, t in rows],
        "device": "web", "ingest_day": "2026-01-01",
    })  # fmt: skip


def _copies_batches() -> list[pd.DataFrame]:
    """Batch 0: 40 events (some malformed, one in-batch duplicate). Batch 1: 30 new events
    and copies of batch-0 events: a malformed one (still rejected for its format), an
    enriched or unmatched one each once, and one twice (one copy an in-batch duplicate)."""
    first = ml.events(0, 40, seed=21)
    copies = first.iloc[[1, 5, 6, 7, 8, 9, 9, 12]]
    return [first, pd.concat([ml.events(1000, 30, seed=22), copies], ignore_index=True)]


@pytest.mark.parametrize("path", ["collected", "distributed", "spark_lookup"])
def test_a_copy_of_an_event_an_earlier_batch_accepted_is_rejected(spark, lake, path):
    ml.build(spark, lake)
    batches = _copies_batches()
    for frame in batches:
        ml.write_events(spark, lake, frame)  # events versions 0 and 1: one batch each
    pipeline = build_pipeline(spark, lake, 1)
    if path == "distributed":
        pipeline.collect_max_rows = 0  # counted and written by Spark jobs
    if path == "spark_lookup":  # the lookup for tables Lakecast cannot read itself
        pipeline.dedup = DedupLookup(spark, pipeline.spec.dedup, lake.table_path,
                                     pipeline.spec.events_table, pipeline.dedup.tables,
                                     direct_reads=False)
    results = pipeline.run()
    want = ml.expected_batches(batches, ml.segments_v1(), 10.0)

    assert [r.counts["cross_batch_duplicates"] for r in results] == list(
        want["cross_batch"].n)
    assert results[1].counts["cross_batch_duplicates"] == 6
    for r in results:
        c = r.counts
        assert c["events_in"] == c["output"] + c["unmatched"] + c["rejected"]
    found = results[1].dedup  # the watermark: the newest event time batch 0 accepted
    newest = ml.expected(batches[0], ml.segments_v1(), 10.0)["accepted"].ts.max()
    assert found["watermark"] == newest.tz_localize("UTC").isoformat()
    assert found["keys_found"] == (-1 if path == "spark_lookup" else 6)
    got = _outputs(spark, lake)
    _assert_outputs(got, want)
    # the rejected copy carries the raw event (with the parsed event_ts)
    rej = got[ENRICHMENT_REJECTED]
    row = rej[(rej.batch_id == 1) & (rej.event_id == 7)].iloc[0]
    raw = json.loads(row.raw_record)
    source = batches[0].iloc[7]
    assert row.reason == "duplicate_event_id"
    assert (raw["user_id"], raw["product_id"], raw["amount"], raw["event_time"]) == (
        source.user_id, source.product_id, source.amount, source.event_time)
    assert raw["event_ts"].startswith(source.event_time.replace(" ", "T"))


@pytest.mark.parametrize("retention", ["7d", "9d"])
def test_retention_by_event_time(spark, lake, monkeypatch, retention):
    """A copy is a duplicate while the earlier copy is retained (its time within the
    retention of the newest accepted time) and within the retention of the copy's time;
    else it is accepted again. The retention comes from LAKECAST_DEDUP_RETENTION."""
    monkeypatch.setenv("LAKECAST_DEDUP_RETENTION", retention)
    settings = get_settings()
    ml.build(spark, settings)
    batches = [
        _frame([(1, "2026-01-01 10:00:00"), (2, "2026-01-01 10:00:00"),
                (3, "2026-01-01 10:00:00"), (4, "2026-01-05 12:00:00")]),
        # 1: 8 days after its first copy; 2: 6 days after; 10 moves the watermark to 01-12
        _frame([(1, "2026-01-09 10:00:00"), (2, "2026-01-07 10:00:00"),
                (10, "2026-01-12 10:00:00")]),
        # 3: 11 days older than the newest accepted event (01-12): too late to check,
        # rejected as such; 4: 6.9 days older, still retained; 10: a plain copy
        _frame([(3, "2026-01-01 10:00:00"), (4, "2026-01-05 12:00:00"),
                (10, "2026-01-12 10:00:00")]),
    ]
    for frame in batches:
        ml.write_events(spark, settings, frame)
    results = build_pipeline(spark, settings, 1).run()
    assert len(results) == 3
    days = pd.Timedelta(days=int(retention[:-1]))
    want = ml.expected_batches(batches, ml.segments_v1(), 10.0, retention=days)
    assert [r.counts["cross_batch_duplicates"] for r in results] == list(
        want["cross_batch"].n)
    assert [r.counts["too_late_to_deduplicate"] for r in results] == list(want["late"].n)
    # the cases, spelled out (7 days: 1 again, 2 dup; 3 too late, 4 dup, 10 dup;
    # 9 days: 1 dup too, and 3 still too late: 01-01 is 11 days behind the watermark)
    assert list(want["cross_batch"].n) == ([0, 1, 2] if retention == "7d" else [0, 2, 2])
    assert list(want["late"].n) == [0, 0, 1]
    _assert_outputs(_outputs(spark, settings), want, unique=retention != "7d")


def test_redo_of_a_crashed_batch_with_copies_equals_a_clean_run(spark, lake, server_url):
    """kill -9 after batch 1 wrote its main output (then after all its outputs): the
    redo looks up the outputs as of batch 0's commit, not its own partial writes. The runs
    are clients of the test run's Spark server (the kills fall between Spark actions)."""
    ml.build(spark, lake)
    batches = _copies_batches()
    for frame in batches:
        ml.write_events(spark, lake, frame)
    assert ml.run_microbatch("main_written:1", remote=server_url) == -signal.SIGKILL
    assert delta_io.latest_version(lake.table_path(ENRICHED_EVENTS)) == 1  # batch 1's main
    assert ml.run_microbatch("outputs_written:1", remote=server_url) == -signal.SIGKILL
    assert ml.run_microbatch(remote=server_url) == 0
    want = ml.expected_batches(batches, ml.segments_v1(), 10.0)
    _assert_outputs(_outputs(spark, lake), want)
    pipeline = build_pipeline(spark, lake)
    _, commit = pipeline.log.last_committed()
    assert commit is not None and commit.counts["cross_batch_duplicates"] == 6


def test_dagster_metadata_shows_cross_batch_duplicates(spark, lake):
    ml.build(spark, lake)
    batches = _copies_batches()
    resources = {"pyspark": LakecastSparkResource(), "lake": LakeResource()}
    seen = []
    for frame in batches:
        ml.write_events(spark, lake, frame)
        res = materialize([enrichment_microbatch_assets], resources=resources)
        assert res.success
        meta = {m.asset_key.to_user_string(): m.materialization.metadata
                for m in res.get_asset_materialization_events()}
        seen.append(meta[ENRICHMENT_REJECTED]["cross_batch_duplicates"].value)
        assert meta[ENRICHED_EVENTS]["run_cross_batch_duplicates"].value == seen[-1]
    assert seen == [0, 6]
    _assert_outputs(_outputs(spark, lake), ml.expected_batches(batches, ml.segments_v1(), 10.0))


def test_retention_is_per_pipeline_too(spark, lake):
    """build_pipeline(dedup_retention=...) overrides the settings' retention."""
    ml.build(spark, lake)
    batches = [_frame([(1, "2026-01-01 10:00:00")]), _frame([(1, "2026-01-02 10:00:00")])]
    for frame in batches:
        ml.write_events(spark, lake, frame)
    pipeline = build_pipeline(spark, lake, 1, dedup_retention=timedelta(hours=12))
    assert pipeline.spec.dedup is not None
    assert pipeline.spec.dedup.retention == timedelta(hours=12)
    results = pipeline.run()
    assert [r.counts["cross_batch_duplicates"] for r in results] == [0, 0]  # a day apart
    want = ml.expected_batches(batches, ml.segments_v1(), 10.0,
                               retention=pd.Timedelta(hours=12))
    _assert_outputs(_outputs(spark, lake), want, unique=False)


@pytest.mark.parametrize("path", ["collected", "distributed"])
def test_a_copy_older_than_the_horizon_is_rejected_as_too_late(spark, lake, path):
    """The issue-43 case: event 1 accepted, then a copy of it whose time is older than the
    newest accepted time minus the retention (7 days): rejected as
    ``too_late_to_deduplicate``, counted per batch and in the Dagster metadata; event 3,
    new but as old, too; event 4 within the horizon is accepted."""
    ml.build(spark, lake)
    batches = [
        _frame([(1, "2026-01-01 10:00:00"), (2, "2026-01-20 10:00:00")]),
        _frame([(1, "2026-01-01 10:00:00"), (3, "2026-01-02 10:00:00"),
                (4, "2026-01-13 10:00:01")]),
    ]
    for frame in batches:
        ml.write_events(spark, lake, frame)
    pipeline = build_pipeline(spark, lake, 1)
    if path == "distributed":
        pipeline.collect_max_rows = 0
    results = pipeline.run()
    assert [r.counts["too_late_to_deduplicate"] for r in results] == [0, 2]
    assert [r.counts["cross_batch_duplicates"] for r in results] == [0, 0]
    assert results[1].dedup["horizon"] == "2026-01-13T10:00:00+00:00"
    want = ml.expected_batches(batches, ml.segments_v1(), 10.0)
    assert list(want["late"].n) == [0, 2]
    got = _outputs(spark, lake)
    _assert_outputs(got, want)  # event 1 once: no second enriched row
    rej = got[ENRICHMENT_REJECTED]
    assert sorted(zip(rej.event_id, rej.reason, strict=True)) == [
        (1, "too_late_to_deduplicate"), (3, "too_late_to_deduplicate")]
    meta = result_metadata(get_settings(), results[1])
    assert {a: m["too_late_to_deduplicate"] for a, m in meta.items()} == {
        a: 2 for a in (ENRICHED_EVENTS, ENRICHMENT_UNMATCHED, ENRICHMENT_REJECTED)}
    assert meta[ENRICHED_EVENTS]["dedup_horizon"] == "2026-01-13T10:00:00+00:00"


def test_accept_late_processes_the_late_copy_again(spark, lake):
    """``DedupSpec.accept_late``: the late copy is accepted unchecked — the documented
    risk: two enriched rows with one event_id (what pandas computes with accept_late)."""
    ml.build(spark, lake)
    batches = [_frame([(1, "2026-01-01 10:00:00"), (2, "2026-01-20 10:00:00")]),
               _frame([(1, "2026-01-01 10:00:00")])]
    for frame in batches:
        ml.write_events(spark, lake, frame)
    pipeline = build_pipeline(spark, lake, 1)
    pipeline.dedup = DedupLookup(spark, replace(pipeline.spec.dedup, accept_late=True),
                                 lake.table_path, pipeline.spec.events_table,
                                 pipeline.dedup.tables)
    results = pipeline.run()
    assert [r.counts["too_late_to_deduplicate"] for r in results] == [0, 0]
    want = ml.expected_batches(batches, ml.segments_v1(), 10.0, accept_late=True)
    got = _outputs(spark, lake)
    _assert_outputs(got, want, unique=False)
    assert sorted(got[ENRICHED_EVENTS].event_id) == [1, 1, 2]
