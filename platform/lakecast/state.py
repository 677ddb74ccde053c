"""Broadcast map states: a dict-backed map and a column-wise (Arrow) table-shaped map.

Values are stored *deep-frozen* (dicts -> :class:`FrozenDict`, lists -> :class:`FrozenList`,
sets -> ``frozenset``), so a value handed out can never be mutated in place — change a
value by putting a new one from ``process_broadcast_element``. The read-only view
(:class:`ReadOnlyBroadcastState`) additionally refuses ``put``/``put_all``/``remove``/
``clear``/``apply`` with :class:`~lakecast.api.ReadOnlyStateError`.
Objects of other classes are stored as given: make them immutable (frozen dataclasses).
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakecast.api import MapStateDescriptor, ReadOnlyStateError, StateDeclarationError

if TYPE_CHECKING:
    import pandas as pd

    from lakecast.source import BroadcastElement

CHANGE_TYPE = "_change_type"
_UPSERT_TYPES = ("insert", "update_postimage")
_SENTINEL = object()


# --------------------------------------------------------------------------- freezing
def _frozen_error(what: str) -> NoReturn:
    raise ReadOnlyStateError(
        f"broadcast state values are immutable ({what}); build a new value and put() it "
        "from process_broadcast_element"
    )


class FrozenDict(dict):
    """A ``dict`` whose every mutator raises :class:`ReadOnlyStateError`."""

    __slots__ = ()

    def _ro(self, *_: Any, **__: Any) -> NoReturn:
        _frozen_error("dict value")

    __setitem__ = __delitem__ = __ior__ = _ro  # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = _ro  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items(), key=repr)))

    def thaw(self) -> dict[str, Any]:
        """A mutable deep copy."""
        return thaw(self)


class FrozenList(tuple):
    """A ``tuple`` standing in for a list value; list mutators raise :class:`ReadOnlyStateError`."""

    __slots__ = ()

    def _ro(self, *_: Any, **__: Any) -> NoReturn:
        _frozen_error("list value")

    append = extend = insert = remove = pop = clear = sort = reverse = _ro

    def __eq__(self, other: object) -> bool:  # equal to a list with the same items
        if isinstance(other, list):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other,
                                                                          strict=False))
        return tuple.__eq__(self, other)  # type: ignore[arg-type]

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = tuple.__hash__
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _ro  # type: ignore[assignment]


def freeze(value: Any) -> Any:
    """Deep-freeze dicts, lists, sets and bytearrays (other values are returned as they are)."""
    if isinstance(value, FrozenDict | FrozenList | str | bytes | int | float | bool | None):
        return value
    if isinstance(value, Mapping):
        return FrozenDict((k, freeze(v)) for k, v in value.items())
    if isinstance(value, tuple):
        return tuple(freeze(v) for v in value)
    if isinstance(value, list):
        return FrozenList(freeze(v) for v in value)
    if isinstance(value, set | frozenset):
        return frozenset(freeze(v) for v in value)
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def thaw(value: Any) -> Any:
    """A mutable deep copy of a frozen value."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, FrozenList):
        return [thaw(v) for v in value]
    if isinstance(value, frozenset):
        return {thaw(v) for v in value}
    return value


# --------------------------------------------------------------------------- the map API
class BroadcastState:
    """Read-write broadcast map state (what :class:`~lakecast.api.Context` hands out)."""

    descriptor: MapStateDescriptor

    # reads
    def get(self, key: Hashable, default: Any = None) -> Any:
        raise NotImplementedError

    def contains(self, key: Hashable) -> bool:
        return self.get(key, _SENTINEL) is not _SENTINEL

    def __contains__(self, key: object) -> bool:
        return self.contains(key)  # type: ignore[arg-type]

    def __getitem__(self, key: Hashable) -> Any:
        value = self.get(key, _SENTINEL)
        if value is _SENTINEL:
            raise KeyError(key)
        return value

    def __len__(self) -> int:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())

    def keys(self) -> list[Any]:
        raise NotImplementedError

    def items(self) -> list[tuple[Any, Any]]:
        raise NotImplementedError

    def values(self) -> list[Any]:
        return [v for _, v in self.items()]

    def immutable_entries(self) -> list[tuple[Any, Any]]:
        """Flink's ``immutableEntries()``: the (key, frozen value) pairs."""
        return self.items()

    def is_empty(self) -> bool:
        return len(self) == 0

    def nbytes(self) -> int:
        """Estimated in-memory size of the state in bytes."""
        raise NotImplementedError

    # writes
    def put(self, key: Hashable, value: Any) -> None:
        raise NotImplementedError

    def put_all(self, entries: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> None:
        items = entries.items() if isinstance(entries, Mapping) else entries
        for k, v in items:
            self.put(k, v)

    def remove(self, key: Hashable) -> None:
        raise NotImplementedError

    def clear(self) -> None:
        raise NotImplementedError

    def apply(
        self,
        element: BroadcastElement,
        key_columns: Sequence[str] | str | None = None,
        value_columns: Sequence[str] | str | None = None,
    ) -> None:
        """Apply a Delta :class:`~lakecast.source.BroadcastElement`: a ``full`` element replaces
        the state, a ``changes`` element upserts inserts/post-images and removes deletes.

        Keys come from ``key_columns`` (a tuple key when several); values are the row as a
        frozen dict of ``value_columns`` (all columns by default), or a scalar when
        ``value_columns`` is one column name.
        """
        raise NotImplementedError


def _key_names(
    key_columns: Sequence[str] | str | None, descriptor: MapStateDescriptor
) -> list[str]:
    if key_columns is None:
        key_columns = descriptor.key_columns
    if isinstance(key_columns, str):
        key_columns = [key_columns]
    if not key_columns:
        raise StateDeclarationError(
            f"state {descriptor.name!r}: apply() needs key_columns "
            "(or a descriptor with key_columns)"
        )
    return list(key_columns)


def split_changes(element: BroadcastElement) -> tuple[pa.Table, pa.Table]:
    """(upsert rows, delete rows) of an element, without the change-type column."""
    rows = element.rows
    if CHANGE_TYPE not in rows.column_names:
        return rows, rows.slice(0, 0)
    ct = rows.column(CHANGE_TYPE)
    ups = rows.filter(pc.is_in(ct, pa.array(_UPSERT_TYPES))).drop_columns([CHANGE_TYPE])
    dels = rows.filter(pc.equal(ct, "delete")).drop_columns([CHANGE_TYPE])
    return ups, dels


def _row_keys(table: pa.Table, key_columns: Sequence[str]) -> list[Any]:
    cols = [table.column(c).to_pylist() for c in key_columns]
    return cols[0] if len(cols) == 1 else list(zip(*cols, strict=True))


class DictMapState(BroadcastState):
    """A broadcast map state backed by a Python ``dict`` (rules, flags, models, configs)."""

    def __init__(self, descriptor: MapStateDescriptor) -> None:
        self.descriptor = descriptor
        self._data: dict[Any, Any] = {}

    def get(self, key: Hashable, default: Any = None) -> Any:
        return self._data.get(key, default)

    def contains(self, key: Hashable) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def keys(self) -> list[Any]:
        return list(self._data)

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._data.items())

    def put(self, key: Hashable, value: Any) -> None:
        self._data[freeze(key)] = freeze(value)

    def remove(self, key: Hashable) -> None:
        self._data.pop(key, None)

    def clear(self) -> None:
        self._data.clear()

    def apply(
        self,
        element: BroadcastElement,
        key_columns: Sequence[str] | str | None = None,
        value_columns: Sequence[str] | str | None = None,
    ) -> None:
        keys = _key_names(key_columns, self.descriptor)
        if element.kind == "changes" and not element.rows.num_rows:
            return
        ups, dels = split_changes(element)
        if element.kind == "full":
            self._data.clear()
        for k in _row_keys(dels, keys):
            self._data.pop(k, None)
        if isinstance(value_columns, str):
            values: list[Any] = ups.column(value_columns).to_pylist()
        else:
            sel = ups.select(list(value_columns)) if value_columns else ups
            values = [FrozenDict(r) for r in sel.to_pylist()]
        for k, v in zip(_row_keys(ups, keys), values, strict=True):
            self._data[k] = freeze(v)

    def nbytes(self) -> int:
        n = len(self._data)
        if not n:
            return sys.getsizeof(self._data)
        sample = list(self._data.items())[: min(n, 200)]
        per = sum(_deep_size(k) + _deep_size(v) for k, v in sample) / len(sample)
        return int(sys.getsizeof(self._data) + per * n)


def _deep_size(value: Any, depth: int = 0) -> int:
    size = sys.getsizeof(value)
    if depth > 4:
        return size
    if isinstance(value, Mapping):
        size += sum(_deep_size(k, depth + 1) + _deep_size(v, depth + 1) for k, v in value.items())
    elif isinstance(value, list | tuple | set | frozenset):
        size += sum(_deep_size(v, depth + 1) for v in value)
    return size


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


# --------------------------------------------------------------------------- read-only view
class ReadOnlyBroadcastState:
    """Read-only view of a broadcast state (what :class:`~lakecast.api.ReadOnlyContext`
    hands out). Reads delegate; every write path raises :class:`ReadOnlyStateError`."""

    __slots__ = ("_state",)

    def __init__(self, state: BroadcastState) -> None:
        object.__setattr__(self, "_state", state)

    @property
    def descriptor(self) -> MapStateDescriptor:
        return self._state.descriptor

    def _denied(self, op: str) -> NoReturn:
        raise ReadOnlyStateError(
            f"broadcast state {self._state.descriptor.name!r} is read-only here: {op}() is only "
            "allowed in process_broadcast_element (Context), never in process_element / "
            "process_batch (ReadOnlyContext) — every task must hold the same state"
        )

    def put(self, key: Any, value: Any) -> NoReturn:
        self._denied("put")

    def put_all(self, entries: Any) -> NoReturn:
        self._denied("put_all")

    def remove(self, key: Any) -> NoReturn:
        self._denied("remove")

    def clear(self) -> NoReturn:
        self._denied("clear")

    def apply(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._denied("apply")

    def put_table(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._denied("put_table")

    def __setitem__(self, key: Any, value: Any) -> NoReturn:
        self._denied("__setitem__")

    def __delitem__(self, key: Any) -> NoReturn:
        self._denied("__delitem__")

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        self._denied(f"setattr {name}")

    def get(self, key: Hashable, default: Any = None) -> Any:
        return self._state.get(key, default)

    def contains(self, key: Hashable) -> bool:
        return self._state.contains(key)

    def __contains__(self, key: object) -> bool:
        return self._state.contains(key)  # type: ignore[arg-type]

    def __getitem__(self, key: Hashable) -> Any:
        return self._state[key]

    def __len__(self) -> int:
        return len(self._state)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._state.keys())

    def keys(self) -> list[Any]:
        return self._state.keys()

    def values(self) -> list[Any]:
        return self._state.values()

    def items(self) -> list[tuple[Any, Any]]:
        return self._state.items()

    def immutable_entries(self) -> list[tuple[Any, Any]]:
        return self._state.immutable_entries()

    def is_empty(self) -> bool:
        return self._state.is_empty()

    # table-shaped extras (Arrow tables are immutable)
    def to_arrow(self) -> pa.Table:
        return self._table_state().to_arrow()

    def lookup(
        self, keys: Sequence[pa.Array | pa.ChunkedArray], columns: Sequence[str]
    ) -> tuple[pa.Table, np.ndarray]:
        return self._table_state().lookup(keys, columns)

    @property
    def schema(self) -> pa.Schema | None:
        return self._table_state().schema

    def _table_state(self) -> TableMapState:
        if not isinstance(self._state, TableMapState):
            raise TypeError(
                f"state {self._state.descriptor.name!r} is not table-shaped (declare key_columns)"
            )
        return self._state


# --------------------------------------------------------------------------- the store
class StateStore:
    """All broadcast states of one task-local function instance, plus applied versions."""

    def __init__(self, descriptors: Sequence[MapStateDescriptor]) -> None:
        self.states: dict[str, BroadcastState] = {}
        self.descriptors: dict[str, MapStateDescriptor] = {}
        for d in descriptors:
            if d.name in self.descriptors:
                raise StateDeclarationError(f"broadcast state {d.name!r} is declared twice")
            self.descriptors[d.name] = d
            self.states[d.name] = TableMapState(d) if d.table_shaped else DictMapState(d)
        #: applied Delta version of each broadcast table
        self.versions: dict[str, int] = {}
        self.elements_applied = 0
        self.rows_applied = 0

    def state(self, descriptor: MapStateDescriptor) -> BroadcastState:
        declared = self.descriptors.get(descriptor.name)
        if declared is None:
            raise StateDeclarationError(
                f"broadcast state {descriptor.name!r} is not declared in state_descriptors() "
                f"(declared: {sorted(self.descriptors)})"
            )
        if declared != descriptor:
            raise StateDeclarationError(
                f"broadcast state {descriptor.name!r} is used with a descriptor that differs "
                f"from the declared one: {descriptor} != {declared}"
            )
        return self.states[descriptor.name]

    def nbytes(self) -> int:
        return sum(s.nbytes() for s in self.states.values())

    def snapshot(self) -> dict[str, dict[Any, Any]]:
        """Plain-Python copy of every state ``{name: {key: value}}`` (for tests and debugging)."""
        return {name: {k: thaw(v) for k, v in s.items()} for name, s in self.states.items()}
