"""Delta table maintenance without Spark: compaction, VACUUM and a log checkpoint, with
``deltalake`` (delta-rs).

A micro-batch pipeline appends one small file per output table per batch (delta-rs
appends, :mod:`lakecast.delta.arrow_write`), its progress log two per batch: reads slow
down as files and JSON commits pile up. :func:`maintain` runs, on one table:

1. **OPTIMIZE** (``DeltaTable.optimize.compact``): small files rewritten into few large
   ones, in ONE commit whose ``add``/``remove`` actions say ``dataChange=false``: the
   rows do not change, and Change Data Feed readers (Spark's ``readChangeFeed``,
   :func:`lakecast.delta.log.read_changes_from_log`) see no rows for that commit;
2. **VACUUM** (``DeltaTable.vacuum``, delta-rs's *lite* mode): deletes the files named by
   ``remove`` actions older than the retention — never a file of a version in
   ``keep_versions`` (the versions a rewind can still restore), never a file the log does
   not name (a write in progress);
3. a **log checkpoint** (``create_checkpoint``) at the newest version: readers replay one
   Parquet file instead of every JSON commit.

VACUUM runs before the checkpoint because a checkpoint drops the ``remove`` actions older
than ``delta.deletedFileRetentionDuration``, and a lite VACUUM only deletes files it finds
in ``remove`` actions. Maintenance never deletes log files (time travel and rewinds read
the JSON commits): the writers' own post-commit hooks expire them after
``delta.logRetentionDuration`` (30 days unless set).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from lakecast.delta.log import DeltaIOError, file_sizes, latest_version
from lakecast.delta.objstore import options_for

#: VACUUM's default retention, Delta's safety default: ``delta.deletedFileRetentionDuration``
#: when a table does not set it (7 days)
DELTA_DEFAULT_RETENTION_HOURS = 168
RETENTION_PROPERTY = "delta.deletedFileRetentionDuration"
LOG_RETENTION_PROPERTY = "delta.logRetentionDuration"
_UNIT_HOURS = {"second": 1 / 3600, "minute": 1 / 60, "hour": 1.0, "day": 24.0, "week": 168.0}


class MaintenanceUnsupported(DeltaIOError):
    """delta-rs cannot rewrite this table (a table feature it does not support)."""


@dataclass(frozen=True)
class TableStats:
    """A table version's size: its active data files, from the log."""

    version: int
    files: int
    bytes: int


@dataclass(frozen=True)
class Retention:
    """The VACUUM retention of one table and why (:func:`vacuum_retention`)."""

    hours: int
    #: the floor: what the user configured, else the table's Delta default
    floor_hours: int
    #: what rewinds to retained checkpoints need (hours since their oldest version)
    needed_hours: int
    #: the user's retention was shorter than ``needed_hours`` and was raised to it
    clamped: bool
    #: delta-rs's check that ``hours`` >= the table's ``deletedFileRetentionDuration``
    enforce: bool
    reason: str


@dataclass(frozen=True)
class MaintenanceResult:
    """What :func:`maintain` did to one table."""

    path: str
    before: TableStats
    after: TableStats
    files_compacted: int  # small files OPTIMIZE rewrote (removed)
    files_written: int  # files OPTIMIZE wrote instead
    files_vacuumed: int
    retention: Retention
    kept_versions: tuple[int, ...]
    checkpoint_version: int
    seconds: dict[str, float]


def parse_interval_hours(text: str) -> float:
    """Hours of a Delta interval property (``"interval 7 days"``, ``"168 hours"``)."""
    m = re.fullmatch(r"\s*(?:interval\s+)?(\d+(?:\.\d+)?)\s*([a-z]+?)s?\s*", text.lower())
    if not m or m.group(2) not in _UNIT_HOURS:
        raise DeltaIOError(f"cannot read the Delta interval {text!r} (e.g. 'interval 7 days')")
    return float(m.group(1)) * _UNIT_HOURS[m.group(2)]


def table_properties(path: str) -> dict[str, str]:
    """The table's properties (its metadata's ``configuration``), read with delta-rs."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    try:
        table = DeltaTable(_uri(path), storage_options=options_for(path))
        return dict(table.metadata().configuration)
    except DeltaError as e:
        raise DeltaIOError(f"delta-rs cannot open the Delta table at {path}: {e}") from e


def default_retention_hours(properties: dict[str, str]) -> int:
    """The table's own VACUUM retention: ``delta.deletedFileRetentionDuration``, else 7 days."""
    text = properties.get(RETENTION_PROPERTY)
    if not text:
        return DELTA_DEFAULT_RETENTION_HOURS
    return math.ceil(parse_interval_hours(text))


def log_retention_hours(properties: dict[str, str]) -> int:
    """How long the table's JSON commits are kept: ``delta.logRetentionDuration``, else
    30 days (a rewind to an older version cannot read its commit)."""
    text = properties.get(LOG_RETENTION_PROPERTY)
    return math.ceil(parse_interval_hours(text)) if text else 30 * 24


def vacuum_retention(requested_hours: int | None, needed_hours: int, default_hours: int,
                     why_needed: str = "") -> Retention:
    """The retention VACUUM uses: ``requested_hours`` (the user's; ``None``: the table's
    ``default_hours``), raised to ``needed_hours`` when shorter — VACUUM must not delete a
    file of a version a rewind can restore (``why_needed`` says which)."""
    if requested_hours is not None and requested_hours < 0:
        raise DeltaIOError(f"VACUUM retention must be >= 0 hours, got {requested_hours}")
    floor = default_hours if requested_hours is None else requested_hours
    hours = max(floor, needed_hours)
    source = ("Delta's default (" + RETENTION_PROPERTY + ")" if requested_hours is None
              else "configured")
    clamped = requested_hours is not None and requested_hours < needed_hours
    need = f"rewinds need {needed_hours} h" + (f" ({why_needed})" if why_needed else "")
    if clamped:
        reason = (f"VACUUM retention {requested_hours} h is shorter than rewinds to the "
                  f"retained checkpoints need: raised to {hours} h ({why_needed or need}); "
                  f"to vacuum more, keep fewer checkpoints")
    else:
        reason = f"VACUUM retention {hours} h: {floor} h {source}, {need}"
    return Retention(hours, floor, needed_hours, clamped, requested_hours is None, reason)


def table_stats(path: str, version: int | None = None) -> TableStats:
    """Active data files and their bytes at ``version`` (default: the newest)."""
    v = latest_version(path) if version is None else version
    if v is None:
        raise DeltaIOError(f"{path} is not a Delta table")
    sizes = file_sizes(path, v)
    return TableStats(v, len(sizes), sum(sizes.values()))


def maintain(path: str, retention: Retention, keep_versions: Sequence[int] = (), *,
             target_size: int | None = None) -> MaintenanceResult:
    """OPTIMIZE, VACUUM (``retention``; never a file of ``keep_versions``), then a log
    checkpoint, on the local Delta table at ``path`` (see the module doc).

    Raises :class:`MaintenanceUnsupported` when delta-rs cannot rewrite the table."""
    from deltalake import DeltaTable, PostCommitHookProperties
    from deltalake.exceptions import DeltaError, DeltaProtocolError

    uri, opts = _uri(path), options_for(path)
    hooks = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
    keep = tuple(sorted(set(keep_versions)))
    before = table_stats(path)
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    try:
        metrics: dict[str, Any] = DeltaTable(uri, storage_options=opts).optimize.compact(
            target_size=target_size, post_commithook_properties=hooks)
        seconds["optimize"] = _lap(t)
        t = time.perf_counter()
        deleted = DeltaTable(uri, storage_options=opts).vacuum(
            retention_hours=retention.hours, dry_run=False,
            enforce_retention_duration=retention.enforce,
            keep_versions=list(keep) or None, post_commithook_properties=hooks)
        remove_sidecars(path, deleted)
        seconds["vacuum"] = _lap(t)
        t = time.perf_counter()
        table = DeltaTable(uri, storage_options=opts)
        table.create_checkpoint()
        seconds["checkpoint"] = _lap(t)
    except DeltaProtocolError as e:
        raise MaintenanceUnsupported(
            f"delta-rs cannot maintain the Delta table at {path}: {e}. Maintain it with "
            f"Spark SQL instead: OPTIMIZE delta.`{path}`; VACUUM delta.`{path}` RETAIN "
            f"{retention.hours} HOURS") from e
    except DeltaError as e:  # e.g. a concurrent commit, or a kept version's log is gone
        raise DeltaIOError(f"maintaining the Delta table at {path} failed: {e}") from e
    checkpoint_version = table.version()
    after = table_stats(path, checkpoint_version)
    return MaintenanceResult(
        path, before, after, int(metrics.get("numFilesRemoved", 0)),
        int(metrics.get("numFilesAdded", 0)), len(deleted), retention, keep,
        checkpoint_version, seconds)


def remove_sidecars(path: str, deleted: Sequence[str]) -> int:
    """Remove the Hadoop checksum files (``.<name>.crc``) of the data files VACUUM deleted,
    and the partition folders left empty (Spark writes both; delta-rs's VACUUM knows
    neither, so a table Spark writes would keep them all). Local tables only; returns how
    many checksum files were removed."""
    if "://" in _uri(path):
        return 0
    root = Path(_uri(path))
    removed, folders = 0, set()
    for name in deleted:
        f = root / unquote(name)
        crc = f.with_name(f".{f.name}.crc")
        if crc.exists():
            crc.unlink(missing_ok=True)
            removed += 1
        folders.add(f.parent)
    for folder in sorted(folders, key=lambda d: len(d.parts), reverse=True):
        while folder != root and root in folder.parents:
            try:
                folder.rmdir()  # only if empty: a folder with a live file stays
            except OSError:
                break
            folder = folder.parent
    return removed


def _lap(start: float) -> float:
    return round(time.perf_counter() - start, 3)


def _uri(path: str) -> str:
    return path.removeprefix("file://")
