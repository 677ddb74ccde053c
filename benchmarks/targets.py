"""Every benchmark's pre-registered targets (issue 40 items 1-2), declared before any run.

The values are read from each benchmark's own result dict (the measurements are the
benchmarks'; this only declares and judges them). A rule that the issue sets and a
benchmark does not follow yet says so in its ``note``: its verdict is then reported but
does not meet the declared rule until the benchmark measures that way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from benchmarks.registry import Benchmark, Measure, Result, Rule, dig, key, ratio, sides


def _percentile(path: str, q: float) -> Callable[[Result], float | None]:
    """A value: the ``q`` percentile (nearest rank) of the list at ``path``."""
    def value(result: Result) -> float | None:
        xs: Sequence[float] | None = dig(result, path)
        if not xs:
            return None
        ordered = sorted(xs)
        return float(ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))])
    return value


BROADCAST_ENRICHMENT = Benchmark(
    "broadcast_enrichment", "python -m benchmarks.broadcast_enrichment", (
    Measure("a_tasks_over_f_broadcast", 1.2, "<=", "x",
            "F.broadcast hash join on 2M events (same enrich, same Delta write)",
            Rule(repeats=4, statistic="median", order="rotated", first_run_counts=True,
                 note="default execution (task-local state); cold start included"),
            value=key("a.ratio"), sides=sides(lakecast_s="a.lakecast_median_s",
                                              f_broadcast_s="a.bhj_median_s"),
            history=("2026-11-28: a fifth side joins the rotation, reported without a "
                     "target: the same lookups hand-written in one mapInArrow without "
                     "Lakecast, to show what PySpark's Arrow round trip of these columns "
                     "costs; the measure, its two sides and its rule are unchanged (last "
                     "result before: 1.294, 7.25 s vs 5.60 s, commit fb01cb1).",
                     "2026-11-29: the default execution of a pure enrich(Lookup...) keeps its "
                     "task-local state in the executor JVM (a Java UDF over a per-executor "
                     "copy built from the chain's Arrow files, lakecast.runtime.jvm_state) "
                     "instead of the Python workers; the measure, its two sides and its rule "
                     "are unchanged (last result before: 1.38, 10.15 s vs 7.35 s).",
                     "2026-11-29 (later): the JVM state reads integer keys through a flat "
                     "index and shares equal values of low-cardinality columns; a changes "
                     "file's deletes apply before its upserts across record batches (a "
                     "correctness fix); the measure, its two sides and its rule are unchanged "
                     "(official results before: 1.259 at 018f586 and 1.288 at 7579843; after: "
                     "1.096 at 878ab72, with runs from 5.2 to 8.5 s on the Lakecast side).")),
    Measure("a_transform_over_f_broadcast_sql", 1.2, "<=", "x",
            "F.broadcast hash join plus the same transform in Spark SQL on 2M events (same "
            "Delta write)",
            Rule(repeats=4, statistic="median", order="rotated", first_run_counts=True,
                 note="an Enrichment overriding transform and output_schema (the tutorial's "
                      "shape): lookups in the executor JVM, the transform vectorized in the "
                      "Python workers; cold start included; declared 2026-12-02 before its "
                      "first run"),
            value=key("a.transform_ratio"),
            sides=sides(lakecast_s="a.transform_median_s",
                        f_broadcast_sql_s="a.bhj_transform_median_s"),
            history=("2026-12-02 (after its first run, which failed): the measured function "
                     "declares the columns its transform reads (Enrichment.transform_reads, "
                     "new), and the transform runs as one scalar Arrow UDF that sends only "
                     "those columns to Python and gets back only the columns it makes, "
                     "instead of a mapInArrow of every column; the target, the Spark side "
                     "and the rule are unchanged. Before: 1.46 (7.33 s vs 5.02 s, one "
                     "unofficial run at c508ffe); a probe of both at 9b33732: mapInArrow "
                     "1.53, the Arrow UDF over every column 1.58, over the two read columns "
                     "1.14. The same function without the declaration is reported beside, "
                     "without a target (a.transform_any_ratio).",),
            findings=("Any Python stage pays PySpark's Arrow round trip of its rows to the "
                      "Python workers and back, which the Spark SQL side never leaves the JVM "
                      "for: the same lookups hand-written in one mapInArrow without Lakecast "
                      "(a.handwritten_median_s, reported beside) take longer than the whole "
                      "F.broadcast side, and a probe of the tutorial's transform alone on the "
                      "same events found its own Python a small share of the Lakecast "
                      "side's time, the round trip of the columns it reads and makes most "
                      "of the gap.",
                      "What would meet the target: a transform that stays in the JVM after "
                      "the JVM lookups, declared as Spark column expressions or compiled to "
                      "them from pyarrow.compute calls; a transform in Python pays the round "
                      "trip whatever it does.")),
    Measure("b_cold_rebuild_1m_s", 2.0, "<=", "s",
            "a cold executor JVM's build of the 1M-row dimension from the chain's base",
            Rule(repeats=3, statistic="median", first_run_counts=True,
                 note="the first batch of each of (b)'s three Lakecast sides (a runtime "
                      "each, so a cold state each), measured in the JVM (StateStats' "
                      "build_ms: reading the base's Arrow file through Hadoop's FileSystem "
                      "and building the index); declared 2026-12-02 before its first run"),
            value=key("b.cold_rebuild_median_s"), sides=sides(runs_s="b.cold_rebuild_s")),
    Measure("b_delta_append_over_batch_join", 0.33, "<=", "x",
            "the same 20 micro-batches as broadcast hash joins against the table's version "
            "(a batch job each), both sides appending to Delta with Spark",
            Rule(repeats=20, statistic="total", order="rotated", first_run_counts=True,
                 note="issue 55 item 5: (b)'s like-for-like pair, reported since 2026-11 "
                      "without a target (0.41 to 0.49 in the committed runs); its target "
                      "declared 2026-12-03 before the next run"),
            value=key("b.ratio"),
            sides=sides(lakecast_s="b.lakecast_total_s", batch_join_s="b.batch_join_total_s"),
            findings=("Both sides pay the same Spark Delta append of about the same rows in "
                      "every batch, and that append alone (b.totals_s.events_append: the "
                      "raw events appended with Spark) is a large share of the batch-join "
                      "side's whole time, so the ratio cannot go much below that share "
                      "however fast the enrichment is: to reach the target with Spark's "
                      "append on both sides, the Lakecast enrichment would have to take less "
                      "than a pass-through mapInArrow of the same events costs "
                      "(b.totals_s.identity_nosink).",
                      "What would meet it: the whole function in the executor JVM (no Python "
                      "stage), or Lakecast's own write; Lakecast's exactly-once path (rows "
                      "collected as Arrow, a delta-rs append with a transaction id: "
                      "b.totals_s.lakecast_txn) makes the whole Lakecast batch cheaper "
                      "than Spark's append alone, and passes against the stream-static "
                      "query (b_exactly_once_over_stream_static).")),
    Measure("b_no_sink_over_stream_static", 0.33, "<=", "x",
            "stream-static join into the noop sink (batch job), 20 micro-batches",
            Rule(repeats=20, statistic="total", order="rotated", first_run_counts=True),
            value=key("b.enrichment_only.ratio"),
            sides=sides(lakecast_s="b.enrichment_only.lakecast_nosink_total_s",
                        stream_static_s="b.enrichment_only.batch_join_nosink_total_s"),
            history=("2026-11-28: the Lakecast no-sink side observes its tasks' accounting "
                     "rows on the way to the sink (a Spark Observation, as side (a) and a "
                     "one-action user do) instead of caching the whole result to read them "
                     "from the cache: it failed at 0.434 (9.38 s vs 21.59 s, commit 1357e56) "
                     "with the cache; the target and the Spark side are unchanged.",)),
    Measure("b_exactly_once_over_stream_static", 0.33, "<=", "x",
            "stream-static Structured Streaming query, Delta source and sink",
            Rule(repeats=20, statistic="total", order="rotated", first_run_counts=True),
            value=key("b.exactly_once.ratio"),
            sides=sides(lakecast_s="b.exactly_once.lakecast_txn_total_s",
                        stream_static_s="b.exactly_once.stream_static_total_s")),
), conditions=lambda r: None if r.get("scale") == 1.0 else
    f"--scale {r.get('scale')} (the targets are set at scale 1: 2M events, 20 x 50k)")

def _keyed_state_conditions(result: Result) -> str | None:
    """Why a keyed-state run is not at its target's conditions (``None``: it is)."""
    size = (result.get("keys"), result.get("events_per_batch"), result.get("batches"))
    if size != (200_000, 100_000, 10):
        return (f"{size[2]} batches of {size[1]} events over {size[0]} keys (the target is "
                f"set on 10 x 100,000 over 200,000)")
    asked = dig(result, "sides.tws.extra.api_requested")
    if asked not in (None, "transformWithState"):
        return f"the Spark side ran {asked} (the target is set against transformWithState)"
    return None


KEYED_STATE = Benchmark("keyed_state", "python -m benchmarks.keyed_state", (
    Measure("lakecast_over_tws_total", 0.5, "<=", "x",
            "row-based transformWithState (PySpark 4.2), RocksDB with changelog "
            "checkpointing, one always-on query",
            Rule(repeats=1, statistic="total", order="rotated", first_run_counts=True,
                 note="10 micro-batches of 100k events over 200k keys; the Spark query "
                      "(processingTime 100 ms, Delta source and sink) started before "
                      "timing, its start reported apart; a Spark batch's time is the "
                      "triggerExecution of the trigger that processed the append (trigger "
                      "wait excluded, the latency beside it); each Lakecast batch a unit "
                      "of work of its own; the sides alternate going first, Lakecast "
                      "first at batch 0; totals over all batches"),
            value=key("ratios_lakecast_over_tws.total_s"),
            sides=sides(lakecast_s="sides.lakecast.total_s", tws_s="sides.tws.total_s",
                        tws_api="sides.tws.extra.api",
                        tws_query_start_s="sides.tws.query_start_s",
                        tws_latency_s="sides.tws.extra.latency_total_s"),
            history=("2026-12-03: a third side joins the rotation (the JVM streaming "
                     "aggregation, lakecast_over_jvm_aggregation_total); its always-on "
                     "query polls the events table while the other sides work, as the tws "
                     "query does; this measure, its sides and its rule are unchanged (last "
                     "result before: 0.359, 65.0 s vs 181.0 s, commit 1357e56).",)),
    Measure("lakecast_over_jvm_aggregation_total", 0.5, "<=", "x",
            "a JVM streaming aggregation (groupBy key: count, max_by(amount, seq)), update "
            "mode, RocksDB with changelog checkpointing, exactly once into Delta "
            "(foreachBatch, idempotent txnAppId/txnVersion append), one always-on query",
            Rule(repeats=1, statistic="total", order="rotated", first_run_counts=True,
                 note="issue 55 item 5, declared 2026-12-03 before its first run; the same "
                      "10 micro-batches of 100k events over 200k keys, timing and rotation "
                      "as the transformWithState measure"),
            value=key("ratios_lakecast_over_agg.total_s"),
            sides=sides(lakecast_s="sides.lakecast.total_s", agg_s="sides.agg.total_s",
                        agg_query_start_s="sides.agg.query_start_s",
                        agg_latency_s="sides.agg.extra.latency_total_s"),
            findings=("Each Lakecast batch is a unit of work of its own: it reads the "
                      "state rows of the batch's keys from the Delta state table, shuffles "
                      "and sorts the events and those rows by key group, calls the Python "
                      "function once per event, then appends the changed keys to the state "
                      "table and the output. A probe of the same batches, each step forced "
                      "and timed on its own (benchmarks.keyed_phases: results/"
                      "keyed_state.phases.json), found the shuffled job with the per-event "
                      "Python calls the largest share of a batch, the state read before it "
                      "the next, both writes a small share. "
                      "The JVM aggregation is one always-on query: its state stays in "
                      "RocksDB on the executor between batches and its update is generated "
                      "JVM code over the whole batch.",
                      "What would meet the target: keyed state kept warm on the executors "
                      "across batches (RocksDB or Spark's state store, with Delta as the "
                      "checkpoint it restores from) instead of a join against the state "
                      "table per batch, and a keyed update declared as a vectorized "
                      "function of a key group's events (or as Spark aggregate "
                      "expressions) instead of one Python call per event.")),
), conditions=_keyed_state_conditions)

SNAPSHOTS = Benchmark("snapshots", "python -m benchmarks.snapshots", (
    Measure("first_checkpoint_over_plain_write", 2.0, "<=", "x",
            "the first plain Delta write of the same rows by an application",
            Rule(repeats=3, statistic="median", order="alternating", first_run_counts=True,
                 note="each sample a fresh application's first write of its kind: a child "
                      "process with its own local Spark session runs the application's "
                      "first batch (untimed; the items table written by delta-rs, so "
                      "nothing warmed Spark's Delta write path), then its first checkpoint "
                      "or its first plain Spark Delta write of the same rows, timed; "
                      "median over median, the sides alternating which goes first (plain "
                      "first at repeat 0); the in-process (warm) checkpoints and plain "
                      "writes reported beside, not judged"),
            value=ratio("first_checkpoint_s", "first_plain_write_s"),
            sides=sides(first_checkpoint_s="first_checkpoint_s",
                        first_plain_write_s="first_plain_write_s",
                        first_checkpoint_runs_s="first_checkpoint_runs_s",
                        first_plain_write_runs_s="first_plain_write_runs_s",
                        inprocess_checkpoint_runs_s="checkpoint_runs_s",
                        inprocess_plain_write_s="plain_delta_write_s",
                        inprocess_plain_write_runs_s="plain_delta_write_runs_s"),
            history=("2026-11-26 (1b71add), after a failing run: the rule changed from one "
                     "sample of each side (4.38 s vs 1.83 s = 2.40x, FAIL) to the median of "
                     "three alternating samples, each checkpoint into a store of its own "
                     "(4.19 / 1.88 / 1.71 s vs 1.54 / 1.39 / 0.84 s = 1.35x, PASS); the "
                     "target stayed 2.0. That change let the warm in-process samples "
                     "outvote the application's first checkpoint, which is what a user "
                     "pays; so on 2026-11-27 (6c3e8ac, 29f92cf) the measure became the one "
                     "above: each sample a fresh application's first write of its kind, "
                     "both sides alike (first result: 6.54 s vs 4.68 s = 1.397x at "
                     "1357e56); the in-process figures are reported beside, not judged. "
                     "Recorded 2026-12-03 (issue 55 item 5).",)),
    Measure("restore_over_cold_read", 2.0, "<=", "x",
            "a cold read of the same rows into Arrow in each of the p tasks (one job)",
            Rule(repeats=1, statistic="single",
                 note="restore = a cold runtime's driver restore (read, verify, decode, "
                      "ship) + its first batch (tasks load the state); the read: the files "
                      "listed in the driver (delta-rs), read with pyarrow by every task; "
                      "cold for both: new store object, delta-rs handles and Spark's "
                      "DeltaLog cache dropped, the read of a table copy this process never "
                      "opened"),
            value=ratio("restore_total_s", "plain_delta_read_s"),
            sides=sides(restore_s="restore_total_s", read_s="plain_delta_read_s",
                        restore_driver_s="restore_driver_s",
                        driver_spark_read_s="cold_read_driver_spark_s",
                        driver_direct_read_s="cold_read_driver_direct_s")),
), conditions=lambda r: None if (r.get("entries"), r.get("p")) == (1_000_000, 4) else
    f"{r.get('entries')} entries over p={r.get('p')} (the targets are set on 1,000,000 "
    f"entries, p=4)")

_SENSOR_RULE = Rule(repeats=10, statistic="p50", order="fixed", first_run_counts=True,
                    note="1,300-event commits every 20 s, each delayed by its own tenth "
                         "of the sensor daemon's 5 s loop; the first commit after two idle "
                         "minutes included")
_STREAMING = sides(streaming_p50_s="streaming.p50_s", streaming_max_s="streaming.max_s")


#: issue 55's targets replace earlier, looser ones: said once per measure
_TIGHTENED = ("2026-12-03: from {old} to {new} (issue 55's target, declared before the "
              "next run), and every freshness benchmark now reads a commit's latency from "
              "the Delta logs of the events table and its output from outside the "
              "pipeline (benchmarks.freshness_watch) instead of the pipeline's progress "
              "log; last figure before, by the progress log: {last} (commit d9510f9).")


#: what the official sensor_freshness runs at fdeb7ec showed (figures: the runs' results and
#: the breakdown of their commits, from the Dagster instance's run records)
_SENSOR_FINDINGS = (
    "Each commit's latency splits in three: the sensor's tick until it creates the run, "
    "the run's launch (the queue, a new process, the code location's imports, the job "
    "loaded) until Dagster starts it, and the run's own work (attach to the Spark server, "
    "restore and warm the task-local state, one batch, its materializations) until the "
    "output commits. In the breakdown of the official runs the launch was the largest "
    "share, about half of each commit's latency, the run's own work about a quarter, the "
    "tick the rest; no run's first batch had a cold task. Dagster's sensor daemon looks at "
    "its sensors once per loop of at least 5 s (MIN_INTERVAL_LOOP_TIME in "
    "dagster._daemon.sensor), so the project's 3 s sensor interval acts as 5 s. Commits "
    "more than a minute apart would add a cold task to each run's batch (Spark stops "
    "Python workers idle for a minute; benchmarks.continuous_phases --pause measures it), "
    "which this benchmark's 20 s commits do not meet.",
    "What would meet the target: a run that does not pay a new process and the code "
    "location's imports per commit (the sensor's runs handed to a long-lived worker that "
    "holds the definitions loaded, as the continuous job does for its own batches), or "
    "those imports cut to a fraction; a shorter sensor interval alone cannot, the tick "
    "being the smallest share.",
)


#: the method's change after the official sensor_freshness FAIL at ff51723, with its figures
_PHASES = ("2026-12-07: the target is unchanged; the method changed after a failing official "
           "run. Dagster's sensor daemon looks every 5 s, and commits every 20 s all met "
           "one phase of that loop, the same for a whole run: in the runs at ff51723 each "
           "commit landed about 1 s after a look, so each waited about 4 s for the next "
           "(tick_s 3.7 to 4.6 s) where a user's commits, coming at any time, wait 2.5 s on "
           "average. Each commit is now delayed by its own tenth of the loop "
           "(benchmarks.common.phase_offsets), and sensor_freshness starts dagster dev as "
           "make ui does and idles 120 s before the first commit, as the rule's note says "
           "(it waited 20 s). Last figures with the fixed phase: p50 8.37 s (FAIL), max "
           "9.02 s (official, ff51723).")


def _sensor(prefix: str) -> tuple[Measure, Measure]:
    return (
        Measure("sensor_p50_s", 8.0, "<=", "s",
                "the always-on stream-static Structured Streaming query, same run",
                _SENSOR_RULE, value=key(f"{prefix}p50_s"), sides=_STREAMING,
                history=(_TIGHTENED.format(old="15 s", new="8 s", last="6.23 s"), _PHASES),
                findings=_SENSOR_FINDINGS),
        Measure("sensor_max_s", 20.0, "<=", "s",
                "the always-on stream-static Structured Streaming query, same run",
                replace(_SENSOR_RULE, statistic="max"),
                value=key(f"{prefix}max_s"), sides=_STREAMING,
                history=(_TIGHTENED.format(old="30 s", new="20 s", last="13.5 s"), _PHASES)),
    )


def _every_20s(result: Result, events: object) -> str | None:
    """Why a freshness run is not at 1,300-event commits every 20 s (``None``: it is)."""
    if result.get("every_s") == 20 and events == 1300:
        return None
    return f"commits every {result.get('every_s')} s of {events} events (targets: 1,300 / 20 s)"


def _sustained_load(result: Result) -> str | None:
    """Why a freshness run's sustained phase is not the declared load (``None``: it is,
    or the run had none): 2,000 events/s as a commit every 2 s for 10 minutes."""
    run = result.get("sustained")
    if not isinstance(run, dict):
        return None
    if (run.get("events_per_s"), run.get("commit_every_s"), run.get("minutes")) == (2000, 2.0,
                                                                                   10.0):
        return None
    return (f"sustained {run.get('events_per_s')} events/s, a commit every "
            f"{run.get('commit_every_s')} s for {run.get('minutes')} min (target: 2,000 / 2 s "
            "/ 10 min)")


def _make_ui(result: Result) -> str | None:
    """Why a freshness run's sensor mode is not what a ``make ui`` user gets (``None``:
    it is, or the run had no sensor mode: see :func:`_sensor_defaults`)."""
    return _sensor_defaults(result) if "sensor" in result else None


def _sensor_defaults(result: Result) -> str | None:
    """Why a sensor run is not what a ``make ui`` user gets (``None``: it is: the
    project's sensor interval, two idle minutes before the first commit)."""
    if result.get("sensor_interval_override_s") is not None:
        return f"sensor interval overridden ({result['sensor_interval_override_s']} s)"
    if (result.get("idle_s") or 0) < 120:
        return f"{result.get('idle_s')} s idle before the first commit (target: 120)"
    return None


#: what the official freshness runs at fdeb7ec and benchmarks.continuous_phases (results/
#: freshness.phases.json: a batch's laps, its waits on the server, the server's jobs) showed
_CONTINUOUS_FINDINGS = (
    "A warm batch of 1,300 events is one Spark job over Spark Connect, and most of its time "
    "is not in that job's tasks: the Spark jobs the server runs for it are a small share; "
    "the rest is the server planning the batch's one large query (validation, cross-batch "
    "dedup, held events, the Python state function, the rejected rows, results back as "
    "Arrow) and the schema requests the batch's DataFrames made before it, each a round "
    "trip in which the server analyzes the plan again. Removed so far: the validator's "
    "df.columns (18a3f7b), the dedup marks' and the rejected rows' requests (702e50b), the "
    "held events' columns when nothing is held (57c0153), and, since cd5d351, every "
    "request of a warm batch but the one PySpark's toArrow makes for the results (the "
    "validated events' schema is reused while the events' schema holds; a test counts "
    "them), and since 5fe6be4 that one too (the results carry the tasks' declared schema; "
    "the test now counts none). Also shortened: the wait for the next look at the Delta "
    "logs (the continuous run's poll_seconds, 0.25 s before 57c0153, is 0.05 s). Events "
    "appended by Spark were read through the Change Data Feed, which made the server load "
    "a snapshot of the events table; since 637d8b2 small appends are read on the driver "
    "whatever wrote them. The poll, the delta-rs writes and the progress log are a small share.",
    "What would meet the target: the query of a batch planned once per runtime and reused "
    "with the new events bound to it, so that a batch costs its tasks, its transfer and its "
    "writes (the server's planning is now the larger part of what is left); or, for "
    "batches this small, the events enriched on the driver from the state it holds, "
    "without a Spark job.",
)
_CONTINUOUS_P99_FINDINGS = (
    "Until 637d8b2 the slowest commit of every official run was the tenth, where two costs "
    "met: the broadcast-state checkpoint fell due (every 10 batches), and its divergence "
    "check (each task hashes its state in a Spark job of its own) ran between the batch's "
    "job and its writes; and the events table reached version 10, where Spark writes a "
    "Delta checkpoint, so the Change Data Feed read of the new events made the server "
    "load the table's snapshot from that checkpoint (a Spark job). The run's log split the "
    "tenth batch's excess between them. Since 637d8b2 small appends are read on the "
    "driver (no snapshot on the server), and a continuous run hashes the state of the "
    "next due batch in the background right after the batch before it, used when no "
    "broadcast version came in between (the batch's metadata says so: "
    "state_hashed_ahead). The tenth batch's Spark job is still slower than the others' by "
    "a few tenths of a second, not located yet.",
    "What would meet the target if it fails again: the tasks' state hashes carried in the "
    "accounting rows of the batch's own job instead of a job of their own.",
)

_SUSTAINED_RULE = Rule(repeats=1, statistic="p99",
                       note="2,000 events/s (a 4,000-event commit every 2 s) for 10 minutes, "
                            "every commit's latency; the streaming query under the same load "
                            "in the same run")
_CONTINUOUS_RULE = Rule(repeats=10, statistic="p50", first_run_counts=True,
                        note="1,300-event commits every 20 s")

FRESHNESS = Benchmark("freshness", "python -m benchmarks.freshness", (
    *_sensor("sensor."),
    Measure("continuous_p50_s", 0.5, "<=", "s",
            "the always-on stream-static Structured Streaming query, same run",
            _CONTINUOUS_RULE, value=key("continuous.p50_s"), sides=_STREAMING,
            history=(_TIGHTENED.format(old="1.0 s", new="0.5 s", last="0.98 s"),),
            findings=_CONTINUOUS_FINDINGS),
    Measure("continuous_p99_s", 1.5, "<=", "s",
            "the always-on stream-static Structured Streaming query, same run",
            replace(_CONTINUOUS_RULE, statistic="p99"),
            value=_percentile("continuous.latencies_s", 0.99), sides=_STREAMING,
            history=(_TIGHTENED.format(old="3.0 s", new="1.5 s", last="2.30 s"),),
            findings=_CONTINUOUS_P99_FINDINGS),
    Measure("continuous_sustained_p99_s", 2.0, "<=", "s",
            "the always-on stream-static Structured Streaming query, same load, same run",
            _SUSTAINED_RULE, value=key("sustained.p99_s"),
            history=(_TIGHTENED.format(old="5.0 s", new="2.0 s", last="2.49 s"),),
            sides=sides(events_per_s="sustained.events_per_s",
                        streaming_p99_s="sustained_streaming.p99_s",
                        highest_sustained_events_per_s="highest_sustained_events_per_s",
                        ceiling_found="ceiling_found")),
    Measure("continuous_sustained_lag_growing", 0.0, "<=", "bool",
            "lag growth: median latency of the last third of the commits over the first "
            "third (growing: > 1.5 and > 1 s apart), or commits left uncovered",
            _SUSTAINED_RULE, value=key("sustained.lag_growing"),
            sides=sides(lag_growth="sustained.lag_growth",
                        streaming_lag_growing="sustained_streaming.lag_growing")),
), conditions=lambda r: (_every_20s(r, r.get("events_per_commit")) or _make_ui(r)
                        or _sustained_load(r)),
    history=("2026-11-28: the harness finds a Lakecast commit's output from the pipeline's "
             "progress log read incrementally (the commits since its last read), as it "
             "already read the streaming sink; it re-read the whole log every 0.2 s, 0.9 s "
             "a read at the end of the 10-minute sustained phase (558 files), taking CPU "
             "from the Lakecast side it measured on 2 cores. Last figure with the old "
             "finder: sustained p99 6.21 s (p50 1.88 s), commit 89aaa5f; the targets, the "
             "load and the streaming side are unchanged.",))

SENSOR_FRESHNESS = Benchmark("sensor_freshness", "python -m benchmarks.sensor_freshness",
                             _sensor(""), conditions=lambda r: (
                                 _every_20s(r, r.get("events_per_commit"))
                                 or _sensor_defaults(r)))

#: issue 55 item 3's second default: the sensor of a new user's project under ``dg dev``
_DG_DEV_RULE = Rule(repeats=10, statistic="p50", order="fixed", first_run_counts=True,
                    note="the new-user test's create-dagster project as the README and the "
                         "tutorial set it up, nothing tuned (dg dev's own instance, the "
                         "project's Spark mode); 1,300-payment commits every 20 s written "
                         "with deltalake, each delayed by its own tenth of the sensor "
                         "daemon's 5 s loop; the first commit after two idle minutes "
                         "included; declared 2026-12-07 before its first run")
#: what the official dg_dev_freshness runs at 4b21733 showed (their breakdowns, from dg dev's
#: instance)
_DG_DEV_FINDINGS = (
    "A commit's latency splits as on the make ui path (the sensor's tick, the run's launch, "
    "the run), and the run is most of it: in a project's default Spark mode each run starts "
    "Spark in its own process (a JVM, Delta, the task-local state built cold from the "
    "newest snapshot), where make ui's runs attach to the Lakecast Spark server, already up, "
    "whose Python workers hold the state warm between runs. The launch is longer than make "
    "ui's too: dg dev's instance has Dagster's default run queue, looked at every 5 s (the "
    "repository's dagster.yaml: every second). The tick is as on the make ui path.",
    "What would meet the target: the project's runs attached to the Lakecast Spark server "
    "(LAKECAST_SPARK_REMOTE=server in the project's .env, which dg dev reads) and its run "
    "queue looked at every second (a dagster.yaml in the project folder), as the how-to on "
    "modes says. A tuned run at 557dc10 (--spark-remote server --dequeue-seconds "
    "1, in the history, not counted) met both targets: its runs took as long as make ui's, "
    "and its launches as make ui's. Out of the box, a new project would need the server started on "
    "demand by the sensor's runs, which the default (Spark in each process) does not do.",
)
DG_DEV_FRESHNESS = Benchmark("dg_dev_freshness", "python -m benchmarks.dg_dev_freshness", (
    Measure("sensor_p50_s", 8.0, "<=", "s", "the make ui path's sensor targets",
            _DG_DEV_RULE, value=key("p50_s"),
            sides=sides(first_after_idle_s="first_after_idle_s"), findings=_DG_DEV_FINDINGS),
    Measure("sensor_max_s", 20.0, "<=", "s", "the make ui path's sensor targets",
            replace(_DG_DEV_RULE, statistic="max"), value=key("max_s"),
            sides=sides(first_after_idle_s="first_after_idle_s")),
), conditions=lambda r: _every_20s(r, r.get("events_per_commit")) or (
    f"LAKECAST_SPARK_REMOTE={r['spark_remote']} set (the project's default: none)"
    if r.get("spark_remote") else None) or (
    f"the run queue looked at every {r['dequeue_seconds']} s (Dagster's default: 5)"
    if r.get("dequeue_seconds") else None) or (
    None if (r.get("idle_s") or 0) >= 120 else f"{r.get('idle_s')} s idle (target: 120)"))

PIPELINE = Benchmark("pipeline", "python -m benchmarks.pipeline", (
    Measure("lakecast_median_2k_s", 2.0, "<=", "s", "2,000-event micro-batch (warm)",
            Rule(repeats=20, statistic="median", first_run_counts=False),
            value=key("per_size.2000.lakecast.median_s"),
            sides=sides(streaming_s="per_size.2000.streaming.median_s")),
    Measure("ratio_2k_over_streaming", 0.5, "<=", "x",
            "Structured Streaming micro-batch, 2,000 events",
            Rule(repeats=20, statistic="median", first_run_counts=False),
            value=key("per_size.2000.ratio_l_over_s")),
    Measure("ratio_50k_over_streaming", 0.5, "<=", "x",
            "Structured Streaming micro-batch, 50,000 events",
            Rule(repeats=20, statistic="median", first_run_counts=False),
            value=key("per_size.50000.ratio_l_over_s")),
))

CLUSTER = Benchmark("cluster", "python -m benchmarks.cluster", (
    Measure("cluster_over_local", 1.5, "<=", "x", "the same batches on local[2]",
            Rule(repeats=5, statistic="median", first_run_counts=True),
            value=key("ratio"), sides=sides(cluster_s="cluster.median_seconds",
                                            local_s="local.median_seconds")),
))

def _sharded_scale(result: Result) -> str | None:
    """Why a sharded_state run is not at the declared scale (``None``: it is): a 10M-row
    dimension in 8 shards, 10 batches of 50k events."""
    got = (result.get("dim_rows"), result.get("shards"), result.get("batches"),
           result.get("batch_events"))
    if got == (10_000_000, 8, 10, 50_000):
        return None
    return (f"dimension {got[0]} rows in {got[1]} shards, {got[2]} batches of {got[3]} events "
            "(targets: 10M rows, 8 shards, 10 x 50k)")


_SHARDED_RULE = Rule(repeats=9, statistic="median", order="rotated", first_run_counts=False,
                     note="10 micro-batches of 50k events against a 10M-row dimension in 8 "
                          "shards, 1,000 of its rows changed between batches; the first "
                          "batch (the shards' cold build) is reported beside, not counted; "
                          "declared 2026-12-07 before the first run")
SHARDED_STATE = Benchmark("sharded_state", "python -m benchmarks.sharded_state", (
    Measure("warm_batch_over_shuffle_join", 1.5, "<=", "x",
            "a Spark shuffle join of the same events with the dimension's same version, "
            "appended to Delta", _SHARDED_RULE, value=key("ratio_over_shuffle_join"),
            sides=sides(lakecast_s="median_warm_batch_s.lakecast",
                        shuffle_join_s="median_warm_batch_s.shuffle_join",
                        cold_first_batch_s="first_batch_s.lakecast",
                        state_bytes_per_task_over_share="state_bytes_per_task_over_share")),
    Measure("warm_batch_over_stream_static", 0.5, "<=", "x",
            "a Structured Streaming stream-static query doing the same join, Delta source "
            "and sink", _SHARDED_RULE, value=key("ratio_over_stream_static"),
            sides=sides(lakecast_s="median_warm_batch_s.lakecast",
                        stream_static_s="median_warm_batch_s.stream_static")),
    Measure("checkpoint_over_delta_write", 1.5, "<=", "x",
            "a plain Delta write of the dimension at the same version",
            Rule(repeats=1, statistic="single", note="one checkpoint of the sharded state "
                 "after one batch; declared 2026-12-07 before the first run"),
            value=key("checkpoint_over_delta_write"),
            sides=sides(checkpoint_s="checkpoint.checkpoint_s",
                        plain_delta_write_s="checkpoint.plain_delta_write_s"),
            findings=("A checkpoint of a sharded state is the unsharded state's checkpoint: "
                      "the manifest job's tasks (the session's default parallelism, not the "
                      "shards) each take the whole table's serialization (made once per "
                      "machine, read by the others, as Python bytes), and the writer task "
                      "emits it whole, so it costs the table's sort and serialization, then "
                      "its copies into every task, then the write; the plain Delta write is "
                      "one pass of Spark's writer.",
                      "What would meet the target: a checkpoint per shard, each shard "
                      "serialized, hashed and written by one task of the shards' own job "
                      "(restore taking the union of the shards), so that the table passes "
                      "once through the tasks, as in a Delta write.")),
), conditions=_sharded_scale)

_SOAK_TARGETS = ("runs", "kills", "materializations", "counts", "memory", "broadcast_changes",
                 "lineage", "maintenance", "restore", "keyed_state", "fraud_state_bounded",
                 "snapshot_data_bounded")
SOAK = Benchmark("soak", "python -m benchmarks.soak", (
    *(Measure(name, 1.0, ">=", "bool", "holds over the whole soak",
              Rule(repeats=1, statistic="single"), value=key(f"targets.{name}"))
      for name in _SOAK_TARGETS),
    # issue 40 item 4: a kill -9 of the Spark server itself mid-batch, restarted with
    # `lakecast server start`: the killed run ended, a run after the restart succeeded, the
    # interrupted batch committed, no process of the old server left (events in == rows out
    # and each event_id once: `counts`); the time to recovery is reported beside it
    Measure("server_kill", 1.0, ">=", "bool",
            "the pipeline recovers from one kill -9 of the Spark server mid-batch",
            Rule(repeats=1, statistic="single",
                 note="once, at --server-kill-at x --minutes, while an enrichment_microbatch "
                      "run is STARTED with a batch planned and not committed"),
            value=key("targets.server_kill"),
            sides=sides(recovery_s="server_kill.recovery_s",
                        restart_s="server_kill.restart_s",
                        killed_run_status="server_kill.killed_run_status")),
))

_POLL_RULE = Rule(repeats=200, statistic="median", first_run_counts=False,
                  note="no new commit between polls; >= 20,000 commits, log checkpoints")
DELTA_LOG_POLL = Benchmark("delta_log_poll", "python -m benchmarks.delta_log_poll", (
    Measure("latest_version_p50_ms", 20.0, "<=", "ms",
            "latest_version of the events table", _POLL_RULE,
            sides=sides(p99_ms="latest_version_ms.p99", after_commit_p50_ms="after_commit_ms.p50",
                        cold_load_p50_ms="cold_load_ms.p50")),
    Measure("poll_p50_ms", 20.0, "<=", "ms",
            "the continuous loop's poll: versions of the events table + 3 broadcast tables",
            _POLL_RULE, sides=sides(p99_ms="poll_ms.p99", max_ms="poll_ms.max")),
    Measure("latest_version_after_commit_p50_ms", 20.0, "<=", "ms",
            "latest_version right after a new commit (found by stat of the commit file)",
            Rule(repeats=20, statistic="median", first_run_counts=True),
            value=key("after_commit_ms.p50"),
            sides=sides(reader_after_p50_ms="after_commit_reader_ms.p50"),
            history=("2026-11-28: latest_version no longer brings the table handle up to "
                     "date (27.8 ms p50, failing, when it did: update_incremental lists the "
                     "log folder); the next reader of the snapshot does, reported beside as "
                     "reader_after_p50_ms.",)),
), conditions=lambda r: None if (r.get("commits") or 0) >= 20_000 else
    f"{r.get('commits')} commits (the target is set on >= 20,000)")

ALL = (DELTA_LOG_POLL, BROADCAST_ENRICHMENT, KEYED_STATE, SNAPSHOTS, FRESHNESS,
       SENSOR_FRESHNESS, DG_DEV_FRESHNESS, PIPELINE, CLUSTER, SOAK, SHARDED_STATE)
