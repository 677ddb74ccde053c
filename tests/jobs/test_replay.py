"""``lakecast replay``: committed batches of the enrichment pipeline re-run into a replay
table, at their original broadcast versions (an audit: exact match, or a mismatch once
the output is tampered with) and at the newest ones (checked against an independent
pandas enrichment). One lake for the module: two batches over two broadcast versions,
product-5 events held in the first and enriched in the second."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from assets import flags
from assets.tables import DIM_PRODUCTS, USER_SEGMENTS
from jobs.storefront.pipeline import ENRICHED_EVENTS, build_pipeline
from lakecast.config import get_settings
from lakecast.delta import io as delta_io
from lakecast.replay import batches as rp
from lakecast.tools import cli
from lakecast.tools.replay_cli import MISMATCH
from tests.jobs import microbatch_lake as ml

REPLAY = f"{ENRICHED_EVENTS}_replay"
COLS = ["event_id", "user_id", "product_category", "product_price", "segment",
        "vip_discount_pct"]


@pytest.fixture(scope="module")
def replay_lake(spark, tmp_path_factory):
    """Batch 0 at products v0 / segments v0 / 10% (product 5 unknown: its events held);
    batch 1 at products v1 (product 5 added: the held events enriched) / segments v1 (user
    5 VIP) / 25%, the newest versions. Yields the settings, the two batches' events and the
    newest products and segments. (Small appends with delta-rs: a Spark MERGE costs ~2 s.)"""
    root = tmp_path_factory.mktemp("replay")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAKECAST_LAKE_ROOT", str(root / "lake"))
        mp.setenv("LAKECAST_CHECKPOINT_ROOT", str(root / "checkpoints"))
        mp.setenv("DAGSTER_HOME", str(root / "dagster_home"))
        mp.setenv("LAKECAST_HOLD_TIMEOUT", "1d")
        lake = get_settings()
        lake.ensure_local_dirs()
        ml.build(spark, lake)
        a, b = ml.events(0, 24, seed=1), ml.events(1000, 24, seed=2)
        pipeline = build_pipeline(spark, lake, 1, checkpoint_every=None)
        ml.write_events(spark, lake, a)
        assert [r.counts.get("held", 0) > 0 for r in pipeline.run()] == [True]
        p5 = pd.DataFrame({"product_id": [5], "name": ["p5"], "category": ["garden"],
                           "price": [50.0]})
        u5 = pd.DataFrame({"user_id": [5], "segment": ["VIP"]})
        for frame, table in ((p5, DIM_PRODUCTS), (u5, USER_SEGMENTS)):
            delta_io.append_arrow(pa.Table.from_pandas(frame, preserve_index=False),
                                  lake.table_path(table))
        flags.set_flag(spark, lake.table_path("feature_flags"), "vip_discount", "25")
        ml.write_events(spark, lake, b)
        [r] = pipeline.run()
        assert r.state_version == {DIM_PRODUCTS: 1, USER_SEGMENTS: 1, "feature_flags": 1}
        assert r.counts["held_retried"] > 0 and r.counts["held"] == 0
        yield (lake, [a, b], pd.concat([ml.products(), p5]),
               pd.concat([ml.segments_v1(), u5]))


def _read(spark, lake, table: str) -> pd.DataFrame:
    return delta_io.read(spark, lake.table_path(table)).toPandas()


def _sorted(df: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    return df[cols].sort_values("event_id").reset_index(drop=True)


def test_original_replay_reproduces_the_output_exactly(spark, replay_lake, capsys):
    lake, _, _, _ = replay_lake
    assert cli.main(["replay", "enrichment", "--state", "original"]) == 0
    out = capsys.readouterr().out
    assert "batch 0: events v0..v0" in out and "batch 1: events v1..v1" in out
    assert "MATCH: batches 0..1" in out and "0 original rows not reproduced" in out
    # independently: every column, lineage included, row for row
    original = _read(spark, lake, ENRICHED_EVENTS)
    replayed = _read(spark, lake, REPLAY)
    assert set(replayed[rp.REPLAY_BATCH]) == {0, 1}
    cols = list(original.columns)
    pd.testing.assert_frame_equal(_sorted(replayed, cols), _sorted(original, cols))
    # the held product-5 events were enriched by batch 1, at products v1
    p5 = replayed[replayed.product_id == 5]
    assert len(p5) and set(p5[rp.REPLAY_BATCH]) == {1}
    assert {ml.versions(v)["dim_products"] for v in p5._state_version} == {1}


def test_latest_replay_is_an_enrichment_with_the_newest_tables(spark, replay_lake, capsys):
    lake, batches, newest, segs = replay_lake
    assert cli.main(["replay", "enrichment", "--state", "latest", "--into", "what_if"]) == 0
    out = capsys.readouterr().out
    assert "dim_products@v1, feature_flags@v1, user_segments@v1" in out
    got = _read(spark, lake, "what_if")
    assert set(got[rp.REPLAY_BATCH]) == {0, 1}
    assert {ml.versions(v)["dim_products"] for v in got._state_version} == {1}
    prior, want = None, []
    for ev in batches:  # pandas, batch by batch (cross-batch dedup), the newest tables
        o = ml.expected(ev, segs, 25.0, newest, prior=prior)
        prior = pd.concat([prior, o["accepted"]]) if prior is not None else o["accepted"]
        assert o["unmatched"].empty  # product 5 is known now: nothing held
        want.append(o["enriched"])
    pd.testing.assert_frame_equal(_sorted(got, COLS), _sorted(pd.concat(want), COLS),
                                  check_dtype=False)
    # batch 0 differs from what it wrote: product 5 enriched at once, 25% for VIPs
    first = got[got[rp.REPLAY_BATCH] == 0]
    assert (first.product_id == 5).any() and (first.vip_discount_pct == 25.0).any()


def test_versions_as_of_a_timestamp(spark, replay_lake):
    lake, _, _, _ = replay_lake
    pipeline = build_pipeline(spark, lake, 1, checkpoint_every=None)
    path = lake.table_path(DIM_PRODUCTS)
    at = delta_io.commit_info(path, 1).timestamp_ms
    when = pd.Timestamp(at, unit="ms", tz="UTC").to_pydatetime()
    assert rp.versions_at(pipeline, when)[DIM_PRODUCTS] == 1
    # feature_flags v0 came last: then every table was at v0 (a naive timestamp is UTC)
    v0 = delta_io.commit_info(lake.table_path("feature_flags"), 0).timestamp_ms
    naive = str(pd.Timestamp(v0, unit="ms"))
    assert rp.fixed_state(pipeline, naive) == {
        DIM_PRODUCTS: 0, USER_SEGMENTS: 0, "feature_flags": 0}
    assert rp.fixed_state(pipeline, rp.LATEST) == {
        DIM_PRODUCTS: 1, USER_SEGMENTS: 1, "feature_flags": 1}
    with pytest.raises(rp.ReplayError, match="no version committed at or before"):
        rp.versions_at(pipeline, when.replace(year=2000))


def test_clear_errors(spark, replay_lake, capsys):
    cases = [
        (["nope"], "no pipeline 'nope' in jobs.registry (known: enrichment, fraud, scoring)"),
        (["enrichment", "--from", "5"], "--from 5 is not a committed batch (committed "
                                         "batches of 'enrichment': 0..1)"),
        (["enrichment", "--from", "1", "--to", "0"], "--from 1 is after --to 0"),
        (["enrichment", "--into", ENRICHED_EVENTS], "is a table of pipeline 'enrichment'"),
        (["enrichment", "--state", "yesterday"], "is not 'original', 'latest' or a timestamp"),
        (["fraud"], "pipeline 'fraud' has no committed batches yet: run it first"),
    ]
    for args, message in cases:
        assert cli.main(["replay", *args]) == 2, args
        assert message in capsys.readouterr().err


def test_tampered_output_is_a_mismatch(spark, replay_lake, capsys):
    lake, _, _, _ = replay_lake
    path = lake.table_path(ENRICHED_EVENTS)
    target = int(_read(spark, lake, ENRICHED_EVENTS).event_id.max())
    DeltaTable(path).update(predicate=f"event_id = {target}",  # (delta-rs: no Spark job)
                            updates={"product_price": "999.0"})
    assert cli.main(["replay", "enrichment", "--from", "1", "--to", "1"]) == MISMATCH
    out = capsys.readouterr().out
    assert ("MISMATCH: batches 1..1" in out and "0 original rows not reproduced, 0 replayed "
            "rows not in the original, 1 original rows changed or deleted" in out), out

