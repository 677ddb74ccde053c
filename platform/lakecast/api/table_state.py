"""A table-shaped broadcast map state stored column-wise in Arrow (:class:`TableMapState`)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakecast.api.descriptors import MapStateDescriptor, StateDeclarationError
from lakecast.api.element import BroadcastElement, split_changes
from lakecast.api.frozen import freeze
from lakecast.api.state import BroadcastState

if TYPE_CHECKING:
    import pandas as pd

class TableMapState(BroadcastState):
    """A table-shaped broadcast map state: rows keyed by ``key_columns``, stored in Arrow.

    Layout: a *base* Arrow table with a hash index over its keys (built once) and a
    liveness mask, plus a small *overlay* table of rows upserted since the base was
    built. An increment touching k keys costs O(k) (mark k base rows dead, rebuild
    the small overlay), not O(state); the overlay is folded into a new base when it
    grows past ``compact_ratio`` of the base. Lookups (:meth:`lookup`) probe both hash
    indexes and ``take`` the rows — no per-row Python. The dict-like API
    (``get``/``put``/``remove``) also works; single writes are buffered and folded in on
    the next read.
    """

    compact_ratio = 0.25

    def __init__(self, descriptor: MapStateDescriptor) -> None:
        if not descriptor.key_columns:
            raise StateDeclarationError(f"state {descriptor.name!r} has no key_columns")
        self.descriptor = descriptor
        self.key_columns = list(descriptor.key_columns)
        self._base: pa.Table | None = None
        self._base_index: pd.Index | None = None
        self._alive: np.ndarray | None = None  # None: every base row is alive
        self._over: pa.Table | None = None
        self._over_index: pd.Index | None = None
        self._view: pa.Table | None = None  # cached compacted view
        self._puts: dict[Any, Any] = {}
        self._removes: set[Any] = set()

    # -- internals -----------------------------------------------------------------
    def _make_index(self, table: pa.Table) -> pd.Index:
        import pandas as pd

        cols = [_to_numpy(table.column(c)) for c in self.key_columns]
        if len(cols) == 1:
            return pd.Index(cols[0])
        return pd.MultiIndex.from_arrays(cols)

    def _dedup(self, ups: pa.Table | None) -> tuple[pa.Table | None, pd.Index | None]:
        if ups is None or not ups.num_rows:
            return None, None
        idx = self._make_index(ups)
        if not idx.is_unique:  # several rows for one key in one element: the last one wins
            dup = idx.duplicated(keep="last")
            ups, idx = ups.filter(pa.array(~dup)), idx[~dup]
        return ups, idx

    def _flush(self) -> None:
        if not self._puts and not self._removes:
            return
        puts, removes = self._puts, self._removes
        self._puts, self._removes = {}, set()
        rows = []
        for key, value in puts.items():
            row = dict(value) if isinstance(value, Mapping) else {"value": value}
            kv = key if len(self.key_columns) > 1 else (key,)
            row.update(zip(self.key_columns, kv, strict=True))
            rows.append(row)
        schema = self.schema_now()
        ups = pa.Table.from_pylist(rows, schema=schema) if rows else None
        dels = None
        if removes:
            keys = [k if len(self.key_columns) > 1 else (k,) for k in removes]
            cols = list(zip(*keys, strict=True))
            dels = pa.table({c: pa.array(list(v)) for c, v in zip(self.key_columns, cols,
                                                                   strict=True)})
        self._merge(ups, dels, replace=False)

    def schema_now(self) -> pa.Schema | None:
        return None if self._base is None else self._base.schema

    def _merge(self, ups: pa.Table | None, dels: pa.Table | None, replace: bool) -> None:
        ups, idx = self._dedup(ups)
        self._view = None
        if replace or self._base is None:
            self._base = ups.combine_chunks() if ups is not None else None
            self._base_index, self._alive = idx, None
            self._over = self._over_index = None
            return
        assert self._base_index is not None
        if ups is not None and ups.schema != self._base.schema:
            ups = ups.select(self._base.column_names).cast(self._base.schema)
        gone_parts = [i for i in (self._make_index(dels) if dels is not None and dels.num_rows
                                  else None, idx) if i is not None]
        if not gone_parts:
            return
        gone = gone_parts[0] if len(gone_parts) == 1 else gone_parts[0].append(gone_parts[1])
        pos = self._base_index.get_indexer(gone) if self._base_index.is_unique else \
            np.flatnonzero(self._base_index.isin(gone))
        pos = pos[pos >= 0]
        if len(pos):
            alive = (np.ones(self._base.num_rows, dtype=bool) if self._alive is None
                     else self._alive.copy())
            alive[pos] = False
            self._alive = alive
        over, over_index = self._over, self._over_index
        if over is not None and over_index is not None:
            keep = ~over_index.isin(gone)
            if not keep.all():
                over, over_index = over.filter(pa.array(keep)), over_index[keep]
        if ups is not None:
            over = ups if over is None else pa.concat_tables([over, ups]).combine_chunks()
            over_index = idx if over_index is None else over_index.append(idx)
        self._over, self._over_index = over, over_index
        if over is not None and over.num_rows > self.compact_ratio * max(self._base.num_rows,
                                                                         1024):
            self._compact()

    def _compact(self) -> None:
        table = self.to_arrow()
        self._base, self._base_index = table, self._make_index(table)
        self._alive = None
        self._over = self._over_index = None

    def _position(self, key: Hashable) -> tuple[str, int]:
        """Where the key's row lives: ("over" | "base", position) or ("", -1)."""
        self._flush()
        for where, index in (("over", self._over_index), ("base", self._base_index)):
            if index is None:
                continue
            try:
                pos = index.get_loc(key)
            except (KeyError, TypeError):
                continue
            if not isinstance(pos, int | np.integer):
                continue
            if where == "base" and self._alive is not None and not self._alive[pos]:
                return "", -1
            return where, int(pos)
        return "", -1

    # -- reads ---------------------------------------------------------------------
    def get(self, key: Hashable, default: Any = None) -> Any:
        where, pos = self._position(key)
        if pos < 0:
            return default
        table = self._over if where == "over" else self._base
        assert table is not None
        return freeze(table.slice(pos, 1).to_pylist()[0])

    def __len__(self) -> int:
        self._flush()
        if self._base is None:
            return 0
        n = self._base.num_rows if self._alive is None else int(self._alive.sum())
        return n + (0 if self._over is None else self._over.num_rows)

    def keys(self) -> list[Any]:
        table = self.to_arrow()
        if not table.num_rows:
            return []
        return list(self._make_index(table))

    def items(self) -> list[tuple[Any, Any]]:
        table = self.to_arrow()
        return list(zip(self.keys(), (freeze(r) for r in table.to_pylist()), strict=True))

    def to_arrow(self) -> pa.Table:
        """The whole state as an (immutable) Arrow table."""
        self._flush()
        if self._base is None:
            return pa.table({c: pa.array([], pa.null()) for c in self.key_columns})
        if self._view is None:
            base = self._base if self._alive is None else self._base.filter(pa.array(self._alive))
            self._view = base if self._over is None else pa.concat_tables(
                [base, self._over]).combine_chunks()
        return self._view

    @property
    def schema(self) -> pa.Schema | None:
        self._flush()
        return self.schema_now()

    def lookup(
        self, keys: Sequence[pa.Array | pa.ChunkedArray], columns: Sequence[str]
    ) -> tuple[pa.Table, np.ndarray]:
        """Vectorized lookup: rows of ``columns`` for each probe key (nulls where missing),
        and a boolean numpy mask of which probe keys were found."""
        import pandas as pd

        self._flush()
        n = len(keys[0])
        if self._base is None or self._base_index is None:
            return pa.table({c: pa.nulls(n) for c in columns}), np.zeros(n, dtype=bool)
        null_mask = None
        probes = []
        for col, arr in zip(self.key_columns, keys, strict=True):
            target = self._base.schema.field(col).type
            if arr.type != target:
                arr = pc.cast(arr, target)
            if arr.null_count:
                m = np.asarray(pc.is_null(arr))
                null_mask = m if null_mask is None else (null_mask | m)
                arr = pc.fill_null(arr, self._base.column(col)[0])
            probes.append(_to_numpy(arr))
        probe = pd.Index(probes[0]) if len(probes) == 1 else pd.MultiIndex.from_arrays(probes)
        pos = self._base_index.get_indexer(probe)
        if self._alive is not None:
            pos = np.where((pos >= 0) & self._alive[np.maximum(pos, 0)], pos, -1)
        base = self._base.select(list(columns))
        hit = None
        if self._over is not None and self._over_index is not None:
            opos = self._over_index.get_indexer(probe)
            hit = opos >= 0
            if null_mask is not None:
                hit &= ~null_mask
            if not hit.any():
                hit = None
        found = pos >= 0
        if null_mask is not None:
            found &= ~null_mask
        if hit is not None:
            found &= ~hit  # base rows that are not shadowed by the overlay
        indices = pa.array(pos) if found.all() else pa.array(pos, mask=~found)
        taken = base.take(indices)
        if hit is None:
            return taken, found
        # overlay rows: a second take and a select (a take over base + overlay chunks would
        # concatenate the whole base first)
        over = self._over.select(list(columns)).take(pa.array(np.maximum(opos, 0)))
        h = pa.array(hit)
        taken = pa.Table.from_arrays(
            [pc.if_else(h, over.column(c), taken.column(c)) for c in columns],
            schema=taken.schema) if len(columns) else taken
        return taken, found | hit

    def nbytes(self) -> int:
        self._flush()
        total = 0
        for t, i in ((self._base, self._base_index), (self._over, self._over_index)):
            if t is not None:
                total += t.nbytes
            if i is not None:
                total += i.memory_usage()
        return int(total + (self._alive.nbytes if self._alive is not None else 0))

    # -- writes --------------------------------------------------------------------
    def put(self, key: Hashable, value: Any) -> None:
        self._removes.discard(key)
        self._puts[key] = value

    def remove(self, key: Hashable) -> None:
        self._puts.pop(key, None)
        self._removes.add(key)

    def clear(self) -> None:
        self._puts, self._removes = {}, set()
        self._base = self._base_index = self._alive = None
        self._over = self._over_index = self._view = None

    def put_table(self, table: pa.Table, replace: bool = False) -> None:
        """Upsert every row of ``table`` (keyed by the key columns); ``replace`` drops the rest."""
        self._flush()
        self._merge(table, None, replace=replace)

    def apply(
        self,
        element: BroadcastElement,
        key_columns: Sequence[str] | str | None = None,
        value_columns: Sequence[str] | str | None = None,
    ) -> None:
        if key_columns is not None and list(
            [key_columns] if isinstance(key_columns, str) else key_columns
        ) != self.key_columns:
            raise StateDeclarationError(
                f"state {self.descriptor.name!r} is keyed by {self.key_columns}, not {key_columns}"
            )
        self._flush()
        if element.kind == "changes" and not element.rows.num_rows:
            return
        ups, dels = split_changes(element)
        if value_columns is not None:
            vc = [value_columns] if isinstance(value_columns, str) else list(value_columns)
            ups = ups.select(self.key_columns + [c for c in vc if c not in self.key_columns])
        self._merge(ups, dels, replace=element.kind == "full")


def _to_numpy(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type):
        return arr.to_numpy(zero_copy_only=False)
    return np.asarray(arr.to_pandas())
