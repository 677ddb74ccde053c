"""Delta logs read without Spark, through ``deltalake`` (delta-rs): versions, commit info,
``txn`` versions, the Change Data Feed of a version range, a commit's actions; the active
files of a version are in :mod:`lakecast.delta.files` (re-exported here).

Nothing here lists or replays ``_delta_log`` by hand: one ``DeltaTable`` handle per table and
process is kept and brought up to date with ``update_incremental()`` (it reads only the
commits after the version it holds) when a reader needs its snapshot. On a local
filesystem, where that call lists the whole log folder, :func:`latest_version` does not
call it: a Delta commit file appears atomically and versions have no gaps, so it
``stat`` s the files a new commit would create (``<v+1>.json``, ``<v+2>.json``, ...) and
the handle catches up later, lazily; a poll's cost does not grow with the log. The one
exception is :func:`commit_actions`, which reads the one commit file it is asked for
(``deltalake`` exposes no commit's actions). Paths may be local or object-store URIs:
``s3a://`` is read as ``s3://`` with the storage options of
:func:`lakecast.delta.objstore.storage_options`. The :mod:`lakecast.delta.io` facade
re-exports what callers use.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakecast.delta import objstore
from lakecast.delta.files import (
    DeltaIOError,
    DirectReadUnsupported,
    TableFiles,
    arrow_schema,
    conform,
    delta_table,
    file_sizes,
    is_local,
    location,
    read_error,
    row_count,
    table_files,
    verify_checksum,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import SparkSession

__all__ = ["CDF_PROPERTY", "CommitInfo", "DeltaIOError", "DirectReadUnsupported",
           "TableFiles", "TableIdentity", "commit_actions", "commit_info", "commit_infos",
           "commit_seconds",
           "file_sizes", "latest_version", "read_changes_from_log", "row_count",
           "table_exists", "table_files", "table_identity", "txn_versions", "verify_checksum",
           "write_handle"]

log = logging.getLogger(__name__)

CDF_PROPERTY = "delta.enableChangeDataFeed"
#: commit-info entries cached per table handle (commits never change once written)
_INFO_CACHE = 4096


@dataclass
class _Handle:
    """A table's ``DeltaTable`` at its newest version, and what was read through it."""

    table: DeltaTable
    stamp: tuple[int, int] | None  # (inode, mtime_ns) of its version's commit file (local)
    lock: threading.Lock = field(default_factory=threading.Lock)
    infos: dict[int, CommitInfo] = field(default_factory=dict)
    #: newest version seen by probing commit files (local; >= the table's version): the
    #: table itself is updated only when a reader needs the snapshot
    seen: int = -1


_HANDLES: dict[str, _Handle] = {}
_MISSING = (-1, -1)  # the stamp of a commit file that is not there
_HANDLES_LOCK = threading.Lock()
_PID = [os.getpid()]


def _commit_stamp(path: str, version: int) -> tuple[int, int] | None:
    """Identity of a local table's newest commit file: a table deleted or written anew
    at the same path changes it (one ``stat``; object stores: ``None``)."""
    if not is_local(path):
        return None
    try:
        st = (Path(location(path)[0]) / "_delta_log" / f"{version:020d}.json").stat()
    except OSError:
        return _MISSING
    return st.st_ino, st.st_mtime_ns


def _commit_file(path: str, version: int) -> Path:
    return Path(location(path)[0]) / "_delta_log" / f"{version:020d}.json"


def _probe(path: str, version: int) -> int:
    """The newest version of a local table known to be at least ``version``: ``stat`` s
    of ``<version+1>.json``, ``<version+2>.json``, ... until one is missing (a commit file
    appears atomically and versions have no gaps; ``update_incremental`` would list the
    whole ``_delta_log`` folder on a local filesystem instead)."""
    while _commit_file(path, version + 1).exists():
        version += 1
    return version


def _handle(path: str, fresh: bool = True) -> tuple[_Handle, int] | None:
    """The handle of the table at ``path`` and its newest version (``None``: no table
    there). ``fresh``: the handle's ``DeltaTable`` is brought to that version (a reader
    needs the snapshot); else a local table's version comes from probing commit files and
    the ``DeltaTable`` is left behind. A local handle whose commit file of its version
    changed identity (the table was deleted or written anew) is replaced."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError, TableNotFoundError

    with _HANDLES_LOCK:
        if _PID[0] != os.getpid():  # a forked child: the parent's handles are not its own
            _HANDLES.clear()
            _PID[0] = os.getpid()
        h = _HANDLES.get(path)
    if h is not None:
        with h.lock:  # a DeltaTable is not used from two threads at once
            version = h.table.version()
            if _commit_stamp(path, version) == h.stamp != _MISSING:  # the same table
                if h.stamp is not None:  # local: probe the next commit files
                    h.seen = _probe(path, max(h.seen, version))
                    if h.seen == version or not fresh:
                        return h, h.seen  # stats only, no listing
                try:
                    h.table.update_incremental()  # reads the commits after ``version``
                    version = h.table.version()
                    h.stamp = _commit_stamp(path, version)
                    h.seen = max(h.seen, version)
                    return h, version
                except (DeltaError, OSError):
                    pass  # e.g. the log was cut: load it anew
    uri, options = location(path)
    try:
        dt = DeltaTable(uri, storage_options=options)
    except TableNotFoundError:
        with _HANDLES_LOCK:
            _HANDLES.pop(path, None)
        return None
    except (DeltaError, OSError) as e:
        raise read_error(path, e) from e
    version = dt.version()
    h = _Handle(dt, _commit_stamp(path, version), seen=version)
    with _HANDLES_LOCK:
        _HANDLES[path] = h
    return h, version


def forget(path: str | None = None) -> None:
    """Drop the cached handle of ``path`` (default: all of them)."""
    with _HANDLES_LOCK:
        if path is None:
            _HANDLES.clear()
        else:
            _HANDLES.pop(path, None)


@contextmanager
def write_handle(path: str) -> Iterator[DeltaTable | None]:
    """The table's cached ``DeltaTable``, brought to its newest version, held for one write
    (``None``: no table at ``path``). A ``deltalake`` write through it leaves it at the
    version it commits, so the next write reads no log again; a writer that loads the
    table anew per write replays every JSON commit since the last log checkpoint."""
    found = _handle(path, fresh=True)
    if found is None:
        yield None
        return
    h = found[0]
    with h.lock:
        yield h.table
        version = h.table.version()
        h.stamp, h.seen = _commit_stamp(path, version), max(h.seen, version)


@dataclass(frozen=True)
class TableIdentity:
    """Who a table is at its newest version: its metadata id (a table deleted and created
    anew at the same path gets a new one) and whether it records its Change Data Feed."""

    id: str
    version: int
    cdf: bool


def table_identity(path: str) -> TableIdentity | None:
    """The :class:`TableIdentity` of the table at ``path`` at its newest version (``None``:
    no table there), from the cached handle."""
    from deltalake.exceptions import DeltaError

    found = _handle(path, fresh=True)
    if found is None:
        return None
    h = found[0]
    with h.lock:
        try:
            meta = h.table.metadata()
        except (DeltaError, OSError) as e:
            raise read_error(path, e) from e
        cdf = str(meta.configuration.get(CDF_PROPERTY, "false")).lower() == "true"
        return TableIdentity(str(meta.id), int(h.table.version()), cdf)


def table_exists(path: str, spark: SparkSession | None = None) -> bool:
    """Whether ``path`` holds a Delta table (at least one commit)."""
    return latest_version(path, spark) is not None


def latest_version(path: str, spark: SparkSession | None = None) -> int | None:
    """Newest committed version of the table at ``path``, or ``None`` if there is none.
    Local tables: ``stat`` s of the commit files after the version seen last; object
    stores: the commits after it, read by ``deltalake`` (``spark`` is not used)."""
    found = _handle(path, fresh=False)
    return None if found is None else int(found[1])


@dataclass(frozen=True)
class CommitInfo:
    """What one Delta commit says about itself."""

    version: int
    timestamp_ms: int
    operation: str
    metrics: dict[str, str]
    parameters: dict[str, Any] = field(default_factory=dict)
    user_metadata: str | None = None


def _info(version: int, ci: dict[str, Any]) -> CommitInfo:
    ts = ci.get("inCommitTimestamp", ci.get("timestamp", 0))
    metrics = {k: str(v) for k, v in (ci.get("operationMetrics") or {}).items()}
    meta = ci.get("userMetadata")
    return CommitInfo(version, int(ts), str(ci.get("operation", "")), metrics,
                      dict(ci.get("operationParameters") or {}),
                      None if meta is None else str(meta))


def commit_infos(path: str, start: int, end: int) -> dict[int, CommitInfo]:
    """``{version: CommitInfo}`` of versions ``start..end``, from ``deltalake``'s history
    (it reads the commits from the newest down to ``start``; cached per table)."""
    from deltalake.exceptions import DeltaError

    found = _handle(path)
    if found is None:
        raise DeltaIOError(f"{path} is not a Delta table")
    h = found[0]
    with h.lock:
        want = range(max(start, 0), end + 1)
        if all(v in h.infos for v in want):
            return {v: h.infos[v] for v in want}
        latest = h.table.version()
        if start < 0 or end > latest:
            raise DeltaIOError(f"{path} has no commit for versions {start}..{end} "
                               f"(newest: {latest})")
        n = latest - start + 1
        try:
            entries = h.table.history(n)
        except (DeltaError, OSError) as e:
            raise read_error(path, e) from e
        if len(entries) < n:
            raise DeltaIOError(f"{path}: the log no longer holds versions {start}..{end}")
        # newest first, ending at ``start``: the k-th from the end is ``start + k`` (this
        # holds even when a commit lands meanwhile and the list starts above ``latest``)
        if len(h.infos) > _INFO_CACHE:
            h.infos.clear()
        for k in range(n):
            h.infos[start + k] = _info(start + k, entries[len(entries) - 1 - k])
        return {v: h.infos[v] for v in want}


def commit_info(path: str, version: int, spark: SparkSession | None = None) -> CommitInfo:
    """The commit's timestamp (in-commit timestamp when enabled), operation and metrics."""
    return commit_infos(path, version, version)[version]


def commit_seconds(path: str, version: int, spark: SparkSession | None = None) -> float | None:
    """Commit time of ``path@version`` in epoch seconds (``None``: no such version)."""
    if version < 0:
        return None
    try:
        return commit_info(path, version, spark).timestamp_ms / 1000.0
    except DeltaIOError:
        return None


def commit_actions(path: str, version: int, spark: SparkSession | None = None
                   ) -> list[dict[str, Any]]:
    """The actions (``add``, ``remove``, ``txn``, ``commitInfo``, ...) of one commit.

    ``deltalake`` exposes no single commit's actions, so this reads the one commit file
    it names (no listing, no replay: its cost does not depend on the log's length)."""
    try:
        if is_local(path):
            text = (Path(location(path)[0]) / "_delta_log" / f"{version:020d}.json"
                    ).read_text()
        else:
            text = objstore.read_log_file(path, f"{version:020d}.json")
    except FileNotFoundError as e:
        raise DeltaIOError(f"{path} has no commit file for version {version}") from e
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def txn_versions(path: str, app_id: str, spark: SparkSession | None = None) -> dict[int, int]:
    """``{txnVersion: Delta version}`` of the commits that carry a ``txn`` action of
    ``app_id`` (the idempotent writes of :func:`lakecast.delta.io.write` with ``txn=``).

    From ``deltalake``'s ``transaction_version`` of table versions, bisected: an app's
    ``txnVersion`` only grows (Delta skips a write whose version is not newer), so a
    range whose two ends agree holds no ``txn`` of it. Costs about
    ``#txns * log2(versions / #txns)`` snapshot loads."""
    from deltalake.exceptions import DeltaError

    latest = latest_version(path, spark)
    if latest is None:
        return {}
    dt = delta_table(path)

    @cache
    def at(v: int) -> int:
        if v < 0:
            return -1
        try:
            dt.load_as_version(v)
        except (DeltaError, OSError):  # cleaned from the log: nothing known before
            return -1
        found = dt.transaction_version(app_id)
        return -1 if found is None else int(found)

    out: dict[int, int] = {}
    stack = [(-1, latest)]
    while stack:
        lo, hi = stack.pop()
        if at(lo) == at(hi):
            continue
        if hi == lo + 1:
            out[at(hi)] = hi
            continue
        mid = (lo + hi) // 2
        stack += [(lo, mid), (mid, hi)]
    return out


#: operations whose changes the ``deltalake`` CDF reader gives exactly like Spark's;
#: any other (schema or property changes, overwrites, restores...) goes to Spark's reader
_NO_DATA_CHANGE = {"OPTIMIZE", "VACUUM START", "VACUUM END"}  # files rearranged: no rows
_CDF_OPERATIONS = {"WRITE", "STREAMING UPDATE", "MERGE", "DELETE", "UPDATE", *_NO_DATA_CHANGE}
_INSERT_ONLY = {"WRITE", "STREAMING UPDATE", *_NO_DATA_CHANGE}  # readable without the CDF


def _cdf_plan(path: str, start: int, end: int) -> str | None:
    """``None`` if ``deltalake`` can read the CDF of ``start..end`` as Spark would, else
    the reason it cannot."""
    try:
        infos = commit_infos(path, start, end)
    except DeltaIOError as e:
        return f"commit info: {e}"
    for v, info in infos.items():
        if info.operation not in _CDF_OPERATIONS:
            return f"version {v} is a {info.operation}"
        if str(info.parameters.get("mode", "Append")).lower() != "append":
            return f"version {v} is a {info.operation} in mode {info.parameters['mode']}"
    return None


def read_changes_from_log(
    path: str, start_version: int, end_version: int
) -> dict[int, pa.Table] | None:
    """The Change Data Feed of versions ``start..end`` read without Spark
    (``deltalake``'s ``load_cdf``), one Arrow table per version with a ``_change_type``
    column (pre-images included, no ``_commit_*`` columns), in the Arrow types of Spark's
    ``toArrow()``.

    Returns ``None`` when a version needs Spark's reader (:func:`read_changes`): schema
    or property changes, overwrites, rewrites of a table without the Change Data Feed,
    deletion vectors, change files missing, types that do not convert.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake.exceptions import DeltaError

    why = _cdf_plan(path, start_version, end_version)
    if why is None:
        try:
            dt = delta_table(path, end_version)
            conf = dt.metadata().configuration
            cdf = conf.get(CDF_PROPERTY, "false").lower() == "true"
            features = set(dt.protocol().reader_features or [])
            if "deletionVectors" in features:
                why = "deletion vectors"
            elif not cdf and any(commit_info(path, v).operation not in _INSERT_ONLY
                                 for v in range(start_version, end_version + 1)):
                why = "rows rewritten without the Change Data Feed"
            else:
                schema = arrow_schema(json.dumps(json.loads(dt.schema().to_json())))
                rows = pa.table(dt.load_cdf(starting_version=start_version,
                                            ending_version=end_version))
        except (DeltaError, DeltaIOError, OSError, ValueError, pa.ArrowException) as e:
            why = f"deltalake cannot read it: {e}"
    if why is not None:
        _fallback(path, f"CDF of versions {start_version}..{end_version}: {why}")
        return None
    want = pa.schema([*schema, pa.field("_change_type", pa.string())])
    versions = rows.column("_commit_version").cast(pa.int64())
    rows = rows.drop_columns(["_commit_version", "_commit_timestamp"])
    try:
        rows = conform(rows.cast(pa.schema([(f.name, _plain(f.type)) for f in rows.schema])),
                       want)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        _fallback(path, f"CDF types do not convert: {e}")
        return None
    return {v: rows.filter(pc.equal(versions, v)) for v in range(start_version, end_version + 1)}


_FELL_BACK: set[str] = set()


def _fallback(path: str, why: str) -> None:
    """Log that Spark reads ``path``'s changes: INFO the first time for a table, then
    DEBUG (a fallback is never silent, and not repeated every poll)."""
    level = logging.DEBUG if path in _FELL_BACK else logging.INFO
    _FELL_BACK.add(path)
    log.log(level, "Delta changes of %s read by Spark: %s", path, why)


def _plain(t: pa.DataType) -> pa.DataType:
    """``t`` with string/binary views as plain strings/binaries (what ``cast`` to Spark's
    types takes)."""
    import pyarrow as pa

    if t == pa.string_view():
        return pa.string()
    if t == pa.binary_view():
        return pa.binary()
    return t
