"""The broadcast source: Delta table versions as an ordered stream of broadcast elements.

Given broadcast tables ``{name: path}`` and the last applied version of each,
:func:`read_broadcast_elements` returns one :class:`BroadcastElement` per new table
version, built from the Change Data Feed (inserts, update post-images, deletes — so a
version that touched 1% of the rows travels as 1% of the rows). When there is no
previous version, it returns one ``full`` element with the table as of the newest version.
Only known conditions replace the changes by such a full *reload* (logged at WARNING, the
reason in the element's ``meta["full_reload"]``): the CDF was not recorded for the range,
its files or the log were cleaned, the table was recreated or its schema changed
incompatibly (:data:`KNOWN_CDF_GAPS`), or the caller's ``reload_if`` says the changes
cannot be applied (a refused version lies in the range, :mod:`lakecast.delta.validation`).
Any other error of the CDF reader fails with its cause. A table that records no CDF at
all (written by ``deltalake`` or a Spark session without ``delta.enableChangeDataFeed``)
has its appends read from the log as inserts and its rewrites (overwrite, MERGE, DELETE,
UPDATE) applied as reloads, logged at INFO once per table: that is expected, not a gap.

Order is total and deterministic: commit order within a table; across tables by commit
timestamp, then table name (a table's timestamps are made non-decreasing first, so
commit order always wins). All reads go through :mod:`lakecast.delta.io`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
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
    """The Change Data Feed cannot serve a version range. ``expected``: the table does not
    record it at all (a writer such as ``deltalake`` or a Spark session without
    ``delta.enableChangeDataFeed``), so a full reload is the normal way to apply a rewrite."""

    def __init__(self, message: str, expected: bool = False) -> None:
        super().__init__(message)
        self.expected = expected


#: ``{path: {version: metadata id}}`` of the versions this process read elements at: a
#: table deleted and created anew at the same path has another id (see
#: :func:`read_broadcast_elements`)
_SEEN_IDS: dict[str, dict[int, str]] = {}
_SEEN_MAX = 256
#: tables whose reloads for lack of a Change Data Feed were logged (INFO once, then DEBUG)
_NO_CDF_LOGGED: set[str] = set()


def _remember(path: str, version: int, ident: delta_io.TableIdentity | None) -> None:
    """Record the table's metadata id for ``version`` (bounded per table)."""
    if ident is None:
        return
    seen = _SEEN_IDS.setdefault(path, {})
    seen[version] = ident.id
    while len(seen) > _SEEN_MAX:
        del seen[next(iter(seen))]


def _recreated(path: str, prev: int, latest: int, ident: delta_io.TableIdentity | None
               ) -> str | None:
    """Why the table at ``path`` is not the one whose version ``prev`` was applied (it was
    deleted and created anew: its versions restarted), or ``None``."""
    if prev > latest:
        return (f"the table was recreated: its newest version v{latest} is older than the "
                f"applied v{prev} (its versions restarted)")
    known = _SEEN_IDS.get(path, {}).get(prev)
    if known is not None and ident is not None and known != ident.id:
        return (f"the table was recreated: its metadata id is {ident.id}, the applied v{prev} "
                f"was read from table {known}")
    return None


#: error conditions of Spark's CDF reader that mean "the feed cannot serve this range" (a
#: full reload is then correct); any other error is a fault and fails the read
KNOWN_CDF_GAPS: dict[str, str] = {
    "DELTA_MISSING_CHANGE_DATA": "the change data feed was not recorded for the range",
    "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE":
        "the table's schema changed incompatibly in the range (overwritten or recreated)",
    "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_DATA_SCHEMA":
        "the table's data schema changed incompatibly in the range (overwritten or recreated)",
    "DELTA_CDC_START_VERSION_AFTER_LATEST": "the table was recreated (its versions restarted)",
    "DELTA_INVALID_CDC_RANGE": "the table was recreated (its versions restarted)",
    "DELTA_VERSION_NOT_FOUND": "the log of the range was cleaned",
    "DELTA_VERSIONS_NOT_CONTIGUOUS": "the log of the range was cleaned",
    "DELTA_LOG_FILE_NOT_FOUND": "the log of the range was cleaned",
    "FAILED_READ_FILE.FILE_NOT_EXIST": "change files of the range were vacuumed",
    "DELTA_FILE_NOT_FOUND": "change files of the range were vacuumed",
    "DELTA_FILE_OR_DIR_NOT_FOUND": "change files of the range were vacuumed",
    "DELTA_CHANGE_DATA_FILE_NOT_FOUND": "change files of the range were vacuumed",
}


#: operations that only add rows or rearrange files: readable from the log without a
#: Change Data Feed (:func:`lakecast.delta.io.read_changes_from_log`)
_APPEND_ONLY = {"WRITE", "STREAMING UPDATE", "OPTIMIZE", "VACUUM START", "VACUUM END"}


def known_cdf_gap(error: BaseException) -> str | None:
    """Why ``error`` (raised by Spark's CDF reader) is a known gap of the feed, or ``None``
    when it is not (a fault: transient storage error, OOM, bug)."""
    condition = ""
    for getter in ("getCondition", "getErrorClass"):
        fn = getattr(error, getter, None)
        if callable(fn):
            try:
                condition = fn() or ""
            except Exception:  # older/other exception types
                condition = ""
            if condition:
                break
    text = str(error)
    for name, why in KNOWN_CDF_GAPS.items():
        if condition == name or condition.startswith(name + ".") or f"[{name}]" in text \
                or f"[{name}." in text:
            return f"{why} ({name})"
    if "java.io.FileNotFoundException" in text:
        return "change files of the range were vacuumed (FileNotFoundException)"
    return None



def _full(spark: SparkSession, name: str, path: str, version: int, reason: str,
          direct: bool = True, reload: bool = False, expected: bool = False
          ) -> BroadcastElement:
    """The whole table at ``version``: as its file list (read where the rows are needed,
    :class:`DeltaFilesElement`) when that is safe, else read by Spark now (and the reason
    says why). ``reload``: it replaces changes that cannot be applied (WARNING, and
    ``meta["full_reload"]`` holds the reason); ``expected``: the table records no Change
    Data Feed, so reloads are its normal way of applying rewrites (INFO the first time for
    the table, then DEBUG)."""
    info = delta_io.commit_info(path, version, spark)
    meta = {"full_reload": reason} if reload else {}
    if reload and expected:
        level = logging.DEBUG if path in _NO_CDF_LOGGED else logging.INFO
        _NO_CDF_LOGGED.add(path)
        log.log(level, "broadcast %s@v%d: full reload instead of changes (the table records "
                "no Change Data Feed; logged once per table): %s", name, version, reason)
    elif reload:
        log.warning("broadcast %s@v%d: full reload instead of changes: %s", name, version,
                    reason)
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
                                     operation=info.operation, meta=meta, files=files)
    rows = delta_io.read(spark, path, version=version).toArrow()
    log.info("broadcast %s@v%d: full (%d rows): %s", name, version, rows.num_rows, reason)
    return BroadcastElement(
        name, version, info.timestamp_ms, "full", rows, reason=reason, operation=info.operation,
        meta=meta,
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
    """Per-version changes from Spark's Change Data Feed reader. A known gap of the feed
    (:func:`known_cdf_gap`) raises :class:`CdfUnavailable`; any other error propagates."""
    try:
        frame = delta_io.read_changes(spark, path, start, end).where(
            f"{CHANGE_TYPE} != 'update_preimage'"
        )
        rows = frame.drop("_commit_timestamp").toArrow()
    except Exception as e:  # AnalysisException, Py4JJavaError, ...: only known gaps fall back
        why = known_cdf_gap(e)
        if why is None:
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CdfUnavailable(f"{why}: {first[:400]}") from e
    versions = rows.column("_commit_version")
    rows = rows.drop_columns(["_commit_version"])
    return {v: rows.filter(pc.equal(versions, v)) for v in range(start, end + 1)}


def _changes(
    spark: SparkSession, name: str, path: str, start: int, end: int, fast_path: bool = True,
    cdf: bool = True,
) -> list[BroadcastElement]:
    """One ``changes`` element per version ``start..end``. ``cdf``: whether the table
    records its Change Data Feed (else a range that rewrites rows raises
    :class:`CdfUnavailable` without running Spark's reader, which would fail)."""
    try:
        infos = list(delta_io.commit_infos(path, start, end).values())
    except delta_io.DeltaIOError as e:
        raise CdfUnavailable(f"log cleaned: {e}") from e
    parts = _changes_from_log(path, start, end) if fast_path or not cdf else None
    if parts is None and not cdf:
        rewrite = next((i for i in infos if i.operation not in _APPEND_ONLY or str(
            i.parameters.get("mode", "Append")).lower() != "append"), None)
        what = (f"version {rewrite.version} is a {rewrite.operation}" if rewrite is not None
                else "its appends cannot be read from the log")
        raise CdfUnavailable(f"{KNOWN_CDF_GAPS['DELTA_MISSING_CHANGE_DATA']} "
                             f"({delta_io.CDF_PROPERTY} is not set) and {what}", expected=True)
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
    reload_if: Callable[[str, int, int], str | None] | None = None,
) -> list[BroadcastElement]:
    """The ordered broadcast elements of ``tables`` after the versions in ``since``.

    ``since[name]`` is the last applied version (missing/``None``: nothing applied yet).
    ``until[name]`` caps the version read; ``until=None``: every table at its newest
    version; given, a table absent from it is skipped (absent at plan time stays absent).
    Tables that do not exist yet are skipped. A table deleted and created anew at its path
    is reloaded whole (its versions restarted: detected when its newest version is older
    than ``since``, or when this process read ``since`` from a table with another
    metadata id). ``reload_if(name, since, until)``: a reason
    to reload the table whole at ``until`` instead of reading its changes (``None``: read
    them). ``fast_path`` reads simple commits' change files directly
    (:func:`lakecast.delta.io.read_changes_from_log`) instead of running a Spark job.
    ``direct_full`` returns full tables as :class:`DeltaFilesElement` s (their files are
    read where the rows are needed) when that is safe, instead of reading them with Spark.
    """
    elements: list[BroadcastElement] = []
    for name in sorted(tables):
        path = tables[name]
        if until is not None:
            if name not in until:
                continue
            latest = until[name]
        else:
            latest = delta_io.latest_version(path, spark)
        if latest is None:
            continue
        prev = since.get(name)
        ident = delta_io.table_identity(path)
        if prev is None:
            elements.append(_full(spark, name, path, latest, "no previous version: initial load",
                                  direct_full))
            _remember(path, latest, ident)
            continue
        why = _recreated(path, prev, latest, ident)
        if why is None and prev >= latest:
            continue
        if why is None and reload_if is not None:
            why = reload_if(name, prev, latest)
        if why:
            elements.append(_full(spark, name, path, latest, why, direct_full, reload=True))
            _remember(path, latest, ident)
            continue
        cdf = ident is None or ident.cdf
        try:
            elements.extend(_changes(spark, name, path, prev + 1, latest, fast_path, cdf))
        except CdfUnavailable as e:
            reason = f"CDF does not cover versions {prev + 1}..{latest}: {e}"
            elements.append(_full(spark, name, path, latest, reason, direct_full, reload=True,
                                  expected=e.expected))
        _remember(path, latest, ident)
    return order_elements(elements)


def latest_versions(
    tables: Mapping[str, str], spark: SparkSession | None = None
) -> dict[str, int | None]:
    """Newest version of each broadcast table, read from the Delta logs (no Spark job)."""
    return {name: delta_io.latest_version(path, spark) for name, path in tables.items()}
