"""Held events in the micro-batch pipeline (issue 21, item 5), against a pandas model.

The enrichment holds an event whose product is not in ``dim_products`` yet; the pipeline
keeps it in ``enrichment_held`` and offers it again to each following batch, until a
version of ``dim_products`` has the product (then it is enriched with that version) or the
hold timeout (by plan time) sends it to ``enrichment_unmatched`` as ``hold_timeout``
(:mod:`lakecast.pipeline.held`). The model below computes every output independently
(pandas, :func:`tests.jobs.microbatch_lake.expected` per batch).
"""

from __future__ import annotations

import json
import signal
from datetime import timedelta

import pandas as pd

from assets.tables import DIM_PRODUCTS
from dagster_lakecast.checks import counts_reconcile, events_freshness
from dagster_lakecast.handle import PipelineHandle
from jobs.storefront.batch_metadata import result_metadata
from jobs.storefront.microbatch import ENRICHMENT_DECLARATION
from jobs.storefront.pipeline import (
    ENRICHED_EVENTS,
    ENRICHMENT_HELD,
    ENRICHMENT_REJECTED,
    ENRICHMENT_UNMATCHED,
    build_pipeline,
    summarize,
)
from lakecast.config import get_settings
from lakecast.delta import io as delta_io
from tests.jobs import microbatch_lake as ml

ENRICHMENT_DECLARATION_H = PipelineHandle.resolve(ENRICHMENT_DECLARATION)

ENRICH = ["event_id", "user_id", "product_category", "product_price", "segment",
          "vip_discount_pct"]
#: long enough for a test's batches: nothing expires
HOUR = timedelta(hours=1)
#: anything held by an earlier batch expires; what this batch holds does not
MOMENT = timedelta(milliseconds=1)


def _late(rows: list[tuple[int, int]]) -> pd.DataFrame:
    """Valid events ``(event_id, product_id)`` of user 1."""
    return pd.DataFrame({
        "event_id": [e for e, _ in rows], "user_id": 1.0, "product_id": [p for _, p in rows],
        "event_type": "view", "amount": 5.0, "event_time": "2026-01-02 10:00:00",
        "device": "web", "ingest_day": "2026-01-01",
    })  # fmt: skip


def _products(*ids: int) -> pd.DataFrame:
    """dim_products rows of products 5.. (the lake starts with 1..4)."""
    return pd.DataFrame({"product_id": list(ids), "name": [f"p{i}" for i in ids],
                         "category": [f"cat{i}" for i in ids],
                         "price": [10.0 * i for i in ids]})


def _steps() -> list[tuple[pd.DataFrame, pd.DataFrame, bool]]:
    """(events, dim_products, whether the events held by earlier batches expire) per batch.

    Batch 0: products 1..4; its events of product 5 (unknown) and 6 are held. Batch 1:
    product 5 arrives (dim_products v1): the held product-5 events are enriched; 6 and a
    new 7 stay held. Batch 2 (a 1 ms timeout): 6 and 7 expire; a new 8 is held."""
    first = pd.concat([ml.events(0, 30, seed=41), _late([(500, 6)])], ignore_index=True)
    second = pd.concat([ml.events(1000, 20, seed=42), _late([(1500, 7), (1501, 5)])],
                       ignore_index=True)
    third = pd.concat([ml.events(2000, 10, seed=43), _late([(2500, 8)])], ignore_index=True)
    with_5 = pd.concat([ml.products(), _products(5)], ignore_index=True)
    return [(first, ml.products(), False), (second, with_5, False), (third, with_5, True)]


def _model(steps: list[tuple[pd.DataFrame, pd.DataFrame, bool]]) -> dict[str, object]:
    """Every batch's outputs and counts, computed with pandas."""
    segs = ml.segments_v1()
    held = steps[0][0].iloc[0:0]
    enriched, unmatched, counts, held_ids = [], [], [], []
    for batch, (ev, prods, expire) in enumerate(steps):
        fresh = ml.expected(ev, segs, 10.0, prods)
        again = ml.expected(held, segs, 10.0, prods)
        for part in (fresh, again):
            enriched.append(part["enriched"].assign(batch=batch))
        still = held[held.event_id.isin(again["unmatched"].event_id)]
        unique = ev.drop_duplicates("event_id")
        new = unique[unique.event_id.isin(fresh["unmatched"].event_id)]
        expired = still if expire else still.iloc[0:0]
        unmatched.append(pd.DataFrame({"event_id": expired.event_id, "batch": batch}))
        retried = len(held)
        held = pd.concat([new, still.iloc[0:0] if expire else still], ignore_index=True)
        held_ids.append(sorted(held.event_id))
        counts.append({
            "events_in": len(ev), "rejected": len(fresh["rejected"]),
            "output": len(fresh["enriched"]) + len(again["enriched"]),
            "unmatched": len(expired), "held": len(held), "held_retried": retried,
            "held_expired": len(expired)})
    return {"enriched": pd.concat(enriched, ignore_index=True),
            "unmatched": pd.concat(unmatched, ignore_index=True),
            "counts": counts, "held": held_ids}


def _write_step(spark, lake, step: int, steps) -> None:
    """The lake before batch ``step``: dim_products gains product 5 before batch 1."""
    if step == 0:
        ml.build(spark, lake)
    if step == 1:
        delta_io.write(spark.createDataFrame(_products(5)), lake.table_path(DIM_PRODUCTS))
    ml.write_events(spark, lake, steps[step][0])


def _assert_outputs(spark, lake, want: dict[str, object], batches: int) -> None:
    """The output tables equal the model's first ``batches`` batches (values, the state
    version of every enriched event, the unmatched reasons, the held set)."""
    got = delta_io.read(spark, lake.table_path(ENRICHED_EVENTS)).toPandas()
    model = want["enriched"]
    model = model[model.batch < batches]
    pd.testing.assert_frame_equal(
        got[ENRICH].sort_values("event_id").reset_index(drop=True),
        model[ENRICH].sort_values("event_id").reset_index(drop=True), check_dtype=False)
    assert got.event_id.is_unique
    # each enriched event carries the dim_products version of the batch that enriched it:
    # v0 in batch 0, v1 (product 5's arrival) after
    versions = {e: json.loads(v)[DIM_PRODUCTS] for e, v in zip(got.event_id,
                                                               got._state_version, strict=True)}
    assert versions == {e: min(b, 1) for e, b in zip(model.event_id, model.batch, strict=True)}
    unmatched = delta_io.read(spark, lake.table_path(ENRICHMENT_UNMATCHED)).toPandas()
    expired = want["unmatched"]
    assert sorted(unmatched.event_id) == sorted(expired[expired.batch < batches].event_id)
    assert set(unmatched._unmatched_reason) <= {"hold_timeout"}
    held = delta_io.read(spark, lake.table_path(ENRICHMENT_HELD)).toPandas()
    assert sorted(held.event_id) == want["held"][batches - 1]
    rejected = delta_io.read(spark, lake.table_path(ENRICHMENT_REJECTED)).toPandas()
    assert len(rejected) == sum(c["rejected"] for c in want["counts"][:batches])


def test_held_event_is_enriched_when_its_product_arrives_or_expires(spark, lake):
    """Batches 0 and 1 take the small-batch path (collected, delta-rs writes); batch 2 runs
    with a 1 ms timeout, at another parallelism (the held set does not depend on it) and
    on the large-batch path (Spark counts and writes, the held events collected)."""
    steps = _steps()
    want = _model(steps)
    results = []
    pipeline = build_pipeline(spark, lake, 1, hold_timeout=HOUR)
    for step in range(3):
        _write_step(spark, lake, step, steps)
        if step == 2:
            pipeline = build_pipeline(spark, lake, 1, hold_timeout=MOMENT, parallelism=2)
            pipeline.collect_max_rows = 0
        (result,) = pipeline.run()
        results.append(result)

    for result, counts in zip(results, want["counts"], strict=True):
        c = result.counts
        assert {k: c[k] for k in counts} == counts, (result.plan.batch_id, c)
        assert c["events_in"] + c["held_retried"] == (
            c["output"] + c["unmatched"] + c["rejected"] + c["held"])
    # the case spelled out: 500 (product 6) held in batch 0, expired in batch 2; 1500
    # (product 7) held in batch 1, expired in batch 2; 2500 (product 8) held in batch 2
    assert want["held"][-1] == [2500]
    assert sorted(want["unmatched"].event_id) == [500, 1500]
    _assert_outputs(spark, lake, want, 3)
    held = delta_io.read(spark, lake.table_path(ENRICHMENT_HELD)).toPandas()
    assert list(held._held_batch_id) == [2]
    # what batch 1 released is enriched with dim_products v1, which has its product
    released = set(ml.expected(steps[0][0], ml.segments_v1(), 10.0)["unmatched"].event_id)
    released -= {500}
    enriched = delta_io.read(spark, lake.table_path(ENRICHED_EVENTS)).toPandas()
    assert released and released <= set(enriched.event_id)
    row = enriched[enriched.event_id == min(released)].iloc[0]
    assert (row.product_category, json.loads(row._state_version)[DIM_PRODUCTS]) == ("cat5", 1)

    # the Dagster metadata and the run totals carry the held counts
    meta = result_metadata(lake, results[2])[ENRICHMENT_UNMATCHED]
    assert {k: meta[k] for k in ("held", "held_retried", "held_expired", "unmatched")} == {
        "held": 1, "held_retried": 2, "held_expired": 2, "unmatched": 2}
    totals = summarize(results)
    assert (totals["held"], totals["held_expired"]) == (1, 2)
    assert totals["held_retried"] == sum(c["held_retried"] for c in want["counts"])

    # the factory's checks of the enrichment hold with held events re-offered (events in +
    # held retried = processed + rejected), against the model's counts and rows
    passed, problems, check = counts_reconcile(ENRICHMENT_DECLARATION_H, lake)
    assert passed, problems
    assert check["events_in"] == sum(c["events_in"] for c in want["counts"])
    assert check["rejected"] == sum(c["rejected"] for c in want["counts"])
    rows = {t: v["rows"] for t, v in check["tables"].value.items()}
    assert rows == {ENRICHED_EVENTS: len(want["enriched"]),
                    ENRICHMENT_UNMATCHED: len(want["unmatched"]),
                    ENRICHMENT_REJECTED: sum(c["rejected"] for c in want["counts"])}
    fresh, problem, _ = events_freshness(ENRICHMENT_DECLARATION_H, lake)
    assert fresh, problem


def test_timeout_zero_sends_held_events_to_unmatched_at_once(spark, lake):
    """The default (LAKECAST_HOLD_TIMEOUT unset): nothing is held past its batch; the
    unknown products' events are unmatched as missing_state, as before holds existed."""
    steps = _steps()[:1]
    _write_step(spark, lake, 0, steps)
    (result,) = build_pipeline(spark, lake, 1).run()
    fresh = ml.expected(steps[0][0], ml.segments_v1(), 10.0)
    c = result.counts
    assert (c["held"], c["held_retried"], c["held_expired"]) == (0, 0, 0)
    assert c["unmatched"] == len(fresh["unmatched"]) > 0
    unmatched = delta_io.read(spark, lake.table_path(ENRICHMENT_UNMATCHED)).toPandas()
    assert sorted(unmatched.event_id) == sorted(fresh["unmatched"].event_id)
    assert set(unmatched._unmatched_reason) == {"missing_state"}
    assert not delta_io.table_exists(lake.table_path(ENRICHMENT_HELD))  # never written


def test_redo_after_kill_reoffers_what_the_first_attempt_saw(spark, lake, monkeypatch,
                                                            server_url):
    """kill -9 after batch 1 wrote every output, its new held set included: the redo (by
    this process) reads the held set as of batch 0's commit (not the attempt's), so the
    outputs equal a clean run's."""
    monkeypatch.setenv("LAKECAST_HOLD_TIMEOUT", "1h")
    settings = get_settings()
    steps = _steps()[:2]
    want = _model(steps)
    _write_step(spark, settings, 0, steps)
    (first,) = build_pipeline(spark, settings, 1).run()
    assert first.counts["held"] == len(want["held"][0]) > 1
    recorded = first.output_versions[ENRICHMENT_HELD]
    _write_step(spark, settings, 1, steps)

    # the attempt: a client of the test run's Spark server, killed between Spark actions
    assert ml.run_microbatch("outputs_written:1", remote=server_url) == -signal.SIGKILL
    path = settings.table_path(ENRICHMENT_HELD)
    assert delta_io.latest_version(path) == recorded + 1  # the attempt's held set landed
    (redo,) = build_pipeline(spark, settings, 1).run()
    assert redo.redone and redo.plan.batch_id == 1
    assert delta_io.latest_version(path) == recorded + 1  # the redo's write was skipped
    assert {k: redo.counts[k] for k in want["counts"][1]} == want["counts"][1]
    _assert_outputs(spark, settings, want, 2)
