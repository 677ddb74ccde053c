"""``benchmarks.broadcast_enrichment`` (a) at a small scale on the test run's Spark: both
Lakecast executions and ``F.broadcast`` write the rows pandas computes from the same
inputs (every column), and the joins plan accounts for every event."""

from __future__ import annotations

import json
import shutil
import types
import uuid

import pandas as pd

from benchmarks import broadcast_enrichment as bench
from lakecast.config import get_settings
from lakecast.delta import io as delta_io

COLUMNS = ["event_id", "user_id", "product_id", "amount", "segment", "ltv", "name",
           "category", "price"]


def _rows(df: pd.DataFrame) -> pd.DataFrame:
    """``COLUMNS`` by event id, nulls as None (pandas NaN and Spark null alike)."""
    out = df[COLUMNS].sort_values("event_id").reset_index(drop=True).astype(object)
    return out.where(out.notna(), None)


def test_scenario_a_small_scale_sides_agree(spark, lake, monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    # keep the run's tables to compare them here (the benchmark removes them at the end)
    monkeypatch.setattr(bench, "shutil", types.SimpleNamespace(rmtree=lambda *a, **k: None))
    name = f"t-{uuid.uuid4().hex[:8]}"
    root = get_settings().project_root / "var" / "bench" / name
    try:
        out = bench.main(["--only", "a", "--scale", "0.01", "--repeats", "1", "--name", name])
        a = out["a"]
        assert a["results_identical"] is True
        assert len(a["joins_seconds"]) == len(a["lakecast_seconds"]) == len(
            a["bhj_seconds"]) == 1
        for key in ("lakecast_metrics", "joins_metrics"):
            assert a[key]["rows_in"] == 20_000
            assert a[key]["rows_main"] == 20_000
        # the joins plan holds no state; the JVM lookups' copy is measured there
        assert a["joins_metrics"]["state_bytes_per_task"] == 0 < a["lakecast_metrics"][
            "state_bytes_per_task"]
        # the tutorial's shape: lookups in the JVM, its transform after them, the same rows
        # as F.broadcast + Spark SQL (checked in the run) and as pandas (below)
        assert a["transform_results_identical"] is True
        assert "transform vectorized" in a["transform_metrics"]["state_engine_reason"]
        assert a["transform_metrics"]["rows_main"] == 20_000
        assert json.loads((tmp_path / f"{name}.json").read_text())["a"]["joins_ratio"] == (
            a["joins_ratio"])

        # pandas from the inputs: left joins, unknown users in segment NEW
        read = {n: delta_io.read(spark, str(root / n)).toPandas()
                for n in ("a_events", "a_users", "a_products", "a_out_lakecast",
                          "a_out_joins", "a_out_bhj", "a_out_transform")}
        want = (read["a_events"].merge(read["a_users"], on="user_id", how="left")
                .merge(read["a_products"], on="product_id", how="left"))
        want["segment"] = want["segment"].fillna("NEW")
        assert len(want) == 20_000 and want["name"].isna().any() and (
            want["segment"] == "NEW").any()
        for side in ("a_out_lakecast", "a_out_joins", "a_out_bhj", "a_out_transform"):
            pd.testing.assert_frame_equal(_rows(read[side]), _rows(want), obj=side)
        rate = want["segment"].map({"VIP": 0.2, "REGULAR": 0.05}).fillna(0.0)
        want_t = want.assign(amount_net=want["amount"] * (1.0 - rate),
                             vip=want["segment"].eq("VIP"))
        got_t = read["a_out_transform"].sort_values("event_id").reset_index(drop=True)
        want_t = want_t.sort_values("event_id").reset_index(drop=True)
        pd.testing.assert_series_equal(got_t["amount_net"], want_t["amount_net"],
                                       check_names=False)
        assert got_t["vip"].tolist() == want_t["vip"].tolist()
    finally:
        shutil.rmtree(root, ignore_errors=True)
