"""Where a Delta table is for ``deltalake`` (:func:`location`, :func:`delta_table`) and the
active files of a version, read with pyarrow as Spark would read them
(:class:`TableFiles`), without a Spark job.

``deltalake`` loads the version's snapshot (``get_add_actions``: paths, partition values,
statistics; schema, protocol, table properties); the rows are read here from the local
Parquet files, checksums verified. What this cannot read exactly as Spark does raises
:class:`DirectReadUnsupported` with the reason (the caller then reads with Spark).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from lakecast.delta import objstore
from lakecast.errors import LakecastError

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

log = logging.getLogger(__name__)

#: reader features a direct read handles (deletion vectors / column mapping only when unused)
_DIRECT_READER_FEATURES = {"deletionVectors", "columnMapping", "timestampNtz", "v2Checkpoint",
                           "vacuumProtocolCheck"}
_LOGGED: set[str] = set()


class DeltaIOError(LakecastError):
    """A Delta table is missing or cannot serve the request."""


class DirectReadUnsupported(DeltaIOError):
    """A table version cannot be read safely without Spark (the message says why)."""


def location(path: str) -> tuple[str, dict[str, str] | None]:
    """``(uri, storage_options)`` for ``deltalake``: a local path as is (``file://``
    stripped), ``s3a://`` as ``s3://``, object stores with :mod:`objstore`'s options."""
    if path.startswith("file:"):
        return re.sub(r"^file:(//)?", "", path), None
    scheme = urlparse(path).scheme
    if scheme in objstore.SCHEMES:
        return "s3://" + path.split("://", 1)[1], objstore.storage_options()
    return path, None


def is_local(path: str) -> bool:
    """Whether ``path`` is on the local filesystem (not an object store)."""
    return "://" not in path or path.startswith("file:")


def read_error(path: str, e: BaseException) -> LakecastError:
    """The error of a failed read of ``path``'s log (object stores: URI and settings)."""
    if not is_local(path):
        return objstore.read_error(path, e)  # names the URI and the settings to fix
    return DeltaIOError(f"cannot read the Delta log of {path}: {e}")


def delta_table(path: str, version: int | None = None) -> DeltaTable:
    """A ``DeltaTable`` of ``path`` (at ``version``; default: the newest) of its own,
    for reads that load a snapshot; :class:`DeltaIOError` if there is no such table."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError, TableNotFoundError

    uri, options = location(path)
    try:
        return DeltaTable(uri, version=version, storage_options=options)
    except TableNotFoundError as e:
        raise DeltaIOError(f"{path} is not a Delta table") from e
    except (DeltaError, OSError) as e:
        raise read_error(path, e) from e


def unsupported(reason: str, once: str | None = None) -> DirectReadUnsupported:
    """The error for a read that Spark must do; logged (INFO) once per process for each
    kind ``once`` of reason (e.g. an object-store lake), so a fallback is never silent."""
    if once is not None and once not in _LOGGED:
        _LOGGED.add(once)
        log.info("Delta files read by Spark (logged once): %s", reason)
    return DirectReadUnsupported(reason)


@dataclass(frozen=True)
class TableFiles:
    """The active data files of one table version (from ``deltalake``'s snapshot).

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
    #: each file's statistics (``numRecords``, ``minValues``, ``maxValues``, ``nullCount``
    #: as in the log, timestamps as ISO strings; ``None``: the writer wrote none)
    stats: tuple[dict[str, Any] | None, ...] = ()

    def read(self, columns: Sequence[str] | None = None,
             where: Mapping[str, object] | None = None) -> pa.Table:
        """The table's rows at :attr:`version` (reads the Parquet files): ``columns`` only
        (default: all), and only the files whose partition values equal ``where``'s."""
        import pyarrow as pa

        parts = list(self.parts(columns, where))
        if not parts:
            return self._schema(columns).empty_table()
        return pa.concat_tables(parts)

    def _schema(self, columns: Sequence[str] | None) -> pa.Schema:
        import pyarrow as pa

        return self.schema if columns is None else pa.schema(
            [self.schema.field(c) for c in columns])

    def parts(self, columns: Sequence[str] | None = None,
              where: Mapping[str, object] | None = None) -> Iterator[pa.Table]:
        """:meth:`read`'s rows one file at a time (a reader that keeps a share of them
        never holds the whole table)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = self._schema(columns)
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
            yield conform(t, schema)


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


def conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
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


def arrow_schema(schema_json: str, large_types: bool = False) -> pa.Schema:
    """The Arrow schema of Spark's ``toArrow()`` for a Delta schema (its JSON)."""
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


def _logged(value: Any) -> Any:
    """A statistic as the log writes it (timestamps and dates as ISO strings)."""
    if isinstance(value, dict):
        return {k: _logged(v) for k, v in value.items() if v is not None}
    if isinstance(value, datetime | date):
        return value.isoformat()
    return value


def _stats(row: Mapping[str, Any]) -> dict[str, Any] | None:
    if row.get("num_records") is None:
        return None
    out: dict[str, Any] = {"numRecords": int(row["num_records"])}
    for key, name in (("min", "minValues"), ("max", "maxValues"), ("null_count", "nullCount")):
        if row.get(key):
            out[name] = _logged(row[key])
    return out


@dataclass(frozen=True)
class Snapshot:
    """What :func:`table_files` needs of a version's ``deltalake`` snapshot."""

    adds: list[dict[str, Any]]  # get_add_actions rows (nested statistics)
    schema_json: str
    partition_columns: list[str]
    configuration: dict[str, str]
    min_reader_version: int
    reader_features: set[str]
    has_deletion_vectors: bool


def snapshot(path: str, version: int) -> Snapshot:
    """The active files and metadata of ``path@version`` from ``deltalake``."""
    import pyarrow as pa
    from deltalake.exceptions import DeltaError

    try:
        dt = delta_table(path, version)
    except DirectReadUnsupported:
        raise
    except DeltaIOError as e:  # e.g. its commits were cleaned from the log
        if delta_table(path).version() < version:  # raises if there is no table at all
            raise
        raise DirectReadUnsupported(f"{path}@v{version}: deltalake cannot load this version "
                                    f"from the log: {e.__cause__ or e}") from e
    try:
        proto = dt.protocol()
        features = set(proto.reader_features or [])
        dvs = "deletionVectors" in features and pa.table(dt.deletion_vectors()).num_rows > 0
        meta = dt.metadata()
        return Snapshot(pa.table(dt.get_add_actions(flatten=False)).to_pylist(),
                        dt.schema().to_json(), list(meta.partition_columns),
                        dict(meta.configuration), int(proto.min_reader_version), features, dvs)
    except (DeltaError, OSError) as e:
        raise DeltaIOError(f"{path}@v{version}: cannot load its snapshot: {e}") from e


def table_files(path: str, version: int, *, large_types: bool = False,
                open_files: bool = True) -> TableFiles:
    """The files and Arrow schema of version ``version`` of the table at ``path``, from
    ``deltalake``, to read it without Spark (:meth:`TableFiles.read`). ``open_files=False``
    opens no Parquet footer (``num_rows``/``nbytes`` are 0 and a file's schema is checked
    when it is read).

    Raises :class:`DirectReadUnsupported` (with the reason) when that is not safe and
    Spark must read it: object-store paths, deletion vectors in use, column mapping,
    partition columns of types read only by Spark, unknown reader features, files
    missing, or file schemas that do not convert.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not is_local(path):
        raise unsupported(f"{path}: rows are read from local files only", once="object store")
    snap = snapshot(path, version)
    if snap.min_reader_version > 3 or snap.reader_features - _DIRECT_READER_FEATURES:
        raise DirectReadUnsupported(
            f"reader protocol {snap.min_reader_version} with features "
            f"{sorted(snap.reader_features - _DIRECT_READER_FEATURES)}")
    mode = snap.configuration.get("delta.columnMapping.mode", "none")
    if mode != "none":
        raise DirectReadUnsupported(f"column mapping mode {mode!r}")
    if snap.has_deletion_vectors:
        raise DirectReadUnsupported("deletion vectors in use")
    schema = arrow_schema(snap.schema_json, large_types)
    part_cols = snap.partition_columns
    odd = [c for c in part_cols if not _castable_partition(schema.field(c).type)]
    if odd:
        raise DirectReadUnsupported(f"partition columns {odd} of types read only by Spark")
    root = Path(location(path)[0])
    adds = sorted(snap.adds, key=lambda a: a["path"])
    partitions = tuple(
        {c: (None if (v := (a.get("partition") or {}).get(c)) is None else str(v))
         for c in part_cols} for a in adds) if part_cols else ()
    stats = tuple(_stats(a) for a in adds)
    files, n_rows, n_bytes = [], 0, 0
    for a in adds:
        f = _file_path(root, a["path"])
        files.append(str(f))
        if not open_files:
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
            conform(stored, schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            raise DirectReadUnsupported(f"{f}: file schema does not convert: {e}") from e
    return TableFiles(path, version, tuple(files), schema, n_rows, n_bytes, partitions, stats)


def _castable_partition(t: pa.DataType) -> bool:
    """Partition values are strings in the log; these types cast from them exactly."""
    import pyarrow as pa

    return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)


def file_sizes(path: str, version: int) -> dict[str, int]:
    """``{data file: size in bytes}`` of the active files of ``path@version`` (no data
    file is read)."""
    return {str(a["path"]): int(a.get("size_bytes") or 0)
            for a in snapshot(path, version).adds}


def row_count(path: str, version: int) -> int | None:
    """Rows in ``path@version`` from the ``numRecords`` file statistics, without reading
    data files; ``None`` when a file has no statistics, deletion vectors are in use or
    the snapshot cannot be loaded."""
    try:
        snap = snapshot(path, version)
    except DeltaIOError:
        return None
    if snap.has_deletion_vectors or any(a.get("num_records") is None for a in snap.adds):
        return None
    return sum(int(a["num_records"]) for a in snap.adds)
