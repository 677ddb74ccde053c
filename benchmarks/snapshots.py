"""Benchmark: broadcast state checkpoints in Delta — bytes, restore and rescale times.

    .venv/bin/python -m benchmarks.snapshots [--entries 1000000] [--p 4] [--repeats 3]
                                             [--name snapshots] [--child-timeout 900]

One table-shaped broadcast state of ``--entries`` rows (``item_id`` -> category, price),
held by ``--p`` tasks. The items table is written with delta-rs (from Arrow built in the
driver), so nothing before an application's first checkpoint has warmed Spark's Delta
write path.

* **first checkpoint of an application** (the pre-registered target, <= 2 x the first
  plain Delta write of an application): measured symmetrically, each sample a fresh
  Spark application — a child process (``python -m benchmarks.snapshots --child ...``)
  with its own local, in-process Spark session (``lakecast.spark.get_spark``, the same
  configuration as this benchmark's, bound to 127.0.0.1; Spark Connect is not used for
  the children, so each one is a new application). Both kinds of child first do the
  same thing, untimed: start the session and run the application's first batch (a
  ``SnapshottingRuntime`` at p over the items table: its tasks read the items rows and
  build the state; 4,000 events enriched). Then, timed, each takes its first write of
  its kind:

  - *checkpoint* child: its FIRST ``checkpoint`` (p tasks hash their state, one copy of
    each content written, one Delta commit) into a store of its own;
  - *plain* child: its FIRST plain Spark Delta write of the same rows the checkpoint
    holds (the ``--entries`` items rows) into a new table.

  Each child prints one JSON line (the timed seconds, and its session start and setup
  times beside) and exits by itself; the parent bounds each with ``--child-timeout``
  (the child's process group is killed past it, and the run fails). ``--repeats``
  samples of each, alternating which goes first (plain, checkpoint; checkpoint, plain;
  ...); the value is ``median(first checkpoint) / median(first plain write)``
  (``first_checkpoint_runs_s`` / ``first_plain_write_runs_s``, medians
  ``first_checkpoint_s`` / ``first_plain_write_s``). The children run before this
  process starts Spark, one at a time, so none shares the 2 cores with another JVM;
* in-process (warm) figures, reported beside it and not judged: **checkpoint** time,
  ``--repeats`` times in this process (each into a store of its own, after its
  runtime's tasks built the state, untimed), and as many **plain Delta writes** of the
  same rows (each into a new table); the two alternate which goes first (the checkpoint
  at repeat 0, so ``checkpoint_runs_s[0]`` is this process's first Spark Delta write);
  ``checkpoint_runs_s`` / ``plain_delta_write_runs_s`` and their medians
  ``checkpoint_s`` / ``plain_delta_write_s``;
* **bytes per checkpoint**: what the checkpoint's Delta commit wrote (content stored once
  by hash + per-task manifest) vs ``p x state size`` (the serialized state of one task
  times p), and vs an actual Flink-style layout (every task's copy written: the same
  entry rows p times, one per task index) measured as a Delta write too;
* **restore** (the pre-registered target, <= 2 x a cold read of the same rows): a cold
  runtime at the same p restores from the checkpoint — the driver reads the checkpoint's
  rows as Arrow (direct Parquet reads, checksums verified), decodes them and ships them
  with the tasks, which load the state in the first (tiny) batch; ``restore_total_s`` =
  driver + first batch. Its baseline, ``plain_delta_read_s``: a **cold read of the same
  rows into the shape the restore leaves them in, Arrow in each of the p tasks** — one
  Spark job of p tasks, each reading the table's Parquet files with pyarrow, the files
  listed once in the driver by delta-rs (the way the restore reads its checkpoint) — of
  a copy of a plain-write table at a path this process never opened. Beside it, cold
  reads into Arrow in the driver only (``cold_read_driver_spark_s``: Spark
  ``toArrow()``; ``cold_read_driver_direct_s``: delta-rs + pyarrow), and the restore's
  driver part over the faster of them (``restore_driver_vs_cold_driver_read``). "Cold"
  for the restore and every read alike: a new ``SnapshotStore``, delta-rs table handles
  forgotten and Spark's ``DeltaLog`` cache cleared first, as in a new process (the OS
  page cache is warm for all of them: every file was written by this run; the Python
  workers are warm for both the restore's job and the read's);
* **rescale** time: cold runtimes at p/2 and 2p restoring the same checkpoint.

Results are printed and written to ``benchmarks/results/<name>.json`` with the verdicts
of the pre-registered targets (``benchmarks.targets.SNAPSHOTS``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.targets import SNAPSHOTS as BENCH

RESULTS = Path(__file__).resolve().parent / "results"
PROJECT_ROOT = Path(__file__).resolve().parent.parent
EVENTS = 4000  # events in an application's first batch


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _items_arrow(n: int) -> Any:
    """The items rows as Arrow, built in the driver (the same rows as ``_rows_df``)."""
    import numpy as np
    import pyarrow as pa

    ids = np.arange(n, dtype=np.int64)
    categories = np.array(["books", "toys", "home", "music"], dtype=object)[ids % 4]
    return pa.table({"item_id": ids, "category": pa.array(categories, pa.string()),
                     "price": (ids % 1000) * 0.25})


def _rows_df(spark: Any, n: int) -> Any:
    """The items rows as a Spark DataFrame (the same rows as ``_items_arrow``)."""
    from pyspark.sql import functions as F

    return spark.range(n).select(
        F.col("id").alias("item_id"),
        F.element_at(F.array(*[F.lit(c) for c in ("books", "toys", "home", "music")]),
                     (F.col("id") % 4 + 1).cast("int")).alias("category"),
        (F.col("id") % 1000 * 0.25).alias("price"))


def _events(spark: Any, n: int, p: int) -> Any:
    """The first batch's events (``item_id`` among the ``n`` items)."""
    from pyspark.sql import functions as F

    return spark.range(0, EVENTS, 1, p).select(
        F.col("id").alias("event_id"), (F.col("id") * 7919 % n).alias("item_id"))


def _function() -> Any:
    from lakecast import Lookup, enrich

    return enrich(Lookup("items", key="item_id", columns=["category", "price"]))


def _runtime(spark: Any, items: str, store: Any, par: int, restore: bool = True) -> Any:
    from lakecast.snapshots.runtime import SnapshottingRuntime

    return SnapshottingRuntime(spark, _function(), {"items": items}, store,
                               parallelism=par, restore=restore,
                               function_id=f"bench-{uuid.uuid4().hex[:8]}")


def _first_batch(rt: Any, events: Any, par: int) -> int:
    return rt.process(events.repartition(par)).main.count()


def _child(side: str, n: int, p: int, out_dir: Path) -> int:
    """One sample of the first-write measure, in a fresh Spark application (this
    process): start the session and run the application's first batch (untimed), then
    time its first write of its kind — ``checkpoint`` or a ``plain`` Delta write of the
    same rows; print one JSON line."""
    from lakecast.config import get_settings
    from lakecast.delta import io as delta_io
    from lakecast.snapshots.store import SnapshotStore
    from lakecast.spark import get_spark

    settings = get_settings()
    t_session, spark = _timed(lambda: get_spark(app_name=f"lakecast-bench-snapshots-{side}"))
    items = settings.table_path("items")
    store = SnapshotStore(spark, str(out_dir / "snapshots"), out_dir.name)
    rt = _runtime(spark, items, store, p, restore=False)
    t_setup, rows = _timed(lambda: _first_batch(rt, _events(spark, n, p), p))
    assert rows == EVENTS, rows
    sample: dict[str, Any] = {"child": side, "session_s": round(t_session, 3),
                              "first_batch_s": round(t_setup, 3)}
    if side == "checkpoint":
        dt, cp = _timed(lambda: rt.checkpoint(0, batch_id=0, events_start=-1, events_end=0))
        sample["stored_bytes"] = cp.stored_bytes
    else:
        path, rows_df = str(out_dir / "plain"), _rows_df(spark, n)
        dt, version = _timed(lambda: delta_io.write(rows_df, path))
        sample["stored_bytes"] = int(delta_io.commit_info(path, version, spark)
                                     .metrics.get("numOutputBytes", 0))
    sample["seconds"] = dt
    rt.close()
    spark.stop()
    print(json.dumps(sample), flush=True)
    return 0


def _fresh_application(side: str, n: int, p: int, out_dir: Path, timeout: float
                       ) -> dict[str, Any]:
    """Run :func:`_child` in a new process (its own local Spark application, in its own
    process group, killed past ``timeout`` s); its JSON line."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")}
    env["LAKECAST_SPARK_REMOTE"] = ""  # a classic session in the child: a new application
    cmd = [sys.executable, "-m", "benchmarks.snapshots", "--child", side, "--entries", str(n),
           "--p", str(p), "--child-dir", str(out_dir)]
    proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RuntimeError(f"the {side} child did not finish in {timeout:.0f} s") from None
    finally:  # anything the child left behind in its group (e.g. a JVM still exiting)
        for _ in range(60):
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode != 0:
        raise RuntimeError(f"the {side} child exited {proc.returncode}:\n"
                           + "\n".join(stderr.splitlines()[-30:]))
    for line in reversed(stdout.splitlines()):
        with contextlib.suppress(ValueError):
            sample = json.loads(line)
            if isinstance(sample, dict) and sample.get("child") == side:
                return sample
    raise RuntimeError(f"the {side} child printed no result:\n{stdout[-2000:]}")


def _cold(spark: Any) -> None:
    """Forget what this process caches about Delta tables — delta-rs table handles and
    Spark's ``DeltaLog`` instances — as a new process would start."""
    from lakecast.delta.log import forget

    forget()
    try:
        spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    except Exception as e:  # Spark Connect: no JVM in this process
        print(f"(Spark's DeltaLog cache not cleared: {e})")


def _read_in_tasks(spark: Any, path: str, p: int) -> list[int]:
    """Read every row of the Delta table at ``path`` into Arrow in each of ``p`` tasks
    (one Spark job): its files listed once in the driver (delta-rs, as a restore lists
    its checkpoint's), read with pyarrow by every task; each task's row count."""
    import pyarrow as pa

    from lakecast.delta import io as delta_io

    files = delta_io.table_files(path, delta_io.latest_version(path))

    def task(batches: Any) -> Any:
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"rows": [files.read().num_rows]})

    return [r["rows"] for r in spark.range(0, p, 1, p).mapInArrow(task, "rows long").collect()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.snapshots", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--p", type=int, default=4)
    parser.add_argument("--name", default="snapshots")
    parser.add_argument("--keep", action="store_true", help="keep the scratch lake")
    parser.add_argument("--repeats", type=int, default=3,
                        help="samples of each side, alternating which goes first (medians)")
    parser.add_argument("--child-timeout", type=float, default=900.0,
                        help="seconds a fresh-application child may take")
    parser.add_argument("--child", choices=("checkpoint", "plain"), help=argparse.SUPPRESS)
    parser.add_argument("--child-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args.child, args.entries, args.p, args.child_dir)
    started = BENCH.start()

    root = Path(tempfile.mkdtemp(prefix="lakecast-bench-snapshots-"))
    os.environ["LAKECAST_LAKE_ROOT"] = str(root / "lake")
    os.environ["LAKECAST_CHECKPOINT_ROOT"] = str(root / "checkpoints")
    from pyspark.sql import functions as F

    from lakecast.config import get_settings
    from lakecast.delta import io as delta_io
    from lakecast.snapshots.checkpointer import snapshot_path
    from lakecast.snapshots.runtime import SnapshottingRuntime
    from lakecast.snapshots.store import SnapshotStore
    from lakecast.spark import get_spark

    settings = get_settings()
    p, n = args.p, args.entries
    items = settings.table_path("items")
    delta_io.overwrite_arrow(_items_arrow(n), items, create=True)  # delta-rs, not Spark
    out: dict[str, Any] = {"entries": n, "p": p, "cpus": os.cpu_count()}
    # the judged measure: each sample a fresh application's first write of its kind, the
    # sides alternating which goes first (plain first at repeat 0); before this process
    # starts Spark, so no other JVM runs beside a child
    fresh: dict[str, list[dict[str, Any]]] = {"checkpoint": [], "plain": []}
    for r in range(args.repeats):
        for side in (("plain", "checkpoint") if r % 2 == 0 else ("checkpoint", "plain")):
            sample = _fresh_application(side, n, p, root / f"fresh_{side}{r}",
                                        args.child_timeout)
            print(f"fresh application {r} {side}: first write {sample['seconds']:.3f} s "
                  f"(session {sample['session_s']} s, first batch {sample['first_batch_s']} s)")
            fresh[side].append(sample)
    out["first_checkpoint_runs_s"] = [round(s["seconds"], 3) for s in fresh["checkpoint"]]
    out["first_plain_write_runs_s"] = [round(s["seconds"], 3) for s in fresh["plain"]]
    out["first_checkpoint_s"] = statistics.median(s["seconds"] for s in fresh["checkpoint"])
    out["first_plain_write_s"] = statistics.median(s["seconds"] for s in fresh["plain"])
    out["fresh_application_samples"] = fresh

    spark = get_spark(app_name="lakecast-bench-snapshots")
    rows_df = _rows_df(spark, n)
    events = _events(spark, n, p)
    store = SnapshotStore(spark, snapshot_path(settings, "bench"), "bench")

    def runtime(par: int, restore: bool = True, into: SnapshotStore = store
                ) -> SnapshottingRuntime:
        return _runtime(spark, items, into, par, restore)

    def first_batch(rt: SnapshottingRuntime, par: int) -> int:
        return _first_batch(rt, events, par)

    # cold start from the full table (the baseline), then the checkpoint
    rt = runtime(p, restore=False)
    out["cold_start_full_table_s"], rows = _timed(lambda: first_batch(rt, p))
    assert rows == EVENTS
    # in-process (reported, not judged): the checkpoint and, beside it, what a user would
    # do instead: a plain Delta write of the same rows (a new table each time, as each
    # checkpoint is the first of its store); each timed --repeats times, alternating which
    # goes first, medians reported
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
            assert first_batch(rt_r, p) == EVENTS

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
    # what a user would do instead of a restore: a cold read of the same rows into the
    # shape a restore leaves them in, Arrow in each of the p tasks (the baseline); beside
    # it, cold reads into Arrow in the driver only (Spark, direct). Each of a copy at a
    # path never opened by this process, after forgetting every cached Delta table
    reads: dict[str, float] = {}
    for how in ("tasks", "driver_spark", "driver_direct"):
        copy = str(root / f"cold_read_{how}")
        shutil.copytree(root / "plain0", copy)
        _cold(spark)
        if how == "tasks":
            reads[how], got = _timed(lambda copy=copy: _read_in_tasks(spark, copy, p))
            assert got == [n] * p, (how, got)
            continue
        if how == "driver_spark":
            reads[how], tbl = _timed(lambda copy=copy: delta_io.read(spark, copy).toArrow())
        else:
            reads[how], tbl = _timed(lambda copy=copy: delta_io.table_files(
                copy, delta_io.latest_version(copy)).read())
        assert tbl.num_rows == n, (how, tbl.num_rows)
    out["plain_delta_read_s"] = reads["tasks"]
    out["cold_read_driver_spark_s"] = round(reads["driver_spark"], 3)
    out["cold_read_driver_direct_s"] = round(reads["driver_direct"], 3)
    # restore (same p) and rescale (p/2, 2p): cold runtimes (a new store object, nothing
    # cached about any Delta table) to their first batch
    for label, par in (("restore", p), ("rescale_down", max(1, p // 2)), ("rescale_up", 2 * p)):
        _cold(spark)
        rt2 = runtime(par, into=SnapshotStore(spark, store.path, store.pipeline))
        t_driver, _ = _timed(lambda rt2=rt2: rt2.refresh())
        t_tasks, rows = _timed(lambda rt2=rt2, par=par: first_batch(rt2, par))
        assert rows == EVENTS and rt2.restored is not None
        out[f"{label}_p"] = par
        out[f"{label}_driver_s"] = round(t_driver, 3)  # read + verify + decode + broadcast
        out[f"{label}_first_batch_s"] = round(t_tasks, 3)  # tasks load the state + process
        out[f"{label}_total_s"] = round(t_driver + t_tasks, 3)
        rt2.close()
    out["first_checkpoint_vs_first_plain_write"] = (out["first_checkpoint_s"]
                                                    / out["first_plain_write_s"])
    out["checkpoint_vs_plain_write"] = out["checkpoint_s"] / out["plain_delta_write_s"]
    out["restore_vs_plain_read"] = out["restore_total_s"] / out["plain_delta_read_s"]
    out["restore_driver_vs_cold_driver_read"] = out["restore_driver_s"] / min(
        reads["driver_spark"], reads["driver_direct"])
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
