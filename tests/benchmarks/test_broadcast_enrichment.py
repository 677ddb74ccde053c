"""``benchmarks.broadcast_enrichment`` (a) at a small scale on the test run's Spark: both
Lakecast executions and ``F.broadcast`` write the same rows, and the joins plan accounts
for every event."""

from __future__ import annotations

import json

from benchmarks import broadcast_enrichment as bench


def test_scenario_a_small_scale_sides_agree(spark, lake, monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    out = bench.main(["--only", "a", "--scale", "0.01", "--repeats", "1", "--name", "t"])
    a = out["a"]
    assert a["results_identical"] is True
    assert len(a["joins_seconds"]) == len(a["lakecast_seconds"]) == len(a["bhj_seconds"]) == 1
    for key in ("lakecast_metrics", "joins_metrics"):
        assert a[key]["rows_in"] == 20_000
        assert a[key]["rows_main"] == 20_000
    assert a["joins_metrics"]["cold_tasks"] == 0
    assert json.loads((tmp_path / "t.json").read_text())["a"]["joins_ratio"] == a["joins_ratio"]
