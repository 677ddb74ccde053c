"""The snapshot table of one pipeline: its layout, one checkpoint's write, its reads.

One Delta table per pipeline (``<checkpoint root>/<pipeline>/snapshots``, partitioned by
``checkpoint_id``) holds every checkpoint; each checkpoint is written in ONE commit, so it
is one Delta version and time travel reaches any past one. A checkpoint has three kinds
of rows (:data:`HEADER`, :data:`MANIFEST`, :data:`ENTRY`):

* ``checkpoint`` (one): the header — batch id, events offsets, state version (applied
  Delta versions), parallelism ``p``, declared states, broadcast table schemas;
* ``manifest`` (``p`` x states): what task ``i`` held for state ``s`` — the SHA-256
  content hash of its canonical serialization, its entry count and size;
* ``entry``: the content, ``(state, seq, key, value)``, stored ONCE per distinct content
  hash (Flink stores one copy per task: ``p`` x state size): Arrow IPC chunks of a table
  state, typed JSON entries of a dict state (data, never code: :mod:`~lakecast.snapshots.codec`).

:class:`SnapshotTable` writes and reads those rows — from the table's files without a
Spark job when it can, with Spark otherwise — and sets aside checkpoints whose files are
damaged or whose header is refused. What is complete, what a restore loads and what is
kept is :class:`~lakecast.snapshots.store.SnapshotStore`'s.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from lakecast.delta import io as delta_io
from lakecast.snapshots.errors import (
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


class SnapshotTable:
    """The snapshot Delta table of one pipeline at ``path``: rows in, rows out."""

    def __init__(self, spark: SparkSession, path: str, pipeline: str) -> None:
        self.spark = spark
        self.path = path
        self.pipeline = pipeline
        #: checkpoint id -> why its files could not be read (found by :meth:`index`)
        self.unreadable: dict[int, str] = {}
        #: checkpoint id -> why its header was refused (found by :meth:`index`)
        self.refused: dict[int, str] = {}
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
