"""The sharded_state benchmark at a small scale: its three sides agree row for row and
each Lakecast task reads one shard."""

from __future__ import annotations

from benchmarks.sharded_state import run


def test_sharded_state_small_scale_sides_agree(spark, lake, tmp_path):
    out = run(spark, tmp_path / "bench", n_dim=5000, shards=3, n_batches=3, batch_events=600)
    assert out["results_identical"] is True
    assert out["shards_per_task_max"] == 1
    assert out["state_bytes_per_task_over_share"] < 1.5
    assert out["checkpoint"]["distinct_contents"] >= 1 and out["checkpoint_over_delta_write"] > 0
    assert set(out["median_warm_batch_s"]) == {"lakecast", "shuffle_join", "stream_static"}
