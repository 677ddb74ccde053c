"""A micro-batch's new events: the inserts of an append-only Delta table's version range.

The events table may be written by any Delta writer (Spark, ``deltalake``, ...), with or
without the Change Data Feed. A range whose commits only add data files (appends; also
OPTIMIZE and VACUUM, which rearrange files without changing rows) is read from its
Change Data Feed when the table records it over the whole range, else from the data
files those commits added (:func:`read_added_files`; small additions are read from their
Parquet files on the driver, without a Spark scan of the table). A commit that deletes or
rewrites rows fails the batch with :class:`AppendOnlyError` (one line naming table,
version and the fix) before anything is read or written, unless the pipeline says
``events_rewrites="skip"``: such a commit is then skipped whole, as Delta's streaming
source does with ``skipChangeCommits`` (its rows are not read; outputs are not retracted;
a WARNING names each one).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from lakecast.delta import io as delta_io
from lakecast.delta.files import delta_table, is_local, location
from lakecast.errors import LakecastError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

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
    #: commits that delete or update rows, skipped (``events_rewrites="skip"``): version ->
    #: operation
    skipped: dict[int, str] = field(default_factory=dict)


def _cdf_on(configuration: dict[str, Any] | None) -> bool:
    return str((configuration or {}).get(delta_io.CDF_PROPERTY, "false")).lower() == "true"


def range_commits(spark: SparkSession, path: str, table: str, start: int, end: int,
                  skip_rewrites: bool = False) -> RangeCommits:
    """One pass over the commits ``start..end`` of the events table ``table``; raises
    :class:`AppendOnlyError` at the first that deletes or updates rows, or with
    ``skip_rewrites`` records it in :attr:`RangeCommits.skipped` and reads none of it."""
    out = RangeCommits(cdf=_cdf_on(delta_table(path, start - 1).metadata().configuration))
    for version in range(start, end + 1):
        actions = delta_io.commit_actions(path, version, spark)
        rewrite = any("cdc" in a or ("remove" in a and a["remove"].get("dataChange", True))
                      for a in actions)
        if rewrite:
            op = next((a["commitInfo"].get("operation") for a in actions
                       if "commitInfo" in a), None) or "a rewrite"
            if not skip_rewrites:
                raise AppendOnlyError(
                    f"events table {table} version {version} ({op}) deletes or updates "
                    f"rows; a micro-batch reads an append-only events table "
                    f"(reprocessing rewritten events would duplicate output). Reset the pipeline's "
                    f"outputs and progress log, or append instead of overwriting, deleting "
                    f"or merging, or set events_rewrites='skip' to skip such commits "
                    f"(their rows are not read; outputs are not retracted).")
            out.skipped[version] = op
        for action in actions:
            remove = action.get("remove")
            if remove is not None:
                out.removes.add(version)
            if "metaData" in action:
                out.cdf = out.cdf and _cdf_on(action["metaData"].get("configuration"))
            add = action.get("add")
            if add is not None and add.get("dataChange", True) and not rewrite:
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


#: added files read on the driver (pyarrow) instead of by a Spark scan of the table, up to
#: this many bytes (their size in the log): a small append is a local relation, not a job
#: that lists and filters every file of the table
DIRECT_READ_BYTES = 64 << 20


def read_small_files(spark: SparkSession, path: str, version: int, names: set[str],
                     adds: list[dict[str, Any]]) -> DataFrame | None:
    """The rows of the files ``names`` of version ``version``, read with pyarrow
    (:class:`~lakecast.delta.files.TableFiles`) into a local DataFrame in the table's
    Spark schema, when they are small and a direct read is safe; else ``None`` (Spark reads
    them)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    if sum(int(a.get("size") or 0) for a in adds) > DIRECT_READ_BYTES:
        return None
    try:
        files = delta_io.table_files(path, version, open_files=False)
    except delta_io.DirectReadUnsupported:
        return None
    keep = [i for i, f in enumerate(files.files) if Path(f).name in names]
    if len(keep) != len(names):
        return None  # a file the log lists is not in the snapshot: Spark says what
    part = replace(files, files=tuple(files.files[i] for i in keep),
                   partitions=tuple(files.partitions[i] for i in keep)
                   if files.partitions else (),
                   stats=tuple(files.stats[i] for i in keep) if files.stats else ())
    # the Spark schema back from the Arrow one Spark's own types made (no second snapshot)
    schema = from_arrow_schema(files.schema)
    try:
        rows = part.read()
    except delta_io.DeltaIOError:
        return None
    # ``to``: the same schema, now known to the client (no schema request for it)
    return spark.createDataFrame(rows, schema=schema).to(schema)


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
        direct = read_small_files(spark, path, version, set(names), adds)
        if direct is not None:
            frames.append(direct)
            continue
        frame = delta_io.read(spark, path, version=version)
        pruned = _partition_filter(frame, adds)
        if pruned is not None:
            frame = frame.where(pruned)
        frames.append(frame.where(F.col("_metadata.file_name").isin(names)))
    if not frames:  # nothing added (e.g. only an OPTIMIZE): no rows, the newest columns
        return delta_io.read(spark, path, version=end).limit(0)
    if len(frames) == 1:  # as read (a direct read's schema stays known to the client)
        return frames[0]
    out = frames[-1]
    columns = out.columns
    for frame in reversed(frames[:-1]):
        out = frame.unionByName(out, allowMissingColumns=True)
    return out.select(*columns)


def read_new_events(spark: SparkSession, path: str, table: str, plan: BatchPlan,
                    rewrites: str = "fail") -> tuple[DataFrame, int | None]:
    """The plan's new events in the table ``table`` at ``path``, and how many rows the
    Delta log says they are (the ``numRecords`` statistics of the range's ``add`` actions,
    read without Spark; ``None`` when a file has none). That count is independent of the
    read, so the batch reconciles against it. One pass over the range's commits also
    checks that it only appends (else :class:`AppendOnlyError`; ``rewrites="skip"``: such
    commits are skipped, each said at WARNING). The rows come from the data files the
    range added (:func:`read_added_files`: small ones read on the driver, so the Spark
    server loads no snapshot of the table, not even one that starts at a Delta
    checkpoint), or from the Change Data Feed when the table records it over the range
    and the added files are too large to read on the driver (for appends, the same rows)."""
    from pyspark.sql import functions as F

    if rewrites not in ("fail", "skip"):
        raise ValueError(f"events_rewrites must be 'fail' or 'skip', not {rewrites!r}")
    if plan.events_start < 0:
        return (delta_io.read(spark, path, version=plan.events_end),
                delta_io.row_count(path, plan.events_end))
    start, end = plan.events_start + 1, plan.events_end
    commits = range_commits(spark, path, table, start, end, skip_rewrites=rewrites == "skip")
    for version, op in commits.skipped.items():
        log.warning("events table %s version %d (%s) deletes or updates rows: skipped "
                    "(events_rewrites='skip'; its rows are not read, outputs are not "
                    "retracted)", table, version, op)
    small = sum(int(a.get("size") or 0) for adds in commits.adds.values()
                for a in adds) <= DIRECT_READ_BYTES
    if not commits.cdf or commits.skipped or small:
        log.debug("events %s v%d..v%d: read from the added files", table, start, end)
        return read_added_files(spark, path, table, commits, end), commits.rows
    changes = delta_io.read_changes(spark, path, start, end)
    return changes.filter(F.col("_change_type") == "insert").drop(
        "_change_type", "_commit_version", "_commit_timestamp"
    ), commits.rows


class ValidatedSchemas:
    """The validated events' schema, known to the client: the first batch asks the server
    (over Spark Connect, a schema request in which it analyzes the batch's plan), later
    batches whose events have the same schema reuse it (``DataFrame.to``: a projection
    that changes nothing), so the runtime's schema request needs no round trip."""

    def __init__(self) -> None:
        self._schemas: dict[tuple[str, bool], StructType] = {}

    def known(self, events: DataFrame, valid: DataFrame, marked: bool) -> DataFrame:
        """``valid`` (validated ``events``; ``marked``: with the dedup's marks) with its
        schema known."""
        key = (events.schema.json(), marked)  # events read on the driver: no request
        schema = self._schemas.get(key)
        if schema is None:
            self._schemas[key] = valid.schema
            return valid
        return valid.to(schema)


def rejected_schema() -> StructType:
    """The rejected rows' columns (:func:`rejected_rows`)."""
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    return StructType([StructField("reason", StringType()),
                       StructField("raw_record", StringType()),
                       StructField("batch_id", IntegerType())])


def rejected_rows(rejected: DataFrame, plan: BatchPlan, reason: str) -> DataFrame:
    """Rejected events (``reason``: the column saying why) as (reason, raw_record JSON,
    batch_id)."""
    from pyspark.sql import functions as F

    return rejected.select(
        F.col(reason).alias("reason"),
        # every column but ``reason``, in order, resolved with the plan (no schema request)
        F.to_json(F.struct("*").dropFields(reason)).alias("raw_record"),
        F.lit(plan.batch_id).alias("batch_id"),
    ).to(rejected_schema())  # its schema, known to the client without asking the server
