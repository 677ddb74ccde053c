"""Benchmark: keyed state per micro-batch — Spark's ``transformWithState`` and a JVM
streaming aggregation vs Lakecast.

    .venv/bin/python -m benchmarks.keyed_state [--scale S] [--only tws|agg|lakecast]
        [--keys K] [--batches B] [--events N] [--tws-api row|pandas] [--trigger-ms T]
        [--first lakecast|tws]

The workload (Flink's ``ValueState`` in a ``KeyedProcessFunction``): for every key, a
running count of its events and the amount of its latest event. ``--keys`` distinct keys
(default 200k), ``--batches`` micro-batches (default 10) of ``--events`` events each
(default 100k); ``--scale`` multiplies keys and events. Each side has its own Delta
events table (the same rows: same seed), created empty before anything starts; before
each micro-batch, its events are appended to it (a Spark Delta write, never timed).
Each side appends one output row ``(key, count, last_amount)`` per key touched to a
Delta output table.

* **tws** — the strongest option PySpark 4.2 offers: the row-based
  ``groupBy("key").transformWithState`` (Python ``Row`` interface, new in 4.1; it runs
  here, so it is the default; ``--tws-api pandas`` runs ``transformWithStateInPandas``
  instead, and a row-based query that fails to start falls back to it, the reason in
  ``sides.tws.extra.api_fallback``). State store: RocksDB
  (``spark.sql.streaming.stateStore.providerClass``) with changelog checkpointing
  (``spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled=true``), set
  on the session before the query starts (the values read back are in
  ``sides.tws.extra.spark_conf``). ONE always-on query (Delta streaming source, Delta
  sink, ``trigger(processingTime=--trigger-ms)``, default 100 ms) is started before any
  timing, on the empty events table, and runs until every batch is done; its start —
  up to its first trigger done, which runs the operator once over the empty table
  (Python workers, state store instances), as an always-on query has before its data
  arrives — is reported apart (``sides.tws.query_start_s``), never in the totals.

  A micro-batch's time is the ``durationMs.triggerExecution`` that the query's progress
  reports for the micro-batch(es) that processed the append (found by ``batchId`` in
  ``recentProgress``; the batch is done when the rows the progress reports as read reach
  the rows appended): the whole of Spark's work for the batch — offsets and WAL, the
  Delta read, the shuffle, the state store (RocksDB changelog commit), the Delta sink
  commit and the commit log — but not the wait for the next trigger after the append
  became visible, which depends only on the trigger interval chosen here (Lakecast's
  side is not charged a scheduling delay either). That is Spark's best case, so a
  Lakecast ratio against it is conservative. The latency from the append being visible
  (its Delta commit's timestamp) to the end of that trigger (progress ``timestamp`` +
  ``triggerExecution``) is recorded beside it (``sides.tws.extra.latency_s``,
  ``latency_total_s``) and so is its ratio (``ratios_lakecast_over_tws.latency_total_s``).
  While the other side works, the query keeps polling the Delta log every trigger
  interval (an always-on query's idle cost, on the same 2 cores).
* **agg** — what a Spark user writes for this workload when it needs no Python: a JVM
  streaming aggregation (``groupBy("key").agg(count, max_by(amount, seq))``, update
  mode), same source, state store (RocksDB with changelog checkpointing), trigger and
  timing as **tws**; each trigger's updated keys appended exactly once to Delta in
  ``foreachBatch`` (an idempotent write: ``txnAppId`` / ``txnVersion``). Its query is
  always on too, started before timing, polling while the other sides work.
* **lakecast** — ``KeyedBroadcastRuntime`` (``LakecastSide``): each micro-batch one
  separately started unit of work, as separate Dagster runs would be, timed with
  ``time.perf_counter()`` from before reading its new events (the Delta Change Data Feed
  since the previous batch) to after its state is durable; keyed state in a Delta table
  used as a changelog: each batch appends its changed keys (delta-rs, one commit), and
  the table is compacted to one row per key every ``compact_every`` batches (default 8,
  so one compaction falls in the steady batches of the default 10).

**Order rotated**: the sides alternate which one processes each micro-batch first —
batch ``i`` runs ``--first`` (default ``lakecast``) first when ``i`` is even, the other
side first when it is odd (``order`` in the JSON). Lakecast goes first at batch 0, so the
process's remaining one-off warm-ups (first Python workers of a job, first reads) fall
on its side: conservative for the Lakecast verdict.

For each side: per-batch seconds, total, first batch, steady-state mean (batches 2..B),
state bytes on disk; the final counts and last amounts are checked against an
independent pandas computation over the side's events table (``check``). Both sides run
in one process on one Spark session (the session start is not timed; a new Dagster run
would also pay it). Results are printed and written to
``benchmarks/results/<name>.json`` with the verdict of the pre-registered target
(``benchmarks.targets.KEYED_STATE``); the scratch data under ``var/bench/keyed_state/``
is deleted unless ``--keep``.
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
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from pyspark.sql import Row
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
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

RESULTS = Path(__file__).resolve().parent / "results"
PROJECT = Path(__file__).resolve().parent.parent
BENCH_ROOT = PROJECT / "var" / "bench" / "keyed_state"

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
CHANGELOG_CHECKPOINTING = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
#: the Spark side's state store, set on the session before its query starts
TWS_CONF = {
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    CHANGELOG_CHECKPOINTING: "true",
}
EVENT_COLUMNS = ("key", "seq", "amount")  # key long, seq long (global event order), amount double
OUTPUT_SCHEMA = "key long, count long, last_amount double"
STATE_SCHEMA = "count long, last_amount double"
TWS_APIS = {"row": "transformWithState", "pandas": "transformWithStateInPandas"}

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
    """The result dict both sides return (see ``LakecastSide`` for the contract)."""
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


def _events(spark: SparkSession, start: int, n: int, keys: int, seed: int) -> DataFrame:
    """``n`` events, ``seq`` from ``start``; keys uniform over ``[0, keys)``."""
    from pyspark.sql import functions as F

    return spark.range(0, n, 1, 2).select(
        F.floor(F.rand(seed) * keys).cast("long").alias("key"),
        (F.col("id") + start).alias("seq"),
        F.round(F.rand(seed + 1) * 100, 2).alias("amount"),
    )


def create_events_table(spark: SparkSession, events_path: str) -> int:
    """The empty events table (its schema, no rows), so that the always-on query can
    start before the first micro-batch; returns its version."""
    return delta_io.write(_events(spark, 0, 0, 1, 0), events_path)


def make_batches(spark: SparkSession, events_path: str, num_batches: int, events: int,
                 keys: int, seed: int) -> list[BatchAppender]:
    """``num_batches`` appenders; the i-th appends micro-batch i's ``events`` rows.

    Keys are uniform over ``[0, keys)``; ``seq`` is the global event order
    (``i * events + n``), so "last amount" is well defined across and within batches.
    """
    def appender(i: int) -> BatchAppender:
        def append() -> int:
            return delta_io.write(_events(spark, i * events, events, keys, seed + 2 * i),
                                  events_path)
        return append

    return [appender(i) for i in range(num_batches)]


def expected_final(spark: SparkSession, events_path: str) -> pd.DataFrame:
    """Independent pandas computation: per key, count and amount of the max ``seq``."""
    pdf = delta_io.read(spark, events_path).select(*EVENT_COLUMNS).toPandas()
    pdf = pdf.sort_values("seq")
    g = pdf.groupby("key")
    return pd.DataFrame({"count": g.size(), "last_amount": g["amount"].last()}) \
        .reset_index().sort_values("key").reset_index(drop=True)


def check_output(spark: SparkSession, output_path: str, expected: pd.DataFrame) -> dict[str, Any]:
    """Final state per key from the output table (the row with the largest count)."""
    out = delta_io.read(spark, output_path).select("key", "count", "last_amount").toPandas()
    final = out.sort_values(["key", "count"]).groupby("key").tail(1) \
        .sort_values("key").reset_index(drop=True)
    same_keys = final["key"].tolist() == expected["key"].tolist()
    ok = bool(same_keys and (final["count"].to_numpy() == expected["count"].to_numpy()).all()
              and (final["last_amount"].to_numpy() == expected["last_amount"].to_numpy()).all())
    return {"correct": ok, "output_rows": len(out), "keys": len(final),
            "expected_keys": len(expected)}


# --------------------------------------------------------------------------------------
# (A) Spark: transformWithState (rows) or transformWithStateInPandas, RocksDB with
#     changelog checkpointing, one always-on query started before timing
# --------------------------------------------------------------------------------------

def _key(key: Any) -> Any:
    """The grouping key's value (PySpark passes a one-element tuple)."""
    return key[0] if isinstance(key, tuple) else key


class CountAndLastRows(StatefulProcessor):
    """Per key: ValueState ``(count, last_amount)``; emits the new value per touched key
    (the row-based ``transformWithState`` interface: ``Row`` s in, ``Row`` s out)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getValueState("agg", STATE_SCHEMA)

    def handleInputRows(self, key: Any, rows: Iterator[Row],
                        timerValues: TimerValues) -> Iterator[Row]:
        current = self.state.get()  # None if absent: one state round trip, not two
        count, last = current if current is not None else (0, None)
        last_seq = -1
        for row in rows:
            count += 1
            if row.seq > last_seq:
                last_seq, last = row.seq, row.amount
        self.state.update((count, last))
        yield Row(key=_key(key), count=count, last_amount=last)

    def close(self) -> None:
        pass


class CountAndLast(StatefulProcessor):
    """The same for ``transformWithStateInPandas`` (pandas DataFrames in and out)."""

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
        yield pd.DataFrame({"key": [_key(key)], "count": [count], "last_amount": [last]})

    def close(self) -> None:
        pass


def _epoch(timestamp: str) -> float:
    """A progress ``timestamp`` (ISO 8601, UTC) as epoch seconds."""
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _conf(spark: SparkSession, key: str) -> str | None:
    """The session's value of ``key`` (its default when unset; ``None``: unknown)."""
    try:
        return spark.conf.get(key)
    except Exception:  # not a registered conf
        return None


class TwsSide:
    """(A): one always-on ``transformWithState`` query; see the module doc for what a
    micro-batch's time is."""

    engine = "tws"

    def __init__(self, spark: SparkSession, root: str, events_path: str, *,
                 events_per_batch: int, api: str = "row", shuffle_partitions: int = 8,
                 trigger_ms: int = 100, timeout_s: float = 3600.0, **_: Any) -> None:
        if api not in TWS_APIS:
            raise ValueError(f"--tws-api {api!r}: one of {sorted(TWS_APIS)}")
        self.spark, self.root, self.events_path = spark, root, events_path
        self.events_per_batch = events_per_batch
        self.api, self.shuffle_partitions = api, shuffle_partitions
        self.trigger_ms, self.timeout_s = trigger_ms, timeout_s
        self.checkpoint, self.output = f"{root}/checkpoint", f"{root}/outputs"
        self.query: StreamingQuery | None = None
        self.query_start_s: float | None = None
        self.fallback: str | None = None
        self.rows_seen = 0
        self.seen: set[tuple[Any, Any]] = set()  # (batchId, timestamp) of progress read
        self.last: tuple[Any, Any] | None = None
        self.batch_seconds: list[float] = []
        self.latency: list[float] = []
        self.trigger_wait: list[float] = []
        self.batch_ids: list[list[int]] = []
        self.progress: list[dict[str, Any]] = []
        self.load = [os.getloadavg()[0]]

    def _start_query(self, api: str, checkpoint: str) -> StreamingQuery:
        grouped = (self.spark.readStream.format("delta").load(self.events_path)
                   .select(*EVENT_COLUMNS).groupBy("key"))
        if api == "row":
            df = grouped.transformWithState(CountAndLastRows(), OUTPUT_SCHEMA, "Append", "None")
        else:
            df = grouped.transformWithStateInPandas(CountAndLast(), OUTPUT_SCHEMA,
                                                    "Append", "None")
        query = (df.writeStream.format("delta").outputMode("append")
                 .option("checkpointLocation", checkpoint)
                 .trigger(processingTime=f"{self.trigger_ms} milliseconds")
                 .start(self.output))
        query.processAllAvailable()  # the first trigger (no rows yet) has run
        return query

    def start(self) -> float:
        """Set the state store confs, start the query and wait for its first trigger
        (reported as ``query_start_s``, not in the totals)."""
        for k, v in TWS_CONF.items():
            self.spark.conf.set(k, v)
        self.spark.conf.set("spark.sql.shuffle.partitions", str(self.shuffle_partitions))
        t0 = time.perf_counter()
        try:
            self.query = self._start_query(self.api, self.checkpoint)
        except Exception as e:  # recorded, then the pandas API is tried
            if self.api != "row":
                raise
            self.fallback = f"{type(e).__name__}: {str(e).splitlines()[0][:500]}"
            print(f"[tws] row-based transformWithState did not start ({self.fallback}); "
                  "falling back to transformWithStateInPandas", flush=True)
            shutil.rmtree(self.checkpoint, ignore_errors=True)
            shutil.rmtree(self.output, ignore_errors=True)
            self.api = "pandas"
            t0 = time.perf_counter()
            self.query = self._start_query(self.api, self.checkpoint)
        self.query_start_s = time.perf_counter() - t0
        self._new_progress()  # the start's own (empty) triggers are not a micro-batch
        return self.query_start_s

    def api_label(self) -> str:
        """The Spark API this side's query runs."""
        return TWS_APIS[self.api]

    def _new_progress(self) -> list[dict[str, Any]]:
        """Progress entries not read before (a cheap ``lastProgress`` check first)."""
        assert self.query is not None
        last = self.query.lastProgress
        if last is None or (last.get("batchId"), last.get("timestamp")) == self.last:
            return []
        self.last = (last.get("batchId"), last.get("timestamp"))
        new = []
        for p in self.query.recentProgress:
            k = (p.get("batchId"), p.get("timestamp"))
            if k not in self.seen:
                self.seen.add(k)
                new.append(p)
        return new

    def process(self, i: int, append: BatchAppender) -> float:
        """Append micro-batch ``i`` (untimed) and wait until the query has processed it;
        its time: the ``triggerExecution`` of the trigger(s) that did."""
        assert self.query is not None
        version = append()
        target = (i + 1) * self.events_per_batch
        deadline = time.monotonic() + self.timeout_s
        done: list[dict[str, Any]] = []
        while self.rows_seen < target:
            if self.query.exception() is not None or not self.query.isActive:
                raise RuntimeError(
                    f"the {self.engine} query stopped: {self.query.exception()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.engine} batch {i} not processed in {self.timeout_s} s "
                                   f"({self.rows_seen} of {target} rows)")
            self.query.processAllAvailable()  # returns after a trigger found nothing new
            for p in self._new_progress():
                if p.get("numInputRows"):
                    done.append(p)
                    self.rows_seen += int(p["numInputRows"])
        for p in done:
            ops = p.get("stateOperators") or [{}]
            self.progress.append({
                "microBatch": i, "batchId": p.get("batchId"), "timestamp": p.get("timestamp"),
                "numInputRows": p.get("numInputRows"), "durationMs": p.get("durationMs"),
                "stateRowsTotal": ops[0].get("numRowsTotal"),
                "stateRowsUpdated": ops[0].get("numRowsUpdated"),
                "stateMemoryUsedBytes": ops[0].get("memoryUsedBytes"),
                "commitTimeMs": ops[0].get("commitTimeMs"),
            })
        # the append is visible to the query from its commit (the commit's timestamp)
        visible = delta_io.commit_info(self.events_path, version).timestamp_ms / 1000
        seconds = sum(p["durationMs"]["triggerExecution"] for p in done) / 1000
        first = min(_epoch(p["timestamp"]) for p in done)
        end = max(_epoch(p["timestamp"]) + p["durationMs"]["triggerExecution"] / 1000
                  for p in done)
        self.batch_seconds.append(seconds)
        self.latency.append(end - visible)
        self.trigger_wait.append(first - visible)
        self.batch_ids.append([int(p["batchId"]) for p in done])
        print(f"  {self.engine} batch {i}: {seconds:.2f}s (trigger), {end - visible:.2f}s from the "
              f"append visible; batch id(s) {self.batch_ids[-1]}", flush=True)
        return seconds

    def finish(self) -> dict[str, Any]:
        """Stop the query (untimed) and summarize."""
        assert self.query is not None
        conf = {k: _conf(self.spark, k) for k in
                (*TWS_CONF, "spark.sql.shuffle.partitions",
                 "spark.sql.streaming.stateStore.encodingFormat",
                 "spark.sql.streaming.stateStore.rocksdb.formatVersion")}
        self.query.stop()
        self.load.append(os.getloadavg()[0])
        touched = [p["stateRowsUpdated"] or 0 for p in self.progress]
        extra = {
            "api": self.api_label(),
            "api_requested": TWS_APIS["row"] if self.fallback else self.api_label(),
            "api_fallback": self.fallback,
            "spark_conf": conf,
            "trigger": f"processingTime {self.trigger_ms} ms (always on)",
            "timing": "durationMs.triggerExecution of the trigger(s) that processed the "
                      "append (query started before timing; trigger wait excluded)",
            "latency_s": [round(x, 3) for x in self.latency],
            "latency_total_s": round(sum(self.latency), 3),
            "trigger_wait_s": [round(x, 3) for x in self.trigger_wait],
            "query_batch_ids": self.batch_ids,
            "loadavg_1m_start_end": [round(x, 1) for x in self.load],
            "keys_touched_per_batch": touched,
            "checkpoint_bytes": dir_bytes(self.checkpoint),
            "shuffle_partitions": self.shuffle_partitions,
            "query_batches": self.progress,
        }
        out = summarize(self.engine, self.batch_seconds, f"{self.checkpoint}/state",
                        self.output, extra)
        out["query_start_s"] = round(self.query_start_s or 0.0, 3)
        return out

class AggSide(TwsSide):
    """(A') What a Spark user writes for this workload without Python in the query: a
    JVM streaming aggregation, ``groupBy("key").agg(count, max_by(amount, seq))``, in
    update mode, over the same Delta streaming source, with the same state store
    (RocksDB, changelog checkpointing) and trigger, timed the same way (the
    ``triggerExecution`` of the trigger(s) that processed the append). Delta's file
    sink takes no update mode, so each trigger's updated keys are appended in
    ``foreachBatch`` as an idempotent Delta write (``txnAppId`` / ``txnVersion`` = the
    batch id: Delta's documented exactly-once ``foreachBatch``), one row per key
    touched, as on the other sides."""

    engine = "agg"

    def api_label(self) -> str:
        return "streaming aggregation (count, max_by)"

    def _start_query(self, api: str, checkpoint: str) -> StreamingQuery:
        from pyspark.sql import functions as F

        app_id = f"lakecast-bench-keyed-agg-{os.getpid()}"
        output = self.output

        def append(batch: DataFrame, batch_id: int) -> None:
            delta_io.write(batch, output, txn=(app_id, int(batch_id)))

        df = (self.spark.readStream.format("delta").load(self.events_path)
              .select(*EVENT_COLUMNS).groupBy("key")
              .agg(F.count(F.lit(1)).alias("count"),
                   F.max_by("amount", "seq").alias("last_amount")))
        query = (df.writeStream.outputMode("update").foreachBatch(append)
                 .option("checkpointLocation", checkpoint)
                 .trigger(processingTime=f"{self.trigger_ms} milliseconds").start())
        query.processAllAvailable()  # the first trigger (no rows yet) has run
        return query

# --------------------------------------------------------------------------------------
# (B) Lakecast: keyed state in a Delta table, one unit of work per micro-batch
# --------------------------------------------------------------------------------------

class LakecastSide:
    """(B) Lakecast's keyed state on the same workload.

    ``lakecast.runtime.keyed.KeyedBroadcastRuntime`` with a
    ``KeyedBroadcastProcessFunction`` keyed by ``key`` holding one ``ValueState``
    ``(count, last_amount)`` and no broadcast tables.

    * ``root`` — an empty scratch folder for this side: the keyed-state Delta table is
      ``f"{root}/state"`` and the output Delta table ``f"{root}/outputs"``.
    * ``events_path`` — the Delta events table, columns ``key long, seq long,
      amount double`` (``seq`` = global event order), created empty (``create_version``).

    :meth:`process` is given micro-batch i's appender (it appends the events and returns
    the Delta version now current): called untimed, then the batch is timed with
    ``time.perf_counter()`` from before reading to after the state is durable (one
    separately started unit of work, as a Dagster run would be; no in-memory state
    carried from batch i-1 except what Spark itself keeps, e.g. warm Python workers —
    the TWS side has that too):

    1. read only the events new since micro-batch i-1 (the Delta Change Data Feed);
    2. process them with keyed state: per key, ``count`` += number of its new events and
       ``last_amount`` = ``amount`` of its event with the largest ``seq`` so far
       (the ``CountAndLast`` processor above, as ``ValueState`` with no TTL);
    3. append one row per key touched in this batch, ``key long, count long,
       last_amount double`` (the values after this batch), to ``f"{root}/outputs"``;
    4. persist the changed state (one append of the changed keys to the keyed-state Delta
       table, a compaction every ``compact_every`` batches: ``lakecast.runtime.keyed_store``).

    :meth:`finish` returns ``summarize("lakecast", ...)``: the TWS side's keys
    (``engine``, ``batches``, ``batch_seconds``, ``total_s``, ``first_batch_s``,
    ``steady_mean_s``, ``state_bytes`` (all Delta versions included), ``state_path``,
    ``output_path``, ``extra``).
    """

    engine = "lakecast"

    def __init__(self, spark: SparkSession, root: str, events_path: str, *,
                 create_version: int, shuffle_partitions: int = 8, **_: Any) -> None:
        self.spark, self.root, self.events_path = spark, root, events_path
        self.state_path, self.output_path = f"{root}/state", f"{root}/outputs"
        self.parallelism = int(shuffle_partitions)
        self.previous = create_version
        self.batch_seconds: list[float] = []
        self.changed: list[int] = []
        self.versions: list[int] = []

    def start(self) -> float:
        """Nothing runs between micro-batches: each one starts its own unit of work."""
        return 0.0

    def process(self, i: int, append: BatchAppender) -> float:
        from pyspark.sql import functions as F

        from lakecast.runtime.keyed import KeyedBroadcastRuntime

        version = append()  # untimed, as on the TWS side
        t0 = time.perf_counter()
        self.spark.conf.set("spark.sql.shuffle.partitions", str(self.parallelism))
        runtime = KeyedBroadcastRuntime(  # a new unit of work per batch (a Dagster run)
            self.spark, CountAndLastKeyed(), {}, self.state_path,
            order_columns=("seq",), key_groups=128, parallelism=self.parallelism,
            lineage=False)
        events = (delta_io.read_changes(self.spark, self.events_path, self.previous + 1, version)
                  .where(F.col("_change_type") == "insert")
                  .drop("_change_type", "_commit_version", "_commit_timestamp"))
        result = runtime.process(events, batch_id=i, processing_time=i + 1).persist()
        delta_io.write(result.main.select("key", "count", "last_amount"), self.output_path)
        self.versions.append(runtime.commit(result))
        self.changed.append(result.keyed_summary()["changed_keys"])
        result.unpersist()
        runtime.close()
        seconds = time.perf_counter() - t0
        self.batch_seconds.append(seconds)
        self.previous = version
        print(f"  lakecast batch {i}: {seconds:.2f}s, {self.changed[-1]} keys changed",
              flush=True)
        return seconds

    def finish(self) -> dict[str, Any]:
        from lakecast.runtime.keyed_store import DEFAULT_COMPACT_EVERY

        return summarize("lakecast", self.batch_seconds, self.state_path, self.output_path,
                         {"keys_changed_per_batch": self.changed,
                          "state_table_versions": self.versions,
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

SIDES: dict[str, type[TwsSide] | type[LakecastSide]] = {
    "tws": TwsSide, "agg": AggSide, "lakecast": LakecastSide}


def rotated_order(i: int, sides: Sequence[str], first: str) -> list[str]:
    """Micro-batch ``i``'s order: ``first`` first on even batches, last on odd ones."""
    order = [first, *[s for s in sides if s != first]] if first in sides else list(sides)
    return order if i % 2 == 0 else order[::-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.keyed_state", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies keys and events")
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--events", type=int, default=100_000, help="events per micro-batch")
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--only", choices=sorted(SIDES), help="run one side only")
    parser.add_argument("--tws-api", choices=sorted(TWS_APIS), default="row",
                        help="row: transformWithState (default); pandas: "
                             "transformWithStateInPandas")
    parser.add_argument("--trigger-ms", type=int, default=100,
                        help="the always-on query's processingTime trigger interval")
    parser.add_argument("--first", choices=sorted(SIDES), default="lakecast",
                        help="the side that goes first on even micro-batches (rotated)")
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
    names = [args.only] if args.only else list(SIDES)
    out: dict[str, Any] = {
        "keys": keys, "batches": args.batches, "events_per_batch": events,
        "scale": args.scale, "shuffle_partitions": args.shuffle_partitions,
        "cpus": os.cpu_count(), "spark": spark.version,
        "command": "python -m benchmarks.keyed_state "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "order": [rotated_order(i, names, args.first) for i in range(args.batches)],
        "sides": {},
    }
    # untimed setup: each side's (empty) events table and appenders, then its start
    # (the TWS query: started before any timing, reported as query_start_s)
    sides: dict[str, TwsSide | LakecastSide] = {}
    paths: dict[str, str] = {}
    appenders: dict[str, list[BatchAppender]] = {}
    for name in names:
        root = BENCH_ROOT / name
        root.mkdir(parents=True)
        paths[name] = str(root / "events")
        created = create_events_table(spark, paths[name])
        appenders[name] = make_batches(spark, paths[name], args.batches, events, keys,
                                       args.seed)
        sides[name] = SIDES[name](spark, str(root), paths[name], events_per_batch=events,
                                  api=args.tws_api, trigger_ms=args.trigger_ms,
                                  create_version=created,
                                  shuffle_partitions=args.shuffle_partitions)
        start_s = sides[name].start()
        if isinstance(sides[name], TwsSide):
            print(f"[{name}] {sides[name].api_label()} query started in {start_s:.1f}s "
                  "(not timed)", flush=True)
    for i, order in enumerate(out["order"]):
        for name in order:
            sides[name].process(i, appenders[name][i])
    for name in names:
        res = sides[name].finish()
        res["check"] = check_output(spark, res["output_path"],
                                    expected_final(spark, paths[name]))
        out["sides"][name] = res
    ran = out["sides"]
    if "tws" in ran and "lakecast" in ran:
        t, lc = ran["tws"], ran["lakecast"]
        out["ratios_lakecast_over_tws"] = {
            k: round(lc[k] / t[k], 3) if t[k] else None
            for k in ("total_s", "first_batch_s", "steady_mean_s", "state_bytes")
        }
        lat = t["extra"]["latency_total_s"]
        out["ratios_lakecast_over_tws"]["latency_total_s"] = (
            round(lc["total_s"] / lat, 3) if lat else None)
    if "agg" in ran and "lakecast" in ran:
        a, lc = ran["agg"], ran["lakecast"]
        out["ratios_lakecast_over_agg"] = {
            k: round(lc[k] / a[k], 3) if a[k] else None
            for k in ("total_s", "first_batch_s", "steady_mean_s", "state_bytes")}

    target = RESULTS / f"{args.name}.json"
    BENCH.report(out, started, name=args.name, results_dir=RESULTS)
    print(f"keys={keys} batches={args.batches} events/batch={events} "
          f"shuffle.partitions={args.shuffle_partitions} cpus={os.cpu_count()}")
    cols = ("total_s", "first_batch_s", "steady_mean_s", "state_bytes")
    print(f"{'side':<10}" + "".join(f"{c:>16}" for c in cols) + f"{'correct':>10}")
    for side, r in out["sides"].items():
        print(f"{side:<10}" + "".join(f"{r[c]:>16}" for c in cols)
              + f"{r['check']['correct']!s:>10}")
        print(f"{'':<10}  per batch (s): {r['batch_seconds']}")
    for name in ("tws", "agg"):
        if name in ran:
            x = ran[name]["extra"]
            print(f"{name}: {x['api']}, query start {ran[name]['query_start_s']} s (not in "
                  f"the totals), latency from append visible: total {x['latency_total_s']} s")
        if f"ratios_lakecast_over_{name}" in out:
            print(f"lakecast / {name}: " + json.dumps(out[f"ratios_lakecast_over_{name}"]))
    print(f"-> {target}")
    spark.stop()
    if not args.keep:
        shutil.rmtree(BENCH_ROOT, ignore_errors=True)
    bad = [s for s, r in ran.items() if not r["check"]["correct"]]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
