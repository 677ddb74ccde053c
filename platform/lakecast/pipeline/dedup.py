"""Exactly once per key across micro-batches: a Delta-side lookup of the events accepted
by earlier batches.

A pipeline whose :class:`~lakecast.pipeline.micro_batch.PipelineSpec` has a
:class:`DedupSpec` rejects a valid event whose key an earlier batch already accepted,
with the spec's reason (``duplicate_<key>``), instead of processing it again. The
semantics:

* the **accepted events** are the rows of the dedup tables (default: the main and side
  outputs) **as of the output versions the last committed batch recorded** — not the
  newest versions: a batch redone after a crash never sees its own partial writes, and
  after a rewind the lookup sees the rolled-back outputs (a later version is read only
  when the commits after the recorded one just compact files: same rows);
* their **watermark** ``W`` is the newest ``time_column`` value among them; an accepted
  event is **retained** while its time is at least ``W - retention`` (a key is
  remembered for ``retention`` of event time past its event, like Flink's event-time
  state TTL; older events are never read again);
* a new valid event is a **duplicate** when a retained event with the same key has a
  time within ``retention`` of its own (``|t_new - t_old| <= retention``). A copy
  whose first copy left the retention, or whose time is further apart, is accepted
  again. Events rejected earlier (malformed, duplicates) are not in the outputs and do
  not count. Copies *within* one batch are the validator's business (it sees the batch);
* a new valid event **older than the horizon** ``W - retention`` (and not found a
  duplicate) cannot be checked any more: its first copy may have left the retention. It
  is rejected as ``too_late_to_deduplicate`` (:attr:`DedupSpec.late_reason`) and counted
  per batch, as Structured Streaming's ``dropDuplicatesWithinWatermark`` drops rows
  behind its watermark; :attr:`DedupSpec.accept_late` accepts it unchecked instead.

Cost: the lookup runs on the driver without a Spark job. It replays the dedup tables'
Delta logs, skips every file whose ``time_column`` statistics end before ``W -
retention`` (file pruning by event time), reads the key and time columns of the others
with pyarrow (each file once: files are immutable, so they stay cached while they are in
the retention window) and keeps the accepted events whose key is among the batch's keys
(read from the events' files, also without Spark). Only when one of those keys is found
does the batch's one Spark job get a broadcast join with those few rows, which marks the
duplicates before the valid rows are processed. Tables Lakecast cannot read directly
(URIs, deletion vectors, column mapping) take a Spark lookup: the same rows, with Spark
reading the tables and one extra action for ``W``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc

from lakecast.config import DEFAULT_DEDUP_RETENTION
from lakecast.delta import io as delta_io
from lakecast.delta.log import verify_checksum
from lakecast.errors import LakecastError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from lakecast.pipeline.progress import BatchPlan

#: ``_reason`` of a row found in an earlier batch, until the rejected rows are written
#: (then it becomes :attr:`DedupSpec.reason_text`; counted on the way)
EARLIER_BATCH = "_earlier_batch_duplicate"
#: the default :attr:`DedupSpec.late_reason` (events older than the dedup horizon)
TOO_LATE = "too_late_to_deduplicate"
#: counts keys of a batch: valid events rejected as copies of events earlier batches
#: accepted, and as older than the dedup horizon
CROSS_BATCH_DUPLICATES = "cross_batch_duplicates"
LATE_EVENTS = "too_late_to_deduplicate"
KEY = "_dedup_key"
TIMES = "_dedup_times"
#: margin for timestamp statistics that writers truncate (e.g. to milliseconds)
STATS_SLACK = timedelta(seconds=1)
TIME_TYPE = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True)
class DedupSpec:
    """Reject a valid event whose ``key`` an earlier batch accepted within ``retention``
    of event time (``time_column``, a timestamp column of the validated events and of
    the ``tables``). ``key`` must be a column of the events table that the validator
    keeps as it is."""

    key: str
    time_column: str
    retention: timedelta = DEFAULT_DEDUP_RETENTION
    #: the rejected rows' reason (default ``duplicate_<key>``)
    reason: str | None = None
    #: tables holding the accepted events (default: the main and side outputs)
    tables: tuple[str, ...] | None = None
    #: a valid event older than the horizon (newest accepted time minus ``retention``):
    #: ``False`` (default) rejects it with ``late_reason``; ``True`` accepts it unchecked —
    #: the risk: a late copy of an event accepted earlier is processed again (two output
    #: rows with one key, silently, as without dedup)
    accept_late: bool = False
    #: the rejected rows' reason for events older than the horizon
    late_reason: str = TOO_LATE

    @property
    def reason_text(self) -> str:
        return self.reason or f"duplicate_{self.key}"


@dataclass(frozen=True)
class Prior:
    """What one batch is checked against: the retained accepted events of its keys, as
    ``(KEY, TIMES)`` rows (Arrow, or a DataFrame from a Spark lookup; ``None``: none)."""

    rows: pa.Table | DataFrame | None
    watermark: datetime | None
    #: accepted events in the retention window (-1: not counted, a Spark lookup)
    retained: int
    #: valid events older than this are rejected as too late (``None``: none are)
    horizon: datetime | None = None

    @property
    def found(self) -> bool:
        """Whether the batch needs the join (some of its keys were accepted before)."""
        return self.rows is not None

    @property
    def marks(self) -> bool:
        """Whether the batch's events must be marked (duplicates found, or a horizon)."""
        return self.found or self.horizon is not None

    def summary(self) -> dict[str, Any]:
        """For logs and metadata: the ``watermark`` (ISO), the ``retained`` events and the
        batch's ``keys_found`` among them (-1: not counted, a Spark lookup)."""
        keys = (self.rows.num_rows if isinstance(self.rows, pa.Table)
                else 0 if self.rows is None else -1)
        return {"watermark": self.watermark.isoformat() if self.watermark else None,
                "horizon": self.horizon.isoformat() if self.horizon else None,
                "retained": self.retained, "keys_found": keys}


@dataclass(frozen=True)
class _Cached:
    rows: pa.Table  # key, time
    newest: datetime | None


class DedupLookup:
    """The driver side of a pipeline's cross-batch dedup (see the module docstring).

    ``direct_reads=False`` always takes the Spark lookup (the fallback for tables that
    cannot be read without Spark)."""

    def __init__(self, spark: SparkSession, spec: DedupSpec, table_path: Callable[[str], str],
                 events_table: str, tables: Sequence[str], *, direct_reads: bool = True
                 ) -> None:
        self.spark = spark
        self.spec = spec
        self.table_path = table_path
        self.events_table = events_table
        self.tables = tuple(spec.tables or tables)
        self.direct_reads = direct_reads
        self._files: dict[str, _Cached] = {}  # data file -> its key/time rows

    # -- the lookup -------------------------------------------------------------------
    def prior(self, plan: BatchPlan, versions: Mapping[str, int]) -> Prior | None:
        """The retained accepted events (as of ``versions``, table -> Delta version, the
        last committed batch's) that share a key with ``plan``'s events (``None``: no
        table yet; :attr:`Prior.found` false: no shared key, the batch needs no join)."""
        at = {t: self._settled(t, v) for t in self.tables if (v := versions.get(t, -1)) >= 0}
        if not at:
            return None
        found = None
        if self.direct_reads:
            try:
                found = self._direct(at, self._batch_keys(plan))
            except delta_io.DirectReadUnsupported:
                found = self._spark(at)
        else:
            found = self._spark(at)
        if found is None or found.watermark is None or self.spec.accept_late:
            return found
        return replace(found, horizon=found.watermark - self.spec.retention)

    def _settled(self, table: str, version: int) -> int:
        """:func:`settled_version` of ``table`` at ``version``."""
        return settled_version(self.spark, self.table_path(table), version)

    def _batch_keys(self, plan: BatchPlan) -> pa.ChunkedArray:
        """The keys of the plan's events, read from the files its commits add (the range
        only appends: :func:`~lakecast.pipeline.events.read_new_events` checked it).
        Raises :class:`~lakecast.delta.io.DirectReadUnsupported` when Spark must read."""
        import pyarrow.parquet as pq

        path, key = self.table_path(self.events_table), self.spec.key
        if plan.events_start < 0:
            return delta_io.table_files(path, plan.events_end).read([key]).column(0)
        if "://" in path and not path.startswith("file://"):
            raise delta_io.DirectReadUnsupported(f"{path} is not on the local filesystem")
        root = Path(path.removeprefix("file://"))
        chunks: list[pa.Array] = []
        for version in range(plan.events_start + 1, plan.events_end + 1):
            for action in delta_io.commit_actions(path, version):
                add = action.get("add")
                if add is None or not add.get("dataChange", True):
                    continue
                name = unquote(add["path"])
                if ":" in name.split("/", 1)[0] or add.get("deletionVector"):
                    raise delta_io.DirectReadUnsupported(f"{name}: not a plain local file")
                try:
                    verify_checksum(str(root / name))
                    t = pq.ParquetFile(root / name).read(columns=[key])
                except (OSError, pa.ArrowInvalid) as e:  # e.g. column mapping: Spark reads
                    raise delta_io.DirectReadUnsupported(f"{name}: {e}") from e
                if key not in t.column_names:
                    raise delta_io.DirectReadUnsupported(f"{name} has no column {key}")
                chunks.extend(t.column(key).chunks)
        return pa.chunked_array(chunks, type=chunks[0].type if chunks else pa.int64())

    def _direct(self, at: Mapping[str, int], keys: pa.ChunkedArray) -> Prior | None:
        """The lookup without Spark (see the module docstring)."""
        key, tcol, keep = self.spec.key, self.spec.time_column, self.spec.retention
        entries: list[tuple[delta_io.TableFiles, int, datetime | None]] = []
        for table, version in at.items():
            files = delta_io.table_files(self.table_path(table), version, open_files=False)
            self._check_columns(table, version, files.schema.names)
            for i, stats in enumerate(files.stats or [None] * len(files.files)):
                entries.append((files, i, _stat_max(stats, tcol)))
        known = [hi for _, _, hi in entries if hi is not None]
        floor = max(known) - keep - STATS_SLACK if known else None
        wanted = [(files, i) for files, i, hi in entries
                  if hi is None or floor is None or hi >= floor]
        cached = {files.files[i]: self._read(files, i) for files, i in wanted}
        self._files = cached  # files out of the window (or removed) are dropped
        newest = [c.newest for c in cached.values() if c.newest is not None]
        if not newest:
            return None
        watermark = max(newest)
        rows = pa.concat_tables([c.rows for c in cached.values()], promote_options="permissive")
        rows = rows.filter(pc.greater_equal(rows.column(1), pa.scalar(watermark - keep,
                                                                      TIME_TYPE)))
        retained = rows.num_rows
        try:
            probe = pc.cast(keys, rows.schema.field(0).type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise LakecastError(f"{self.events_table}.{key} ({keys.type}) does not compare "
                                f"with the accepted events' {key} ({rows.schema.field(0).type}): "
                                f"{e}") from e
        rows = rows.filter(pc.is_in(rows.column(0), value_set=pc.unique(probe)))
        if not rows.num_rows:
            return Prior(None, watermark, retained)
        grouped = rows.group_by(key).aggregate([(tcol, "list")])
        return Prior(pa.table({KEY: grouped.column(key), TIMES: grouped.column(f"{tcol}_list")}),
                     watermark, retained)

    def _read(self, files: delta_io.TableFiles, i: int) -> _Cached:
        """One data file's key and time columns (cached: data files never change)."""
        name = files.files[i]
        hit = self._files.get(name)
        if hit is not None:
            return hit
        one = replace(files, files=(name,), stats=(),
                      partitions=(files.partitions[i],) if files.partitions else ())
        t = one.read([self.spec.key, self.spec.time_column])
        t = pa.table([t.column(0), pc.cast(t.column(1), TIME_TYPE)],
                     names=[self.spec.key, self.spec.time_column])
        newest = pc.max(t.column(1)).as_py()
        return _Cached(t, newest)

    def _spark(self, at: Mapping[str, int]) -> Prior | None:
        """The Spark lookup: the same retained events, read by Spark (one action for W)."""
        from pyspark.sql import functions as F

        key, tcol = self.spec.key, self.spec.time_column
        frames = []
        for table, version in at.items():
            df = delta_io.read(self.spark, self.table_path(table), version=version)
            self._check_columns(table, version, df.columns)
            frames.append(df.select(key, tcol))
        accepted = frames[0]
        for f in frames[1:]:
            accepted = accepted.unionByName(f)
        newest = accepted.agg(F.max(tcol)).first()[0]  # naive, in the driver's time zone
        if newest is None:
            return None
        watermark = newest.astimezone(timezone.utc)
        rows = (accepted.where(F.col(tcol) >= F.lit(watermark - self.spec.retention))
                .groupBy(F.col(key).alias(KEY)).agg(F.collect_list(tcol).alias(TIMES)))
        return Prior(rows, watermark, -1)

    def _check_columns(self, table: str, version: int, columns: Sequence[str]) -> None:
        missing = [c for c in (self.spec.key, self.spec.time_column) if c not in columns]
        if missing:
            raise LakecastError(
                f"{table}@v{version} has no column {missing} for the cross-batch dedup of "
                f"{self.events_table} (key {self.spec.key!r}, time "
                f"{self.spec.time_column!r}); name the tables that hold the accepted events "
                f"in DedupSpec.tables, or drop the pipeline's dedup")

    # -- the batch's Spark job --------------------------------------------------------
    def mark(self, checked: DataFrame, prior: Prior, reason: str) -> DataFrame:
        """``checked`` (validated events with ``reason``, null = valid) with the valid rows
        that ``prior`` holds marked :data:`EARLIER_BATCH`, and the other valid rows older
        than its horizon marked :attr:`DedupSpec.late_reason` (same columns, order)."""
        from pyspark.sql import functions as F

        rows, now = prior.rows, F.unix_micros(F.col(self.spec.time_column))
        marked = F.col(reason)
        joined = checked
        if rows is not None:
            if isinstance(rows, pa.Table):
                rows = F.broadcast(self.spark.createDataFrame(rows))
            limit = int(self.spec.retention.total_seconds() * 1_000_000)
            joined = checked.join(rows, F.col(self.spec.key) == F.col(KEY), "left")
            found = F.col(reason).isNull() & F.exists(
                F.col(TIMES), lambda t: F.abs(F.unix_micros(t) - now) <= F.lit(limit))
            marked = F.when(found, F.lit(EARLIER_BATCH)).otherwise(marked)
        if prior.horizon is not None:
            late = marked.isNull() & (now < F.lit(_micros(prior.horizon)))
            marked = F.when(late, F.lit(self.spec.late_reason)).otherwise(marked)
        # withColumn replaces ``reason`` in place: no schema request (a Spark Connect round
        # trip per batch) to list ``checked``'s columns
        out = joined.withColumn(reason, marked)
        return out if rows is None else out.drop(KEY, TIMES)

    def late_count(self, rows: pa.Table, column: str = "reason") -> int:
        """Collected rejected rows rejected as older than the horizon."""
        hit = pc.equal(rows.column(column), self.spec.late_reason)
        return int(pc.sum(pc.fill_null(hit, False)).as_py() or 0)

    def public_reason(self, reason: Column) -> Column:
        """``reason`` with :data:`EARLIER_BATCH` written as the spec's reason."""
        from pyspark.sql import functions as F

        return F.when(reason == F.lit(EARLIER_BATCH), F.lit(self.spec.reason_text)
                      ).otherwise(reason)

    def finish_rejected(self, rows: pa.Table, column: str = "reason") -> tuple[pa.Table, int]:
        """Collected rejected rows with :data:`EARLIER_BATCH` written as the spec's reason,
        and how many there were."""
        col = rows.column(column)
        hit = pc.fill_null(pc.equal(col, EARLIER_BATCH), False)
        n = int(pc.sum(hit).as_py() or 0)
        if not n:
            return rows, 0
        fixed = pc.if_else(hit, pa.scalar(self.spec.reason_text, col.type), col)
        return rows.set_column(rows.schema.get_field_index(column), column, fixed), n


def rejected_counts(lookup: DedupLookup | None, by_reason: Mapping[str | None, int]
                    ) -> dict[str, int]:
    """A batch's dedup counts from its rejected rows counted by reason (no late count
    without a dedup)."""
    out = {CROSS_BATCH_DUPLICATES: int(by_reason.get(EARLIER_BATCH, 0))}
    if lookup is not None:
        out[LATE_EVENTS] = int(by_reason.get(lookup.spec.late_reason, 0))
    return out


def settled_version(spark: SparkSession | None, path: str, version: int) -> int:
    """The newest version of the Delta table at ``path`` whose commits after ``version``
    only rearrange its files (``dataChange: false``: OPTIMIZE; VACUUM, metadata): the same
    rows, in files that a VACUUM after the compaction keeps. A commit that changes data
    (e.g. a redone batch's own partial writes) ends the search."""
    latest = delta_io.latest_version(path, spark) or version
    settled = version
    for v in range(version + 1, latest + 1):
        if any(_changes_data(a) for a in delta_io.commit_actions(path, v, spark)):
            return settled
        settled = v
    return settled


def _changes_data(action: Mapping[str, Any]) -> bool:
    """Whether a Delta log action adds or removes rows (not a compaction's rewrite)."""
    if "cdc" in action:
        return True
    change = action.get("add") or action.get("remove")
    return change is not None and bool(change.get("dataChange", True))


def _micros(t: datetime) -> int:
    """Microseconds since the epoch of an aware datetime (exact)."""
    return (t - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1)


def _stat_max(stats: Mapping[str, Any] | None, column: str) -> datetime | None:
    """A file's largest ``column`` value from its Delta statistics (``None``: unknown)."""
    value = ((stats or {}).get("maxValues") or {}).get(column)
    if not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
