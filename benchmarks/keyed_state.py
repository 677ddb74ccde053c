"""Benchmark: keyed state per micro-batch — Spark's transformWithStateInPandas vs Lakecast.

    .venv/bin/python -m benchmarks.keyed_state [--scale S] [--only tws|lakecast]
                                               [--keys K] [--batches B] [--events N]

The workload (Flink's ``ValueState`` in a ``KeyedProcessFunction``): for every key, a
running count of its events and the amount of its latest event. ``--keys`` distinct keys
(default 200k), ``--batches`` micro-batches (default 10) of ``--events`` events each
(default 100k); ``--scale`` multiplies keys and events. Before each micro-batch, its
events are appended to a Delta events table (not timed). Each micro-batch is then one
separately started and stopped run, as separate Dagster runs would be, that reads the
new events, updates the keyed state, persists it and appends one output row
``(key, count, last_amount)`` per key touched to a Delta output table (timed).

* **tws** — ``groupBy("key").transformWithStateInPandas`` with the RocksDB state store
  provider, fed by a Delta streaming source; one ``trigger(availableNow=True)`` query run
  per micro-batch on the same checkpoint; Delta streaming sink.
* **lakecast** — ``KeyedBroadcastRuntime`` (``run_lakecast``): keyed state in a Delta
  table used as a changelog: each batch appends its changed keys (delta-rs, one commit),
  and the table is compacted to one row per key every ``compact_every`` batches (default
  8, so one compaction falls in the steady batches of the default 10).

For each side: per-batch seconds, total, first batch, steady-state mean (batches 2..B),
state bytes on disk; the final counts and last amounts are checked against an
independent pandas computation over the events table. Both sides run in one process on
one Spark session (the session start is not timed; a new Dagster run would also pay
it). Results are printed and written to ``benchmarks/results/<name>.json``; the scratch
data under ``var/bench/keyed_state/`` is deleted unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from benchmarks.targets import KEYED_STATE as BENCH
from lakecast.api.keyed import KeyedBroadcastProcessFunction
from lakecast.api.keyed_state import ValueStateDescriptor
from lakecast.delta import io as delta_io

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

RESULTS = Path(__file__).resolve().parent / "results"
PROJECT = Path(__file__).resolve().parent.parent
BENCH_ROOT = PROJECT / "var" / "bench" / "keyed_state"

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
EVENT_COLUMNS = ("key", "seq", "amount")  # key long, seq long (global event order), amount double
OUTPUT_SCHEMA = "key long, count long, last_amount double"
STATE_SCHEMA = "count long, last_amount double"

# A micro-batch source: calling it appends that batch's events to the events table
# (untimed) and returns the events table's Delta version now current.
BatchAppender = Callable[[], int]


# --------------------------------------------------------------------------------------
# shared helpers
# --------------------------------------------------------------------------------------

def dir_bytes(path: str | Path) -> int:
    """Bytes of all files under ``path`` (0 if it does not exist)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            fp = os.path.join(dirpath, f)
            if not os.path.islink(fp):
                total += os.path.getsize(fp)
    return total


def summarize(engine: str, batch_seconds: Sequence[float], state_path: str,
              output_path: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The result dict both sides return (see ``run_lakecast`` for the contract)."""
    secs = [round(s, 3) for s in batch_seconds]
    steady = secs[1:] or secs
    return {
        "engine": engine,
        "batches": len(secs),
        "batch_seconds": secs,
        "total_s": round(sum(secs), 3),
        "first_batch_s": secs[0] if secs else None,
        "steady_mean_s": round(statistics.fmean(steady), 3) if steady else None,
        "state_bytes": dir_bytes(state_path),
        "state_path": state_path,
        "output_path": output_path,
        "extra": extra or {},
    }


def make_batches(spark: SparkSession, events_path: str, num_batches: int, events: int,
                 keys: int, seed: int) -> list[BatchAppender]:
    """``num_batches`` appenders; the i-th appends micro-batch i's ``events`` rows.

    Keys are uniform over ``[0, keys)``; ``seq`` is the global event order
    (``i * events + n``), so "last amount" is well defined across and within batches.
    """
    from pyspark.sql import functions as F

    from lakecast.delta import io as delta_io

    def appender(i: int) -> BatchAppender:
        def append() -> int:
            df = spark.range(0, events, 1, 2).select(
                F.floor(F.rand(seed + 2 * i) * keys).cast("long").alias("key"),
                (F.col("id") + i * events).alias("seq"),
                F.round(F.rand(seed + 2 * i + 1) * 100, 2).alias("amount"),
            )
            return delta_io.write(df, events_path)
        return append

    return [appender(i) for i in range(num_batches)]


def expected_final(spark: SparkSession, events_path: str) -> pd.DataFrame:
    """Independent pandas computation: per key, count and amount of the max ``seq``."""
    from lakecast.delta import io as delta_io

    pdf = delta_io.read(spark, events_path).select(*EVENT_COLUMNS).toPandas()
    pdf = pdf.sort_values("seq")
    g = pdf.groupby("key")
    return pd.DataFrame({"count": g.size(), "last_amount": g["amount"].last()}) \
        .reset_index().sort_values("key").reset_index(drop=True)


def check_output(spark: SparkSession, output_path: str, expected: pd.DataFrame) -> dict[str, Any]:
    """Final state per key from the output table (the row with the largest count)."""
    from lakecast.delta import io as delta_io

    out = delta_io.read(spark, output_path).select("key", "count", "last_amount").toPandas()
    final = out.sort_values(["key", "count"]).groupby("key").tail(1) \
        .sort_values("key").reset_index(drop=True)
    same_keys = final["key"].tolist() == expected["key"].tolist()
    ok = bool(same_keys and (final["count"].to_numpy() == expected["count"].to_numpy()).all()
              and (final["last_amount"].to_numpy() == expected["last_amount"].to_numpy()).all())
    return {"correct": ok, "output_rows": len(out), "keys": len(final),
            "expected_keys": len(expected)}


# --------------------------------------------------------------------------------------
# (A) Spark: transformWithStateInPandas + RocksDB, one availableNow run per micro-batch
# --------------------------------------------------------------------------------------

class CountAndLast(StatefulProcessor):
    """Per key: ValueState ``(count, last_amount)``; emits the new value per touched key."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getValueState("agg", STATE_SCHEMA)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        current = self.state.get()  # None if absent: one state round trip, not two
        count, last = current if current is not None else (0, None)
        last_seq = -1
        for pdf in rows:
            count += len(pdf)
            i = int(pdf["seq"].to_numpy().argmax())
            if int(pdf["seq"].iat[i]) > last_seq:
                last_seq, last = int(pdf["seq"].iat[i]), float(pdf["amount"].iat[i])
        self.state.update((count, last))
        yield pd.DataFrame({"key": [key[0]], "count": [count], "last_amount": [last]})

    def close(self) -> None:
        pass


def run_tws(spark: SparkSession, root: str, events_path: str,
            batches: Sequence[BatchAppender], shuffle_partitions: int = 8) -> dict[str, Any]:
    """(A): each micro-batch = one ``availableNow`` query run on one checkpoint."""
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
    spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
    checkpoint, output = f"{root}/checkpoint", f"{root}/outputs"
    seconds: list[float] = []
    progress: list[dict[str, Any]] = []
    load = [os.getloadavg()[0]]
    for append in batches:
        append()
        t0 = time.perf_counter()
        query = (
            spark.readStream.format("delta").load(events_path)
            .select(*EVENT_COLUMNS)
            .groupBy("key")
            .transformWithStateInPandas(CountAndLast(), OUTPUT_SCHEMA, "Append", "None")
            .writeStream.format("delta")
            .outputMode("append")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start(output)
        )
        query.awaitTermination()
        query.stop()
        seconds.append(time.perf_counter() - t0)
        for p in query.recentProgress:
            ops = p.get("stateOperators") or [{}]
            progress.append({
                "batchId": p.get("batchId"), "numInputRows": p.get("numInputRows"),
                "durationMs": p.get("durationMs", {}).get("triggerExecution"),
                "stateRowsTotal": ops[0].get("numRowsTotal"),
                "stateRowsUpdated": ops[0].get("numRowsUpdated"),
                "stateMemoryUsedBytes": ops[0].get("memoryUsedBytes"),
                "commitTimeMs": ops[0].get("commitTimeMs"),
            })
    load.append(os.getloadavg()[0])
    touched = [p["stateRowsUpdated"] or 0 for p in progress if p["numInputRows"]]
    extra = {
        "loadavg_1m_start_end": [round(x, 1) for x in load],
        "keys_touched_per_batch": touched,
        "wall_ms_per_touched_key": [round(1000 * s / k, 2) if k else None
                               for s, k in zip(seconds, touched, strict=False)],
        "checkpoint_bytes": dir_bytes(checkpoint),
        "shuffle_partitions": shuffle_partitions,
        "state_store_provider": ROCKSDB_PROVIDER,
        "query_batches": progress,
    }
    return summarize("tws", seconds, f"{checkpoint}/state", output, extra)


# --------------------------------------------------------------------------------------
# (B) Lakecast: keyed state in a Delta table — to be filled in by the keyed runtime
# --------------------------------------------------------------------------------------

def run_lakecast(spark: SparkSession, root: str, events_path: str,
                 batches: Sequence[BatchAppender], **options: Any) -> dict[str, Any]:
    """(B) Lakecast's keyed state on the same workload.

    Expected to use ``lakecast.runtime.keyed.KeyedBroadcastRuntime`` with a
    ``KeyedBroadcastProcessFunction`` keyed by ``key`` holding one ``ValueState``
    ``(count, last_amount)`` and no broadcast tables (or an empty one).

    Inputs:

    * ``root`` — an empty scratch folder for this side: put the keyed-state Delta table
      under ``f"{root}/state"`` and the output Delta table at ``f"{root}/outputs"``
      (anything else, e.g. a progress log, under ``root`` too).
    * ``events_path`` — the Delta events table, columns ``key long, seq long,
      amount double`` (``seq`` = global event order). Empty before the first call below.
    * ``batches`` — one callable per micro-batch; ``batches[i]()`` appends micro-batch
      i's events to ``events_path`` and returns the Delta version now current. Call it,
      untimed, right before processing micro-batch i.
    * ``options`` — e.g. ``shuffle_partitions`` (main passes the same value as to TWS).

    For each micro-batch i, in order, timed with ``time.perf_counter()`` from before
    reading to after the state is durable (one separately started unit of work, as a
    Dagster run would be; no in-memory state carried from batch i-1 except what Spark
    itself keeps, e.g. warm Python workers — the TWS side has that too):

    1. read only the events new since micro-batch i-1 (Delta version range / CDF);
    2. process them with keyed state: per key, ``count`` += number of its new events and
       ``last_amount`` = ``amount`` of its event with the largest ``seq`` so far
       (the ``CountAndLast`` processor above, as ``ValueState`` with no TTL, no timers);
    3. append one row per key touched in this batch, ``key long, count long,
       last_amount double`` (the values after this batch), to the Delta table
       ``f"{root}/outputs"``;
    4. persist the changed state (one append of the changed keys to the keyed-state Delta
       table, a compaction every ``compact_every`` batches: ``lakecast.runtime.keyed_store``).

    Return ``summarize("lakecast", batch_seconds, f"{root}/state", f"{root}/outputs",
    extra)``, i.e. a dict with exactly the TWS side's keys: ``engine`` ("lakecast"),
    ``batches``, ``batch_seconds`` (list of float, one per micro-batch), ``total_s``,
    ``first_batch_s``, ``steady_mean_s`` (mean of batches 2..B), ``state_bytes`` (bytes on
    disk under the state path, all Delta versions included), ``state_path``,
    ``output_path``, ``extra`` (free-form, e.g. keys changed per batch, state table
    versions). ``main`` checks ``output_path`` against the pandas expectation.
    """
    from pyspark.sql import functions as F

    from lakecast.runtime.keyed import KeyedBroadcastRuntime
    from lakecast.runtime.keyed_store import DEFAULT_COMPACT_EVERY

    state_path, output_path = f"{root}/state", f"{root}/outputs"
    spark.conf.set("spark.sql.shuffle.partitions", str(options.get("shuffle_partitions", 8)))
    parallelism = int(options.get("shuffle_partitions", 8))
    batch_seconds: list[float] = []
    changed: list[int] = []
    versions: list[int] = []
    previous: int | None = None
    for i, append in enumerate(batches):
        version = append()  # untimed, as on the TWS side
        t0 = time.perf_counter()
        runtime = KeyedBroadcastRuntime(  # a new unit of work per batch (a Dagster run)
            spark, CountAndLastKeyed(), {}, state_path,
            order_columns=("seq",), key_groups=128, parallelism=parallelism, lineage=False)
        if previous is None:
            events = delta_io.read(spark, events_path, version=version)
        else:
            events = (delta_io.read_changes(spark, events_path, previous + 1, version)
                      .where(F.col("_change_type") == "insert")
                      .drop("_change_type", "_commit_version", "_commit_timestamp"))
        result = runtime.process(events, batch_id=i, processing_time=i + 1).persist()
        delta_io.write(result.main.select("key", "count", "last_amount"), output_path)
        versions.append(runtime.commit(result))
        changed.append(result.keyed_summary()["changed_keys"])
        result.unpersist()
        runtime.close()
        batch_seconds.append(time.perf_counter() - t0)
        previous = version
        print(f"  lakecast batch {i}: {batch_seconds[-1]:.1f}s, {changed[-1]} keys changed",
              flush=True)
    return summarize("lakecast", batch_seconds, state_path, output_path,
                     {"keys_changed_per_batch": changed, "state_table_versions": versions,
                      "key_groups": 128, "compact_every": DEFAULT_COMPACT_EVERY})


class CountAndLastKeyed(KeyedBroadcastProcessFunction):
    """Lakecast's side of the workload: per key, a count and the last amount (ValueState);
    one output row per key touched, emitted by a processing-time timer at the batch's
    end (registering the same time twice is one timer)."""

    key_by = "key"

    def keyed_state_descriptors(self) -> list[ValueStateDescriptor]:
        return [COUNT_AND_LAST]

    def output_schema(self, input_schema: Any) -> Any:
        import pyarrow as pa

        return pa.schema([("key", pa.int64()), ("count", pa.int64()),
                          ("last_amount", pa.float64())])

    def process_element(self, value: Any, ctx: Any) -> None:
        state = ctx.get_state(COUNT_AND_LAST)
        count, _ = state.value() or (0, None)
        state.update((count + 1, value["amount"]))
        ctx.timer_service().register_processing_time_timer(ctx.current_processing_time())

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        count, last = ctx.get_state(COUNT_AND_LAST).value()
        yield {"key": ctx.get_current_key(), "count": count, "last_amount": last}


COUNT_AND_LAST = ValueStateDescriptor("count_and_last", tuple)


# --------------------------------------------------------------------------------------

SIDES: dict[str, Callable[..., dict[str, Any]]] = {"tws": run_tws, "lakecast": run_lakecast}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.keyed_state", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies keys and events")
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--events", type=int, default=100_000, help="events per micro-batch")
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--only", choices=sorted(SIDES), help="run one side only")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--name", default="keyed_state")
    parser.add_argument("--keep", action="store_true", help="keep var/bench/keyed_state")
    args = parser.parse_args(argv)
    started = BENCH.start()

    keys = max(1, int(args.keys * args.scale))
    events = max(1, int(args.events * args.scale))
    shutil.rmtree(BENCH_ROOT, ignore_errors=True)
    BENCH_ROOT.mkdir(parents=True)
    os.environ.setdefault("LAKECAST_LAKE_ROOT", str(BENCH_ROOT / "lake"))
    os.environ.setdefault("LAKECAST_CHECKPOINT_ROOT", str(BENCH_ROOT / "checkpoints"))
    from lakecast.spark import get_spark

    spark = get_spark({"spark.sql.shuffle.partitions": str(args.shuffle_partitions)},
                      app_name="lakecast-bench-keyed-state")
    out: dict[str, Any] = {
        "keys": keys, "batches": args.batches, "events_per_batch": events,
        "shuffle_partitions": args.shuffle_partitions, "cpus": os.cpu_count(),
        "spark": spark.version, "command": "python -m benchmarks.keyed_state "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "sides": {},
    }
    for side in [args.only] if args.only else list(SIDES):
        root = BENCH_ROOT / side
        root.mkdir(parents=True)
        events_path = str(root / "events")
        batches = make_batches(spark, events_path, args.batches, events, keys, args.seed)
        try:
            res = SIDES[side](spark, str(root), events_path, batches,
                              shuffle_partitions=args.shuffle_partitions)
        except NotImplementedError as e:
            print(f"[{side}] not available: {e}")
            out["sides"][side] = {"engine": side, "skipped": str(e)}
            continue
        res["check"] = check_output(spark, res["output_path"],
                                    expected_final(spark, events_path))
        out["sides"][side] = res
    ran = {k: v for k, v in out["sides"].items() if "skipped" not in v}
    if "tws" in ran and "lakecast" in ran:
        t, lc = ran["tws"], ran["lakecast"]
        out["ratios_lakecast_over_tws"] = {
            k: round(lc[k] / t[k], 3) if t[k] else None
            for k in ("total_s", "first_batch_s", "steady_mean_s", "state_bytes")
        }

    target = RESULTS / f"{args.name}.json"
    BENCH.report(out, started, name=args.name, results_dir=RESULTS)
    print(f"keys={keys} batches={args.batches} events/batch={events} "
          f"shuffle.partitions={args.shuffle_partitions} cpus={os.cpu_count()}")
    cols = ("total_s", "first_batch_s", "steady_mean_s", "state_bytes")
    print(f"{'side':<10}" + "".join(f"{c:>16}" for c in cols) + f"{'correct':>10}")
    for side, r in out["sides"].items():
        if "skipped" in r:
            print(f"{side:<10}  skipped ({r['skipped']})")
            continue
        print(f"{side:<10}" + "".join(f"{r[c]:>16}" for c in cols)
              + f"{r['check']['correct']!s:>10}")
        print(f"{'':<10}  per batch (s): {r['batch_seconds']}")
    if "ratios_lakecast_over_tws" in out:
        print("lakecast / tws: " + json.dumps(out["ratios_lakecast_over_tws"]))
    print(f"-> {target}")
    spark.stop()
    if not args.keep:
        shutil.rmtree(BENCH_ROOT, ignore_errors=True)
    bad = [s for s, r in ran.items() if not r["check"]["correct"]]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
