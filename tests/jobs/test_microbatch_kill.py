"""kill -9 of the micro-batch job at points of a batch, then a rerun: every event exactly
once, each enriched with the broadcast state version its batch planned.

The broadcast tables change between the runs, so a redo that read another state version
than its plan (the tables' newest, say) would enrich with the wrong segment, price or
discount and record another ``_state_version``: the outputs are compared value by value
with the pandas reference (:mod:`tests.jobs.microbatch_lake`).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from assets import flags
from assets.tables import DIM_PRODUCTS, USER_SEGMENTS
from jobs.storefront.microbatch import ENRICHED_EVENTS, ENRICHMENT_REJECTED, ENRICHMENT_UNMATCHED
from jobs.storefront.pipeline import ENRICHMENT
from lakecast.delta import io as delta_io
from lakecast.pipeline.progress import progress_path, read_log
from tests import ROOT as PROJECT_ROOT
from tests.jobs import microbatch_lake as ml
from tests.runs import remote_env

#: a run's bound (a Spark start and a few small batches take well under a minute)
RUN_TIMEOUT_S = 300
#: the random kill comes this long at most after its batch's plan row is seen; a batch of
#: this test is longer (a new process: Spark jobs, Python workers, three Delta writes, the
#: log commit), and the test checks that the kill did land before the batch's commit
MAX_KILL_DELAY_S = 0.8


def _start(tmp: Path, name: str, *args: str, crash_at: str | None = None,
           remote: str | None = None) -> tuple[subprocess.Popen, Path]:
    """The job in a process of its own: with its own Spark (``remote`` None) or as a client
    of the Spark server at ``remote``."""
    env = remote_env(remote, **({"LAKECAST_CRASH_AT": crash_at} if crash_at else {}))
    out = tmp / f"{name}.out"
    with out.open("w") as fh:  # a file, not a pipe: a chatty child never blocks on it
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobs.storefront.microbatch", "--max-versions-per-batch", "1",
            *args],
            cwd=PROJECT_ROOT, env=env, start_new_session=True, stdout=fh,
            stderr=subprocess.STDOUT, text=True,
        )
    return proc, out


def _finish(proc: subprocess.Popen, out: Path) -> int:
    try:
        proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):  # no lingering JVM of a killed job
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode


def _run(tmp: Path, name: str, *args: str, crash_at: str | None = None,
         remote: str | None = None) -> int:
    proc, out = _start(tmp, name, *args, crash_at=crash_at, remote=remote)
    rc = _finish(proc, out)
    assert rc in (0, -signal.SIGKILL), f"{name}: exit {rc}\n{out.read_text()[-4000:]}"
    return rc


def _log(lake):
    return read_log(progress_path(lake.checkpoint_root, ENRICHMENT.name))


def _kill_inside(tmp: Path, lake, batch_id: int, rng: random.Random) -> float:
    """Start the job, wait for the plan row of ``batch_id`` (the batch has started), kill
    the job's process group after a random delay; the job must die by SIGKILL with that
    batch planned and not committed (the kill was inside it). Returns the delay."""
    proc, out = _start(tmp, "random-kill")
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while True:
            assert proc.poll() is None, (
                f"the job ended (exit {proc.returncode}) before batch {batch_id} started\n"
                f"{out.read_text()[-4000:]}")
            assert time.monotonic() < deadline, f"batch {batch_id} never started"
            try:
                plans, _ = _log(lake)
            except (OSError, ValueError, delta_io.DeltaIOError):  # a log commit being
                plans = []  # written (a file listed but not complete yet): read again
            if any(p.batch_id == batch_id for p in plans):
                break
            time.sleep(0.05)
        delay = rng.uniform(0.0, MAX_KILL_DELAY_S)
        time.sleep(delay)
        with contextlib.suppress(ProcessLookupError):  # (if it ended: the rc check says so)
            os.killpg(proc.pid, signal.SIGKILL)  # the job and its Spark JVM
    finally:
        rc = _finish(proc, out)
    assert rc == -signal.SIGKILL, f"exit {rc}, not SIGKILL\n{out.read_text()[-4000:]}"
    plans, commits = _log(lake)
    assert batch_id in {p.batch_id for p in plans} and batch_id not in commits, (
        f"the kill {delay:.2f} s after batch {batch_id}'s plan landed after its commit")
    return delay


def _upsert(spark, lake, table: str, rows: pd.DataFrame, key: str) -> None:
    delta_io.merge_upsert(spark, spark.createDataFrame(rows), lake.table_path(table),
                          keys=[key])


def test_kill_minus_9_at_several_points_then_rerun_is_exactly_once(
    spark, lake, tmp_path, server_url
):
    """The named crash points fall between Spark actions: those runs are clients of the
    test run's Spark server (no JVM start each), and their kills leave nothing running.
    The random kill lands anywhere, inside a Spark action too: that run has a JVM of its
    own, killed with it. The server's warm task state is then older than the lake's
    progress, which the rerun (a client again) must notice."""
    ml.build(spark, lake)  # dim_products v0, user_segments v0, feature_flags v0 (10 %)
    frames = [ml.events(i * 1000, 40, seed=10 + i) for i in range(3)]
    for f in frames:
        ml.write_events(spark, lake, f)  # events versions 0, 1, 2: one batch each
    seed = random.randrange(2**32)
    rng = random.Random(seed)

    # batch 0 is planned at the first versions; the job dies after its main output
    assert _run(tmp_path, "a", crash_at="main_written:0", remote=server_url) == -signal.SIGKILL
    # the broadcast side moves: segments v1 (user 1 VIP -> CHURNING, user 5 VIP), flag 25 %
    _upsert(spark, lake, USER_SEGMENTS,
            pd.DataFrame({"user_id": [1, 5], "segment": ["CHURNING", "VIP"]}), "user_id")
    flags.set_flag(spark, lake.table_path("feature_flags"), "vip_discount", "25")
    # the redo of batch 0 (with its plan's versions) commits; batch 1 is planned at the new
    # versions and dies after its outputs, before its commit
    assert _run(tmp_path, "b", crash_at="outputs_written:1", remote=server_url) == -signal.SIGKILL
    # segments v2 (user 6 VIP), product 2 costs 22
    _upsert(spark, lake, USER_SEGMENTS,
            pd.DataFrame({"user_id": [6], "segment": ["VIP"]}), "user_id")
    _upsert(spark, lake, DIM_PRODUCTS, ml.products()[lambda d: d.product_id == 2].assign(
        price=22.0), "product_id")
    # one batch and a clean exit: the redo of batch 1, still at its plan's versions
    assert _run(tmp_path, "c", "--max-batches", "1", remote=server_url) == 0
    flags.set_flag(spark, lake.table_path("feature_flags"), "vip_discount", "50")  # v2
    # batch 2 starts in a new process at the newest versions; killed at a random point in it
    delay = _kill_inside(tmp_path, lake, 2, rng)
    # after the kill the tables move again: the redo must not see it
    _upsert(spark, lake, USER_SEGMENTS,
            pd.DataFrame({"user_id": [2], "segment": ["VIP"]}), "user_id")
    flags.set_flag(spark, lake.table_path("feature_flags"), "vip_discount", "75")
    assert _run(tmp_path, "rerun", remote=server_url) == 0  # the rerun finishes the work
    info = f"random kill seed {seed}, {delay:.2f} s into batch 2"

    # the reference: each batch at the versions it planned
    segs0 = ml.segments_v1()
    segs1 = pd.concat([segs0[segs0.user_id != 1],
                       pd.DataFrame({"user_id": [1, 5], "segment": ["CHURNING", "VIP"]})])
    segs2 = pd.concat([segs1, pd.DataFrame({"user_id": [6], "segment": ["VIP"]})])
    prods1 = ml.products().assign(price=lambda d: d.price.where(d.product_id != 2, 22.0))
    batches = [
        (segs0, 10.0, ml.products(), {"dim_products": 0, "user_segments": 0, "feature_flags": 0}),
        (segs1, 25.0, ml.products(), {"dim_products": 0, "user_segments": 1, "feature_flags": 1}),
        (segs2, 50.0, prods1, {"dim_products": 1, "user_segments": 2, "feature_flags": 2}),
    ]  # fmt: skip
    plans, commits = _log(lake)
    assert sorted(commits) == [0, 1, 2], info
    assert {p.batch_id: p.broadcast_versions for p in plans} == {
        i: b[3] for i, b in enumerate(batches)}, info
    want: dict[str, list[pd.DataFrame]] = {"enriched": [], "unmatched": [], "rejected": []}
    for frame, (segs, pct, prods, versions) in zip(frames, batches, strict=True):
        w = ml.expected(frame, segs, pct, prods)
        v = json.dumps(versions, sort_keys=True)
        w["enriched"] = w["enriched"].assign(v=v)
        w["unmatched"] = w["unmatched"].assign(v=v)
        for k in want:
            want[k].append(w[k])
    want_df = {k: pd.concat(v, ignore_index=True) for k, v in want.items()}

    got = {t: delta_io.read(spark, lake.table_path(t)).toPandas()
           for t in (ENRICHED_EVENTS, ENRICHMENT_UNMATCHED, ENRICHMENT_REJECTED)}  # fmt: skip
    enriched = got[ENRICHED_EVENTS]
    assert enriched.event_id.is_unique, info
    enriched["v"] = enriched["_state_version"].map(
        lambda x: json.dumps(ml.versions(x), sort_keys=True))
    cols = ["event_id", "user_id", "product_category", "product_price", "segment",
            "vip_discount_pct", "v"]
    pd.testing.assert_frame_equal(
        enriched[cols].sort_values("event_id").reset_index(drop=True),
        want_df["enriched"][cols].sort_values("event_id").reset_index(drop=True),
        check_dtype=False, obj=f"enriched ({info})")
    unmatched = got[ENRICHMENT_UNMATCHED]
    assert unmatched.event_id.is_unique, info
    unmatched["v"] = unmatched["_state_version"].map(
        lambda x: json.dumps(ml.versions(x), sort_keys=True))
    pd.testing.assert_frame_equal(
        unmatched[["event_id", "v"]].sort_values("event_id").reset_index(drop=True),
        want_df["unmatched"][["event_id", "v"]].sort_values("event_id").reset_index(drop=True),
        check_dtype=False, obj=f"unmatched ({info})")
    rejected = got[ENRICHMENT_REJECTED]
    rejected["event_id"] = rejected["raw_record"].map(
        lambda s: pd.read_json(__import__("io").StringIO(f"[{s}]")).event_id[0])
    key = ["event_id", "reason"]
    pd.testing.assert_frame_equal(
        rejected[key].sort_values(key).reset_index(drop=True),
        want_df["rejected"][key].sort_values(key).reset_index(drop=True),
        check_dtype=False, obj=f"rejected ({info})")
    assert sum(len(g) for g in got.values()) == sum(len(f) for f in frames), info
