"""Where :class:`~lakecast.runtime.keyed.KeyedBroadcastRuntime` keeps keyed state: a Delta
changelog of per-key rows, appended once per batch and compacted every N batches.

Layout (one Delta table): the columns of
:data:`~lakecast.runtime.keyed_tasks.STATE_SCHEMA` plus ``_batch``, the id of the batch
that wrote the row. A batch appends one row per changed key (its new state, or a
tombstone: ``_state`` null) and one ``__meta__`` row (group -1: batch id, watermark,
broadcast versions, schemas), in ONE blind append (delta-rs, no Spark job). The state as of
a version is, per ``(_key_group, _key)``, the row with the largest ``_batch`` unless it is a
tombstone (rows of tables written before the changelog have no ``_batch``: oldest). So:

* one Delta version per batch: the keyed state as of batch ``b`` is Delta time travel to
  the version ``b`` wrote, and a rewind is a Delta ``RESTORE`` as before;
* **compaction** (:meth:`KeyedStateStore.compact`, every ``compact_every`` appends)
  rewrites the table to its newest non-tombstone row per key in one commit: the same
  state, so every version, before or after it, reads the same;
* a commit is idempotent: a batch whose meta row is already the newest is not appended
  again (a redo after a crash), nor compacted twice;
* every commit this module writes carries its meta in ``commitInfo.userMetadata``, so
  which batch a version holds is read from the log, without a Spark job (other commits —
  ``RESTORE``, ``OPTIMIZE``, a MERGE-era table — fall back to reading the meta rows).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakecast.delta import io as delta_io
from lakecast.runtime.keyed_tasks import (
    BATCH,
    DUE,
    EXPIRES,
    GROUP,
    KEY,
    META_KEY,
    NEXT_EVENT,
    NEXT_PROC,
    STATE,
    STATE_SCHEMA,
    KeyedStateError,
    StateMeta,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

#: the keyed state table's columns
STORE_SCHEMA = STATE_SCHEMA.append(pa.field(BATCH, pa.int64()))
#: the key of this module's commit tag in ``commitInfo.userMetadata``
TAG = "lakecast.keyed_state"
APPEND, COMPACT = "append", "compact"
DEFAULT_COMPACT_EVERY = 8
DRIVER_COMPACT_ROWS = 2_000_000


def _tag(op: str, meta: StateMeta) -> str:
    return json.dumps({TAG: {"op": op, "meta": meta.to_json()}}, sort_keys=True)


class KeyedStateStore:
    """The keyed state table at ``path`` (see the module docstring): which version feeds
    a batch, the rows a batch needs, the per-batch append and the compaction."""

    def __init__(self, spark: SparkSession, path: str, key_groups: int,
                 compact_every: int = DEFAULT_COMPACT_EVERY) -> None:
        if compact_every < 1:
            raise ValueError(f"compact_every must be >= 1, not {compact_every}")
        self.spark = spark
        self.path = path
        self.key_groups = key_groups
        self.compact_every = compact_every
        self._known: tuple[int, StateMeta] | None = None  # (version, meta) last seen
        #: tables up to this many rows are compacted on the driver, larger ones by Spark
        self.driver_compact_rows = DRIVER_COMPACT_ROWS

    def forget(self) -> None:
        """Drop what is cached about the table (it was rolled back)."""
        self._known = None

    def latest_version(self) -> int | None:
        return delta_io.latest_version(self.path, self.spark)

    # -- versions and their meta ------------------------------------------------------
    def _tag_at(self, version: int) -> dict[str, Any] | None:
        """This module's tag on the commit of ``version`` (``None``: another writer's)."""
        for action in delta_io.commit_actions(self.path, version, self.spark):
            info = action.get("commitInfo")
            if info is None:
                continue
            try:
                tag = json.loads(info.get("userMetadata") or "null")
            except ValueError:
                return None
            return tag.get(TAG) if isinstance(tag, dict) else None
        return None

    def meta_at(self, version: int) -> StateMeta | None:
        """The meta of the state at ``version`` (``None``: the table was emptied)."""
        from pyspark.sql import functions as F

        tag = self._tag_at(version)
        if tag is not None:
            return StateMeta.from_json(tag["meta"])
        table = self.read(version)
        rows = (table.where(F.col(KEY) == META_KEY)
                .orderBy(F.col(BATCH).desc_nulls_last()).select(STATE).limit(1).collect())
        if rows:
            return StateMeta.from_json(bytes(rows[0][0]).decode())
        if table.limit(1).count():
            raise KeyedStateError(f"{self.path}@v{version} has no {META_KEY} row: not a "
                                  "Lakecast keyed state table")
        return None

    def state_before(self, batch_id: int) -> tuple[int | None, StateMeta]:
        """The version (and its meta) that batch ``batch_id`` starts from: the newest
        version written by an earlier batch (``None``: no state yet)."""
        latest = self.latest_version()
        if latest is None:
            return None, StateMeta(key_groups=self.key_groups)
        if self._known is not None and self._known[0] == latest \
                and self._known[1].batch_id < batch_id:
            return self._known
        version = latest
        while version >= 0:
            meta = self.meta_at(version)
            if meta is None:
                break
            if version == latest:
                self._known = (version, meta)
            if meta.batch_id < batch_id:
                return version, meta
            version -= 1  # a crashed attempt of this batch (or later) already committed
        return None, StateMeta(key_groups=self.key_groups)

    # -- reads ------------------------------------------------------------------------
    def read(self, version: int) -> DataFrame:
        """Every row of ``version``, with ``_batch`` (null in a MERGE-era table)."""
        from pyspark.sql import functions as F

        df = delta_io.read(self.spark, self.path, version=version)
        if BATCH not in df.columns:
            df = df.withColumn(BATCH, F.lit(None).cast("long"))
        return df

    def current(self, version: int) -> DataFrame:
        """The state at ``version``: per key (and the meta), its newest row, tombstones
        dropped (a Spark window over the whole table: for compaction and sizes)."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        newest = Window.partitionBy(GROUP, KEY).orderBy(F.col(BATCH).desc_nulls_last())
        return (self.read(version).withColumn("_newest", F.row_number().over(newest))
                .where((F.col("_newest") == 1) & F.col(STATE).isNotNull())
                .select(*STORE_SCHEMA.names))

    def rows_for_batch(self, version: int, batch_keys: DataFrame, all_keys: bool,
                       watermark: int | None, proc_time: int) -> DataFrame:
        """The rows a batch needs: EVERY row (all versions) of the keys in ``batch_keys``
        (columns group, key; duplicates allowed) and of the keys with a due timer or
        expiring TTL in any row, or of every key when ``all_keys``; each row with
        ``_due``. The task keeps each key's newest row, drops tombstones, and loads a key
        not in the batch only when its newest row is due (an older row may be due when
        the newest is not). The wanted keys are broadcast, so the table is filtered where
        it is read, and only the wanted rows are shuffled (with the events)."""
        from pyspark.sql import functions as F

        rows = self.read(version).where(F.col(GROUP) >= 0)
        if all_keys:
            return rows.select(GROUP, KEY, STATE, BATCH, F.lit(True).alias(DUE))
        due = _due(watermark, proc_time)
        wanted = batch_keys.unionByName(rows.where(due).select(GROUP, KEY))
        return (rows.join(F.broadcast(wanted), [GROUP, KEY], "left_semi")
                .select(GROUP, KEY, STATE, BATCH, due.alias(DUE)))

    def size(self, version: int | None = None) -> dict[str, int]:
        """Keys and state bytes at ``version`` (default latest)."""
        from pyspark.sql import functions as F

        version = self.latest_version() if version is None else version
        if version is None:
            return {"keys": 0, "bytes": 0}
        row = (self.current(version).where(F.col(GROUP) >= 0)
               .agg(F.count("*"), F.sum(F.length(STATE))).collect()[0])
        return {"keys": int(row[0]), "bytes": int(row[1] or 0)}

    # -- writes -----------------------------------------------------------------------
    def commit(self, changes: pa.Table, meta: StateMeta) -> int:
        """Append batch ``meta.batch_id``'s changed rows (``STATE_SCHEMA``; a null state
        deletes its key) and its meta row in one commit, then compact when
        ``compact_every`` appends have piled up; returns the version now current.
        Idempotent: a batch already committed is not appended again."""
        latest = self.latest_version()
        done = self.meta_at(latest) if latest is not None else None
        if done is None or done.batch_id < meta.batch_id:
            n = changes.num_rows
            meta_row = pa.table({
                GROUP: pa.array([-1], pa.int32()), KEY: [META_KEY],
                STATE: pa.array([meta.to_json().encode()], pa.binary()),
                NEXT_EVENT: pa.nulls(1, pa.int64()), NEXT_PROC: pa.nulls(1, pa.int64()),
                EXPIRES: pa.nulls(1, pa.int64()), BATCH: pa.array([meta.batch_id], pa.int64()),
            }, schema=STORE_SCHEMA)
            rows = changes.select(STATE_SCHEMA.names).cast(STATE_SCHEMA).append_column(
                BATCH, pa.array([meta.batch_id] * n, pa.int64()))
            delta_io.append_arrow(pa.concat_tables([rows, meta_row]), self.path,
                                  user_metadata=_tag(APPEND, meta))
        if self.appends_since_compaction() >= self.compact_every:
            self.compact()
        version = self.latest_version()
        assert version is not None
        self._known = (version, self.meta_at(version) or meta)
        return version

    def appends_since_compaction(self) -> int:
        """This module's appends since the newest commit that is not one (a compaction,
        a RESTORE, ...), counted from the log up to ``compact_every``."""
        version, n = self.latest_version(), 0
        while version is not None and version >= 0 and n < self.compact_every:
            tag = self._tag_at(version)
            if tag is None or tag.get("op") != APPEND:
                break
            n, version = n + 1, version - 1
        return n

    def copy_to(self, path: str, version: int | None) -> KeyedStateStore:
        """A store at ``path`` (another table: this one is only read) whose newest version
        holds the state of this table's ``version`` (``None``: empty state), compacted,
        with its meta; what ``path`` held before is replaced (one commit). For a replay:
        a runtime pointed at the copy continues from that state without touching this
        table."""
        copy = KeyedStateStore(self.spark, path, self.key_groups, self.compact_every)
        copy.driver_compact_rows = self.driver_compact_rows
        meta = None if version is None else self.meta_at(version)
        if meta is None:  # no state yet: an empty table (no meta row, so no meta)
            delta_io.overwrite_arrow(STORE_SCHEMA.empty_table(), path, create=True,
                                     replace_schema=True)
            return copy
        assert version is not None
        try:
            files = delta_io.table_files(self.path, version)
        except delta_io.DirectReadUnsupported:
            files = None
        if files is not None and files.num_rows <= self.driver_compact_rows:
            delta_io.overwrite_arrow(newest_rows(files.read()), path, create=True,
                                     replace_schema=True, user_metadata=_tag(COMPACT, meta))
        else:
            (self.current(version).write.format("delta").mode("overwrite")
             .option("overwriteSchema", "true").option("userMetadata", _tag(COMPACT, meta))
             .save(path))
        return copy

    def compact(self) -> int:
        """Rewrite the table to its newest non-tombstone row per key (one commit, the
        same state) and checkpoint the log there; returns the version committed. A table
        of at most ``driver_compact_rows`` rows that pyarrow can read is compacted on the
        driver (pyarrow, delta-rs), a larger one by Spark."""
        latest = self.latest_version()
        if latest is None:
            raise KeyedStateError(f"no keyed state table at {self.path} to compact")
        meta = self.meta_at(latest)
        if meta is None:
            raise KeyedStateError(f"{self.path}@v{latest} is empty: nothing to compact")
        try:
            files = delta_io.table_files(self.path, latest)
        except delta_io.DirectReadUnsupported:
            files = None  # e.g. deletion vectors (a MERGE-era table): Spark reads it
        if files is not None and files.num_rows <= self.driver_compact_rows:
            delta_io.overwrite_arrow(newest_rows(files.read()), self.path,
                                     user_metadata=_tag(COMPACT, meta))
        else:
            (self.current(latest).write.format("delta").mode("overwrite")
             .option("userMetadata", _tag(COMPACT, meta)).save(self.path))
        # appends by delta-rs leave the log without checkpoints: one per compaction
        return delta_io.checkpoint_log(self.path)


def newest_rows(rows: pa.Table) -> pa.Table:
    """Per ``(_key_group, _key)`` (the meta included), the row with the largest
    ``_batch`` (null: oldest), tombstones dropped: the compacted table, in key order."""
    import pyarrow.compute as pc

    if BATCH not in rows.column_names:
        rows = rows.append_column(BATCH, pa.nulls(rows.num_rows, pa.int64()))
    rows = rows.select(STORE_SCHEMA.names).cast(STORE_SCHEMA)
    order = pc.sort_indices(rows, sort_keys=[(GROUP, "ascending"), (KEY, "ascending"),
                                              (BATCH, "ascending", "at_start")])
    rows = rows.take(order)
    n = rows.num_rows
    if n == 0:
        return rows
    g, k = rows.column(GROUP), rows.column(KEY)
    # the last row of each key: the next row has another group or key
    differs = pc.or_(pc.not_equal(g.slice(0, n - 1), g.slice(1)),
                     pc.not_equal(k.slice(0, n - 1), k.slice(1)))
    last = pa.concat_arrays([*differs.chunks, pa.array([True])]) if n > 1 \
        else pa.array([True])
    keep = pc.and_(last, pc.is_valid(rows.column(STATE)))
    return rows.filter(keep)


def _due(watermark: int | None, proc_time: int) -> Column:
    """A row's timers or TTL need the batch: a processing-time timer or an expiry at or
    before ``proc_time``, an event-time timer at or before ``watermark``."""
    from pyspark.sql import functions as F

    due = (F.col(NEXT_PROC) <= F.lit(proc_time)) | (F.col(EXPIRES) <= F.lit(proc_time))
    if watermark is not None:
        due = due | (F.col(NEXT_EVENT) <= F.lit(watermark))
    return F.coalesce(due, F.lit(False))


__all__ = ["DEFAULT_COMPACT_EVERY", "DRIVER_COMPACT_ROWS", "STORE_SCHEMA", "TAG", "KeyedStateStore",
           "newest_rows"]
