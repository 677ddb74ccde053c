"""The files of a sharded state's base (:mod:`lakecast.runtime.sharded_state`).

A base (a full version of a table) is written once per machine as one Arrow IPC file per
shard, each sorted by :data:`HASH` (:func:`~lakecast.runtime.shards.key_hash64` of the
key), in a folder named by the state, the base and the shard count (:func:`build`): the
first process that needs it takes a lock (a folder: ``<base>.lock`` with its pid), reads
the base one file at a time, splits each by shard into streams, then sorts and writes
one shard at a time, and publishes the folder by renaming it whole; the others wait for
it. A lock whose process is gone (killed while building) is taken over. A task opens the
shard files it reads memory-mapped (:class:`Shard`): the Python workers of a machine
share their pages. Building a base removes the older bases of the same state beside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakecast.api.element import CHANGE_TYPE, BroadcastElement
from lakecast.runtime.shards import canonical, key_hash64, shard_of

#: a shard file's column of the sorted key hashes
HASH = "__lakecast_h"
#: how long a task waits for another process building the same base (seconds)
BUILD_WAIT_S = 1800.0
#: shard streams open at once while a base is split (more shards: more passes over it)
OPEN_WRITERS = 256


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
        column = table.column(HASH)  # one chunk (zero copy) unless a column outgrew one
        hashes = (column.chunk(0).to_numpy(zero_copy_only=True) if column.num_chunks == 1
                  else np.concatenate([np.zeros(0, np.uint64),
                                       *(c.to_numpy() for c in column.chunks)]))
        if len(hashes) != table.num_rows:
            raise OSError(f"shard file {path}: {len(hashes)} hashes for {table.num_rows} rows")
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


def build(folder: Path, element: BroadcastElement, key_columns: Sequence[str],
          columns: Sequence[str] | None, shards: int) -> None:
    """Write ``element``'s rows (``columns`` of them) as ``shards`` sorted shard files in
    ``folder``, unless they are there; one process builds, the others wait."""
    done = folder / "_DONE"
    if done.exists():
        return
    with _exclusive(folder, done.exists) as mine:
        if mine:
            _write(folder, element, list(key_columns), columns, shards)
            _prune(folder)


def computed_once(path: Path, compute: Callable[[], pa.Table]) -> pa.Table:
    """``compute()``'s table, written to ``path`` (Arrow IPC) by the first process of the
    machine that needs it; the others wait for it and read it, memory-mapped."""
    if not path.exists():
        with _exclusive(path, path.exists) as mine:
            if mine:
                table = compute()
                tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
                with pa.OSFile(str(tmp), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
                    w.write_table(table)
                os.replace(tmp, path)
                return table
    return pa.ipc.open_file(pa.memory_map(str(path))).read_all()


@contextlib.contextmanager
def _exclusive(target: Path, done: Callable[[], bool]) -> Iterator[bool]:
    """Hold ``<target>.lock`` (an exclusive ``flock``, released by the system when its
    process ends, killed or not): yields ``True`` when this process must make ``target``,
    ``False`` when another made it meanwhile (``done``). What a killed maker left half
    written (``<target>.tmp-<pid>``) is removed first. Waiting longer than
    :data:`BUILD_WAIT_S` raises."""
    import fcntl

    target.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + BUILD_WAIT_S
    with open(target.with_name(target.name + ".lock"), "a") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if done():
                    yield False
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{target}: another process has been making it for "
                                       f"{BUILD_WAIT_S:.0f} s") from None
                time.sleep(0.05)
        try:
            if done():
                yield False
                return
            for half in target.parent.glob(f"{target.name}.tmp-*"):
                shutil.rmtree(half, ignore_errors=True) if half.is_dir() else half.unlink()
            yield True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write(folder: Path, element: BroadcastElement, keys: list[str],
           columns: Sequence[str] | None, shards: int) -> None:
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    schema: pa.Schema | None = None
    for group in range(0, shards, OPEN_WRITERS):  # a pass over the base per group
        schema = _split(element, columns, keys, shards, range(group, min(
            shards, group + OPEN_WRITERS)), tmp) or schema
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


def _split(element: BroadcastElement, columns: Sequence[str] | None, keys: list[str],
           shards: int, group: range, tmp: Path) -> pa.Schema | None:
    """Append the base's rows of the shards of ``group`` to one stream each in ``tmp``
    (``part-<shard>``), a file of the base at a time; the rows' schema (``None``: no
    file)."""
    writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
    schema = None
    try:
        for part in _parts(element, columns):
            schema = part.schema
            valid = pc.is_valid(part.column(keys[0]))
            for k in keys[1:]:
                valid = pc.and_(valid, pc.is_valid(part.column(k)))
            part = part.filter(valid)
            if not part.num_rows:
                continue
            shard = shard_of([part.column(k) for k in keys], shards)
            order = np.argsort(shard, kind="stable")  # one take, then a slice per shard
            part, counts = part.take(pa.array(order)), np.bincount(shard, minlength=shards)
            starts = np.concatenate([[0], np.cumsum(counts)])
            for s in group:
                if not counts[s]:
                    continue
                w = writers.get(s)
                if w is None:
                    w = writers[s] = pa.ipc.new_stream(str(tmp / f"part-{s}"), part.schema)
                w.write_table(part.slice(int(starts[s]), int(counts[s])))
    finally:
        for w in writers.values():
            w.close()
    return schema


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


def _prune(folder: Path) -> None:
    """Remove the older bases of the same state (``<name>@...`` beside it)."""
    stem = folder.name.rsplit("@", 1)[0]
    for other in folder.parent.glob(f"{stem}@*"):
        if other != folder and other.is_dir() and ".tmp-" not in other.name:
            shutil.rmtree(other, ignore_errors=True)


def safe_name(name: str) -> str:
    """``name`` as a folder name (letters, digits, ``-_.``; anything else ``_``)."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
