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
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakecast.api.descriptors import MapStateDescriptor, StateDeclarationError
from lakecast.api.element import split_changes
from lakecast.api.frozen import FrozenDict, freeze

if TYPE_CHECKING:

    from lakecast.api.element import BroadcastElement

_SENTINEL = object()



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
        """Apply a Delta :class:`~lakecast.api.element.BroadcastElement`: a ``full`` element
        replaces the state, a ``changes`` element upserts inserts/post-images and removes deletes.

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


