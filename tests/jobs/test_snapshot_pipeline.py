"""Broadcast state checkpoints of the enrichment pipeline: content, dedup, diff, restore."""

from __future__ import annotations

import pandas as pd

from jobs.microbatch import build_pipeline
from lakecast import delta_io, flags
from lakecast.snapshot_runtime import snapshot_path
from lakecast.snapshots import SnapshotStore
from lakecast.tables import DIM_PRODUCTS, USER_SEGMENTS
from tests.jobs import microbatch_lake as ml


def _store(spark, lake) -> SnapshotStore:
    return SnapshotStore(spark, snapshot_path(lake, "enrichment"), "enrichment")


def _frame(table) -> pd.DataFrame:
    return table.to_pandas().sort_values(table.column_names[0]).reset_index(drop=True)


def test_checkpoint_per_batch_holds_the_state_once_and_diffs(spark, lake):
    ml.build(spark, lake)
    ml.write_events(spark, lake, ml.events(0, 30, seed=1))
    pipeline = build_pipeline(spark, lake, parallelism=4)
    (r0,) = pipeline.run()
    store = _store(spark, lake)
    (h0,) = store.headers()
    assert (h0.checkpoint_id, h0.batch_id, h0.events_end, h0.parallelism) == (0, 0, 0, 4)
    assert h0.state_version == {"dim_products": 0, "feature_flags": 0, "user_segments": 0}
    manifest = store.manifest(0)
    assert sorted({m.task for m in manifest}) == [0, 1, 2, 3]
    for s in h0.states:  # every task holds the same content ...
        assert len({m.content_hash for m in manifest if m.state == s}) == 1
    # ... stored once: entry rows = one copy of each state
    counts = store.entry_counts(0)
    n_one_copy = sum(m.n_entries for m in manifest if m.task == 0)
    assert sum(c for c, _ in counts.values()) == n_one_copy == 4 + 4 + 1
    # the checkpointed content equals the tables (independent: pandas)
    restored = store.resolve(0, parallelism=4)
    assert restored is not None and restored.assignment == {0: 0, 1: 1, 2: 2, 3: 3}
    prods = _frame(restored.contents[DIM_PRODUCTS][1])
    want = ml.products()[["product_id", "category", "price"]]
    pd.testing.assert_frame_equal(prods, want, check_dtype=False)
    segs = _frame(restored.contents[USER_SEGMENTS][1])
    pd.testing.assert_frame_equal(segs, ml.segments_v1(), check_dtype=False)
    # each checkpoint is one Delta version
    assert store.delta_versions() == {0: delta_io.latest_version(store.path)}

    # broadcast changes, next batch: a second checkpoint, and the diff names the keys
    segs2 = pd.DataFrame({"user_id": [1, 5], "segment": ["CHURNING", "VIP"]})
    delta_io.merge_upsert(spark, spark.createDataFrame(segs2), lake.table_path(USER_SEGMENTS),
                          keys=["user_id"])
    flags.set_flag(spark, lake.table_path("feature_flags"), "vip_discount", "25")
    ml.write_events(spark, lake, ml.events(100, 20, seed=2))
    (r1,) = pipeline.run()
    assert [h.checkpoint_id for h in store.headers()] == [0, 1]
    assert store.delta_versions() == {0: 0, 1: 1}
    d = store.diff(0, 1)
    assert d[USER_SEGMENTS] == {"added": ["5"], "removed": [], "changed": ["1"]}
    assert d["feature_flags"]["changed"] == ['"vip_discount"']
    assert d[DIM_PRODUCTS] == {"added": [], "removed": [], "changed": []}
    # time travel reaches the first checkpoint as it was committed
    old = delta_io.read(spark, store.path, version=0).where("kind = 'checkpoint'").count()
    assert old == 1
    summ = store.summaries()
    assert [s.complete for s in summ] == [True, True]
    assert all(s.stored_bytes and s.stored_bytes > 0 for s in summ)
