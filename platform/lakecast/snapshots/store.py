"""Which checkpoints of the snapshot table are complete, what a restore loads, what is kept.

A checkpoint (rows of :class:`~lakecast.snapshots.table.SnapshotTable`) is *complete*
when its header exists, every task ``0..p-1`` has a manifest row for every declared
state, and every referenced content has exactly the stored rows its manifest says, whose
recomputed hash matches and which decode in the checkpoint format
(:meth:`SnapshotStore.validate`). :meth:`SnapshotStore.resolve` loads the newest complete
one that fits (incomplete, corrupt or unreadable checkpoints — damaged or missing files
included — are skipped, with the reason, for the previous complete one), redistributing
task states as Flink does (:func:`rescale_assignment`); :meth:`SnapshotStore.retain`
deletes old ones, never the newest complete one.

Contents are serialized canonically (:mod:`lakecast.snapshots.codec`), so equal states
hash equally on every task.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from lakecast.delta import io as delta_io
from lakecast.snapshots.codec import (
    FORMAT,
    content_digest,
    decode_content,
    schema_from_b64,
    schema_text,
)
from lakecast.snapshots.errors import (
    IncompleteCheckpointError,
    RefusedCheckpointError,
    SnapshotError,
    UnreadableCheckpointError,
)
from lakecast.snapshots.records import CheckpointHeader, ManifestRow, parse_manifest_row
from lakecast.snapshots.table import ENTRY, MANIFEST, SnapshotTable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


@dataclass
class RestoredCheckpoint:
    """A validated checkpoint ready to load: per-state content and the task assignment."""

    header: CheckpointHeader
    contents: dict[str, tuple[str, Any]]  # state -> (kind, content)
    assignment: dict[int, int]  # new task -> old task it reads
    n_entries: int
    skipped: list[str] = field(default_factory=list)


def rescale_assignment(p_old: int, p_new: int) -> dict[int, int]:
    """Flink's redistribution of broadcast state: new task ``i`` reads old task
    ``i mod p_old`` (same or smaller parallelism: each task reads its own)."""
    if p_old < 1 or p_new < 1:
        raise SnapshotError(f"parallelism must be >= 1 (old {p_old}, new {p_new})")
    return {i: i % p_old for i in range(p_new)}


class SnapshotStore(SnapshotTable):
    """The snapshot table of one pipeline, with what is complete, restorable and kept."""

    def __init__(self, spark: SparkSession, path: str, pipeline: str) -> None:
        super().__init__(spark, path, pipeline)
        #: what the last :meth:`resolve` skipped, and why
        self.skipped: list[str] = []
        #: the checkpoints the last :meth:`resolve` refused (forged or unparseable parts)
        self.refusals: list[int] = []

    # -- validation ------------------------------------------------------------------
    def check_structure(self, header: CheckpointHeader,
                        manifest: Sequence[ManifestRow] | None = None,
                        counts: Mapping[tuple[str, str], tuple[int, int]] | None = None
                        ) -> str | None:
        """Cheap completeness check (no content read): ``None`` if fine, else the problem."""
        cid = header.checkpoint_id
        manifest = self.manifest(cid) if manifest is None else manifest
        counts = self.entry_counts(cid) if counts is None else counts
        have = {(m.task, m.state): m for m in manifest}
        missing = [(t, s) for t in range(header.parallelism) for s in header.states
                   if (t, s) not in have]
        if missing:
            tasks = sorted({t for t, _ in missing})
            return (f"manifest rows missing for task(s) {tasks} "
                    f"(states {sorted({s for _, s in missing})})")
        extra = sorted({m.task for m in manifest if m.task >= header.parallelism})
        if extra:
            return (f"manifest has rows for unknown task(s) {extra} "
                    f"(parallelism {header.parallelism})")
        for m in manifest:
            stored = counts.get((m.state, m.content_hash), (0, 0))[0]
            if stored != m.stored_rows:
                return (f"state {m.state!r} content {m.content_hash[:12]} of task {m.task} has "
                        f"{stored} entry rows, the manifest says {m.stored_rows}")
        return None

    def validate(self, checkpoint_id: int) -> CheckpointHeader:
        """Full check (structure + recomputed content hashes); raises
        :class:`IncompleteCheckpointError` with the problem."""
        known = {h.checkpoint_id: h for h in self.headers()}
        if checkpoint_id not in known:
            raise IncompleteCheckpointError(
                f"checkpoint {checkpoint_id} has no header row (incomplete)")
        header = known[checkpoint_id]
        self._load(header, header.parallelism)
        return header

    def _load(self, header: CheckpointHeader, p_new: int) -> RestoredCheckpoint:
        cid = header.checkpoint_id
        if header.format != FORMAT:
            raise UnreadableCheckpointError(
                f"checkpoint {cid} is in format {header.format!r} (pickled values of an "
                f"older Lakecast); restores read only {FORMAT!r} data, never code")
        rows = self.read_checkpoint(cid)  # one read: manifest and content
        kind_col = rows.column("kind")
        man = rows.filter(pc.equal(kind_col, MANIFEST))
        manifest = [parse_manifest_row(cid, r["task"], r["state"], r["content_hash"],
                                       r["n_entries"], r["meta"]) for r in man.to_pylist()]
        table = rows.filter(pc.equal(kind_col, ENTRY))
        counts: dict[tuple[str, str], tuple[int, int]] = {}
        if table.num_rows:
            grouped = table.group_by(["state", "content_hash"]).aggregate([("seq", "count")])
            for r in grouped.to_pylist():
                counts[(r["state"], r["content_hash"])] = (int(r["seq_count"]), 0)
            table = table.take(pc.sort_indices(table, sort_keys=[
                ("state", "ascending"), ("content_hash", "ascending"), ("seq", "ascending")]))
        problem = self.check_structure(header, manifest, counts)
        if problem:
            raise IncompleteCheckpointError(f"checkpoint {cid} is incomplete: {problem}")
        by_task = {(m.task, m.state): m for m in manifest}
        assignment = rescale_assignment(header.parallelism, p_new)
        needed: dict[str, ManifestRow] = {}
        for new_task, old_task in assignment.items():
            for s in header.states:
                m = by_task[(old_task, s)]
                prev = needed.get(s)
                if prev is not None and prev.content_hash != m.content_hash:
                    raise IncompleteCheckpointError(
                        f"checkpoint {cid}: state {s!r} differs between old tasks "
                        f"{prev.task} and {m.task}; refusing to restore new task {new_task} "
                        "from a diverged checkpoint")
                needed.setdefault(s, m)
        contents: dict[str, tuple[str, Any]] = {}
        total = 0
        for s, m in needed.items():
            mask = pc.and_(pc.equal(table.column("state"), s),
                           pc.equal(table.column("content_hash"), m.content_hash)) \
                if table.num_rows else None
            part = table.filter(mask) if mask is not None else table
            keys = part.column("key").to_pylist() if part.num_rows else []
            values = part.column("value").to_pylist() if part.num_rows else []
            kind = header.states[s]["kind"]
            schema_b64 = m.meta.get("schema")
            text = schema_text(schema_from_b64(schema_b64)) if kind == "table" and schema_b64 \
                else ""
            digest = content_digest(kind, text, keys, values)
            if digest != m.content_hash or len(keys) != m.stored_rows:
                raise IncompleteCheckpointError(
                    f"checkpoint {cid} is corrupt: state {s!r} content hash mismatch (manifest "
                    f"{m.content_hash[:12]}, recomputed {digest[:12]} over {len(keys)} rows)")
            # verified; decoding accepts data only (Arrow IPC / typed JSON), never code
            content = decode_content(cid, s, kind, values, schema_b64)
            n = content.num_rows if kind == "table" else len(content)
            if n != m.n_entries:
                raise IncompleteCheckpointError(
                    f"checkpoint {cid} is corrupt: state {s!r} holds {n} entries, the manifest "
                    f"says {m.n_entries}")
            contents[s] = (kind, content)
            total += n
        return RestoredCheckpoint(header, contents, assignment, total)

    def resolve(
        self,
        checkpoint_id: int | None = None,
        *,
        timestamp_ms: int | None = None,
        max_versions: Mapping[str, int] | None = None,
        eligible: Callable[[int], bool] | None = None,
        parallelism: int = 1,
        states: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> RestoredCheckpoint | None:
        """Load the newest complete checkpoint matching the filters (``checkpoint_id``: at
        or before it; ``timestamp_ms``: created at or before it; ``max_versions``: state
        version not after it; ``states``: same declared states). Incomplete or corrupt
        ones are skipped for the previous complete one, each with a logged reason
        (returned in :attr:`RestoredCheckpoint.skipped`). ``None`` when none qualifies."""
        skipped: list[str] = []
        self.refusals = []
        ids, headers = self.index()
        ids_with_rows = set(ids)
        known = {h.checkpoint_id for h in headers}
        candidates: list[tuple[int, CheckpointHeader | None]] = [
            (h.checkpoint_id, h) for h in headers] + [
            (i, None) for i in ids_with_rows - known]
        for cid, h in sorted(candidates, key=lambda x: x[0], reverse=True):
            if checkpoint_id is not None and cid > checkpoint_id:
                continue
            if eligible is not None and not eligible(cid):
                continue
            if h is None:
                if cid in self.refused:
                    self.refusals.append(cid)
                    msg = f"{self.refused[cid]}; skipped for the previous complete checkpoint"
                else:
                    why = (f"its files cannot be read ({self.unreadable[cid]})"
                           if cid in self.unreadable else "no header row (incomplete write)")
                    msg = f"checkpoint {cid} skipped: {why}"
                skipped.append(msg)
                log.warning(msg)
                continue
            if timestamp_ms is not None and h.created_at_ms > timestamp_ms:
                continue
            if max_versions is not None and any(
                    max_versions.get(t, -1) < v for t, v in h.state_version.items()):
                continue
            if states is not None and {k: dict(v) for k, v in states.items()} != h.states:
                msg = (f"checkpoint {cid} skipped: its states {sorted(h.states)} do not match "
                       f"the function's {sorted(states)}")
                skipped.append(msg)
                log.warning(msg)
                continue
            try:
                restored = self._load(h, parallelism)
            except IncompleteCheckpointError as e:
                if isinstance(e, RefusedCheckpointError):
                    self.refusals.append(cid)
                msg = f"{e}; skipped for the previous complete checkpoint"
                skipped.append(msg)
                log.warning(msg)
                continue
            restored.skipped = skipped
            self.skipped = skipped
            return restored
        self.skipped = skipped
        return None

    # -- retention ---------------------------------------------------------------------
    def retain(self, keep: int, in_use: Iterable[int] | Callable[[], Iterable[int]] = (),
               verified: int | None = None) -> list[int]:
        """Delete all but the newest ``keep`` checkpoints, never one in ``in_use`` nor the
        newest complete one (``verified``: a checkpoint id known complete, e.g. the one
        just written; else found by full validation, newest first). One atomic Delta
        DELETE of whole partitions; older Delta versions keep the removed checkpoints
        reachable by time travel until VACUUM. Returns the removed ids."""
        if keep < 1:
            raise SnapshotError(f"keep must be >= 1, got {keep}")
        ids = self.checkpoint_ids()
        if len(ids) <= keep:
            return []
        protect = set(ids[-keep:]) | set(in_use() if callable(in_use) else in_use)
        if verified is None:
            newest = self.resolve()
            verified = newest.header.checkpoint_id if newest is not None else None
        if verified is not None:
            protect.add(verified)
        drop = [i for i in ids if i not in protect]
        if drop:
            delta_io.delete(self.spark, self.path,
                            f"checkpoint_id IN ({', '.join(str(i) for i in drop)})")
        return drop


def now_ms() -> int:
    return int(time.time() * 1000)
