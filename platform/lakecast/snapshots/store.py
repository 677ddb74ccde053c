"""Broadcast state snapshots versioned in Delta: serialization, the snapshot table, checks.

One Delta table per pipeline (``<checkpoint root>/<pipeline>/snapshots``, partitioned by
``checkpoint_id``) holds every checkpoint; each checkpoint is written in ONE commit, so it
is one Delta version and time travel reaches any past one. A checkpoint has three kinds
of rows:

* ``checkpoint`` (one): the header — batch id, events offsets, state version (applied
  Delta versions), parallelism ``p``, declared states, broadcast table schemas;
* ``manifest`` (``p`` x states): what task ``i`` held for state ``s`` — the SHA-256
  content hash of its canonical serialization, its entry count and size;
* ``entry``: the content, ``(state, seq, key, value)``, stored ONCE per distinct content
  hash (Flink stores one copy per task: ``p`` x state size): Arrow IPC chunks of a table
  state, typed JSON entries of a dict state (data, never code: :mod:`~lakecast.snapshots.codec`).

A checkpoint is *complete* when its header exists, every task ``0..p-1`` has a manifest
row for every declared state, and every referenced content has exactly the stored rows
its manifest says, whose recomputed hash matches and which decode in the checkpoint format
(:meth:`SnapshotStore.validate`). Incomplete, corrupt or unreadable checkpoints (damaged or
missing files included) are skipped, with the reason, for the previous complete one.

Contents are serialized canonically (:mod:`lakecast.snapshots.codec`), so equal states
hash equally on every task.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
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
    first_line,
    is_damaged_read,
)
from lakecast.snapshots.records import CheckpointHeader, ManifestRow, parse_manifest_row

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

SNAPSHOT_SCHEMA = (
    "checkpoint_id LONG, kind STRING, task INT, state STRING, seq LONG, key STRING, "
    "value BINARY, content_hash STRING, n_entries LONG, meta STRING, created_at_ms LONG"
)
SNAPSHOT_COLUMNS = [c.strip().split()[0] for c in SNAPSHOT_SCHEMA.split(",")]
SNAPSHOT_CASTS = [f"CAST({name} AS {kind}) AS {name}"
                  for name, kind in (c.strip().split() for c in SNAPSHOT_SCHEMA.split(","))]
HEADER, MANIFEST, ENTRY = "checkpoint", "manifest", "entry"


# ============================================================================ the store
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


class SnapshotStore:
    """The snapshot Delta table of one pipeline."""

    def __init__(self, spark: SparkSession, path: str, pipeline: str) -> None:
        self.spark = spark
        self.path = path
        self.pipeline = pipeline
        #: checkpoint id -> why its files could not be read (found by :meth:`index`)
        self.unreadable: dict[int, str] = {}
        #: checkpoint id -> why its header was refused (found by :meth:`index`)
        self.refused: dict[int, str] = {}
        #: what the last :meth:`resolve` skipped, and why
        self.skipped: list[str] = []
        #: the checkpoints the last :meth:`resolve` refused (forged or unparseable parts)
        self.refusals: list[int] = []
        #: the file list of the newest version read directly (one log replay serves the
        #: index and the rows of a restore)
        self._files: delta_io.TableFiles | None = None

    @property
    def app_id(self) -> str:
        return f"{self.pipeline}:snapshots"

    def exists(self) -> bool:
        return delta_io.latest_version(self.path, self.spark) is not None

    def _df(self, version: int | None = None) -> DataFrame:
        return delta_io.read(self.spark, self.path, version=version)

    # -- writing ---------------------------------------------------------------------
    def small_rows(self, header: CheckpointHeader, manifest: Sequence[ManifestRow]
                   ) -> DataFrame:
        """The header and manifest rows of a checkpoint as a DataFrame."""
        cid, ts = header.checkpoint_id, header.created_at_ms
        rows: list[tuple[Any, ...]] = [
            (cid, HEADER, None, None, None, None, None, None, None, header.meta(), ts)]
        for m in manifest:
            rows.append((cid, MANIFEST, m.task, m.state, None, None, None, m.content_hash,
                         m.n_entries, json.dumps(m.meta, sort_keys=True), ts))
        return self.spark.createDataFrame(rows, SNAPSHOT_SCHEMA)

    def write(self, header: CheckpointHeader, rows: DataFrame) -> int:
        """Write one checkpoint (all its rows) in ONE commit; returns the Delta version."""
        # cast to the declared types: over Spark Connect mapInArrow's strings are "string
        # collate UTF8_BINARY", a schema type that delta-rs (maintenance) cannot open
        return delta_io.write(rows.selectExpr(*SNAPSHOT_CASTS), self.path,
                              partition_by=["checkpoint_id"],
                              txn=(self.app_id, header.checkpoint_id))

    # -- reading ---------------------------------------------------------------------
    def index(self) -> tuple[list[int], list[CheckpointHeader]]:
        """(every checkpoint id with rows, the headers), in one Spark job."""
        self.unreadable = {}
        self.refused = {}
        if not self.exists():
            return [], []
        self._check_schema()
        try:
            rows = self._index_rows()
        except Exception as e:
            if not is_damaged_read(e):
                raise
            # damaged files somewhere: read checkpoint by checkpoint (partition pruning)
            # and set the unreadable ones aside (ids from the log: no file is read)
            log.debug("snapshot table %s has unreadable files (%s); reading its "
                      "checkpoints one by one", self.path, first_line(e))
            rows = []
            for cid in sorted(self.delta_versions()):
                try:
                    rows += self._index_rows(cid)
                except Exception as e2:
                    if not is_damaged_read(e2):
                        raise
                    self.unreadable[cid] = first_line(e2)
        ids = sorted({r[0] for r in rows} | set(self.unreadable))
        headers = []
        for r in rows:
            if r[1] is None:
                continue
            try:
                headers.append(CheckpointHeader.from_row(r[0], r[1], r[2]))
            except RefusedCheckpointError as e:
                self.refused[r[0]] = str(e)
        return ids, sorted(headers, key=lambda h: h.checkpoint_id)

    def _check_schema(self) -> None:
        """Raise a :class:`SnapshotError` naming the missing columns when the table at
        the snapshot path is not a snapshot table (checked from the Delta log's schema)."""
        version = delta_io.latest_version(self.path)
        try:
            names = delta_io.table_files(self.path, version, open_files=False).schema.names
        except delta_io.DeltaIOError:  # read by Spark: its own error names the column
            return
        missing = [c for c in SNAPSHOT_COLUMNS if c not in names]
        if missing:
            raise SnapshotError(
                f"pipeline {self.pipeline!r}: the Delta table at {self.path} is not a "
                f"snapshot table: it has no column(s) {missing} (its columns: {names}). "
                f"Move it aside or point the pipeline's checkpoint root elsewhere; the "
                f"pipeline creates its snapshot table on its first checkpoint")

    def _direct(self, columns: Sequence[str] | None = None,
                checkpoint_id: int | None = None) -> pa.Table | None:
        """The table's rows (``columns``; one checkpoint's partition) read from its files
        without a Spark job, checksums verified; ``None`` when only Spark can read them
        (:func:`lakecast.delta.io.table_files`) or a file fails to read — Spark then
        reads them and reports what is damaged."""
        version = delta_io.latest_version(self.path)
        if version is None:
            return None
        where = None if checkpoint_id is None else {"checkpoint_id": int(checkpoint_id)}
        try:
            if self._files is None or self._files.version != version:
                self._files = delta_io.table_files(self.path, version)
            return self._files.read(columns, where)
        except delta_io.DeltaIOError as e:
            log.debug("snapshot table %s read by Spark: %s", self.path, e)
            return None

    def _index_rows(self, checkpoint_id: int | None = None) -> list[Any]:
        from pyspark.sql import functions as F

        direct = self._direct(["checkpoint_id", "kind", "meta", "created_at_ms"], checkpoint_id)
        if direct is not None:
            found: dict[int, tuple[int, str | None, int | None]] = {
                cid: (cid, None, None)
                for cid in pc.unique(direct.column("checkpoint_id")).to_pylist()}
            heads = direct.filter(pc.equal(direct.column("kind"), HEADER))
            for r in heads.to_pylist():
                found[r["checkpoint_id"]] = (r["checkpoint_id"], r["meta"], r["created_at_ms"])
            return list(found.values())
        df = self._df()
        if checkpoint_id is not None:
            df = df.where(F.col("checkpoint_id") == int(checkpoint_id))
        is_header = F.col("kind") == HEADER
        return (df.groupBy("checkpoint_id")
                .agg(F.max(F.when(is_header, F.col("meta"))).alias("meta"),
                     F.max(F.when(is_header, F.col("created_at_ms"))).alias("ts"))
                .collect())

    def headers(self) -> list[CheckpointHeader]:
        """Every checkpoint header, oldest first."""
        return self.index()[1]

    def checkpoint_ids(self) -> list[int]:
        """Ids with any rows (including ones without a header: incomplete)."""
        return self.index()[0]

    def rows(self, checkpoint_id: int) -> pa.Table:
        """All rows of one checkpoint (one partition), as Arrow."""
        direct = self._direct(None, checkpoint_id)
        if direct is not None:
            return direct
        return self._df().where(f"checkpoint_id = {int(checkpoint_id)}").toArrow()

    def read_checkpoint(self, checkpoint_id: int) -> pa.Table:
        """:meth:`rows`, raising :class:`UnreadableCheckpointError` when a file of THIS
        checkpoint is damaged or missing (Spark's FAILED_READ_FILE, checksum errors);
        any other error propagates."""
        try:
            return self.rows(checkpoint_id)
        except Exception as e:
            if not is_damaged_read(e):
                raise
            raise UnreadableCheckpointError(
                f"checkpoint {checkpoint_id} is unreadable: {first_line(e)}") from None

    def header(self, checkpoint_id: int) -> CheckpointHeader:
        for h in self.headers():
            if h.checkpoint_id == checkpoint_id:
                return h
        known = [h.checkpoint_id for h in self.headers()]
        raise SnapshotError(f"no checkpoint {checkpoint_id} in {self.path} (checkpoints: "
                            f"{known or 'none'})")

    def manifest(self, checkpoint_id: int) -> list[ManifestRow]:
        """The manifest rows of a checkpoint (:class:`RefusedCheckpointError` when one
        does not parse)."""
        cid = int(checkpoint_id)
        rows = (self._df().where(f"checkpoint_id = {cid} AND kind = '{MANIFEST}'")
                .select("task", "state", "content_hash", "n_entries", "meta").collect())
        return sorted((parse_manifest_row(cid, *r) for r in rows),
                      key=lambda m: (m.task, m.state))

    def entry_counts(self, checkpoint_id: int) -> dict[tuple[str, str], tuple[int, int]]:
        """(state, content hash) -> (stored rows, stored key+value bytes)."""
        from pyspark.sql import functions as F

        rows = (self._df().where(f"checkpoint_id = {int(checkpoint_id)} AND kind = '{ENTRY}'")
                .groupBy("state", "content_hash")
                .agg(F.count("*"), F.sum(F.length("key") + F.length("value"))).collect())
        return {(r[0], r[1]): (int(r[2]), int(r[3] or 0)) for r in rows}

    def entries(self, checkpoint_id: int, state: str | None = None,
                content_hash: str | None = None) -> pa.Table:
        """Entry rows (state, content_hash, seq, key, value) of a checkpoint, in order
        (values read from the lake filter as literals, never as SQL text)."""
        from pyspark.sql import functions as F

        where = (F.col("checkpoint_id") == int(checkpoint_id)) & (F.col("kind") == ENTRY)
        for column, value in (("state", state), ("content_hash", content_hash)):
            if value is not None:
                where = where & (F.col(column) == F.lit(str(value)))
        t = (self._df().where(where)
             .select("state", "content_hash", "seq", "key", "value").toArrow())
        if t.num_rows == 0:
            return t
        return t.take(pc.sort_indices(t, sort_keys=[("state", "ascending"),
                                                    ("content_hash", "ascending"),
                                                    ("seq", "ascending")]))

    def delta_versions(self) -> dict[int, int]:
        """checkpoint id -> the Delta version that committed it (from the log's txn)."""
        return delta_io.txn_versions(self.path, self.app_id, self.spark)

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
