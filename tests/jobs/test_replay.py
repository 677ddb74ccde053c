"""``lakecast replay``: committed batches of the enrichment pipeline re-run into a replay
table, at their original broadcast versions (an audit: exact match, or a mismatch once
the output is tampered with) and at today's (checked against an independent pandas
enrichment). One lake for the module: two batches over two broadcast versions, an event
held in the first and enriched in the second, then newer broadcast versions."""

from __future__ import annotations

import pandas as pd
import pytest

from jobs.enrichment_pipeline import ENRICHED_EVENTS, build_pipeline
from lakecast.config import get_settings
from lakecast.delta import io as delta_io
from lakecast.pipeline import replay as rp
from lakecast.tables import DIM_PRODUCTS, USER_SEGMENTS
from lakecast.tools import cli, flags
from lakecast.tools.replay_cli import MISMATCH
from tests.jobs import microbatch_lake as ml

REPLAY = f"{ENRICHED_EVENTS}_replay"
COLS = ["event_id", "user_id", "product_category", "product_price", "segment",
        "vip_discount_pct"]


def _products(*extra: tuple[int, str, str, float]) -> pd.DataFrame:
    rows = pd.DataFrame(extra, columns=["product_id", "name", "category", "price"])
    return pd.concat([ml.products(), rows], ignore_index=True)


@pytest.fixture(scope="module")
def replay_lake(spark, tmp_path_factory):
    """Batch 0 at products v0 / segments v1 / 10% (product 5 unknown: its events held);
    batch 1 at products v1 (product 5 added: the held events enriched) / segments v2 /
    25%; then products v2 (product 2's price) and 35%: the state a ``latest`` replay uses.
    Yields the settings and the two batches' events."""
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
        assert (a.product_id == 5).any() and (b.product_id == 5).any()
        pipeline = build_pipeline(spark, lake, 1, checkpoint_every=None)
        ml.write_events(spark, lake, a)
        assert [r.counts.get("held", 0) > 0 for r in pipeline.run()] == [True]
        products = lake.table_path(DIM_PRODUCTS)
        delta_io.merge_upsert(spark, spark.createDataFrame(_products((5, "p5", "garden", 50.0))),
                              products, keys=["product_id"])
        segs2 = pd.DataFrame({"user_id": [1, 5], "segment": ["CHURNING", "VIP"]})
        delta_io.merge_upsert(spark, spark.createDataFrame(segs2),
                              lake.table_path(USER_SEGMENTS), keys=["user_id"])
        flags.set_flag(spark, lake.table_path("feature_flags"), "vip_discount", "25")
        ml.write_events(spark, lake, b)
        [r] = pipeline.run()
        assert r.counts["held_retried"] > 0 and r.counts["held"] == 0
        today = _products((5, "p5", "garden", 50.0)).assign(
            price=lambda d: d.price.where(d.product_id != 2, 22.0))
        delta_io.merge_upsert(spark, spark.createDataFrame(today), products,
                              keys=["product_id"])
        flags.set_flag(spark, lake.table_path("feature_flags"), "vip_discount", "35")
        segs = pd.concat([ml.segments_v1()[lambda d: d.user_id != 1], segs2])
        yield lake, [a, b], today, segs


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


def test_latest_replay_is_an_enrichment_with_todays_tables(spark, replay_lake, capsys):
    lake, batches, today, segs = replay_lake
    assert cli.main(["replay", "enrichment", "--state", "latest", "--into", "what_if"]) == 0
    out = capsys.readouterr().out
    assert "dim_products@v2, feature_flags@v2, user_segments@v1" in out
    got = _read(spark, lake, "what_if")
    assert {ml.versions(v)["dim_products"] for v in got._state_version} == {2}
    prior, want = None, []
    for ev in batches:  # pandas, batch by batch (cross-batch dedup), today's tables
        o = ml.expected(ev, segs, 35.0, today, prior=prior)
        prior = pd.concat([prior, o["accepted"]]) if prior is not None else o["accepted"]
        assert o["unmatched"].empty  # product 5 is known today: nothing held
        want.append(o["enriched"])
    pd.testing.assert_frame_equal(_sorted(got, COLS), _sorted(pd.concat(want), COLS),
                                  check_dtype=False)
    assert (got.product_price == 22.0).any()


def test_versions_as_of_a_timestamp(spark, replay_lake):
    lake, _, _, _ = replay_lake
    pipeline = build_pipeline(spark, lake, 1, checkpoint_every=None)
    path = lake.table_path(DIM_PRODUCTS)
    at = delta_io.commit_info(path, 1).timestamp_ms
    when = pd.Timestamp(at, unit="ms", tz="UTC").to_pydatetime()
    assert rp.versions_at(pipeline, when)[DIM_PRODUCTS] == 1
    assert rp.fixed_state(pipeline, rp.LATEST) == {
        DIM_PRODUCTS: 2, USER_SEGMENTS: 1, "feature_flags": 2}
    with pytest.raises(rp.ReplayError, match="no version committed at or before"):
        rp.versions_at(pipeline, when.replace(year=2000))


def test_clear_errors(spark, replay_lake, capsys):
    cases = [
        (["nope"], "no pipeline 'nope' in jobs.registry (known: enrichment, fraud)"),
        (["enrichment", "--from", "5"], "--from 5 is not a committed batch (committed "
                                         "batches of 'enrichment': 0..1)"),
        (["enrichment", "--from", "1", "--to", "0"], "--from 1 is after --to 0"),
        (["enrichment", "--into", ENRICHED_EVENTS], "is a table of pipeline 'enrichment'"),
        (["enrichment", "--state", "yesterday"], "is not 'original', 'latest' or a timestamp"),
        (["fraud"], "pipeline 'fraud' is keyed"),
    ]
    for args, message in cases:
        assert cli.main(["replay", *args]) == 2, args
        assert message in capsys.readouterr().err


def test_tampered_output_is_a_mismatch(spark, replay_lake, capsys):
    lake, _, _, _ = replay_lake
    path = lake.table_path(ENRICHED_EVENTS)
    target = int(_read(spark, lake, ENRICHED_EVENTS).event_id.max())
    spark.sql(f"UPDATE {delta_io.table_ref(path)} SET product_price = 999.0 "
              f"WHERE event_id = {target}")
    assert cli.main(["replay", "enrichment", "--from", "1", "--to", "1"]) == MISMATCH
    out = capsys.readouterr().out
    assert ("MISMATCH: batches 1..1" in out and "0 original rows not reproduced, 0 replayed "
            "rows not in the original, 1 original rows changed or deleted" in out), out

