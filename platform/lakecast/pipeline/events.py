"""A micro-batch's new events: the inserts of an append-only Delta table's version range.

The events table may be written by any Delta writer (Spark, ``deltalake``, ...), with or
without the Change Data Feed. A range whose commits only add data files (appends; also
OPTIMIZE and VACUUM, which rearrange files without changing rows) is read from its
Change Data Feed when the table records it over the whole range, else from the data
files those commits added (:func:`read_added_files`). A commit that deletes or rewrites
rows fails the batch with :class:`AppendOnlyError` (one line naming table, version and
the fix) before anything is read or written.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from lakecast.delta import io as delta_io
from lakecast.delta.files import delta_table, is_local, location
from lakecast.errors import LakecastError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakecast.pipeline.progress import BatchPlan

log = logging.getLogger(__name__)


class AppendOnlyError(LakecastError):
    """The events table was rewritten (deletes/updates) inside a batch's range."""


@dataclass
class RangeCommits:
    """What the commits of an events range hold: the data files each version added (its
    ``add`` actions with ``dataChange`` true), the versions that removed files without changing
    rows (OPTIMIZE), whether every commit keeps the Change Data Feed on, and the rows
    added according to the log's statistics (``None``: a file has none)."""

    adds: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    removes: set[int] = field(default_factory=set)
    cdf: bool = True
    rows: int | None = 0


def _cdf_on(configuration: dict[str, Any] | None) -> bool:
    return str((configuration or {}).get(delta_io.CDF_PROPERTY, "false")).lower() == "true"


def range_commits(spark: SparkSession, path: str, table: str, start: int, end: int
                  ) -> RangeCommits:
    """One pass over the commits ``start..end`` of the events table ``table``; raises
    :class:`AppendOnlyError` at the first that deletes or updates rows."""
    out = RangeCommits(cdf=_cdf_on(delta_table(path, start - 1).metadata().configuration))
    for version in range(start, end + 1):
        for action in delta_io.commit_actions(path, version, spark):
            remove = action.get("remove")
            if "cdc" in action or (remove is not None and remove.get("dataChange", True)):
                op = next((a["commitInfo"].get("operation") for a in
                           delta_io.commit_actions(path, version, spark) if "commitInfo" in a),
                          None)
                raise AppendOnlyError(
                    f"events table {table} version {version}"
                    f"{f' ({op})' if op else ''} deletes or updates rows; a micro-batch "
                    f"reads only appended events (reprocessing rewritten events would "
                    f"duplicate output). Reset the pipeline's outputs and progress log, or "
                    f"append instead of overwriting, deleting or merging.")
            if remove is not None:
                out.removes.add(version)
            if "metaData" in action:
                out.cdf = out.cdf and _cdf_on(action["metaData"].get("configuration"))
            add = action.get("add")
            if add is not None and add.get("dataChange", True):
                out.adds.setdefault(version, []).append(add)
                if out.rows is not None:
                    n = json.loads(add.get("stats") or "{}").get("numRecords")
                    out.rows = None if n is None else out.rows + int(n)
    return out


def _groups(commits: RangeCommits) -> list[tuple[int, list[dict[str, Any]]]]:
    """``(read version, add actions)`` per run of consecutive versions in which no later
    version removes a file: a group's files are all present at its last version."""
    groups: list[tuple[int, list[dict[str, Any]]]] = []
    current: list[dict[str, Any]] = []
    last = -1
    for version in sorted(commits.adds):
        if current and any(last < v <= version for v in commits.removes):
            groups.append((last, current))
            current = []
        current = current + commits.adds[version]
        last = version
    if current:
        groups.append((last, current))
    return groups


def _check_present(path: str, table: str, version: int, adds: list[dict[str, Any]]) -> None:
    """A local data file the range added that is gone (compacted away, then vacuumed):
    say so clearly, before Spark fails on it inside a job (object stores: not checked)."""
    if not is_local(path):
        return
    root = Path(location(path)[0])
    gone = [unquote(a["path"]) for a in adds
            if "://" not in a["path"] and not (root / unquote(a["path"])).exists()]
    if gone:
        raise AppendOnlyError(
            f"events table {table}: {len(gone)} data file(s) added by version <= {version} "
            f"(e.g. {gone[0]}) were compacted and vacuumed before the pipeline read "
            f"them; their events cannot be told apart from older ones. Reset the pipeline's "
            f"outputs and progress log, or vacuum with a retention longer than the "
            f"pipeline's lag.")


#: partition column types whose ``partitionValues`` strings cast back exactly in Spark
_PRUNABLE = ("string", "tinyint", "smallint", "int", "bigint", "date", "boolean")


def _partition_filter(frame: DataFrame, adds: list[dict[str, Any]]) -> Any:
    """A filter on the partition columns that keeps the partitions of ``adds`` (Delta
    skips the other partitions' files), or ``None`` (not partitioned, or a type whose
    values do not cast back exactly)."""
    from functools import reduce

    from pyspark.sql import functions as F

    keys = sorted({k for a in adds for k in (a.get("partitionValues") or {})})
    types = dict(frame.dtypes)
    if not keys or any(types.get(k) not in _PRUNABLE for k in keys):
        return None
    values = {tuple((a.get("partitionValues") or {}).get(k) for k in keys) for a in adds}
    if len(values) > 64:
        return None
    terms = [reduce(lambda x, y: x & y, [
        F.col(k).isNull() if v is None else F.col(k) == F.lit(v).cast(types[k])
        for k, v in zip(keys, tup, strict=True)]) for tup in sorted(values, key=repr)]
    return reduce(lambda x, y: x | y, terms)


def read_added_files(spark: SparkSession, path: str, table: str, commits: RangeCommits,
                     end: int) -> DataFrame:
    """The rows of the data files the range added, read through Delta (column mapping,
    partition values, schema evolution as Delta resolves them) without the Change Data
    Feed: per group of versions (:func:`_groups`), the table at the group's last version
    restricted to the files by ``_metadata.file_name`` (and to their partitions, so Delta
    skips the others' files); the groups are unioned in the newest group's columns
    (no file added: no rows, in the columns of version ``end``)."""
    from pyspark.sql import functions as F

    frames = []
    groups = _groups(commits)
    for version, adds in groups:
        _check_present(path, table, version, adds)
        names = sorted({unquote(a["path"].rsplit("/", 1)[-1]) for a in adds})
        frame = delta_io.read(spark, path, version=version)
        pruned = _partition_filter(frame, adds)
        if pruned is not None:
            frame = frame.where(pruned)
        frames.append(frame.where(F.col("_metadata.file_name").isin(names)))
    if not frames:  # nothing added (e.g. only an OPTIMIZE): no rows, the newest columns
        return delta_io.read(spark, path, version=end).limit(0)
    out = frames[-1]
    columns = out.columns
    for frame in reversed(frames[:-1]):
        out = frame.unionByName(out, allowMissingColumns=True)
    return out.select(*columns)


def read_new_events(spark: SparkSession, path: str, table: str, plan: BatchPlan
                    ) -> tuple[DataFrame, int | None]:
    """The plan's new events in the table ``table`` at ``path``, and how many rows the
    Delta log says they are (the ``numRecords`` statistics of the range's ``add`` actions,
    read without Spark; ``None`` when a file has none). That count is independent of the
    read, so the batch reconciles against it. One pass over the range's commits also
    checks that it only appends (else :class:`AppendOnlyError`). The rows come from the
    Change Data Feed when the table records it over the range, else from the data files
    the range added (:func:`read_added_files`)."""
    from pyspark.sql import functions as F

    if plan.events_start < 0:
        return (delta_io.read(spark, path, version=plan.events_end),
                delta_io.row_count(path, plan.events_end))
    start, end = plan.events_start + 1, plan.events_end
    commits = range_commits(spark, path, table, start, end)
    if not commits.cdf:
        log.debug("events %s v%d..v%d: read from the added files (no Change Data Feed)",
                  table, start, end)
        return read_added_files(spark, path, table, commits, end), commits.rows
    changes = delta_io.read_changes(spark, path, start, end)
    return changes.filter(F.col("_change_type") == "insert").drop(
        "_change_type", "_commit_version", "_commit_timestamp"
    ), commits.rows


def rejected_rows(rejected: DataFrame, plan: BatchPlan, reason: str) -> DataFrame:
    """Rejected events (``reason``: the column saying why) as (reason, raw_record JSON,
    batch_id)."""
    from pyspark.sql import functions as F

    return rejected.select(
        F.col(reason).alias("reason"),
        F.to_json(F.struct(*[c for c in rejected.columns if c != reason])).alias("raw_record"),
        F.lit(plan.batch_id).alias("batch_id"),
    )
