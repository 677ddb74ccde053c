"""Benchmark: broadcast state checkpoints in Delta — bytes, restore and rescale times.

    .venv/bin/python -m benchmarks.snapshots [--entries 1000000] [--p 4] [--name snapshots]

One table-shaped broadcast state of ``--entries`` rows (``item_id`` -> category, price),
held by ``--p`` tasks:

* **bytes per checkpoint**: what the checkpoint's Delta commit wrote (content stored once
  by hash + per-task manifest) vs ``p x state size`` (the serialized state of one task
  times p), and vs an actual Flink-style layout (every task's copy written: the same
  entry rows p times, one per task index) measured as a Delta write too;
* **checkpoint** time (p tasks hash their state, one copy written), ``--repeats`` times
  (each into a store of its own, after its tasks built the state);
* **restore** time: a cold runtime at the same p restores from the checkpoint and runs a
  first (tiny) batch — vs a cold start that reads the full table;
* **rescale** time: cold runtimes at p/2 and 2p restoring the same checkpoint;
* beside them, in the same run, what a user would do instead: a **plain Delta write** of
  the same rows (as often as the checkpoint, alternating which goes first; medians), and a
  **plain Delta read** of them into the driver (Arrow); the ratios
  checkpoint / plain write and restore (driver + first batch) / plain read (target: ≤ 2
  each, issue 15).

Results are printed and written to ``benchmarks/results/<name>.json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.targets import SNAPSHOTS as BENCH

RESULTS = Path(__file__).resolve().parent / "results"


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.snapshots", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--p", type=int, default=4)
    parser.add_argument("--name", default="snapshots")
    parser.add_argument("--keep", action="store_true", help="keep the scratch lake")
    parser.add_argument("--repeats", type=int, default=3,
                        help="checkpoints and plain writes timed, alternating (medians)")
    args = parser.parse_args(argv)
    started = BENCH.start()

    root = Path(tempfile.mkdtemp(prefix="lakecast-bench-snapshots-"))
    os.environ["LAKECAST_LAKE_ROOT"] = str(root / "lake")
    os.environ["LAKECAST_CHECKPOINT_ROOT"] = str(root / "checkpoints")
    from pyspark.sql import functions as F

    from lakecast import Lookup, enrich
    from lakecast.config import get_settings
    from lakecast.delta import io as delta_io
    from lakecast.snapshots.checkpointer import snapshot_path
    from lakecast.snapshots.runtime import SnapshottingRuntime
    from lakecast.snapshots.store import SnapshotStore
    from lakecast.spark import get_spark

    settings = get_settings()
    spark = get_spark(app_name="lakecast-bench-snapshots")
    p, n = args.p, args.entries
    items = settings.table_path("items")
    rows_df = spark.range(n).select(
        F.col("id").alias("item_id"),
        F.element_at(F.array(*[F.lit(c) for c in ("books", "toys", "home", "music")]),
                     (F.col("id") % 4 + 1).cast("int")).alias("category"),
        (F.col("id") % 1000 * 0.25).alias("price"))
    delta_io.write(rows_df, items, mode="overwrite")
    events = spark.range(0, 4000, 1, p).select(
        F.col("id").alias("event_id"), (F.col("id") * 7919 % n).alias("item_id"))
    store = SnapshotStore(spark, snapshot_path(settings, "bench"), "bench")

    def function() -> Any:
        return enrich(Lookup("items", key="item_id", columns=["category", "price"]))

    def runtime(par: int, restore: bool = True, into: SnapshotStore = store
                ) -> SnapshottingRuntime:
        return SnapshottingRuntime(spark, function(), {"items": items}, into,
                                   parallelism=par, restore=restore,
                                   function_id=f"bench-{uuid.uuid4().hex[:8]}")

    def first_batch(rt: SnapshottingRuntime, par: int) -> int:
        return rt.process(events.repartition(par)).main.count()

    out: dict[str, Any] = {"entries": n, "p": p, "cpus": os.cpu_count()}
    # cold start from the full table (the baseline), then the checkpoint
    rt = runtime(p, restore=False)
    out["cold_start_full_table_s"], rows = _timed(lambda: first_batch(rt, p))
    assert rows == 4000
    # the checkpoint and, beside it, what a user would do instead: a plain Delta write of
    # the same rows (a new table each time, as each checkpoint is the first of its store);
    # each timed --repeats times, alternating which goes first, medians reported
    checkpoints: list[float] = []
    writes: list[float] = []
    cp: Any = None
    for r in range(args.repeats):
        if r == 0:
            rt_r, into = rt, store
        else:  # a store of its own (nothing stored yet) and a runtime whose tasks built
            # the state from the table (untimed), as before the first checkpoint
            into = SnapshotStore(spark, snapshot_path(settings, f"bench{r}"), f"bench{r}")
            rt_r = runtime(p, restore=False, into=into)
            assert first_batch(rt_r, p) == 4000

        def checkpoint(rt_r: SnapshottingRuntime = rt_r) -> Any:
            return rt_r.checkpoint(0, batch_id=0, events_start=-1, events_end=0)

        def plain_write(r: int = r) -> Any:
            return delta_io.write(rows_df, str(root / f"plain{r}"))

        for side in (("checkpoint", "write") if r % 2 == 0 else ("write", "checkpoint")):
            if side == "checkpoint":
                dt, got = _timed(checkpoint)
                checkpoints.append(dt)
                cp = cp if r else got
            else:
                writes.append(_timed(plain_write)[0])
        if r:
            rt_r.close()
    out["checkpoint_runs_s"] = [round(t, 3) for t in checkpoints]
    out["plain_delta_write_runs_s"] = [round(t, 3) for t in writes]
    out["checkpoint_s"] = statistics.median(checkpoints)
    out["plain_delta_write_s"] = statistics.median(writes)
    out["stored_bytes"] = cp.stored_bytes
    out["state_bytes_serialized"] = cp.state_bytes
    out["p_x_state_bytes"] = cp.flink_bytes
    out["task_state_bytes_in_memory"] = max(int(m.meta["state_bytes"]) for m in cp.manifest)
    out["worker_processes"] = len(cp.pids)
    # a Flink-style checkpoint: every task's copy written (same rows, one per task index)
    naive_path = str(root / "naive")
    entries = delta_io.read(spark, store.path).where("kind = 'entry'")
    copies = entries.crossJoin(spark.range(p).select(F.col("id").cast("int").alias("t"))) \
        .withColumn("task", F.col("t")).drop("t")
    out["flink_style_write_s"], v = _timed(lambda: delta_io.write(copies, naive_path))
    out["flink_style_stored_bytes"] = int(
        delta_io.commit_info(naive_path, v).metrics.get("numOutputBytes", 0))
    out["stored_vs_p_x_state"] = round(out["stored_bytes"] / max(out["p_x_state_bytes"], 1), 4)
    out["stored_vs_flink_style"] = round(
        out["stored_bytes"] / max(out["flink_style_stored_bytes"], 1), 4)
    # what a user would do instead of a restore: a read of the same rows back into the
    # driver as Arrow (warm: the table was written above)
    plain = str(root / "plain0")
    out["plain_delta_read_s"], tbl = _timed(lambda: delta_io.read(spark, plain).toArrow())
    assert tbl.num_rows == n
    # restore (same p) and rescale (p/2, 2p): cold runtimes to their first batch
    for label, par in (("restore", p), ("rescale_down", max(1, p // 2)), ("rescale_up", 2 * p)):
        rt2 = runtime(par)
        t_driver, _ = _timed(lambda rt2=rt2: rt2.refresh())
        t_tasks, rows = _timed(lambda rt2=rt2, par=par: first_batch(rt2, par))
        assert rows == 4000 and rt2.restored is not None
        out[f"{label}_p"] = par
        out[f"{label}_driver_s"] = round(t_driver, 3)  # read + verify + decode + broadcast
        out[f"{label}_first_batch_s"] = round(t_tasks, 3)  # tasks load the state + process
        out[f"{label}_total_s"] = round(t_driver + t_tasks, 3)
        rt2.close()
    out["checkpoint_vs_plain_write"] = out["checkpoint_s"] / out["plain_delta_write_s"]
    out["restore_vs_plain_read"] = out["restore_total_s"] / out["plain_delta_read_s"]
    out["targets_met"] = {"checkpoint <= 2x plain write": out["checkpoint_vs_plain_write"] <= 2.0,
                          "restore <= 2x plain read": out["restore_vs_plain_read"] <= 2.0}
    for k, val in list(out.items()):
        if isinstance(val, float):
            out[k] = round(val, 3)
    target = RESULTS / f"{args.name}.json"
    BENCH.report(out, started, name=args.name, results_dir=RESULTS)
    width = max(len(k) for k in out)
    for k in sorted(out):
        print(f"{k:<{width}}  {out[k]}")
    print(f"-> {target}")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
