"""Point-in-time replay: re-run committed batches of a pipeline into a separate table.

A replay takes committed batches ``first..last`` (batch ids of the progress log) and runs
each again exactly as it was planned — the same events range, the same validation and
cross-batch dedup (against the outputs as of the previous commit), the held events the
previous commit left — with the broadcast tables at a chosen state:

* ``original``: each batch's own planned broadcast versions (the versions its output rows
  name in ``_state_version``). The replay must reproduce the batches' main output
  exactly: an audit (:func:`compare`);
* ``latest``: the newest (contract-valid) versions of the broadcast tables, for every
  batch: what today's broadcast tables would have done;
* a timestamp: the versions current at that time (Delta time travel), for every batch.

Events the replay holds (state still missing) are re-offered to the next replayed batch,
as the pipeline does. The main output rows go to ``into`` (replaced by each replay) with
the column :data:`REPLAY_BATCH` naming the batch; nothing of the pipeline is written:
not its outputs, its progress log, its checkpoints or its keyed state table. A replay
runs a fresh runtime (its own worker cache), collects each batch to the driver (Arrow)
and writes it with delta-rs.

Keyed pipelines (:mod:`lakecast.replay.keyed`) start from their keyed state as of the batch
before ``first`` (empty for the first batch), copied into the scratch table
``<into>_keyed_state`` (replaced by each replay), which the replay advances batch by
batch. With ``latest`` or a timestamp, that state (built by the original broadcast
versions) meets the chosen versions at ``first``, as it would a new broadcast version:
the function's broadcast handler sees the changes (e.g. a changed rule's flags are
dropped); keyed state cannot go back, so versions older than the ones that state has
seen are refused (replay from an earlier batch, or from the first).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from lakecast.delta import io as delta_io
from lakecast.errors import LakecastError
from lakecast.pipeline.held import HELD_SIDE
from lakecast.pipeline.micro_batch import REASON_COLUMN, MicroBatchPipeline
from lakecast.pipeline.progress import MAIN_COUNT, BatchCommit, BatchPlan
from lakecast.replay.keyed import STATE_SUFFIX, KeyedReplay, start_meta
from lakecast.runtime.broadcast import BroadcastRuntime
from lakecast.runtime.keyed import KeyedBroadcastRuntime

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from lakecast.runtime.collected import CollectedOutput

ORIGINAL, LATEST = "original", "latest"
#: the replay table's column naming the replayed batch
REPLAY_BATCH = "_replayed_batch"


class ReplayError(LakecastError):
    """A replay cannot run as asked (range, state, target table); the message says why."""


@dataclass(frozen=True)
class ReplayedBatch:
    """One replayed batch: its plan, the state version it ran at, rows written."""

    plan: BatchPlan
    state_version: dict[str, int]
    events_in: int
    rows: int
    #: the main output rows the batch wrote originally (its commit's count)
    original_rows: int | None
    seconds: float


@dataclass(frozen=True)
class Verdict:
    """How a replay compares with the rows the batches wrote (multisets of rows)."""

    replayed: int
    original: int
    #: rows the batches wrote that the replay did not produce, and the reverse
    missing: int
    extra: int
    #: rows the batches wrote that the output table no longer holds (changed or deleted)
    gone: int

    @property
    def matched(self) -> bool:
        return self.missing == self.extra == self.gone == 0


def history(pipeline: MicroBatchPipeline) -> list[tuple[BatchPlan, BatchCommit]]:
    """The committed batches of the pipeline's current history, oldest first (batches a
    rewind abandoned and the rewinds themselves excluded)."""
    plans, commits = pipeline.log.state()
    abandoned = pipeline.log.abandoned()
    return [(p, commits[p.batch_id]) for p in plans
            if not p.is_restore and p.batch_id in commits and p.batch_id not in abandoned]


def select(done: list[tuple[BatchPlan, BatchCommit]], name: str, first: int | None,
           last: int | None) -> tuple[BatchCommit | None, list[tuple[BatchPlan, BatchCommit]]]:
    """The commit before ``first`` (``None``: ``first`` is the first batch) and the batches
    ``first..last`` (default: all); :class:`ReplayError` names a bad range and the fix."""
    if not done:
        raise ReplayError(f"pipeline {name!r} has no committed batches yet: run it first")
    ids = [p.batch_id for p, _ in done]
    span = f"committed batches of {name!r}: {ids[0]}..{ids[-1]}"
    first = ids[0] if first is None else first
    last = ids[-1] if last is None else last
    for flag, b in (("--from", first), ("--to", last)):
        if b not in ids:
            why = ("; batches a rewind abandoned are not replayable"
                   if ids[0] <= b <= ids[-1] else "")
            raise ReplayError(f"{flag} {b} is not a committed batch ({span}{why})")
    if first > last:
        raise ReplayError(f"--from {first} is after --to {last}; give --from <= --to ({span})")
    i, j = ids.index(first), ids.index(last)
    return (done[i - 1][1] if i else None), done[i:j + 1]


def parse_time(text: str) -> dt.datetime:
    """An ISO date-time (``2026-11-22 03:40:00``, ``2026-11-22T03:40:00Z``; naive = UTC)."""
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ReplayError(f"--state {text!r} is not {ORIGINAL!r}, {LATEST!r} or a timestamp "
                          "like '2026-11-22 03:40:00' (UTC)") from None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def versions_at(pipeline: MicroBatchPipeline, when: dt.datetime) -> dict[str, int]:
    """Each broadcast table's newest version committed at or before ``when``."""
    ms, spark = int(when.timestamp() * 1000), pipeline.spark
    out = {}
    for table in pipeline.spec.broadcast_tables:
        path = pipeline.table_path(table)
        v = delta_io.latest_version(path, spark)
        while v is not None and v >= 0 and delta_io.commit_info(path, v, spark).timestamp_ms > ms:
            v -= 1
        if v is None or v < 0:
            raise ReplayError(f"{table} has no version committed at or before "
                              f"{when.isoformat()}: give a later --state timestamp (see "
                              f"`lakecast versions`)")
        out[table] = v
    return out


def fixed_state(pipeline: MicroBatchPipeline, state: str) -> dict[str, int] | None:
    """The broadcast versions every batch replays at (``None``: ``original``, each batch
    its own); the newest versions that pass the tables' contracts."""
    if state == ORIGINAL:
        return None
    if state == LATEST:
        wanted = pipeline.current_versions()[1]
    else:
        wanted = versions_at(pipeline, parse_time(state))
    if pipeline.version_gate is not None:
        wanted, _ = pipeline.version_gate.plan({}, wanted)
    return wanted


def batch_input(pipeline: MicroBatchPipeline, plan: BatchPlan, prev: BatchCommit | None
                ) -> tuple[DataFrame, int]:
    """The batch's valid events as the pipeline processed them: validated, cross-batch
    duplicates (of the outputs as of ``prev``) removed; and how many events it read."""
    from pyspark.sql import functions as F

    events, n = pipeline.read_events(plan)
    dedup = pipeline.dedup
    prior = dedup.prior(plan, prev.output_versions if prev else {}) if dedup else None
    if pipeline.validator is None and (prior is None or not prior.found):
        return events, n if n is not None else events.count()
    checked = (pipeline.validator(events) if pipeline.validator is not None
               else events.withColumn(REASON_COLUMN, F.lit(None).cast("string")))
    if dedup is not None and prior is not None and prior.found:
        checked = dedup.mark(checked, prior, REASON_COLUMN)
    valid = checked.filter(F.col(REASON_COLUMN).isNull()).drop(REASON_COLUMN)
    return valid, n if n is not None else events.count()


class Runner(Protocol):
    """Runs one replayed batch (collected as Arrow); closed after the last."""

    def run(self, events: DataFrame, plan: BatchPlan) -> CollectedOutput: ...

    def close(self) -> None: ...


class BroadcastReplay:
    """A fresh :class:`BroadcastRuntime` like the pipeline's (its own worker cache)."""

    def __init__(self, live: BroadcastRuntime) -> None:
        function = getattr(live, "user_function", live.function)  # unwrapped (snapshotting)
        self.runtime = BroadcastRuntime(
            live.spark, function, live.tables, timestamp_column=live.timestamp_column,
            parallelism=live.parallelism, state_budget_bytes=live.state_budget_bytes,
            reload_if=live.reload_if)

    def run(self, events: DataFrame, plan: BatchPlan) -> CollectedOutput:
        return self.runtime.process_batch(events, plan).collect()

    def close(self) -> None:
        self.runtime.close()


def keyed_start(pipeline: MicroBatchPipeline, prev: BatchCommit | None, state: str,
                fixed: Mapping[str, int] | None) -> int | None:
    """The version of the keyed state table the replay starts from: the one ``prev``
    (the commit before the first replayed batch) recorded (``None``: empty state); a
    :class:`ReplayError` when it is unknown or has seen newer broadcast versions than
    ``fixed``."""
    spec, live = pipeline.spec, pipeline.runtime
    table = spec.state_table
    assert isinstance(live, KeyedBroadcastRuntime) and table is not None
    if prev is None:
        return None
    if not prev.output_versions:
        raise ReplayError(
            f"batch {prev.batch_id} of {spec.name!r} was committed without output versions "
            f"(an older progress log): the version of {table} as of it is unknown; replay "
            f"from the first batch (omit --from)")
    version = prev.output_versions.get(table, -1)
    if version < 0:
        return None
    meta = start_meta(live, version)
    seen = {} if meta is None else meta.broadcast_versions
    back = {t: v for t, v in seen.items() if fixed is not None and fixed.get(t, -1) < v}
    if back:
        assert fixed is not None
        raise ReplayError(
            f"--state {state} gives {describe(fixed)}, but the keyed state of "
            f"{spec.name!r} after batch {prev.batch_id} ({table}@v{version}) has seen "
            f"{describe(back)}: keyed state cannot go back to older broadcast versions; give "
            f"--from a batch whose previous batch ran at those versions or older, or omit "
            f"--from (the first batch starts from empty state)")
    return version


def replay(pipeline: MicroBatchPipeline, into: str, *, first: int | None = None,
           last: int | None = None, state: str = ORIGINAL,
           on_batch: Callable[[ReplayedBatch], None] | None = None) -> list[ReplayedBatch]:
    """Replay committed batches ``first..last`` of ``pipeline`` at ``state`` (see the
    module docstring) into the table ``into`` (replaced)."""
    spec, live = pipeline.spec, pipeline.runtime
    keyed = isinstance(live, KeyedBroadcastRuntime)
    if not keyed and (spec.state_table is not None or not isinstance(live, BroadcastRuntime)):
        raise ReplayError(f"pipeline {spec.name!r} runs on {type(live).__name__}, which "
                          f"replay does not support (a broadcast or keyed runtime only)")
    own = {spec.events_table, *spec.broadcast_tables, *spec.output_tables}
    for name in (into, f"{into}{STATE_SUFFIX}") if keyed else (into,):
        if name in own:
            raise ReplayError(f"--into {into}: {name} is a table of pipeline {spec.name!r}; "
                              f"a replay never writes those: name another table (default "
                              f"{spec.output_table}_replay)")
    prev, batches = select(history(pipeline), spec.name, first, last)
    fixed = fixed_state(pipeline, state)
    runner: Runner
    if isinstance(live, KeyedBroadcastRuntime):
        start = keyed_start(pipeline, prev, state, fixed)
        runner = KeyedReplay(live, pipeline.table_path(f"{into}{STATE_SUFFIX}"), start)
    else:
        runner = BroadcastReplay(live)
    held = pipeline.held
    held_rows = held.prior(prev.output_versions) if held is not None and prev else None
    path, out = pipeline.table_path(into), []
    try:
        for plan, commit in batches:
            t0 = time.perf_counter()
            valid, n = batch_input(pipeline, plan, prev)
            columns = valid.columns
            if held is not None and held_rows is not None:
                valid = held.offer(valid, held_rows)
            at = replace(plan, broadcast_versions=dict(plan.broadcast_versions
                                                       if fixed is None else fixed))
            result = runner.run(valid, at)
            if held is not None:
                settled = held.settle(result.sides.get(HELD_SIDE), held_rows,
                                      lambda c=columns: c, plan)
                held_rows = settled.held if settled.held.num_rows else None
            _write(result.main, plan.batch_id, path, first=not out)
            done = ReplayedBatch(plan, at.broadcast_versions, n, result.main.num_rows,
                                 commit.counts.get(MAIN_COUNT), time.perf_counter() - t0)
            out.append(done)
            if on_batch is not None:
                on_batch(done)
            prev = commit
    finally:
        runner.close()
    return out


def _write(rows: pa.Table, batch_id: int, path: str, *, first: bool) -> None:
    """Append a batch's rows with :data:`REPLAY_BATCH` (the first batch replaces the
    table: one replay per table)."""
    import pyarrow as pa

    rows = rows.append_column(REPLAY_BATCH, pa.array([batch_id] * rows.num_rows, pa.int64()))
    if first:
        delta_io.overwrite_arrow(rows, path, create=True, replace_schema=True)
    else:
        delta_io.append_arrow(rows, path)


def compare(pipeline: MicroBatchPipeline, into: str, batches: list[ReplayedBatch]) -> Verdict:
    """The replayed rows of ``batches`` (in ``into``) against the main output rows those
    batches wrote (the output table's rows added between the previous batch's commit and
    the last one's, read by time travel), and whether the output table still holds them."""
    from pyspark.sql import functions as F

    spark, table = pipeline.spark, pipeline.spec.output_table
    ids = [b.plan.batch_id for b in batches]
    done = history(pipeline)
    commits = {p.batch_id: c for p, c in done}
    order = [p.batch_id for p, _ in done]
    i = order.index(ids[0])
    before = done[i - 1][1].output_versions.get(table, -1) if i else -1
    end = commits[ids[-1]].output_versions.get(table, -1)
    path = pipeline.table_path(table)
    if end < 0:
        raise ReplayError(f"batch {ids[-1]} recorded no version of {table}")
    written = delta_io.read(spark, path, version=end)
    if before >= 0:
        written = written.exceptAll(delta_io.read(spark, path, version=before))
    cols = written.columns
    replayed = delta_io.read(spark, pipeline.table_path(into)).where(
        F.col(REPLAY_BATCH).isin(ids))
    missing_cols = sorted(set(cols) - set(replayed.columns))
    if missing_cols:
        raise ReplayError(f"the replay in {into} lacks the columns {missing_cols} of {table}")
    replayed = replayed.select(*cols)
    current = delta_io.read(spark, path).select(*cols)
    return Verdict(
        replayed=sum(b.rows for b in batches), original=written.count(),
        missing=written.exceptAll(replayed).count(), extra=replayed.exceptAll(written).count(),
        gone=written.exceptAll(current).count())


def describe(versions: Mapping[str, int]) -> str:
    """``{table: version}`` as ``table@vN, ...``."""
    return ", ".join(f"{t}@v{v}" for t, v in sorted(versions.items()))
