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
table once: :meth:`ShardedTableState.to_arrow`, serialized once per machine:
:meth:`ShardedTableState.computed_once`). Folders of older bases of the same state are
removed when a newer base is built (a task still mapping one keeps its pages).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakecast.api.descriptors import MapStateDescriptor
from lakecast.api.element import CHANGE_TYPE, BroadcastElement, split_changes
from lakecast.api.frozen import freeze
from lakecast.api.table_state import TableMapState
from lakecast.runtime.shard_files import (
    HASH,
    Shard,
    build,
    computed_once,
    safe_name,
    shard_root,
)
from lakecast.runtime.shards import canonical, key_hash64, shard_of

#: the overlay's column marking a key deleted since the base
DEAD = "__lakecast_dead"


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
        name = name or (f"{safe_name(self.descriptor.name)}@v{element.version}"
                        f"-t{element.commit_timestamp}-n{self.shards}")
        self._folder = shard_root() / safe_name(self.namespace) / name
        self._open = {}
        self._overlay = TableMapState(self.descriptor)

    def prepare(self) -> None:
        """Build the base's shard files on this machine now (a warm-up), not at the first
        lookup."""
        if self._folder is not None and self._source is not None:
            build(self._folder, self._source, self.key_columns, self._value_columns,
                  self.shards)

    def computed_once(self, key: str, compute: Callable[[], pa.Table]) -> pa.Table:
        """``compute()`` for this state's content (its base and its changes since) and
        ``key``, made once per machine: what each task of a checkpoint makes of the same
        content (the others read it)."""
        if self._folder is None:
            return compute()
        self.prepare()
        digest = hashlib.sha256(key.encode())
        over = self._overlay.to_arrow() if self._overlay.schema is not None else None
        if over is not None and over.num_rows:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, over.schema) as w:
                w.write_table(over)
            digest.update(sink.getvalue().to_pybytes())
        return computed_once(self._folder / f"once-{digest.hexdigest()[:20]}.arrow", compute)

    def _shard(self, s: int, *, touch: bool = True) -> Shard:
        """Shard ``s`` of the base, built if this machine has not yet, mapped; ``touch``:
        counted as read by the task (:attr:`touched`)."""
        shard = self._open.get(s)
        if shard is None:
            assert self._folder is not None and self._source is not None
            build(self._folder, self._source, self.key_columns, self._value_columns,
                  self.shards)
            shard = Shard.open(self._folder / f"shard-{s}.arrow")
            if touch:
                self._open[s] = shard
        if touch:
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
        probe = []
        for col, arr in zip(self.key_columns, keys, strict=True):
            target = self._schema.field(col).type  # as the table's key (then hashed alike)
            probe.append(canonical(arr if arr.type == target else pc.cast(arr, target)))
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
        parts = [self._shard(s, touch=False).table.drop_columns([HASH])
                 for s in range(self.shards)]
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
        if not element.rows.num_rows:
            return
        ups, dels = split_changes(element)
        if self._schema is None:  # changes over an empty state (e.g. restored empty)
            empty = ups.slice(0, 0)
            self._set_base(BroadcastElement(self.descriptor.name, element.version - 1, 0,
                                            "full", empty), vc,
                           name=f"{safe_name(self.descriptor.name)}@empty-n{self.shards}")
            assert self._schema is not None
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
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        digest = hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()[:16]
        element = BroadcastElement(self.descriptor.name, 0, 0, "full", table)
        self._set_base(element, None, name=f"{safe_name(self.descriptor.name)}@c{digest}"
                                           f"-n{self.shards}")

    def put(self, key: Hashable, value: Any) -> None:
        raise NotImplementedError("a sharded state is written by its table's versions only")

    def remove(self, key: Hashable) -> None:
        raise NotImplementedError("a sharded state is written by its table's versions only")

    def clear(self) -> None:
        self._schema = self._source = self._folder = None
        self._open = {}
        self._overlay = TableMapState(self.descriptor)


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
