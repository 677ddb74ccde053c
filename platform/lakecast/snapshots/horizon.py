"""How far back a rewind can take a pipeline's output tables, and so what VACUUM must keep.

A rewind (``lakecast snapshots restore``, :func:`lakecast.pipeline.rewind.rewind`) rolls
every output table back (Delta ``RESTORE``) to the version its progress log recorded for
the checkpoint's batch. Any retained checkpoint of the current lineage can be the target,
so the files of those versions must survive VACUUM: a file of version ``v`` was removed
after ``v`` was committed, so a VACUUM retention at least as long as the age of the oldest
such version never deletes one (:meth:`RewindHorizon.needed_hours`), and
:attr:`RewindHorizon.versions` names them for VACUUM to keep besides.

A keyed pipeline has no checkpoints: every committed batch is a restore point
(:func:`batch_horizon` keeps the newest N of them rewindable).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from lakecast.delta import io as delta_io
from lakecast.pipeline.progress import ProgressLog
from lakecast.snapshots.store import SnapshotStore

HOUR_MS = 3_600_000


@dataclass(frozen=True)
class OldestVersion:
    """The oldest version of one output table that a rewind can restore."""

    version: int
    checkpoint_id: int
    committed_at_ms: int
    #: ``committed_at_ms`` is not the version's own commit time (its JSON commit is gone):
    #: it is the pipeline's first plan, an earlier time
    estimated: bool = False


@dataclass(frozen=True)
class RewindHorizon:
    """The output versions a pipeline's retained checkpoints can roll back to."""

    pipeline: str
    #: checkpoints a rewind can target (retained, not abandoned by an earlier rewind)
    checkpoints: tuple[int, ...]
    #: output table -> the versions rewinds can restore, oldest first
    versions: dict[str, tuple[int, ...]] = field(default_factory=dict)
    oldest: dict[str, OldestVersion] = field(default_factory=dict)
    #: what a restore point is: a retained ``checkpoint``, or a committed ``batch`` (keyed)
    point: str = "checkpoint"

    def needed_hours(self, table: str, now_ms: int | None = None) -> int:
        """Whole hours (rounded up) since the oldest version of ``table`` that a rewind can
        restore was committed: the shortest safe VACUUM retention (0: no such version)."""
        old = self.oldest.get(table)
        if old is None:
            return 0
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return max(0, math.ceil((now - old.committed_at_ms) / HOUR_MS))

    def describe(self, table: str, now_ms: int | None = None) -> str:
        """Which checkpoint needs how old a version of ``table``, in words."""
        old = self.oldest.get(table)
        if old is None:
            return f"no retained checkpoint of {self.pipeline} rolls {table} back"
        now = int(time.time() * 1000) if now_ms is None else now_ms
        age = (now - old.committed_at_ms) / HOUR_MS
        when = "the pipeline's first plan" if old.estimated else f"v{old.version}"
        return (f"{self.point} {old.checkpoint_id} of {self.pipeline} rolls {table} back to "
                f"v{old.version}; {when} was committed {age:.2f} h ago")


def rewind_horizon(store: SnapshotStore, log: ProgressLog,
                   table_path: Callable[[str], str]) -> RewindHorizon:
    """The :class:`RewindHorizon` of the pipeline of ``store`` and ``log``: every retained
    checkpoint that no rewind abandoned, plus a rewind still to finish (its rollback)."""
    plans, commits = log.state()
    abandoned = log.abandoned()
    needs: dict[str, dict[int, int]] = {}  # table -> version -> checkpoint id (oldest)

    def need(versions: dict[str, int], checkpoint_id: int) -> None:
        for table, version in versions.items():
            if version >= 0:
                known = needs.setdefault(table, {})
                known[version] = min(known.get(version, checkpoint_id), checkpoint_id)

    ids = []
    for h in store.headers():
        commit = commits.get(h.batch_id)
        if h.batch_id in abandoned or commit is None:
            continue
        ids.append(h.checkpoint_id)
        need(commit.output_versions, h.checkpoint_id)
    _need_rollback(plans, commits, need)
    return _horizon(log, plans, tuple(ids), needs, table_path, store.spark)


def batch_horizon(log: ProgressLog, table_path: Callable[[str], str], keep: int,
                  spark: Any = None) -> RewindHorizon:
    """The :class:`RewindHorizon` of a pipeline whose every committed batch is a restore
    point (a keyed pipeline: its state table is versioned with each batch, and
    :func:`lakecast.pipeline.rewind.rewind` rolls it back with the outputs): the newest
    ``keep`` committed batches that no rewind abandoned, the newest commit (a batch left
    pending by a crash is redone from its versions) and a rewind still to finish. A
    version that is still its table's newest needs no retention (its files are live)."""
    plans, commits = log.state()
    abandoned = log.abandoned()
    restores = {p.batch_id for p in plans if p.is_restore}
    batches = sorted(b for b in commits if b not in restores and b not in abandoned)
    targets = batches[-keep:] if keep > 0 else []
    needs: dict[str, dict[int, int]] = {}

    def need(versions: dict[str, int], batch_id: int) -> None:
        for table, version in versions.items():
            if version >= 0:
                known = needs.setdefault(table, {})
                known[version] = min(known.get(version, batch_id), batch_id)

    for b in targets:
        need(commits[b].output_versions, b)
    if commits:
        newest = max(commits)
        need(commits[newest].output_versions, newest)
    _need_rollback(plans, commits, need)
    live = {t: delta_io.latest_version(table_path(t), spark) for t in needs}
    return replace(_horizon(log, plans, tuple(targets), needs, table_path, spark, live),
                   point="batch")


def _need_rollback(plans: list, commits: dict, need: Callable[[dict[str, int], int], None]
                   ) -> None:
    """Add the versions an unfinished rewind rolls back to."""
    pending, _, _ = ProgressLog.position_of(plans, commits)
    if pending is not None and pending.is_restore and pending.rollback_to:
        need(pending.rollback_to, int(pending.restore_of or 0))


def _horizon(log: ProgressLog, plans: list, ids: tuple[int, ...],
             needs: dict[str, dict[int, int]], table_path: Callable[[str], str], spark: Any,
             live: dict[str, int | None] | None = None) -> RewindHorizon:
    """The horizon of ``needs`` (table -> version -> checkpoint or batch id); the oldest
    needed version of each table, from its commit's timestamp, not counting ``live``
    versions (each table's newest)."""
    first_plan_ms = min((p.planned_at_ms for p in plans), default=0)
    oldest = {}
    for table, by_version in needs.items():
        old = [v for v in by_version if live is None or v != live.get(table)]
        if not old:
            continue
        version = min(old)
        try:
            ms, estimated = delta_io.commit_info(table_path(table), version,
                                              spark).timestamp_ms, False
        except (delta_io.DeltaIOError, OSError):
            ms, estimated = first_plan_ms, True
        oldest[table] = OldestVersion(version, by_version[version], ms, estimated)
    return RewindHorizon(log.pipeline, tuple(sorted(ids)),
                         {t: tuple(sorted(v)) for t, v in needs.items()}, oldest)
