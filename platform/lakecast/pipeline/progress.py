"""Exactly-once bookkeeping for micro-batch pipelines: a plan log and a commit log in Delta.

Like Structured Streaming's ``offsets/`` and ``commits/`` folders, but as one
append-only Delta table per pipeline (under the checkpoint root):

1. before a batch writes anything, its **plan** is logged: batch id, the events
   table's version range and the broadcast tables' versions (the state version);
2. the batch writes its outputs idempotently (Delta ``txnAppId``/``txnVersion``
   = pipeline/output and batch id), so a retry never writes twice;
3. a **commit** row records the counts. The offsets (events range) and the state
   version commit together, in the plan row that the commit row seals.

After a crash, :meth:`ProgressLog.pending` returns the planned-but-uncommitted
batch, which is redone *with the same plan*: same events, same state version,
same output, and Delta skips every output write that had already landed.
Both log rows are themselves written with ``txnVersion`` = batch id.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from lakecast.config import PipelinePaths
from lakecast.delta import io as delta_io
from lakecast.delta import objstore

#: the count key of the main output's rows in a commit's counts
MAIN_COUNT = "output"
#: its name in progress logs written before it was named for what it counts (2026-12):
#: :func:`upgraded_counts` reads them as :data:`MAIN_COUNT`
LEGACY_MAIN_COUNT = "enriched"

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PROGRESS_SCHEMA = (
    "batch_id LONG, kind STRING, events_start LONG, events_end LONG, "
    "broadcast_versions STRING, counts STRING, recorded_at_ms LONG, output_versions STRING, "
    "refused STRING"
)
PROGRESS_TYPES = [tuple(c.split()) for c in PROGRESS_SCHEMA.split(", ")]
PROGRESS_COLUMNS = [c for c, _ in PROGRESS_TYPES]


@dataclass(frozen=True)
class BatchPlan:
    """What one micro-batch processes: events versions ``(events_start, events_end]``
    (``events_start`` = -1: everything up to ``events_end``) against the broadcast
    tables at ``broadcast_versions`` (the state version)."""

    batch_id: int
    events_start: int
    events_end: int
    broadcast_versions: dict[str, int]
    planned_at_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    #: a *rewind* (not a batch): go back to checkpoint ``restore_of``, rolling every output
    #: table back to ``rollback_to`` (table -> version, -1 = empty)
    restore_of: int | None = None
    rollback_to: dict[str, int] | None = None
    #: broadcast versions refused at planning (newer than the planned ones, or skipped):
    #: ``[{"table", "version", "reasons"}]`` (:mod:`lakecast.delta.validation`)
    refused: list[dict[str, Any]] = field(default_factory=list)

    @property
    def is_restore(self) -> bool:
        return self.restore_of is not None


@dataclass(frozen=True)
class BatchCommit:
    """A committed batch and its counts."""

    batch_id: int
    counts: dict[str, int]
    committed_at_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    #: each output table's version once the batch's writes landed (-1: no table yet)
    output_versions: dict[str, int] = field(default_factory=dict)


class ProgressLog:
    """Plan and commit log of one pipeline, stored as a Delta table at ``path``."""

    def __init__(self, spark: SparkSession, path: str, pipeline: str) -> None:
        self.spark = spark
        self.path = path
        self.pipeline = pipeline
        #: (version, its commit timestamp, plans by batch id, commits) of the last read
        self._cache: tuple[int, int | None, dict[int, BatchPlan],
                           dict[int, BatchCommit]] | None = None

    def _parsed(self) -> tuple[dict[int, BatchPlan], dict[int, BatchCommit]]:
        """The log's plans and commits: read from its Parquet files without a Spark job
        when the table allows it (a local path, no deletion vectors), else with Spark. What
        was read is kept, parsed: the next read reads and parses only the rows of the
        commits since (a long-running pipeline does not re-read nor re-parse its whole log
        every batch)."""
        version = delta_io.latest_version(self.path, self.spark)
        if version is None:
            self._cache = None
            return {}, {}
        cached = self._cache
        if (cached is not None and cached[0] <= version and cached[1] is not None
                and self._stamp(cached[0]) == cached[1]):
            if cached[0] == version:
                return cached[2], cached[3]
            added = delta_io.read_changes_from_log(self.path, cached[0] + 1, version)
            if added is not None and all(
                    set(t.column("_change_type").to_pylist()) <= {"insert"}
                    for t in added.values()):
                plans, commits = dict(cached[2]), dict(cached[3])
                for t in added.values():
                    _parse_into(t.drop_columns(["_change_type"]).to_pylist(), plans, commits)
                self._cache = (version, self._stamp(version), plans, commits)
                return plans, commits
        try:
            rows = delta_io.table_files(self.path, version).read().to_pylist()
        except delta_io.DirectReadUnsupported:
            if self.spark is None:  # a reader without Spark (read_log)
                raise
            rows = [r.asDict() for r in delta_io.read(self.spark, self.path,
                                                      version=version).collect()]
        plans, commits = {}, {}
        _parse_into(rows, plans, commits)
        self._cache = (version, self._stamp(version), plans, commits)
        return plans, commits

    def _stamp(self, version: int) -> int | None:
        """The commit timestamp of ``version`` (tells a recreated log from the one read)."""
        try:
            return delta_io.commit_info(self.path, version, self.spark).timestamp_ms
        except (delta_io.DeltaIOError, OSError):
            return None

    def _append(self, row: dict[str, Any], kind: str) -> None:
        import pyarrow as pa

        row = {c: row.get(c) for c in PROGRESS_COLUMNS}
        schema = pa.schema([(c, pa.int64() if t == "LONG" else pa.string())
                            for c, t in PROGRESS_TYPES])
        # one small commit without a Spark job (delta-rs), exactly once by its txn
        delta_io.append_arrow(pa.Table.from_pylist([row], schema), self.path,
                              txn=(f"{self.pipeline}-{kind}", row["batch_id"]))

    def write_plan(self, plan: BatchPlan) -> None:
        restore = plan.restore_of is not None
        self._append(
            {
                "batch_id": plan.batch_id, "kind": "restore" if restore else "plan",
                "events_start": plan.events_start, "events_end": plan.events_end,
                "broadcast_versions": json.dumps(plan.broadcast_versions, sort_keys=True),
                "counts": json.dumps({"checkpoint_id": plan.restore_of}) if restore else None,
                "recorded_at_ms": plan.planned_at_ms,
                "output_versions": json.dumps(plan.rollback_to, sort_keys=True)
                if restore else None,
                "refused": json.dumps(plan.refused, sort_keys=True) if plan.refused else None,
            },
            "plan",
        )

    def write_commit(self, commit: BatchCommit) -> None:
        self._append(
            {
                "batch_id": commit.batch_id, "kind": "commit", "events_start": None,
                "events_end": None, "broadcast_versions": None,
                "counts": json.dumps(commit.counts, sort_keys=True),
                "recorded_at_ms": commit.committed_at_ms,
                "output_versions": json.dumps(commit.output_versions, sort_keys=True),
            },
            "commit",
        )

    def state(self) -> tuple[list[BatchPlan], dict[int, BatchCommit]]:
        """All plans (by batch id) and commits."""
        plans, commits = self._parsed()
        return [plans[b] for b in sorted(plans)], dict(commits)

    @staticmethod
    def parse_rows(rows: list[dict[str, Any]]) -> tuple[list[BatchPlan], dict[int, BatchCommit]]:
        """:meth:`state` of log rows read elsewhere (e.g. without Spark:
        :func:`read_position`)."""
        plans: dict[int, BatchPlan] = {}
        commits: dict[int, BatchCommit] = {}
        _parse_into(rows, plans, commits)
        return [plans[b] for b in sorted(plans)], commits

    def last_committed(self) -> tuple[BatchPlan | None, BatchCommit | None]:
        """The newest committed batch's plan and commit (``(None, None)`` before any)."""
        return self.position()[1:]

    def pending(self) -> BatchPlan | None:
        """The planned batch that has not committed (to be redone with the same plan)."""
        return self.position()[0]

    def position(self) -> tuple[BatchPlan | None, BatchPlan | None, BatchCommit | None]:
        """(pending plan, last committed plan, its commit) from one read of the log.

        After a rewind (a ``restore`` row), only the rewind and later rows count: the
        batches it abandoned are neither pending nor the position."""
        return self.position_of(*self.state())

    @staticmethod
    def position_of(plans: list[BatchPlan], commits: dict[int, BatchCommit]
                    ) -> tuple[BatchPlan | None, BatchPlan | None, BatchCommit | None]:
        """:meth:`position` of already read log rows."""
        rewinds = [p for p in plans if p.is_restore]
        if rewinds:
            plans = [p for p in plans if p.batch_id >= rewinds[-1].batch_id]
        done = [p for p in plans if p.batch_id in commits]
        open_ = [p for p in plans if p.batch_id not in commits]
        last = done[-1] if done else None
        return (
            open_[-1] if open_ else None,
            last,
            commits[last.batch_id] if last else None,
        )

    def abandoned(self) -> set[int]:
        """Batch ids abandoned by rewinds (between a restored checkpoint and its rewind):
        their checkpoints are not part of the current history."""
        plans, _ = self.state()
        out: set[int] = set()
        for r in (p for p in plans if p.is_restore):
            assert r.restore_of is not None
            out |= {p.batch_id for p in plans if r.restore_of < p.batch_id < r.batch_id}
        return out

    @staticmethod
    def as_dict(obj: BatchPlan | BatchCommit) -> dict[str, Any]:
        return asdict(obj)


def _parse_into(rows: list[dict[str, Any]], plans: dict[int, BatchPlan],
                commits: dict[int, BatchCommit]) -> None:
    """Add log rows, in log order, to ``plans`` and ``commits`` (a later row of a batch id
    replaces an earlier one; files written before a column was added lack it)."""
    for r in rows:
        kind, batch_id = r["kind"], r["batch_id"]
        if kind == "plan":
            plans[batch_id] = BatchPlan(
                batch_id, r.get("events_start"), r.get("events_end"),
                json.loads(r.get("broadcast_versions")), r.get("recorded_at_ms"),
                refused=json.loads(r.get("refused") or "[]"),
            )
        elif kind == "restore":
            plans[batch_id] = BatchPlan(
                batch_id, r.get("events_start"), r.get("events_end"),
                json.loads(r.get("broadcast_versions")), r.get("recorded_at_ms"),
                restore_of=json.loads(r.get("counts"))["checkpoint_id"],
                rollback_to=json.loads(r.get("output_versions") or "{}"),
            )
        elif kind == "commit":
            commits[batch_id] = BatchCommit(
                batch_id, upgraded_counts(json.loads(r.get("counts"))), r.get("recorded_at_ms"),
                json.loads(r.get("output_versions") or "{}"),
            )


def upgraded_counts(counts: dict[str, int]) -> dict[str, int]:
    """A commit's counts in today's names: logs written before the main output's count key
    was :data:`MAIN_COUNT` say ``"enriched"`` (read as ``"output"``)."""
    if LEGACY_MAIN_COUNT in counts and MAIN_COUNT not in counts:
        counts[MAIN_COUNT] = counts.pop(LEGACY_MAIN_COUNT)
    return counts


def progress_path(checkpoint_root: str, pipeline: str) -> str:
    """Where pipeline ``pipeline`` keeps its progress log (under the checkpoint root,
    :class:`~lakecast.config.PipelinePaths`)."""
    return PipelinePaths.under(checkpoint_root, pipeline).progress


#: the readers of :func:`read_log`, one per local log: what they read is kept
_READERS: dict[str, ProgressLog] = {}


def read_log(path: str) -> tuple[list[BatchPlan], dict[int, BatchCommit]]:
    """Every plan and commit of the log at ``path`` (:meth:`ProgressLog.state`), read
    without Spark: the log's Delta files are read with pyarrow, by one reader per log and
    process that keeps what it read (a sensor tick or an asset check reads only the
    commits since the last read). Empty if there is no log.

    Object-store logs are read with ``deltalake``; raises
    :class:`lakecast.delta.io.DirectReadUnsupported` when a local log cannot be read
    without Spark.
    """
    if objstore.is_object_store(path):  # read with deltalake
        version = delta_io.latest_version(path)
        if version is None:
            return [], {}
        return ProgressLog.parse_rows(objstore.read_table(path, version).to_pylist())
    reader = _READERS.get(path)
    if reader is None:
        reader = _READERS[path] = ProgressLog(None, path, "")  # type: ignore[arg-type]
    return reader.state()


def read_position(path: str) -> tuple[BatchPlan | None, BatchPlan | None, BatchCommit | None]:
    """:meth:`ProgressLog.position` of the log at ``path``, read without Spark (for sensors,
    see :func:`read_log`). ``(None, None, None)`` if there is no log."""
    return ProgressLog.position_of(*read_log(path))


def bounded_versions(events_end: int | None, bvs: dict[str, int],
                     until: Mapping[str, int | None], events_table: str,
                     applied: Mapping[str, int]) -> tuple[int | None, dict[str, int]]:
    """``events_end`` and ``bvs`` capped at ``until`` (broadcast tables: never behind
    ``applied``; a table ``until`` does not name, or names as ``None``, is not capped)."""
    cap = until.get(events_table)
    if events_end is not None and cap is not None:
        events_end = min(events_end, cap)
    out = {}
    for table, version in bvs.items():
        limit = until.get(table)
        if limit is not None:
            version = max(min(version, limit), applied.get(table, -1))
        out[table] = version
    return events_end, out
