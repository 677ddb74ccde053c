"""Delta logs read without Spark: versions, commit info, ``txn`` actions, the Change Data
Feed of a version range and the active files of a version (``_delta_log`` replay).

Paths may be local or object-store URIs (``s3a://``, ``s3://``: read with ``deltalake``
and pyarrow's S3 filesystem, :mod:`lakecast.delta.objstore`; no Spark needed). The
:mod:`lakecast.delta.io` facade re-exports what callers use.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from lakecast.delta import objstore
from lakecast.errors import LakecastError

CDF_PROPERTY = "delta.enableChangeDataFeed"

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

_COMMIT = re.compile(r"^(\d{20})\.json$")
class DeltaIOError(LakecastError):
    """A Delta table is missing or cannot serve the request."""


def _is_uri(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def _local(path: str) -> Path:
    return Path(path.removeprefix("file://"))


def _log_names(path: str, spark: SparkSession | None) -> list[str]:
    if not _is_uri(path):
        log = _local(path) / "_delta_log"
        return [p.name for p in log.iterdir()] if log.is_dir() else []
    return objstore.log_names(path)


def _read_log_file(path: str, name: str, spark: SparkSession | None) -> str:
    if not _is_uri(path):
        return (_local(path) / "_delta_log" / name).read_text()
    return objstore.read_log_file(path, name)


def table_exists(path: str, spark: SparkSession | None = None) -> bool:
    """Whether ``path`` holds a Delta table (at least one commit)."""
    return latest_version(path, spark) is not None


def latest_version(path: str, spark: SparkSession | None = None) -> int | None:
    """Newest committed version of the table at ``path``, or ``None`` if there is none
    (object stores: read with ``deltalake``)."""
    if _is_uri(path):
        return objstore.latest_version(path)
    versions = [int(m.group(1)) for n in _log_names(path, spark) if (m := _COMMIT.match(n))]
    return max(versions) if versions else None


@dataclass(frozen=True)
class CommitInfo:
    """What one Delta commit says about itself."""

    version: int
    timestamp_ms: int
    operation: str
    metrics: dict[str, str]


def commit_actions(path: str, version: int, spark: SparkSession | None = None
                   ) -> list[dict[str, Any]]:
    """The actions (``add``, ``remove``, ``txn``, ``commitInfo``, ...) of one commit."""
    try:
        text = _read_log_file(path, f"{version:020d}.json", spark)
    except FileNotFoundError as e:
        raise DeltaIOError(f"{path} has no commit file for version {version}") from e
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def commit_info(path: str, version: int, spark: SparkSession | None = None) -> CommitInfo:
    """The commit's timestamp (in-commit timestamp when enabled), operation and metrics."""
    for action in commit_actions(path, version, spark):
        if "commitInfo" in action:
            ci = action["commitInfo"]
            ts = ci.get("inCommitTimestamp", ci.get("timestamp", 0))
            metrics = {k: str(v) for k, v in (ci.get("operationMetrics") or {}).items()}
            return CommitInfo(version, int(ts), str(ci.get("operation", "")), metrics)
    raise DeltaIOError(f"{path} version {version} has no commitInfo action")


def commit_seconds(path: str, version: int, spark: SparkSession | None = None) -> float | None:
    """Commit time of ``path@version`` in epoch seconds (``None``: no such version)."""
    if version < 0:
        return None
    try:
        return commit_info(path, version, spark).timestamp_ms / 1000.0
    except DeltaIOError:
        return None


def read_changes_from_log(
    path: str, start_version: int, end_version: int
) -> dict[int, pa.Table] | None:
    """The Change Data Feed of versions ``start..end`` read without Spark: straight from
    the files each commit names (its ``cdc`` files, else its data-changing ``add`` files
    as inserts or ``remove`` files as deletes), one Arrow table per version with a
    ``_change_type`` column (pre-images included, no ``_commit_*`` columns).

    Returns ``None`` when a version needs Spark's reader (:func:`read_changes`): URI
    paths, metadata/protocol changes, deletion vectors, partitioned or column-mapped
    files, commits rewriting files without CDC files, or missing files.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if _is_uri(path):
        return None
    root = _local(path)
    out: dict[int, pa.Table] = {}
    for version in range(start_version, end_version + 1):
        try:
            text = _read_log_file(path, f"{version:020d}.json", None)
        except FileNotFoundError:
            return None
        files: dict[str, list[str]] = {"add": [], "remove": [], "cdc": []}
        for line in text.splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "metaData" in action or "protocol" in action:
                return None
            for kind, bucket in files.items():
                act = action.get(kind)
                if act is None:
                    continue
                if act.get("deletionVector") or act.get("partitionValues"):
                    return None
                if kind == "cdc" or act.get("dataChange", True):
                    bucket.append(act["path"])
        if files["cdc"]:
            names, change_type = files["cdc"], None
        elif files["add"] and files["remove"]:
            return None
        elif files["add"]:
            names, change_type = files["add"], "insert"
        else:
            names, change_type = files["remove"], "delete"
        tables = []
        for name in names:
            try:
                t = pq.read_table(root / unquote(name), partitioning=None)
            except OSError:
                return None
            if any(f.metadata and b"PARQUET:field_id" in f.metadata for f in t.schema):
                return None  # column mapping: physical names differ from the logical ones
            if "__is_cdc" in t.column_names:  # Delta's internal marker in CDC files
                t = t.drop_columns(["__is_cdc"])
            if change_type is not None:
                t = t.append_column("_change_type", pa.array([change_type] * t.num_rows,
                                                             pa.string()))
            tables.append(t)
        out[version] = (pa.concat_tables(tables, promote_options="permissive") if tables
                        else pa.table({"_change_type": pa.array([], pa.string())}))
    return out


def txn_versions(path: str, app_id: str, spark: SparkSession | None = None) -> dict[int, int]:
    """``{txnVersion: Delta version}`` of the commits that carry a ``txn`` action of
    ``app_id`` (the idempotent writes of :func:`write` with ``txn=``), read from the log."""
    out: dict[int, int] = {}
    for name in _log_names(path, spark):
        m = _COMMIT.match(name)
        if not m:
            continue
        for line in _read_log_file(path, name, spark).splitlines():
            if '"txn"' not in line:
                continue
            txn = json.loads(line).get("txn")
            if txn and txn.get("appId") == app_id:
                out[int(txn["version"])] = int(m.group(1))
    return out


# --------------------------------------------------------------------------- direct reads
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")
#: reader features a direct read handles (deletion vectors / column mapping only when unused)
_DIRECT_READER_FEATURES = {"deletionVectors", "columnMapping", "timestampNtz", "v2Checkpoint",
                           "vacuumProtocolCheck"}


class DirectReadUnsupported(DeltaIOError):
    """A table version cannot be read safely without Spark (the message says why)."""


@dataclass(frozen=True)
class TableFiles:
    """The active data files of one table version, found by replaying ``_delta_log``
    (newest classic checkpoint at or before the version, then the JSON commits after it).

    Build it with :func:`table_files`; :meth:`read` reads the rows with pyarrow, as Spark's
    ``read.format("delta").option("versionAsOf", version)`` would (same rows, same Arrow
    schema as ``DataFrame.toArrow()``), without a Spark job — on the driver or in a task.
    """

    path: str
    version: int
    files: tuple[str, ...]  # absolute local paths, sorted
    schema: pa.Schema  # the Arrow schema of Spark's toArrow() for this version
    num_rows: int  # from the files' Parquet footers
    nbytes: int  # uncompressed size of the files' row groups (an estimate of the Arrow size)
    #: each file's partition values (column -> Delta's string form; None: null)
    partitions: tuple[dict[str, str | None], ...] = ()
    #: each file's statistics from its ``add`` action (``None``: the writer wrote none)
    stats: tuple[dict[str, Any] | None, ...] = ()

    def read(self, columns: Sequence[str] | None = None,
             where: Mapping[str, object] | None = None) -> pa.Table:
        """The table's rows at :attr:`version` (reads the Parquet files): ``columns`` only
        (default: all), and only the files whose partition values equal ``where``'s."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = self.schema if columns is None else pa.schema(
            [self.schema.field(c) for c in columns])
        parts = []
        for i, f in enumerate(self.files):
            values = self.partitions[i] if self.partitions else {}
            if where and any(values.get(c) != str(v) for c, v in where.items()):
                continue
            try:
                data = Path(f).read_bytes()  # read once: checksum, then Parquet
                verify_checksum(f, data)
                pf = pq.ParquetFile(pa.BufferReader(data), coerce_int96_timestamp_unit="us")
                stored = None if columns is None else [  # those in this file (evolution)
                    c for c in pf.schema_arrow.names if c in schema.names]
                t = pf.read(columns=stored)
            except (OSError, pa.ArrowInvalid) as e:
                raise DeltaIOError(f"{self.path}@v{self.version}: cannot read {f}: {e}") from e
            for c, v in values.items():  # the log's value (some writers also store it)
                if c in t.column_names:
                    t = t.drop_columns([c])
                if c in schema.names:
                    t = t.append_column(c, pa.array([v] * t.num_rows, pa.string()))
            parts.append(_conform(t, schema))
        if not parts:
            return schema.empty_table()
        return pa.concat_tables(parts)


def verify_checksum(file: str, data: bytes | None = None) -> None:
    """Check ``file`` (its bytes: ``data``, read here if not given) against the checksum
    Hadoop's local filesystem wrote beside it (``.<name>.crc``: "crc\\0", bytes per
    checksum, one CRC-32 per chunk), as Spark does when it reads it; raises
    :class:`OSError` on a mismatch, does nothing without one."""
    import struct
    import zlib

    f = Path(file)
    crc = f.with_name(f".{f.name}.crc")
    if not crc.exists():
        return
    head = crc.read_bytes()
    if head[:4] != b"crc\x00":
        raise OSError(f"{crc}: not a Hadoop checksum file")
    chunk = struct.unpack(">i", head[4:8])[0]
    sums = head[8:]
    if len(sums) % 4:
        raise OSError(f"{crc} does not match {f}")
    view = memoryview(f.read_bytes() if data is None else data)
    expected = struct.unpack(f">{len(sums) // 4}I", sums)
    if len(view) > chunk * len(expected):
        raise OSError(f"{f} is longer than its checksum file {crc} says")
    if len(view) <= chunk * (len(expected) - 1):
        raise OSError(f"{crc} does not match {f}")
    for i, want in enumerate(expected):
        if zlib.crc32(view[i * chunk:(i + 1) * chunk]) != want:
            raise OSError(f"checksum error in {f} at byte {i * chunk}")


def _conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
    """``t`` with exactly ``schema``'s columns (missing ones as nulls: added by schema
    evolution after the file was written), cast to its types."""
    import pyarrow as pa

    cols = []
    for f in schema:
        if f.name in t.column_names:
            c = t.column(f.name)
            cols.append(c if c.type == f.type else c.cast(f.type))
        else:
            cols.append(pa.nulls(t.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=schema)


def _arrow_schema(schema_json: str, large_types: bool = False) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    return to_arrow_schema(StructType.fromJson(json.loads(schema_json)),
                           error_on_duplicated_field_names_in_struct=True, timezone="UTC",
                           prefers_large_types=large_types)


def _file_path(root: Path, name: str) -> Path:
    if "://" in name or name.startswith("file:"):
        if not name.startswith("file:"):
            raise DirectReadUnsupported(f"data file {name} is not on the local filesystem")
        return Path(unquote(re.sub(r"^file:(//)?", "", name)))
    return root / unquote(name)


def _replay(path: str, version: int, names: list[str]) -> tuple[dict[str, dict[str, Any]],
                                                                 dict[str, Any], dict[str, Any]]:
    """(active add actions by path, metaData, protocol) at ``version``."""
    import pyarrow.parquet as pq

    log = _local(path) / "_delta_log"
    commits = {int(m.group(1)) for n in names if (m := _COMMIT.match(n))}
    parts: dict[int, dict[int, list[str]]] = {}  # checkpoint version -> n_parts -> names
    for n in names:
        if m := _CHECKPOINT.match(n):
            v, total = int(m.group(1)), int(m.group(3) or 1)
            parts.setdefault(v, {}).setdefault(total, []).append(n)
    start, cp_files = 0, []
    for v in sorted((v for v in parts if v <= version), reverse=True):
        complete = [sorted(ns) for total, ns in parts[v].items() if len(ns) == total]
        if complete and all(c in commits for c in range(v + 1, version + 1)):
            start, cp_files = v + 1, complete[0]
            break
    missing = [c for c in range(start, version + 1) if c not in commits]
    if missing:
        raise DirectReadUnsupported(
            f"no classic checkpoint + JSON commits cover version {version} "
            f"(missing commit files {missing[:3]}...)")
    adds: dict[str, dict[str, Any]] = {}
    meta: dict[str, Any] = {}
    protocol: dict[str, Any] = {}
    for name in cp_files:
        t = pq.read_table(log / name, columns=["add", "metaData", "protocol"])
        for a in t.column("add").to_pylist():
            if a is not None:  # Parquet maps come back as (key, value) lists
                a["partitionValues"] = dict(a.get("partitionValues") or [])
                adds[_file_key(a)] = a
        for m in t.column("metaData").to_pylist():
            if m is not None:  # Parquet maps come back as (key, value) lists
                meta = {**m, "configuration": dict(m.get("configuration") or [])}
        for p in t.column("protocol").to_pylist():
            if p is not None:
                protocol = p
    for c in range(start, version + 1):
        added, removed = [], []
        for line in (log / f"{c:020d}.json").read_text().splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "add" in action:
                added.append(action["add"])
            elif "remove" in action:
                removed.append(action["remove"])
            elif "metaData" in action:
                meta = action["metaData"]
            elif "protocol" in action:
                protocol = action["protocol"]
        # a commit's actions are a set: its removes apply to the files before it (a DELETE
        # with deletion vectors removes (file) and adds (file + DV) in one commit)
        for r in removed:
            adds.pop(_file_key(r), None)
        for a in added:
            adds[_file_key(a)] = a
    return adds, meta, protocol


def _file_key(action: dict[str, Any]) -> str:
    """A file's identity in log replay: its path and deletion vector (Delta's spec)."""
    dv = action.get("deletionVector")
    if not dv:
        return str(action["path"])
    return f"{action['path']}#{dv.get('storageType')}{dv.get('pathOrInlineDv')}@{dv.get('offset')}"


def table_files(path: str, version: int, *, large_types: bool = False,
                open_files: bool = True) -> TableFiles:
    """The files and Arrow schema of version ``version`` of the table at ``path``, from
    its log, to read it without Spark (:meth:`TableFiles.read`). ``open_files=False``
    reads the log only (no Parquet footer is opened: ``num_rows``/``nbytes`` are 0 and a
    file's schema is checked when it is read).

    Raises :class:`DirectReadUnsupported` (with the reason) when that is not safe and
    Spark must read it: URI paths, deletion vectors in use, column mapping, partition
    columns (their values are not in the files), reader features or checkpoint formats
    not handled here (V2 checkpoints are skipped for older classic ones or the JSON
    commits), files missing, or file schemas that do not convert.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if _is_uri(path):
        raise DirectReadUnsupported(f"{path} is not on the local filesystem")
    names = _log_names(path, None)
    if not names:
        raise DeltaIOError(f"{path} is not a Delta table")
    adds, meta, protocol = _replay(path, version, names)
    if not meta:
        raise DirectReadUnsupported(f"{path}@v{version}: no metaData action found")
    features = set(protocol.get("readerFeatures") or [])
    if int(protocol.get("minReaderVersion", 1)) > 3 or features - _DIRECT_READER_FEATURES:
        raise DirectReadUnsupported(
            f"reader protocol {protocol.get('minReaderVersion')} with features "
            f"{sorted(features - _DIRECT_READER_FEATURES)}")
    conf = meta.get("configuration") or {}
    if conf.get("delta.columnMapping.mode", "none") != "none":
        raise DirectReadUnsupported(
            f"column mapping mode {conf['delta.columnMapping.mode']!r}")
    if any(a.get("deletionVector") for a in adds.values()):
        raise DirectReadUnsupported("deletion vectors in use")
    schema = _arrow_schema(meta["schemaString"], large_types)
    part_cols = list(meta.get("partitionColumns") or [])
    odd = [c for c in part_cols if not _castable_partition(schema.field(c).type)]
    if odd:
        raise DirectReadUnsupported(f"partition columns {odd} of types read only by Spark")
    root = _local(path)
    files, n_rows, n_bytes = [], 0, 0
    by_path = {a["path"]: a for a in adds.values()}
    partitions = tuple({c: (by_path[n].get("partitionValues") or {}).get(c) for c in part_cols}
                       for n in sorted(by_path)) if part_cols else ()
    stats = tuple(json.loads(by_path[n].get("stats") or "null") for n in sorted(by_path))
    for name in sorted(by_path):
        f = _file_path(root, name)
        if not open_files:
            files.append(str(f))
            continue
        try:
            pf = pq.ParquetFile(f, coerce_int96_timestamp_unit="us")
        except (OSError, pa.ArrowInvalid) as e:
            raise DirectReadUnsupported(f"cannot open data file {f}: {e}") from e
        md = pf.metadata
        n_rows += md.num_rows
        n_bytes += sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
        try:  # every file's columns (and partition values) convert to the table's types
            stored = pf.schema_arrow.empty_table()
            for c in part_cols:
                if c in stored.column_names:
                    stored = stored.drop_columns([c])
                stored = stored.append_column(c, pa.array([], pa.string()))
            _conform(stored, schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            raise DirectReadUnsupported(f"{f}: file schema does not convert: {e}") from e
        files.append(str(f))
    return TableFiles(path, version, tuple(files), schema, n_rows, n_bytes, partitions, stats)


def _castable_partition(t: pa.DataType) -> bool:
    """Partition values are strings in the log; these types cast from them exactly."""
    import pyarrow as pa

    return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)


def file_sizes(path: str, version: int) -> dict[str, int]:
    """``{data file: size in bytes}`` of the active files of version ``version`` of the
    local table at ``path``, from its log (no data file is read)."""
    if _is_uri(path):
        raise DirectReadUnsupported(f"{path} is not on the local filesystem")
    adds, _, _ = _replay(path, version, _log_names(path, None))
    return {str(a["path"]): int(a.get("size") or 0) for a in adds.values()}


def row_count(path: str, version: int) -> int | None:
    """Rows in version ``version`` of the table at ``path``, from the ``numRecords`` file
    statistics in its log (minus deletion-vector cardinalities), without reading data
    files; ``None`` when a file has no statistics or the log cannot be read directly."""
    if _is_uri(path):
        return None
    try:
        adds, _, _ = _replay(path, version, _log_names(path, None))
    except (DirectReadUnsupported, OSError):
        return None
    total = 0
    for a in adds.values():
        stats = a.get("stats")
        if not stats:
            return None
        n = json.loads(stats).get("numRecords")
        if n is None:
            return None
        total += int(n) - int((a.get("deletionVector") or {}).get("cardinality", 0))
    return total
