"""The broadcast source: Delta table versions as an ordered stream of broadcast elements.

Given broadcast tables ``{name: path}`` and the last applied version of each,
:func:`read_broadcast_elements` returns one :class:`BroadcastElement` per new table
version, built from the Change Data Feed (inserts, update post-images, deletes — so a
version that touched 1% of the rows travels as 1% of the rows). When there is no
previous version, or the CDF does not cover the range (enabled later, log cleaned, ...),
it returns one ``full`` element with the table as of the newest version and says why.

Order is total and deterministic: commit order within a table; across tables by commit
timestamp, then table name (a table's timestamps are made non-decreasing first, so
commit order always wins). All reads go through :mod:`lakecast.delta.io`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from lakecast.api.element import (
    CHANGE_TYPE,
    BroadcastElement,
    ElementKind,
    order_elements,
)
from lakecast.delta import io as delta_io

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class DeltaFilesElement(BroadcastElement):
    """A ``full`` element whose rows are the Parquet files of one table version
    (:class:`lakecast.delta.io.TableFiles`), read on first access of :attr:`rows`.

    The runtime ships it to the tasks as a file list, so each task that builds its state
    reads the files itself (no Spark job on the driver, no rows in the broadcast).
    ``num_rows``, ``nbytes`` and ``schema`` come from the log and the Parquet footers
    without reading the rows. It pickles without its rows; :meth:`release` drops them.
    """

    def __init__(self, table: str, version: int, commit_timestamp: int,
                 kind: ElementKind = "full", rows: pa.Table | None = None, reason: str = "",
                 operation: str = "", meta: Mapping[str, Any] | None = None, *,
                 files: delta_io.TableFiles | None = None) -> None:
        # same positional fields as BroadcastElement (rows given: a plain element)
        if files is None and rows is None:
            raise ValueError("a DeltaFilesElement needs files (or rows)")
        fields = {"table": table, "version": version, "commit_timestamp": commit_timestamp,
                  "kind": kind, "reason": reason, "operation": operation, "meta": meta or {},
                  "files": files, "_rows": rows}
        for k, v in fields.items():
            object.__setattr__(self, k, v)

    @property
    def rows(self) -> pa.Table:  # type: ignore[override]
        if self._rows is None:
            object.__setattr__(self, "_rows", self.files.read())
        return self._rows

    @property
    def num_rows(self) -> int:
        return self.files.num_rows if self.files is not None else self._rows.num_rows

    @property
    def nbytes(self) -> int:
        return int(self.files.nbytes if self._rows is None else self._rows.nbytes)

    @property
    def schema(self) -> pa.Schema:
        return self.files.schema if self.files is not None else self._rows.schema

    def release(self) -> None:
        """Forget the rows read so far (they are read again on the next access)."""
        if self.files is not None:
            object.__setattr__(self, "_rows", None)

    def __getstate__(self) -> dict[str, Any]:
        if self.files is None:
            return dict(self.__dict__)
        return {**self.__dict__, "_rows": None}


class CdfUnavailable(Exception):
    """The Change Data Feed cannot serve a version range."""



def _full(spark: SparkSession, name: str, path: str, version: int, reason: str,
          direct: bool = True) -> BroadcastElement:
    """The whole table at ``version``: as its file list (read where the rows are needed,
    :class:`DeltaFilesElement`) when that is safe, else read by Spark now (and the reason
    says why)."""
    info = delta_io.commit_info(path, version, spark)
    if direct:
        large = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"
        try:
            files = delta_io.table_files(path, version, large_types=large)
        except delta_io.DirectReadUnsupported as e:
            reason = f"{reason} (read with Spark: {e})"
        else:
            log.info("broadcast %s@v%d: full (%d rows in %d files): %s", name, version,
                     files.num_rows, len(files.files), reason)
            return DeltaFilesElement(name, version, info.timestamp_ms, reason=reason,
                                     operation=info.operation, files=files)
    rows = delta_io.read(spark, path, version=version).toArrow()
    log.info("broadcast %s@v%d: full (%d rows): %s", name, version, rows.num_rows, reason)
    return BroadcastElement(
        name, version, info.timestamp_ms, "full", rows, reason=reason, operation=info.operation
    )


def _changes_from_log(path: str, start: int, end: int) -> dict[int, pa.Table] | None:
    """Per-version changes read straight from the commits' CDC/data files (no Spark job)."""
    tables = delta_io.read_changes_from_log(path, start, end)
    if tables is None:
        return None
    out = {}
    for v, t in tables.items():
        if t.num_rows:
            t = t.filter(pc.not_equal(t.column(CHANGE_TYPE), "update_preimage"))
            names = [c for c in t.column_names if c != CHANGE_TYPE]
            t = t.select([*names, CHANGE_TYPE])
        out[v] = t
    return out


def _changes_with_spark(spark: SparkSession, path: str, start: int, end: int
                        ) -> dict[int, pa.Table]:
    """Per-version changes from Spark's Change Data Feed reader."""
    try:
        frame = delta_io.read_changes(spark, path, start, end).where(
            f"{CHANGE_TYPE} != 'update_preimage'"
        )
        rows = frame.drop("_commit_timestamp").toArrow()
    except Exception as e:  # AnalysisException, Py4JJavaError, ...: the CDF cannot serve it
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CdfUnavailable(first[:500]) from e
    versions = rows.column("_commit_version")
    rows = rows.drop_columns(["_commit_version"])
    return {v: rows.filter(pc.equal(versions, v)) for v in range(start, end + 1)}


def _changes(
    spark: SparkSession, name: str, path: str, start: int, end: int, fast_path: bool = True
) -> list[BroadcastElement]:
    try:
        infos = [delta_io.commit_info(path, v, spark) for v in range(start, end + 1)]
    except delta_io.DeltaIOError as e:
        raise CdfUnavailable(f"log cleaned: {e}") from e
    parts = _changes_from_log(path, start, end) if fast_path else None
    if parts is None:
        parts = _changes_with_spark(spark, path, start, end)
    out = []
    for info in infos:
        part = parts[info.version]
        out.append(
            BroadcastElement(
                name, info.version, info.timestamp_ms, "changes", part, operation=info.operation
            )
        )
    return out


def read_broadcast_elements(
    spark: SparkSession,
    tables: Mapping[str, str],
    since: Mapping[str, int | None],
    until: Mapping[str, int] | None = None,
    *,
    fast_path: bool = True,
    direct_full: bool = True,
) -> list[BroadcastElement]:
    """The ordered broadcast elements of ``tables`` after the versions in ``since``.

    ``since[name]`` is the last applied version (missing/``None``: nothing applied yet).
    ``until[name]`` caps the version read (default: the newest). Tables that do not
    exist yet are skipped. ``fast_path`` reads simple commits' change files directly
    (:func:`lakecast.delta.io.read_changes_from_log`) instead of running a Spark job.
    ``direct_full`` returns full tables as :class:`DeltaFilesElement` s (their files are
    read where the rows are needed) when that is safe, instead of reading them with Spark.
    """
    elements: list[BroadcastElement] = []
    for name in sorted(tables):
        path = tables[name]
        latest = (until or {}).get(name)
        if latest is None:
            latest = delta_io.latest_version(path, spark)
        if latest is None:
            continue
        prev = since.get(name)
        if prev is not None and prev >= latest:
            continue
        if prev is None:
            elements.append(_full(spark, name, path, latest, "no previous version: initial load",
                                  direct_full))
            continue
        try:
            elements.extend(_changes(spark, name, path, prev + 1, latest, fast_path))
        except CdfUnavailable as e:
            reason = f"CDF does not cover versions {prev + 1}..{latest}: {e}"
            elements.append(_full(spark, name, path, latest, reason, direct_full))
    return order_elements(elements)


def latest_versions(
    tables: Mapping[str, str], spark: SparkSession | None = None
) -> dict[str, int | None]:
    """Newest version of each broadcast table, read from the Delta logs (no Spark job)."""
    return {name: delta_io.latest_version(path, spark) for name, path in tables.items()}
