"""The one Delta I/O layer: writes, MERGE upserts, versions, time travel, Change Data Feed.

The facade every caller imports (``from lakecast.delta import io as delta_io``): the
Spark-side operations live here; version look-ups (:func:`latest_version`,
:func:`commit_info`), ``txn`` versions, the Change Data Feed and direct reads of a
version's files come from :mod:`lakecast.delta.log`, which reads the Delta log through
``deltalake`` without Spark (so sensors and the continuous loop poll cheaply), and are
re-exported here.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from lakecast.delta.arrow_write import append_arrow, checkpoint_log, overwrite_arrow
from lakecast.delta.log import (
    CDF_PROPERTY,
    CommitInfo,
    DeltaIOError,
    DirectReadUnsupported,
    TableFiles,
    TableIdentity,
    commit_actions,
    commit_info,
    commit_infos,
    commit_seconds,
    file_sizes,
    latest_version,
    read_changes_from_log,
    row_count,
    table_exists,
    table_files,
    table_identity,
    txn_versions,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

T = TypeVar("T")


def table_ref(path: str) -> str:
    """The SQL name of the Delta table at ``path`` (Delta SQL runs in both Spark modes,
    classic and Spark Connect, without Delta's Python ``DeltaTable`` API)."""
    return "delta.`" + path.replace("`", "``") + "`"


def _temp_view(df: DataFrame) -> str:
    name = f"lakecast_src_{uuid.uuid4().hex}"
    df.createOrReplaceTempView(name)
    return name


def read(
    spark: SparkSession, path: str, version: int | None = None, timestamp: str | None = None
) -> DataFrame:
    """Read the table, optionally as of a version or timestamp (time travel)."""
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    elif timestamp is not None:
        reader = reader.option("timestampAsOf", timestamp)
    return reader.load(path)


def read_changes(
    spark: SparkSession, path: str, start_version: int, end_version: int | None = None
) -> DataFrame:
    """The Change Data Feed between two versions (inclusive), with ``_change_type``,
    ``_commit_version`` and ``_commit_timestamp`` columns."""
    reader = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", start_version)
    )
    if end_version is not None:
        reader = reader.option("endingVersion", end_version)
    return reader.load(path)


def plain_types(df: DataFrame) -> DataFrame:
    """``df`` with every column that holds strings cast to its type as SQL spells it.

    Over Spark Connect, ``mapInArrow``'s string columns are "string collate UTF8_BINARY"
    on the server (the client shows plain ``string``); written as they are, Delta records
    that type in the table's schema and delta-rs (table maintenance, direct reads) refuses
    the table. A cast written in SQL gives the plain type; other columns are untouched.
    """
    fields = df.schema.fields
    if not any("string" in f.dataType.simpleString() for f in fields):
        return df
    return df.selectExpr(*(
        f"CAST(`{f.name}` AS {f.dataType.simpleString()}) AS `{f.name}`"
        if "string" in f.dataType.simpleString() else f"`{f.name}`"
        for f in fields))


def write(
    df: DataFrame,
    path: str,
    mode: str = "append",
    partition_by: Sequence[str] = (),
    txn: tuple[str, int] | None = None,
    merge_schema: bool = False,
) -> int:
    """Write ``df`` to the table at ``path``; return the version now current.

    ``txn=(app_id, txn_version)`` makes the write idempotent: Delta skips a
    write whose ``txnVersion`` for ``app_id`` was already committed, so a
    retried batch never writes twice.
    """
    writer = plain_types(df).write.format("delta").mode(mode)
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    if txn is not None:
        writer = writer.option("txnAppId", txn[0]).option("txnVersion", txn[1])
    if merge_schema:
        writer = writer.option("mergeSchema", "true")
    writer.save(path)
    version = latest_version(path, df.sparkSession)
    assert version is not None
    return version


@dataclass(frozen=True)
class MergeResult:
    """Outcome of :func:`merge_upsert`."""

    version: int
    inserted: int
    updated: int
    deleted: int
    created: bool = False

    @property
    def changed(self) -> int:
        return self.inserted + self.updated + self.deleted


def merge_upsert(
    spark: SparkSession,
    source: DataFrame,
    path: str,
    keys: Sequence[str],
    *,
    compare_columns: Sequence[str] | None = None,
    delete_missing: bool = False,
    partition_by: Sequence[str] = (),
) -> MergeResult:
    """Upsert ``source`` into the table at ``path`` by ``keys`` with Delta MERGE.

    Only rows whose values differ (null-safe, over ``compare_columns`` — all
    non-key columns by default) are updated, so a refresh that changes 1% of
    rows commits 1% of rows and the Change Data Feed holds exactly those.
    ``delete_missing`` deletes target rows absent from ``source``. Creates the
    table (version 0) when it does not exist. When nothing would change, no
    version is committed (an empty MERGE would otherwise wake every sensor and
    broadcast an empty element).
    """
    if not keys:
        raise DeltaIOError("merge_upsert needs at least one key column")
    current = latest_version(path, spark)
    if current is None:
        version = write(source, path, mode="overwrite", partition_by=partition_by)
        n = source.sparkSession.read.format("delta").load(path).count()
        return MergeResult(version, inserted=n, updated=0, deleted=0, created=True)
    cols = [c for c in (compare_columns or source.columns) if c not in keys]
    on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
    changed = " OR ".join(f"NOT (t.`{c}` <=> s.`{c}`)" for c in cols) or "false"
    target = read(spark, path)
    probe = source.alias("s").join(
        target.alias("t"), [source[k] == target[k] for k in keys],
        "full_outer" if delete_missing else "left_outer",
    )
    missing_t = " AND ".join(f"t.`{k}` IS NULL" for k in keys)
    missing_s = " AND ".join(f"s.`{k}` IS NULL" for k in keys)
    differs = f"({missing_t}) OR ({missing_s}) OR ({changed})"
    if probe.where(differs).limit(1).count() == 0:
        return MergeResult(current, 0, 0, 0)
    clauses = [f"WHEN MATCHED AND ({changed}) THEN UPDATE SET *",
               "WHEN NOT MATCHED THEN INSERT *"]
    if delete_missing:
        clauses.append("WHEN NOT MATCHED BY SOURCE THEN DELETE")
    view = _temp_view(source)
    try:
        spark.sql(f"MERGE INTO {table_ref(path)} AS t USING {view} AS s ON {on} "
                  + " ".join(clauses))
    finally:
        spark.catalog.dropTempView(view)
    version = latest_version(path, spark)
    assert version is not None
    if version == current:  # nothing committed
        return MergeResult(version, 0, 0, 0)
    m = commit_info(path, version, spark).metrics
    return MergeResult(
        version,
        inserted=int(m.get("numTargetRowsInserted", 0)),
        updated=int(m.get("numTargetRowsUpdated", 0)),
        deleted=int(m.get("numTargetRowsDeleted", 0)),
    )


def history(spark: SparkSession, path: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The table's history, newest first, as plain dicts."""
    sql = f"DESCRIBE HISTORY {table_ref(path)}" + (f" LIMIT {int(limit)}" if limit else "")
    return [r.asDict(recursive=True) for r in spark.sql(sql).collect()]


def table_properties(spark: SparkSession, path: str) -> dict[str, str]:
    """The table's properties (e.g. ``delta.enableChangeDataFeed``)."""
    row = spark.sql(f"DESCRIBE DETAIL {table_ref(path)}").collect()[0]
    return dict(row["properties"] or {})


def replace_where(
    df: DataFrame, path: str, predicate: str, partition_by: Sequence[str] = ()
) -> int:
    """Atomically replace the rows matching ``predicate`` with ``df`` (one commit).

    Every row of ``df`` must satisfy ``predicate``. Running it again with the
    same rows leaves the same table content, so a rerun never duplicates rows.
    Creates the table when it does not exist. Returns the version now current.
    """
    if latest_version(path, df.sparkSession) is None:
        return write(df, path, mode="overwrite", partition_by=partition_by)
    writer = df.write.format("delta").mode("overwrite").option("replaceWhere", predicate)
    writer.save(path)
    version = latest_version(path, df.sparkSession)
    assert version is not None
    return version


def is_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is a Delta optimistic-concurrency conflict (safe to retry)."""
    text = f"{type(exc).__name__} {exc}"
    return "Concurrent" in text or "DELTA_CONCURRENT" in text


def retry_on_conflict(fn: Callable[[], T], attempts: int = 5, backoff_s: float = 0.5) -> T:
    """Call ``fn``; when a concurrent Delta commit wins, call it again (up to ``attempts``).

    ``fn`` must rebuild its input DataFrames, so a retry reads the new snapshot.
    """
    import time

    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as e:
            if attempt == attempts or not is_conflict(e):
                raise
            time.sleep(backoff_s * attempt)
    raise AssertionError("unreachable")


def delete(spark: SparkSession, path: str, predicate: str) -> int:
    """Delete the rows matching ``predicate`` (one atomic commit); returns the version now
    current (unchanged when nothing matched)."""
    spark.sql(f"DELETE FROM {table_ref(path)} WHERE {predicate}")
    version = latest_version(path, spark)
    assert version is not None
    return version


def restore_version(spark: SparkSession, path: str, version: int) -> int:
    """Delta ``RESTORE`` the table to ``version`` (a new commit; history is kept)."""
    spark.sql(f"RESTORE TABLE {table_ref(path)} TO VERSION AS OF {int(version)}")
    current = latest_version(path, spark)
    assert current is not None
    return current


__all__ = [
    "CDF_PROPERTY", "CommitInfo", "DeltaIOError", "DirectReadUnsupported", "MergeResult",
    "TableFiles", "TableIdentity", "append_arrow", "checkpoint_log", "commit_actions",
    "commit_info", "commit_infos", "commit_seconds",
    "delete", "file_sizes", "history", "is_conflict",
    "latest_version", "merge_upsert", "overwrite_arrow", "read", "read_changes",
    "read_changes_from_log", "replace_where", "restore_version", "retry_on_conflict",
    "row_count", "table_exists", "table_files", "table_identity", "table_properties",
    "table_ref",
    "txn_versions", "write",
]  # fmt: skip
