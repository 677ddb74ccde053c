"""Broadcast versions are validated before they touch task state (issue 18, 21.4, 21.6).

Each bad version (duplicate key, null key, dropped column, malformed flag) is refused: the
state and the outputs stay at the last good version (checked against a pandas reference),
the refusal is recorded in the plan and reported, and a later good version is applied
whole (its changes since the last good version were written against a table the state
never held).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import replace

import pandas as pd
import pytest
from dagster import materialize

from assets import flags
from assets.tables import DIM_PRODUCTS, USER_SEGMENTS
from dagster_lakecast.resources import LakecastSparkResource, LakeResource
from jobs.storefront.enrichment import FEATURE_FLAGS, StorefrontEnrichment, validate_events
from jobs.storefront.microbatch import (
    ENRICHED_EVENTS,
    ENRICHMENT,
    ENRICHMENT_UNMATCHED,
    broadcast_versions_accepted,
    build_pipeline,
    enrichment_microbatch_assets,
)
from lakecast.api.contracts import BroadcastVersionRefused
from lakecast.build import broadcast_pipeline
from lakecast.delta import io as delta_io
from tests import ROOT as PROJECT_ROOT
from tests.jobs import microbatch_lake as ml
from tests.runs import remote_env

COLS = ["event_id", "user_id", "product_category", "product_price", "segment",
        "vip_discount_pct"]
PRODUCTS_SCHEMA = "product_id LONG, name STRING, category STRING, price DOUBLE"


def _overwrite(spark, lake, frame: pd.DataFrame, schema: str = PRODUCTS_SCHEMA) -> int:
    df = spark.createDataFrame(list(frame.itertuples(index=False, name=None)), schema)
    df.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(
        lake.table_path(DIM_PRODUCTS))
    return delta_io.latest_version(lake.table_path(DIM_PRODUCTS))


def _append_product(spark, lake, row: tuple) -> int:
    df = spark.createDataFrame([row], PRODUCTS_SCHEMA)
    return delta_io.write(df, lake.table_path(DIM_PRODUCTS))


def _outputs(spark, lake, first_id: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Enriched and unmatched rows of the events ``first_id .. first_id + 999``."""
    out = []
    for table in (ENRICHED_EVENTS, ENRICHMENT_UNMATCHED):
        df = delta_io.read(spark, lake.table_path(table)).toPandas()
        out.append(df[(df.event_id >= first_id) & (df.event_id < first_id + 1000)])
    return out[0], out[1]


def _assert_outputs(spark, lake, first_id, ev, prods, segs, pct, state) -> None:
    """Exact outputs against the pandas reference, and the lineage of every row."""
    enriched, unmatched = _outputs(spark, lake, first_id)
    want = ml.expected(ev, segs, pct, prods)
    got = enriched[COLS].sort_values("event_id").reset_index(drop=True)
    exp = want["enriched"][COLS].sort_values("event_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, exp, check_dtype=False)
    assert sorted(unmatched.event_id) == sorted(want["unmatched"].event_id)
    assert {tuple(sorted(ml.versions(v).items())) for v in enriched["_state_version"]} == {
        tuple(sorted(state.items()))}


def _batch(spark, lake, pipeline, first_id, seed):
    ev = ml.events(first_id, 30, seed=seed)
    ml.write_events(spark, lake, ev)
    (result,) = pipeline.run()
    return ev, result


def test_bad_versions_are_refused_and_the_last_good_state_keeps_enriching(spark, lake):
    segs = ml.segments_v1()
    v0 = ml.products()
    ml.build(spark, lake)  # dim_products v0, user_segments v0, feature_flags v0 (10%)
    pipeline = build_pipeline(spark, lake, checkpoint_every=1)
    ev, r = _batch(spark, lake, pipeline, 0, seed=1)
    assert r.state_version == {DIM_PRODUCTS: 0, USER_SEGMENTS: 0, FEATURE_FLAGS: 0}
    assert (r.refused_versions, r.full_reloads) == ([], [])

    # v1: a second row for product 1 (category changed) -> refused; through Dagster
    assert _append_product(spark, lake, (1, "p1", "garden", 10.0)) == 1
    ev1 = ml.events(1000, 30, seed=2)
    ml.write_events(spark, lake, ev1)
    res = materialize([enrichment_microbatch_assets, broadcast_versions_accepted],
                      resources={"pyspark": LakecastSparkResource(), "lake": LakeResource()})
    assert res.success
    dup_reason = ("dim_products@v1: 1 duplicate key(s): product_id=1 (2 rows); write a "
                  "version of dim_products with one row per product_id")
    refused_v1 = [{"table": DIM_PRODUCTS, "version": 1, "reasons": [dup_reason]}]
    meta = {m.asset_key.to_user_string(): m.materialization.metadata
            for m in res.get_asset_materialization_events()}
    assert meta[ENRICHED_EVENTS]["refused_versions"].value == refused_v1
    (check,) = res.get_asset_check_evaluations()
    assert check.check_name == "broadcast_versions_accepted" and not check.passed
    assert check.metadata["refused_versions"].value == refused_v1
    assert check.description == dup_reason
    _assert_outputs(spark, lake, 1000, ev1, v0, segs, 10.0,
                    {DIM_PRODUCTS: 0, USER_SEGMENTS: 0, FEATURE_FLAGS: 0})
    plans, _ = pipeline.log.state()
    assert plans[1].refused == refused_v1  # recorded in the progress log
    assert plans[1].broadcast_versions[DIM_PRODUCTS] == 0

    # v2 fixes it by deleting the extra row: applied whole (v1's insert was never applied,
    # so v2's delete of that row, applied as a change, would drop product 1 from the state)
    delta_io.delete(spark, lake.table_path(DIM_PRODUCTS),
                    "product_id = 1 AND category = 'garden'")
    assert delta_io.latest_version(lake.table_path(DIM_PRODUCTS)) == 2
    ev2, r = _batch(spark, lake, pipeline, 2000, seed=3)
    assert r.state_version[DIM_PRODUCTS] == 2 and r.refused_versions == []
    (reload,) = r.full_reloads
    assert (reload["table"], reload["version"]) == (DIM_PRODUCTS, 2)
    assert "refused version(s) [1] lie between the applied v0 and v2" in reload["reason"]
    _assert_outputs(spark, lake, 2000, ev2, v0, segs, 10.0,
                    {DIM_PRODUCTS: 2, USER_SEGMENTS: 0, FEATURE_FLAGS: 0})
    v2 = v0.assign(category=["garden", "toys", "home", "music"])  # the next versions' base
    assert _overwrite(spark, lake, v2) == 3

    # v3 (good: product 1 is now garden) and v4, a null key -> refused: state at v3
    assert _append_product(spark, lake, (None, "p9", "misc", 9.0)) == 4
    ev3, r = _batch(spark, lake, pipeline, 3000, seed=4)
    null_reason = ("dim_products@v4: 1 row(s) with a null key (product_id); write a version "
                   "of dim_products without null product_id")
    assert r.refused_versions == [{"table": DIM_PRODUCTS, "version": 4,
                                   "reasons": [null_reason]}]
    _assert_outputs(spark, lake, 3000, ev3, v2, segs, 10.0,
                    {DIM_PRODUCTS: 3, USER_SEGMENTS: 0, FEATURE_FLAGS: 0})

    # v5: overwritten without `category` -> refused (v4 is still refused too)
    assert _overwrite(spark, lake, v2.drop(columns=["category"]),
                      "product_id LONG, name STRING, price DOUBLE") == 5
    ev4, r = _batch(spark, lake, pipeline, 4000, seed=5)
    col_reason = ("dim_products@v5: column(s) 'category' missing from the table's schema (the "
                  "function uses them); write a version of dim_products that has column(s) "
                  "'category'")
    assert r.refused_versions == [
        {"table": DIM_PRODUCTS, "version": 4, "reasons": [null_reason]},
        {"table": DIM_PRODUCTS, "version": 5, "reasons": [col_reason]}]
    _assert_outputs(spark, lake, 4000, ev4, v2, segs, 10.0,
                    {DIM_PRODUCTS: 3, USER_SEGMENTS: 0, FEATURE_FLAGS: 0})

    # a malformed flag (feature_flags v1) and a good dim_products v6; a restarted process
    # (cold start from the checkpoint at dim_products v3) catches up across v4, v5 whole
    flags.set_flag(spark, lake.table_path(FEATURE_FLAGS), "vip_discount", "ten")
    v6 = v2.assign(price=[11.0, 22.0, 33.0, 44.0])
    assert _overwrite(spark, lake, v6) == 6
    restarted = build_pipeline(spark, lake, checkpoint_every=1)
    ev5, r = _batch(spark, lake, restarted, 5000, seed=6)
    flag_reason = ("feature_flags@v1: flag='vip_discount' has value='ten', not a percent from "
                   "0 to 100; write a version of feature_flags whose vip_discount value is a "
                   "number (e.g. `lakecast flag set vip_discount 10`)")
    assert r.refused_versions == [{"table": FEATURE_FLAGS, "version": 1,
                                   "reasons": [flag_reason]}]
    assert [(f["table"], f["version"]) for f in r.full_reloads] == [(DIM_PRODUCTS, 6)]
    assert "refused version(s) [4, 5]" in r.full_reloads[0]["reason"]
    _assert_outputs(spark, lake, 5000, ev5, v6, segs, 10.0,  # the discount stays at 10%
                    {DIM_PRODUCTS: 6, USER_SEGMENTS: 0, FEATURE_FLAGS: 0})

    # a good flag (v2) is applied (whole: v1 was never applied)
    flags.set_flag(spark, lake.table_path(FEATURE_FLAGS), "vip_discount", "30")
    ev6, r = _batch(spark, lake, restarted, 6000, seed=7)
    assert r.refused_versions == []
    assert [(f["table"], f["version"]) for f in r.full_reloads] == [(FEATURE_FLAGS, 2)]
    _assert_outputs(spark, lake, 6000, ev6, v6, segs, 30.0,
                    {DIM_PRODUCTS: 6, USER_SEGMENTS: 0, FEATURE_FLAGS: 2})
    # every event is in exactly one output, once
    total = sum(delta_io.read(spark, lake.table_path(t)).count()
                for t in (ENRICHED_EVENTS, ENRICHMENT_UNMATCHED, "enrichment_rejected"))
    assert total == sum(len(e) for e in (ev, ev1, ev2, ev3, ev4, ev5, ev6))


def test_policy_fail_stops_the_batch_before_anything_is_written(spark, lake):
    fn = StorefrontEnrichment()
    fn.lookups[0] = replace(fn.lookups[0], on_invalid="fail")  # dim_products: fail

    def build():
        return broadcast_pipeline(spark, ENRICHMENT, fn, table_path=lake.table_path,
                                  checkpoint_root=lake.checkpoint_root,
                                  validator=validate_events, timestamp_column="event_ts")

    ml.build(spark, lake)
    pipeline = build()
    _batch(spark, lake, pipeline, 0, seed=11)
    _append_product(spark, lake, (2, "p2", "garden", 20.0))  # v1: product 2 twice
    ev1 = ml.events(1000, 30, seed=12)
    ml.write_events(spark, lake, ev1)
    before = {t: delta_io.latest_version(lake.table_path(t)) for t in pipeline.output_tables}
    with pytest.raises(BroadcastVersionRefused) as err:
        pipeline.run()
    msg = str(err.value)
    assert "policy 'fail' (dim_products@v1); nothing was planned or written" in msg
    assert ("dim_products@v1: 1 duplicate key(s): product_id=2 (2 rows); write a version of "
            "dim_products with one row per product_id") in msg
    assert {t: delta_io.latest_version(lake.table_path(t))
            for t in pipeline.output_tables} == before
    plans, _ = pipeline.log.state()
    assert [p.batch_id for p in plans] == [0] and pipeline.log.pending() is None

    v2 = ml.products().assign(category=["books", "garden", "home", "music"])
    _overwrite(spark, lake, v2)  # the fix: the same batch now runs at v2
    (r,) = build().run()
    assert r.state_version[DIM_PRODUCTS] == 2
    _assert_outputs(spark, lake, 1000, ev1, v2, ml.segments_v1(), 10.0,
                    {DIM_PRODUCTS: 2, USER_SEGMENTS: 0, FEATURE_FLAGS: 0})


def test_a_table_absent_at_plan_time_stays_absent_in_the_redo(spark, lake, server_url):
    """21.6: feature_flags is created between a crash and the redo of the batch."""
    from lakecast.delta.io import write

    write(spark.createDataFrame(ml.products()), lake.table_path(DIM_PRODUCTS))
    write(spark.createDataFrame(ml.segments_v1()), lake.table_path(USER_SEGMENTS))
    ev = ml.events(0, 40, seed=21)
    ml.write_events(spark, lake, ev)
    # the crashed run: a client of the test run's Spark server, killed after its plan
    env = remote_env(server_url, LAKECAST_CRASH_AT="planned:0")
    proc = subprocess.run([sys.executable, "-m", "jobs.storefront.microbatch"], cwd=PROJECT_ROOT,
    env=env,
                          capture_output=True, text=True, timeout=600, start_new_session=True)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    pipeline = build_pipeline(spark, lake, checkpoint_every=1)
    first = pipeline.log.pending()
    assert first is not None and first.broadcast_versions == {DIM_PRODUCTS: 0,
                                                              USER_SEGMENTS: 0}

    flags.set_flag(spark, lake.table_path(FEATURE_FLAGS), "vip_discount", "25")
    (r,) = pipeline.run()
    assert r.redone and r.plan == first
    assert r.state_version == {DIM_PRODUCTS: 0, USER_SEGMENTS: 0}
    # the first attempt's plan had no flag: no discount, whatever the table holds now
    _assert_outputs(spark, lake, 0, ev, ml.products(), ml.segments_v1(), 0.0,
                    {DIM_PRODUCTS: 0, USER_SEGMENTS: 0})
    enriched, _ = _outputs(spark, lake, 0)
    assert enriched.event_id.is_unique
