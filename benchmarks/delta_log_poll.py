"""Cost of polling Delta versions on a long log (issue 40 item 3).

``python -m benchmarks.delta_log_poll [--commits 20000] [--checkpoint-every 100]
[--polls 200]``

1. builds (once; cached under ``var/bench/delta_log_poll``, reused while its commit count
   matches) an events table of ``--commits`` ``deltalake`` appends (empty ones, and a
   one-row one every ``--checkpoint-every`` commits: a snapshot that stays small keeps
   the build fast) with a log checkpoint (``DeltaTable.create_checkpoint()``) every
   ``--checkpoint-every`` commits, and three broadcast tables (copies of it: the same long log);
2. times, ``--polls`` times each, after one warm-up call (not counted):

   - ``latest_version`` of the events table (:func:`lakecast.delta.log.latest_version`);
   - the continuous loop's poll: the versions of the events table and the 3 broadcast
     tables, as ``jobs.storefront.pipeline.pipeline_versions`` reads them;
   - ``latest_version`` right after a new (empty) commit of the events table, 20 times
     (each run adds 20 commits to the cached table), and beside it (not judged) the
     ``commit_info`` of that commit right after: the reader that brings the handle up to
     date pays ``update_incremental``;
   - for reference: a fresh ``DeltaTable(path).version()`` (a cold load of the log);

3. prints the p50 / p99 / max of each and PASS/FAIL of the p50s against the target
   (<= 20 ms on >= 20,000 commits); JSON goes to ``benchmarks/results/delta_log_poll.json``.

No Spark: it only needs the machine to be quiet for the figures to mean something.

On a local filesystem ``latest_version`` finds new commits by ``stat`` of the next commit
files; ``update_incremental``, which lists the whole ``_delta_log`` folder there
(delta-rs / object_store; S3 lists from the version on), is paid by the next reader of
the snapshot (``after_commit_reader_ms``): that one grows with the number of log files.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.targets import DELTA_LOG_POLL as BENCH

ROOT = Path(__file__).resolve().parents[1] / "var" / "bench" / "delta_log_poll"
BROADCAST = ("dim_a", "dim_b", "dim_c")
MIN_COMMITS = 20_000

def build_table(path: Path, commits: int, checkpoint_every: int) -> None:
    """A table of ``commits`` appends (versions 0..commits-1; one row every
    ``checkpoint_every`` commits, else none), a log checkpoint every ``checkpoint_every``
    commits; a partly built one is continued, a complete one reused."""
    import pyarrow as pa
    from deltalake import DeltaTable, PostCommitHookProperties, write_deltalake

    row = pa.table({"id": pa.array([0], pa.int64())})
    empty = row.slice(0, 0)
    hooks = PostCommitHookProperties(create_checkpoint=False)
    if not DeltaTable.is_deltatable(str(path)):
        shutil.rmtree(path, ignore_errors=True)
        write_deltalake(str(path), row, post_commithook_properties=hooks)
    dt = DeltaTable(str(path))
    started = time.monotonic()
    for v in range(dt.version() + 1, commits):
        if v % (10 * checkpoint_every) == 0:  # a writer handle accumulates the commits it
            dt = DeltaTable(str(path))        # saw: a fresh one starts at the checkpoint
        data = row if v % checkpoint_every == 0 else empty
        write_deltalake(dt, data, mode="append", post_commithook_properties=hooks)
        if v % checkpoint_every == 0:
            dt.create_checkpoint()
        if v % 1000 == 0:
            print(f"  {v} commits ({time.monotonic() - started:.0f} s)", flush=True)


def build(commits: int, checkpoint_every: int, root: Path = ROOT) -> dict[str, Path]:
    """The events table and the broadcast tables (copies of it) under ``root``."""
    events = root / "events"
    build_table(events, commits, checkpoint_every)
    tables = {"events": events}
    for name in BROADCAST:
        copy = root / name
        if not (copy / "_delta_log" / f"{commits - 1:020d}.json").exists():
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(events, copy)
        tables[name] = copy
    return tables


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    """Milliseconds of ``repeats`` calls of ``fn`` after one uncounted warm-up call."""
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def after_commit(path: str, times: int) -> tuple[list[float], list[float]]:
    """Milliseconds of ``latest_version`` right after each of ``times`` new empty commits
    (it must see each one), and of the ``commit_info`` of that commit right after it (a
    reader of the snapshot: the handle then reads the new commit, the cost the poll
    leaves to it)."""
    import pyarrow as pa
    from deltalake import DeltaTable, PostCommitHookProperties, write_deltalake

    from lakecast.delta import log

    writer = DeltaTable(path)
    empty = pa.table({"id": pa.array([], pa.int64())})
    out, read = [], []
    for _ in range(times):
        write_deltalake(writer, empty, mode="append",
                        post_commithook_properties=PostCommitHookProperties(
                            create_checkpoint=False))
        t0 = time.perf_counter()
        seen = log.latest_version(path)
        t1 = time.perf_counter()
        info = log.commit_info(path, writer.version())
        t2 = time.perf_counter()
        out.append((t1 - t0) * 1000)
        read.append((t2 - t1) * 1000)
        if seen != writer.version() or info.version != seen:
            raise AssertionError(f"latest_version {seen} missed commit {writer.version()}")
    return out, read


def summary(ms: list[float]) -> dict[str, float]:
    """p50 / p99 / max of ``ms``, rounded."""
    ordered = sorted(ms)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50": round(statistics.median(ordered), 3), "p99": round(p99, 3),
            "max": round(ordered[-1], 3)}


def main(argv: list[str] | None = None) -> int:
    from deltalake import DeltaTable

    from lakecast.delta import log

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--commits", type=int, default=MIN_COMMITS)
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--polls", type=int, default=200)
    p.add_argument("--root", type=Path, default=ROOT, help="where the tables are built")
    args = p.parse_args(argv)

    load = BENCH.start()
    tables = build(args.commits, args.checkpoint_every, args.root)
    events = str(tables["events"])
    paths = [str(t) for t in tables.values()]
    latest = summary(timed(lambda: log.latest_version(events), args.polls))
    poll = summary(timed(lambda: [log.latest_version(x) for x in paths], args.polls))
    cold = summary(timed(lambda: DeltaTable(events).version(), min(args.polls, 20)))
    after_ms, read_ms = after_commit(events, 20)
    after, read = summary(after_ms), summary(read_ms)
    version = log.latest_version(events)
    print(f"events table: {version + 1 if version is not None else 0} commits, "
          f"checkpoint every {args.checkpoint_every}")
    for name, s in (("latest_version", latest), ("poll (4 tables)", poll),
                    ("latest_version after a commit", after),
                    ("then commit_info of it", read),
                    ("cold DeltaTable().version()", cold)):
        print(f"  {name:30s} p50 {s['p50']:8.3f} ms  p99 {s['p99']:8.3f} ms  "
              f"max {s['max']:8.3f} ms")
    big_enough = version is not None and version + 1 >= MIN_COMMITS
    result = BENCH.report({
        "latest_version_p50_ms": latest["p50"], "poll_p50_ms": poll["p50"],
        "commits": (version or 0) + 1, "checkpoint_every": args.checkpoint_every,
        "latest_version_ms": latest, "poll_ms": poll, "cold_load_ms": cold,
        "after_commit_ms": after, "after_commit_reader_ms": read,
        "scale_meets_target_conditions": big_enough}, load)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
