"""A table-shaped broadcast state split into shards (:class:`ShardedTableState`).

``Lookup(..., shards=N)`` declares it. Its rows are split by Spark's hash of the key
(:func:`lakecast.runtime.shards.shard_of`) into ``N`` shards, and each micro-batch routes
the events to the tasks of their keys' shards, so a task reads only its shard's rows:

* **the base** (a full version of the table: its first version, a reload, a rebase or a
  restored checkpoint) is written once per machine as ``N`` Arrow IPC files, one per
  shard, sorted by a 64-bit hash of the key (:func:`~lakecast.runtime.shards.key_hash64`),
  under the Spark application's local folder (a task's ``SparkFiles`` root; elsewhere the
  system's temporary folder). The first task on a machine that needs a base builds all its
  shards in one pass over the base's files (one file in memory at a time, then one shard
  at a time); the others wait for it. Tasks **memory-map** the shard files they look up:
  every Python worker of the machine reads the same pages, the operating system's page
  cache holds them once and may evict them, so a task's state is its shard, wherever
  Spark runs the task;
* **the changes since the base** (each later version's upserts and deletes) are small and
  kept in memory by each task (an overlay, in the order of the versions), so a new
  version costs its changes, not a rewrite of the shards;
* a lookup hashes the probe keys, finds each key's shard and its row by binary search in
  that shard's sorted hashes (then compares the keys themselves), and lets the overlay's
  rows and deletes win over the base's.

Every other promise is the table state's (:class:`~lakecast.api.table_state.TableMapState`):
the same version on every task, lineage, refused versions, checkpoints (which hold the
table once: :meth:`ShardedTableState.to_arrow`). Folders of older bases of the same state
are removed when a newer base is built (a task still mapping one keeps its pages).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakecast.api.descriptors import MapStateDescriptor
from lakecast.api.element import CHANGE_TYPE, BroadcastElement, split_changes
from lakecast.api.frozen import freeze
from lakecast.api.table_state import TableMapState
from lakecast.runtime.shards import canonical, key_hash64, shard_of

#: the overlay's column marking a key deleted since the base
DEAD = "__lakecast_dead"
#: a shard file's column of the sorted key hashes
HASH = "__lakecast_h"
#: how long a task waits for another process building the same base (seconds)
BUILD_WAIT_S = 1800.0


def shard_root() -> Path:
    """Where this process keeps shard files: in a Spark task, under the application's
    ``SparkFiles`` root (removed with the application); elsewhere, the temporary folder."""
    try:
        from pyspark import SparkFiles, TaskContext

        if TaskContext.get() is not None:
            return Path(SparkFiles.getRootDirectory()) / "lakecast-shards"
    except Exception:  # no Spark here: the temporary folder
        pass
    return Path(tempfile.gettempdir()) / f"lakecast-shards-{os.getuid()}"


@dataclass(frozen=True)
class Shard:
    """One shard of a base, memory-mapped: its rows sorted by :data:`HASH`."""

    table: pa.Table
    hashes: np.ndarray  # uint64, a view of the mapped file
    source: Any = None  # the open memory map (kept while the shard is used)

    @staticmethod
    def open(path: Path) -> Shard:
        source = pa.memory_map(str(path))
        table = pa.ipc.open_file(source).read_all()
        hashes = (table.column(HASH).chunk(0).to_numpy(zero_copy_only=True)
                  if table.num_rows else np.zeros(0, dtype=np.uint64))
        return Shard(table, hashes, source)

    @property
    def nbytes(self) -> int:
        return int(self.table.nbytes)

    def find(self, keys: Sequence[pa.Array], hashes: np.ndarray,
             key_columns: Sequence[str]) -> np.ndarray:
        """The row of each probe key in this shard (-1: none)."""
        n, size = len(hashes), len(self.hashes)
        if not size or not n:
            return np.full(n, -1, dtype=np.int64)
        at = np.searchsorted(self.hashes, hashes, side="left")
        cand = np.minimum(at, size - 1)
        match = (at < size) & (self.hashes[cand] == hashes)
        rows = np.flatnonzero(match)
        pos = np.full(n, -1, dtype=np.int64)
        if not len(rows):
            return pos
        same = self._equal(rows, cand[rows], keys, key_columns)
        pos[rows[same]] = cand[rows[same]]
        for r in rows[~same]:  # another key with the same hash: the next rows of that hash
            j = int(cand[r]) + 1
            while j < size and self.hashes[j] == hashes[r]:
                if self._equal(np.array([r]), np.array([j]), keys, key_columns)[0]:
                    pos[r] = j
                    break
                j += 1
        return pos

    def _equal(self, probe_rows: np.ndarray, rows: np.ndarray, keys: Sequence[pa.Array],
               key_columns: Sequence[str]) -> np.ndarray:
        same = np.ones(len(rows), dtype=bool)
        idx, pidx = pa.array(rows), pa.array(probe_rows)
        for c, probe in zip(key_columns, keys, strict=True):
            mine = canonical(self.table.column(c).take(idx))
            same &= np.asarray(pc.fill_null(pc.equal(mine, probe.take(pidx)), False))
        return same


class ShardedTableState(TableMapState):
    """A table-shaped broadcast state in ``descriptor.shards`` shards (see the module doc).

    ``namespace``: what names this state's files apart from every other function's (the
    runtime's function id; a fresh one per instance by default)."""

    def __init__(self, descriptor: MapStateDescriptor, namespace: str | None = None) -> None:
        super().__init__(descriptor)
        self.shards = int(descriptor.shards or 1)
        self.namespace = namespace or f"local-{uuid.uuid4().hex[:12]}"
        self._overlay = TableMapState(descriptor)
        self._folder: Path | None = None  # the base's shard files
        self._source: BroadcastElement | None = None  # the base, built when first read
        self._value_columns: list[str] | None = None
        self._schema: pa.Schema | None = None
        self._open: dict[int, Shard] = {}
        #: the shards this instance has looked up (a task's accounting)
        self.touched: set[int] = set()

    # -- the base ------------------------------------------------------------------
    def _set_base(self, element: BroadcastElement, value_columns: list[str] | None,
                  name: str | None = None) -> None:
        schema = element.schema
        if CHANGE_TYPE in schema.names:
            schema = schema.remove(schema.get_field_index(CHANGE_TYPE))
        cols = self.key_columns + [c for c in (value_columns or schema.names)
                                   if c not in self.key_columns]
        self._schema = pa.schema([schema.field(c) for c in cols])
        self._source, self._value_columns = element, cols
        name = name or (f"{_safe(self.descriptor.name)}@v{element.version}"
                        f"-t{element.commit_timestamp}-n{self.shards}")
        self._folder = shard_root() / _safe(self.namespace) / name
        self._open = {}
        self._overlay = TableMapState(self.descriptor)

    def prepare(self) -> None:
        """Build the base's shard files on this machine now (a warm-up), not at the first
        lookup."""
        if self._folder is not None and self._source is not None:
            build(self._folder, self._source, self.key_columns, self._value_columns,
                  self.shards)

    def _shard(self, s: int) -> Shard:
        shard = self._open.get(s)
        if shard is None:
            assert self._folder is not None and self._source is not None
            build(self._folder, self._source, self.key_columns, self._value_columns,
                  self.shards)
            shard = self._open[s] = Shard.open(self._folder / f"shard-{s}.arrow")
        self.touched.add(s)
        return shard

    def _base_lookup(self, keys: list[pa.Array], columns: Sequence[str]
                     ) -> tuple[pa.Table, np.ndarray]:
        n = len(keys[0])
        assert self._schema is not None
        empty = pa.table({c: pa.nulls(n, self._schema.field(c).type) for c in columns})
        if not n:
            return empty, np.zeros(0, dtype=bool)
        null = np.zeros(n, dtype=bool)
        for k in keys:
            if k.null_count:
                null |= np.asarray(pc.is_null(k))
        shard = shard_of(keys, self.shards)
        hashes = key_hash64(keys)
        found = np.zeros(n, dtype=bool)
        parts, order = [], []
        for s in np.unique(shard[~null]):
            rows = np.flatnonzero((shard == s) & ~null)
            idx = pa.array(rows)
            base = self._shard(int(s))
            pos = base.find([k.take(idx) for k in keys], hashes[rows], self.key_columns)
            hit = pos >= 0
            found[rows] = hit
            parts.append(base.table.select(list(columns)).take(
                pa.array(pos, mask=~hit)))
            order.append(rows)
        if not parts:
            return empty, found
        missing = np.flatnonzero(null)
        if len(missing):
            parts.append(empty.slice(0, len(missing)))
            order.append(missing)
        gathered = pa.concat_tables([p.cast(empty.schema) for p in parts])
        inverse = np.empty(n, dtype=np.int64)
        inverse[np.concatenate(order)] = np.arange(n)
        return gathered.take(pa.array(inverse)), found

    # -- reads ---------------------------------------------------------------------
    @property
    def schema(self) -> pa.Schema | None:
        return self._schema

    def schema_now(self) -> pa.Schema | None:
        return self._schema

    def lookup(self, keys: Sequence[pa.Array | pa.ChunkedArray], columns: Sequence[str]
               ) -> tuple[pa.Table, np.ndarray]:
        """Vectorized lookup (as :meth:`TableMapState.lookup`): the base's shards, then
        the changes since the base over them."""
        n = len(keys[0])
        if self._schema is None:
            return pa.table({c: pa.nulls(n) for c in columns}), np.zeros(n, dtype=bool)
        probe = [canonical(k) for k in keys]
        taken, found = self._base_lookup(probe, columns)
        if self._overlay.schema is None:
            return taken, found
        over, hit = self._overlay.lookup(keys, [*columns, DEAD])
        if not hit.any():
            return taken, found
        h = pa.array(hit)
        dead = np.asarray(pc.fill_null(over.column(DEAD), False))
        cols = [pc.if_else(h, over.column(c).cast(taken.schema.field(c).type), taken.column(c))
                for c in columns]
        taken = pa.Table.from_arrays(cols, schema=taken.schema) if columns else taken
        return taken, np.where(hit, ~dead, found)

    def get(self, key: Hashable, default: Any = None) -> Any:
        kv = key if len(self.key_columns) > 1 and isinstance(key, tuple) else (key,)
        arrays = [pa.array([v]) for v in kv]
        if self._schema is None:
            return default
        values = [c for c in self._schema.names if c not in self.key_columns]
        taken, found = self.lookup(arrays, self.key_columns + values)
        return freeze(taken.to_pylist()[0]) if found[0] else default

    def to_arrow(self) -> pa.Table:
        """The whole state (every shard, then the changes since the base): for checkpoints
        and tests, which hold the table once."""
        if self._schema is None:
            return pa.table({c: pa.array([], pa.null()) for c in self.key_columns})
        parts = []
        for s in range(self.shards):
            t = self._shard(s).table.drop_columns([HASH])
            parts.append(t)
        base = pa.concat_tables(parts) if parts else self._schema.empty_table()
        over = self._overlay.to_arrow() if self._overlay.schema is not None else None
        if over is None or not over.num_rows:
            return base.combine_chunks()
        gone = over.select(self.key_columns)
        keep = ~np.asarray(_is_in(base.select(self.key_columns), gone))
        live = over.filter(pc.invert(pc.fill_null(over.column(DEAD), False))).drop_columns(
            [DEAD])
        return pa.concat_tables([base.filter(pa.array(keep)),
                                 live.select(base.column_names).cast(base.schema)]
                                ).combine_chunks()

    def __len__(self) -> int:
        return self.to_arrow().num_rows

    def nbytes(self) -> int:
        """What this task holds: the shards it read (:attr:`touched`), and the changes
        since the base."""
        mapped = sum(self._open[s].nbytes for s in self.touched if s in self._open)
        return int(mapped + (self._overlay.nbytes() if self._overlay.schema is not None
                             else 0))

    # -- writes --------------------------------------------------------------------
    def apply(self, element: BroadcastElement, key_columns: Sequence[str] | str | None = None,
              value_columns: Sequence[str] | str | None = None) -> None:
        """A full element becomes the new base (its shards are built when first read); a
        changes element goes to the overlay, deletes first, then upserts."""
        vc = None if value_columns is None else (
            [value_columns] if isinstance(value_columns, str) else list(value_columns))
        if element.kind == "full":
            self._set_base(element, vc)
            return
        if self._schema is None:
            raise ValueError(f"state {self.descriptor.name!r}: changes of version "
                             f"{element.version} before any full version")
        if not element.rows.num_rows:
            return
        ups, dels = split_changes(element)
        cols = [c for c in self._schema.names]
        ups = ups.select(cols).cast(self._schema).append_column(
            DEAD, pa.array(np.zeros(ups.num_rows, dtype=bool)))
        dead = pa.table({c: (dels.column(c).cast(self._schema.field(c).type)
                             if c in self.key_columns else pa.nulls(dels.num_rows,
                                                                    self._schema.field(c).type))
                         for c in cols}).append_column(
            DEAD, pa.array(np.ones(dels.num_rows, dtype=bool)))
        self._overlay.put_table(pa.concat_tables([dead, ups]))  # the upserts win

    def put_table(self, table: pa.Table, replace: bool = False) -> None:
        """``replace``: ``table`` becomes the base (a restored checkpoint), its shard files
        named by its content; otherwise its rows are upserted over the base."""
        if not replace:
            if self._schema is None:
                raise ValueError(f"state {self.descriptor.name!r}: rows before any base")
            element = BroadcastElement(self.descriptor.name, -1, 0, "changes",
                                       table.append_column(CHANGE_TYPE, pa.array(
                                           ["insert"] * table.num_rows, pa.string())))
            self.apply(element)
            return
        import hashlib

        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        digest = hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()[:16]
        element = BroadcastElement(self.descriptor.name, 0, 0, "full", table)
        self._set_base(element, None, name=f"{_safe(self.descriptor.name)}@c{digest}"
                                           f"-n{self.shards}")

    def put(self, key: Hashable, value: Any) -> None:
        raise NotImplementedError("a sharded state is written by its table's versions only")

    def remove(self, key: Hashable) -> None:
        raise NotImplementedError("a sharded state is written by its table's versions only")

    def clear(self) -> None:
        self._schema = self._source = self._folder = None
        self._open = {}
        self._overlay = TableMapState(self.descriptor)


# ============================================================================ building
def build(folder: Path, element: BroadcastElement, key_columns: Sequence[str],
          columns: Sequence[str] | None, shards: int) -> None:
    """Write ``element``'s rows (``columns`` of them) as ``shards`` sorted shard files in
    ``folder``, unless they are there; one process builds, the others wait."""
    if (folder / "_DONE").exists():
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock = folder.with_name(folder.name + ".lock")
    deadline = time.monotonic() + BUILD_WAIT_S
    while True:
        try:
            lock.mkdir()
            break
        except FileExistsError:
            if (folder / "_DONE").exists():
                return
            if _stale(lock):
                shutil.rmtree(lock, ignore_errors=True)
                continue
            if time.monotonic() > deadline:
                raise TimeoutError(f"shard files {folder}: another process has held "
                                   f"{lock} for {BUILD_WAIT_S:.0f} s; remove it") from None
            time.sleep(0.05)
    try:
        (lock / "pid").write_text(str(os.getpid()))
        if (folder / "_DONE").exists():
            return
        _write(folder, element, list(key_columns), columns, shards)
        _prune(folder)
    finally:
        shutil.rmtree(lock, ignore_errors=True)


def _write(folder: Path, element: BroadcastElement, keys: list[str],
           columns: Sequence[str] | None, shards: int) -> None:
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
    schema: pa.Schema | None = None
    try:
        for part in _parts(element, columns):
            schema = part.schema
            valid = pc.and_(*[pc.is_valid(part.column(k)) for k in keys]) if len(keys) > 1 \
                else pc.is_valid(part.column(keys[0]))
            part = part.filter(valid)
            if not part.num_rows:
                continue
            shard = shard_of([part.column(k) for k in keys], shards)
            for s in np.unique(shard):
                w = writers.get(int(s))
                if w is None:
                    w = writers[int(s)] = pa.ipc.new_stream(str(tmp / f"part-{s}"),
                                                            part.schema)
                w.write_table(part.filter(pa.array(shard == s)))
    finally:
        for w in writers.values():
            w.close()
    if schema is None:
        schema = _element_schema(element, columns)
    counts = {}
    for s in range(shards):
        src = tmp / f"part-{s}"
        if src.exists():
            with pa.ipc.open_stream(str(src)) as r:
                table = r.read_all()
            src.unlink()
        else:
            table = schema.empty_table()
        table = _last_per_key(table, keys)
        hashes = key_hash64([table.column(k) for k in keys]) if table.num_rows else \
            np.zeros(0, dtype=np.uint64)
        order = np.argsort(hashes, kind="stable")
        table = table.take(pa.array(order)).append_column(HASH, pa.array(hashes[order]))
        table = table.combine_chunks()
        with pa.OSFile(str(tmp / f"shard-{s}.arrow"), "wb") as f, \
                pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table, max_chunksize=max(1, table.num_rows))
        counts[s] = table.num_rows
    (tmp / "_DONE").write_text(json.dumps({"rows": counts}))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)


def _parts(element: BroadcastElement, columns: Sequence[str] | None) -> Iterator[pa.Table]:
    """The element's rows, a file at a time when it is a file list."""
    files = getattr(element, "files", None)
    if files is not None and getattr(element, "_rows", None) is None:
        for part in files.parts():
            yield part.select(list(columns)) if columns else part
        return
    rows = element.rows
    if CHANGE_TYPE in rows.column_names:
        rows = rows.drop_columns([CHANGE_TYPE])
    yield rows.select(list(columns)) if columns else rows


def _element_schema(element: BroadcastElement, columns: Sequence[str] | None) -> pa.Schema:
    schema = element.schema
    if CHANGE_TYPE in schema.names:
        schema = schema.remove(schema.get_field_index(CHANGE_TYPE))
    return pa.schema([schema.field(c) for c in columns]) if columns else schema


def _last_per_key(table: pa.Table, keys: list[str]) -> pa.Table:
    """One row per key, the last one (as a state applying the rows in order keeps)."""
    if table.num_rows < 2:
        return table
    import pandas as pd

    frame = pd.DataFrame({k: table.column(k).to_numpy(zero_copy_only=False) for k in keys})
    dup = frame.duplicated(keep="last").to_numpy()
    return table.filter(pa.array(~dup)) if dup.any() else table


def _is_in(table: pa.Table, values: pa.Table) -> np.ndarray:
    """Which rows of ``table`` have a key of ``values`` (same key columns)."""
    if len(table.column_names) == 1:
        c = table.column_names[0]
        return np.asarray(pc.fill_null(pc.is_in(table.column(c), value_set=values.column(
            c).cast(table.schema.field(c).type)), False))
    import pandas as pd

    def index(t: pa.Table) -> pd.MultiIndex:
        return pd.MultiIndex.from_arrays([canonical(t.column(c)).to_numpy(zero_copy_only=False)
                                          for c in table.column_names])

    return np.asarray(index(table).isin(index(values)))


def _stale(lock: Path) -> bool:
    """Whether the process that took ``lock`` is gone (killed while building)."""
    try:
        pid = int((lock / "pid").read_text())
    except (OSError, ValueError):  # not written yet: stale only when old
        try:
            return time.time() - lock.stat().st_mtime > 60
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _prune(folder: Path) -> None:
    """Remove the older bases of the same state (``<name>@...`` beside it)."""
    stem = folder.name.rsplit("@", 1)[0]
    for other in folder.parent.glob(f"{stem}@*"):
        if other != folder and other.is_dir() and not other.name.endswith(".lock") \
                and ".tmp-" not in other.name:
            shutil.rmtree(other, ignore_errors=True)


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
