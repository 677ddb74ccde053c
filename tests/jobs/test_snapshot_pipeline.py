"""Broadcast state checkpoints of the enrichment pipeline, end to end.

Two lakes get the same inputs. Run A never rescales and never checkpoints. Run B
checkpoints every batch and restarts with parallelism 2 -> 4 -> 1 (each restart is a
cold runtime that restores from the newest complete checkpoint; the last one after a
failed batch), then is rewound to checkpoint 1 with the CLI and rerun. After both, the
outputs of A and B are identical: no duplicates, nothing missing.

Damaged checkpoint files (bytes overwritten, a file deleted, a file truncated) are skipped
on restore, in-process and over Spark Connect; every output row then equals a pandas
reference of the same inputs, with the lineage its batch must record.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from assets import flags
from assets.tables import DIM_PRODUCTS, USER_SEGMENTS
from jobs.storefront.batch_metadata import result_metadata
from jobs.storefront.enrichment import StorefrontEnrichment
from jobs.storefront.microbatch import (
    ENRICHED_EVENTS,
    ENRICHMENT_REJECTED,
    ENRICHMENT_UNMATCHED,
    build_pipeline,
)
from jobs.storefront.pipeline import ENRICHMENT
from lakecast import BroadcastTestHarness, read_broadcast_elements
from lakecast.config import get_settings
from lakecast.delta import io as delta_io
from lakecast.snapshots.checkpointer import snapshot_path
from lakecast.snapshots.store import SnapshotStore
from lakecast.tools import cli
from tests.jobs import microbatch_lake as ml

OUTPUTS = (ENRICHED_EVENTS, ENRICHMENT_UNMATCHED, ENRICHMENT_REJECTED)


def _changes(step: int) -> tuple[dict[int, str], str | None, tuple[int, int, int]]:
    """Step ``step``'s inputs: segment upserts (user -> segment), a new ``vip_discount``
    flag value (or none), and its events (first id, count, seed of :func:`ml.events`)."""
    if step == 0:
        return {}, None, (0, 30, 1)
    if step == 1:
        return {1: "CHURNING", 5: "VIP"}, "25", (100, 20, 2)
    if step == 2:
        return {6: "VIP"}, None, (200, 20, 3)
    if step >= 10:  # events only: the broadcast state does not move
        return {}, None, (100 * step, 12, step)
    return {step % 6 + 1: "VIP" if step % 2 else "NEW"}, None, (100 * step, 12, step)


def _inputs(spark, lake, step: int) -> None:
    """The same broadcast changes and events, step by step, on any lake (step 0 builds
    the broadcast tables at their first version)."""
    segs, vip, (first, n, seed) = _changes(step)
    if step == 0:
        ml.build(spark, lake)
    if segs:
        frame = pd.DataFrame({"user_id": list(segs), "segment": list(segs.values())})
        delta_io.merge_upsert(spark, spark.createDataFrame(frame),
                              lake.table_path(USER_SEGMENTS), keys=["user_id"])
    if vip is not None:
        flags.set_flag(spark, lake.table_path("feature_flags"), "vip_discount", vip)
    ml.write_events(spark, lake, ml.events(first, n, seed=seed))


def _outputs(spark, lake) -> dict[str, pd.DataFrame]:
    out = {}
    for t in OUTPUTS:
        df = delta_io.read(spark, lake.table_path(t)).toPandas()
        key = "raw_record" if t == ENRICHMENT_REJECTED else "event_id"
        if t == ENRICHMENT_REJECTED:  # records the writing batch's id (new ids after a rewind)
            df = df.drop(columns=["batch_id"])
        out[t] = df[sorted(df.columns)].sort_values(key).reset_index(drop=True)
    return out


def _check_metadata(spark, lake, r, *, parallelism: int, applied_per_task: int,
                    from_tables: bool = True) -> None:
    """The Dagster metadata of batch result ``r`` (what the micro-batch job records for
    each output, :func:`jobs.storefront.batch_metadata.result_metadata`), each figure against what
    it describes: the configured parallelism, the tables' Delta versions, the elements
    a cold task has to apply, the state built in this process from the same versions
    (``from_tables``: the tasks built theirs from the tables too), and the checkpoint's
    files on disk."""
    tables = {t: lake.table_path(t) for t in ENRICHMENT.broadcast_tables}
    versions = {t: delta_io.latest_version(p) for t, p in tables.items()}
    elements = read_broadcast_elements(spark, tables, {}, versions)
    harness = BroadcastTestHarness(StorefrontEnrichment(),
                                   table_schemas={e.table: e.schema for e in elements})
    harness.process_broadcast_elements(elements)
    assert harness.state_version == versions
    cid = r.checkpoint["checkpoint_id"]
    files = list((Path(snapshot_path(lake, ENRICHMENT.name)) / f"checkpoint_id={cid}"
                  ).glob("*.parquet"))
    assert files
    metas = result_metadata(lake, r)
    assert set(metas) == set(OUTPUTS)
    for asset, meta in metas.items():
        m = {k: getattr(v, "value", v) for k, v in meta.items()}
        assert m["parallelism"] == parallelism, asset
        assert m["state_version"] == versions, asset
        # a cold task applies the whole chain; a task that follows one in the same Python
        # worker (Spark's choice) finds the state there and applies nothing
        assert 1 <= m["cold_tasks"] <= parallelism, asset
        assert m["broadcast_updates_applied"] == m["cold_tasks"] * applied_per_task, asset
        if from_tables:  # the same elements applied the same way: the same Arrow state
            assert m["state_bytes_per_task"] == harness.executor.store.nbytes() > 0, asset
        else:  # restored (Arrow IPC) + changes: same content, other buffers; not 0
            assert m["state_bytes_per_task"] > 0, asset
        assert m["checkpoint_id"] == cid, asset
        assert m["checkpoint_stored_bytes"] == sum(f.stat().st_size for f in files), asset


def _assert_same(a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame]) -> None:
    for t in OUTPUTS:
        pd.testing.assert_frame_equal(a[t], b[t], check_dtype=False)
    assert a[ENRICHED_EVENTS].event_id.is_unique


def test_rescale_2_4_1_failure_and_rewind_equal_a_run_that_never_rescales(
        spark, lake, tmp_path, capsys):
    lake_a = get_settings({**os.environ, "LAKECAST_LAKE_ROOT": str(tmp_path / "lake_a"),
                           "LAKECAST_CHECKPOINT_ROOT": str(tmp_path / "cp_a")})
    lake_b = lake
    run_a = build_pipeline(spark, lake_a, 1, parallelism=2, checkpoint_every=None,
                           function_id="snap-a")
    store = SnapshotStore(spark, snapshot_path(lake_b, "enrichment"), "enrichment")

    # step 0 -- B at p=2: batch 0, checkpoint 0
    _inputs(spark, lake_a, 0)
    _inputs(spark, lake_b, 0)
    assert [r.plan.batch_id for r in run_a.run()] == [0]
    b2 = build_pipeline(spark, lake_b, 1, parallelism=2, checkpoint_every=1, function_id="snap-b2")
    (r0,) = b2.run()
    assert r0.plan.batch_id == 0
    # cold from the tables: each task applies one full element per table
    _check_metadata(spark, lake_b, r0, parallelism=2, applied_per_task=3)
    (h0,) = store.headers()
    assert (h0.checkpoint_id, h0.batch_id, h0.events_end, h0.parallelism) == (0, 0, 0, 2)
    assert h0.state_version == {"dim_products": 0, "feature_flags": 0, "user_segments": 0}
    manifest = store.manifest(0)
    assert sorted({m.task for m in manifest}) == [0, 1]
    for s in h0.states:  # every task holds the same content, stored once
        assert len({m.content_hash for m in manifest if m.state == s}) == 1
    counts = store.entry_counts(0)  # table states: one Arrow IPC chunk (row) per state
    assert sum(m.n_entries for m in manifest if m.task == 0) == 4 + 4 + 1
    assert sum(c for c, _ in counts.values()) == sum(
        m.stored_rows for m in manifest if m.task == 0) == 3
    restored = store.resolve(0, parallelism=2)
    assert restored is not None and restored.assignment == {0: 0, 1: 1}
    prods = restored.contents[DIM_PRODUCTS][1].to_pandas().sort_values("product_id")
    pd.testing.assert_frame_equal(prods.reset_index(drop=True),
                                  ml.products()[["product_id", "category", "price"]],
                                  check_dtype=False)
    assert store.delta_versions() == {0: delta_io.latest_version(store.path)}

    # step 1 -- restart at p=4 (cold): restores checkpoint 0 round-robin, batch 1
    _inputs(spark, lake_a, 1)
    _inputs(spark, lake_b, 1)
    assert [r.plan.batch_id for r in run_a.run()] == [1]
    b4 = build_pipeline(spark, lake_b, 1, parallelism=4, checkpoint_every=1, function_id="snap-b4")
    (r1,) = b4.run()
    assert r1.plan.batch_id == 1 and r1.parallelism == 4
    rt4 = b4.runtime
    assert rt4.restored.header.checkpoint_id == 0
    assert rt4.restored.assignment == {0: 0, 1: 1, 2: 0, 3: 1}  # new i reads old i mod 2
    h1 = store.header(1)
    assert h1.parallelism == 4 and h1.state_version["user_segments"] == 1
    # cold from checkpoint 0: each task applies one restored element per table, then the
    # versions committed since (user_segments 0 -> 1, feature_flags 0 -> 1)
    since = sum(v - h0.state_version[t] for t, v in h1.state_version.items())
    assert since == 2
    _check_metadata(spark, lake_b, r1, parallelism=4, applied_per_task=3 + since,
                    from_tables=False)

    # step 2 -- restart at p=1 whose batch 2 fails; the next restart redoes it
    _inputs(spark, lake_a, 2)
    _inputs(spark, lake_b, 2)
    assert [r.plan.batch_id for r in run_a.run()] == [2]
    b1 = build_pipeline(spark, lake_b, 1, parallelism=1, checkpoint_every=1, function_id="snap-b1")

    def broken(events, plan):
        raise RuntimeError("executor lost")

    b1.runtime.process_batch = broken  # fault injection: this pipeline is discarded
    with pytest.raises(RuntimeError, match="executor lost"):
        b1.run()
    b1 = build_pipeline(spark, lake_b, 1, parallelism=1, checkpoint_every=1, function_id="snap-b1b")
    (r2,) = b1.run()
    assert r2.redone and r2.plan.batch_id == 2
    assert b1.runtime.restored.header.checkpoint_id == 1
    assert b1.runtime.restored.assignment == {0: 0}
    want = _outputs(spark, lake_a)
    _assert_same(_outputs(spark, lake_b), want)

    # the CLI: list, show, diff
    assert cli.main(["snapshots", "list"]) == 0
    out = capsys.readouterr().out
    assert out.count("complete") == 3 and '"user_segments": 2' in out
    assert cli.main(["snapshots", "show", "1", "--state", USER_SEGMENTS]) == 0
    out = capsys.readouterr().out
    assert "5 entries" in out and '"segment": "CHURNING"' in out
    assert cli.main(["snapshots", "diff", "0", "1"]) == 0
    out = capsys.readouterr().out
    seg_line = next(line for line in out.splitlines() if line.startswith(USER_SEGMENTS))
    assert seg_line.split()[1:4] == ["1", "0", "1"] and "+5" in seg_line and "~1" in seg_line
    assert cli.main(["snapshots", "show", "9"]) == 2
    assert "no checkpoint 9" in capsys.readouterr().err

    # rewind to checkpoint 1: batch 2's outputs are rolled back, then redone once
    assert cli.main(["snapshots", "restore", "1"]) == 0
    assert "rewound to after batch 1" in capsys.readouterr().out
    enriched = delta_io.read(spark, lake_b.table_path(ENRICHED_EVENTS)).toPandas()
    assert enriched.event_id.max() < 200  # batch 2's events are gone
    again = build_pipeline(spark, lake_b, 1, parallelism=2, checkpoint_every=1,
                           function_id="snap-b2b")
    (r3,) = again.run()
    assert r3.plan.batch_id == 4 and r3.plan.events_start == 1  # after the rewind row (3)
    assert again.runtime.restored.header.checkpoint_id == 1  # not the abandoned 2
    _assert_same(_outputs(spark, lake_b), want)
    assert again.run() == []


# --------------------------------------------------------------------------- damaged files
def _versions(lake) -> dict[str, int]:
    """The broadcast tables' newest Delta versions: what the next batch applies."""
    return {t: delta_io.latest_version(lake.table_path(t)) for t in ENRICHMENT.broadcast_tables}


def _reference(steps: list[tuple[int, dict[str, int]]]) -> dict[str, pd.DataFrame]:
    """The outputs of one batch per ``(step, broadcast versions)``, computed with pandas
    (:func:`tests.jobs.microbatch_lake.expected`) from the inputs :func:`_changes` says,
    each row with the lineage its batch must record."""
    segs = dict(zip(ml.segments_v1().user_id, ml.segments_v1().segment, strict=True))
    vip = 10.0
    prior = pd.DataFrame({"event_id": pd.Series([], dtype="int64"),
                          "ts": pd.Series([], dtype="datetime64[ns]")})
    outs = []
    for step, versions in steps:
        changed, flag, (first, n, seed) = _changes(step)
        segs.update(changed)
        vip = float(flag) if flag is not None else vip
        frame = pd.DataFrame({"user_id": list(segs), "segment": list(segs.values())})
        out = ml.expected(ml.events(first, n, seed=seed), frame, vip, prior=prior)
        prior = pd.concat([prior, out["accepted"]], ignore_index=True)
        for part in ("enriched", "unmatched"):
            out[part] = out[part].assign(lineage=[versions] * len(out[part]))
        outs.append(out)
    return {k: pd.concat([o[k] for o in outs], ignore_index=True)
            for k in ("rejected", "unmatched", "enriched")}


def _assert_reference(spark, lake, want: dict[str, pd.DataFrame]) -> None:
    """Every output row of ``lake`` equals the pandas reference, lineage included; no
    event twice."""
    got = {t: delta_io.read(spark, lake.table_path(t)).toPandas() for t in OUTPUTS}
    cols = ["event_id", "user_id", "product_category", "product_price", "segment",
            "vip_discount_pct", "lineage"]  # fmt: skip
    enriched = got[ENRICHED_EVENTS].assign(
        lineage=lambda d: d["_state_version"].map(json.loads),
        product_price=lambda d: d["product_price"].astype(float))
    assert enriched.event_id.is_unique
    pd.testing.assert_frame_equal(
        enriched[cols].sort_values("event_id").reset_index(drop=True),
        want["enriched"][cols].sort_values("event_id").reset_index(drop=True),
        check_dtype=False)
    unmatched = got[ENRICHMENT_UNMATCHED]
    got_unmatched = zip(unmatched.event_id, unmatched["_state_version"].map(json.loads),
                        strict=True)  # fmt: skip
    want_unmatched = zip(want["unmatched"].event_id, want["unmatched"].lineage, strict=True)
    assert sorted(got_unmatched, key=str) == sorted(want_unmatched, key=str)
    rejected = got[ENRICHMENT_REJECTED]
    ids = rejected.raw_record.map(lambda r: json.loads(r)["event_id"])
    assert sorted(zip(ids, rejected.reason, strict=True)) == sorted(
        zip(want["rejected"].event_id, want["rejected"].reason, strict=True))


def _damage(store_path: str, checkpoint_id: int, how: str) -> list[str]:
    """Damage the Parquet files of one checkpoint ON DISK: ``middle`` overwrites bytes in
    the middle of each file, ``delete`` removes one, ``truncate`` cuts one in half."""
    files = sorted((Path(store_path) / f"checkpoint_id={checkpoint_id}").glob("*.parquet"))
    assert files, f"checkpoint {checkpoint_id} has no files"
    if how == "middle":
        for f in files:
            n = f.stat().st_size
            with f.open("r+b") as fh:
                fh.seek(n // 2)
                fh.write(b"\xde\xad\xbe\xef" * 8)
    elif how == "delete":
        files[-1].unlink()
    else:
        with files[0].open("r+b") as fh:
            fh.truncate(files[0].stat().st_size // 2)
    return [f.name for f in files]


def test_damaged_checkpoint_files_are_skipped_and_output_stays_exact(any_spark, lake):
    spark = any_spark  # in-process, then over Spark Connect
    batches: list[tuple[int, dict[str, int]]] = []  # (step, versions): the pandas reference
    store = SnapshotStore(spark, snapshot_path(lake, "enrichment"), "enrichment")
    b = build_pipeline(spark, lake, 1, parallelism=2, checkpoint_every=1, function_id="dmg-b")
    for step in range(4):  # batches 0..3, a checkpoint after each
        _inputs(spark, lake, step)
        batches.append((step, _versions(lake)))
        (r,) = b.run()
        assert r.plan.batch_id == step and r.checkpoint["checkpoint_id"] == step
        assert r.state_check["state_tasks_verified"] == 2  # hashes compared before commit
        if step:  # the checkpoint's jobs keep the Python workers: the next batch is warm
            assert r.cold_tasks == 0, r
    assert [h.checkpoint_id for h in store.headers()] == [0, 1, 2, 3]

    _damage(store.path, 3, "middle")
    _damage(store.path, 2, "delete")
    _damage(store.path, 1, "truncate")
    _inputs(spark, lake, 4)
    batches.append((4, _versions(lake)))
    cold = build_pipeline(spark, lake, 1, parallelism=2, checkpoint_every=1, function_id="dmg-b2")
    (r4,) = cold.run()
    assert r4.plan.batch_id == 4 and not r4.redone
    assert cold.runtime.restored.header.checkpoint_id == 0  # newest that reads and verifies
    skipped = cold.runtime.restore_skipped
    assert [s.split(" ")[1] for s in skipped] == ["3", "2", "1"], skipped
    assert all("unreadable" in s or "cannot be read" in s for s in skipped), skipped
    assert "FILE_NOT_EXIST" in skipped[1] or "does not exist" in skipped[1], skipped
    assert r4.state_check["restored_from_checkpoint"] == 0
    assert r4.state_check["skipped_checkpoints"] == 3
    _assert_reference(spark, lake, _reference(batches))

    # every checkpoint damaged: the state is rebuilt from the tables, output still exact
    for cid in store.checkpoint_ids():
        _damage(store.path, cid, "middle")
    _inputs(spark, lake, 5)
    batches.append((5, _versions(lake)))
    rebuilt = build_pipeline(spark, lake, 1, parallelism=2, checkpoint_every=1,
                             function_id="dmg-b3")
    (r5,) = rebuilt.run()
    assert r5.plan.batch_id == 5 and rebuilt.runtime.restored is None
    assert r5.state_check["restored_from_checkpoint"] == -1
    assert r5.state_check["skipped_checkpoints"] == len(rebuilt.runtime.restore_skipped) >= 5
    _assert_reference(spark, lake, _reference(batches))


def test_deferred_checkpoints_hold_the_state_of_their_batch_and_restore_exactly(any_spark, lake):
    """A continuous run's checkpoints (``defer_checkpoints``) are written in a background
    thread while the next batches run and the broadcast tables change under them: each
    one holds the state of the batch it was due at (its content hashes are those the
    batch's tasks reported before its commit), and a cold start restores the newest one
    with every output row equal to the pandas reference."""
    spark = any_spark  # in-process, then over Spark Connect (two threads, one session)
    batches: list[tuple[int, dict[str, int]]] = []
    store = SnapshotStore(spark, snapshot_path(lake, "enrichment"), "enrichment")
    b = build_pipeline(spark, lake, 1, parallelism=2, checkpoint_every=1, function_id="bg-b")
    assert b.defer_checkpoints()
    summaries = []
    for step in range(4):
        _inputs(spark, lake, step)
        batches.append((step, _versions(lake)))
        (r,) = b.run()
        assert r.plan.batch_id == step
        if step == 0:  # started, not waited for: nothing finished yet
            assert r.checkpoint is None
        if r.checkpoint:
            summaries.append(r.checkpoint)
    last = b.settle()
    summaries += [last] if last else []
    assert b.settle() is None
    headers = {h.checkpoint_id: h for h in store.headers()}
    assert 0 in headers and set(headers) == {s["checkpoint_id"] for s in summaries}
    for cid, h in headers.items():  # the state of the batch it was due at
        assert h.batch_id == cid and h.state_version == batches[cid][1], (cid, h)

    _inputs(spark, lake, 4)
    batches.append((4, _versions(lake)))
    cold = build_pipeline(spark, lake, 1, parallelism=2, checkpoint_every=1, function_id="bg-b2")
    (r4,) = cold.run()
    assert cold.runtime.restored.header.checkpoint_id == max(headers)
    assert r4.state_check["restored_from_checkpoint"] == max(headers)
    _assert_reference(spark, lake, _reference(batches))


def test_a_continuous_run_hashes_the_state_ahead_of_a_due_batch_when_it_does_not_move(
        spark, lake):
    """With deferred checkpoints, the tasks' hashes for the batch a checkpoint is due at are
    taken in the background after the batch before it. The due batch uses them when no
    broadcast version came in between (``state_hashed_ahead`` 1), else hashes its own
    state before its commit (0). Each checkpoint holds the state of its batch, and every
    output row equals the pandas reference."""
    store = SnapshotStore(spark, snapshot_path(lake, "enrichment"), "enrichment")
    b = build_pipeline(spark, lake, 1, parallelism=2, checkpoint_every=2, function_id="ahead")
    assert b.defer_checkpoints()
    batches: list[tuple[int, dict[str, int]]] = []
    ahead = {}
    for step in (0, 10, 11, 12, 4):  # 10-12: events only; 4 adds a user segment
        _inputs(spark, lake, step)
        batches.append((step, _versions(lake)))
        (r,) = b.run()
        ahead[r.plan.batch_id] = (r.state_check or {}).get("state_hashed_ahead")
        b.settle()  # each checkpoint written before the next batch
    # batch 0: no checkpoint yet (nothing before it); 1 and 3: not due; 2: due, the state
    # unchanged since batch 1; 4: due, user_segments moved after batch 3
    assert ahead == {0: 0, 1: None, 2: 1, 3: None, 4: 0}
    headers = {h.checkpoint_id: h for h in store.headers()}
    assert set(headers) == {0, 2, 4}
    for cid, h in headers.items():
        assert h.batch_id == cid and h.state_version == batches[cid][1], (cid, h)
    _assert_reference(spark, lake, _reference(batches))


def test_a_background_checkpoint_that_fails_is_raised_with_what_it_leaves(spark, lake):
    """A checkpoint written in the background whose Delta write fails (the snapshot table
    was replaced by one of another schema) does not undo the batch it was due at: that
    batch is committed; ``settle`` raises a SnapshotError naming the pipeline, the
    checkpoint, the table and the fix, with Delta's error as its cause."""
    from lakecast.snapshots.errors import SnapshotError

    path = snapshot_path(lake, "enrichment")
    b = build_pipeline(spark, lake, 1, parallelism=2, checkpoint_every=1, function_id="bg-f")
    assert b.defer_checkpoints()
    _inputs(spark, lake, 0)
    (r0,) = b.run()
    assert r0.plan.batch_id == 0 and b.settle()["checkpoint_id"] == 0
    # a real Delta table of another schema where the snapshot table was: the next
    # checkpoint's append (only that) fails in Delta's schema check
    (spark.range(3).selectExpr("id AS other").write.format("delta").mode("overwrite")
     .option("overwriteSchema", "true").save(path))
    _inputs(spark, lake, 1)
    (r1,) = b.run()
    assert r1.plan.batch_id == 1
    with pytest.raises(SnapshotError) as err:
        b.settle()
    text = str(err.value)
    assert "'enrichment'" in text and "checkpoint 1" in text and path in text
    assert "already committed" in text and "restart the run" in text
    assert err.value.__cause__ is not None  # Delta's own error, kept as the cause
    assert b.settle() is None  # raised once
    # the batch the checkpoint was due at is committed: its events are in the output
    events = delta_io.read(spark, lake.table_path(ml.EVENTS)).count()
    out = _outputs(spark, lake)
    assert sum(len(out[t]) for t in OUTPUTS) == events
