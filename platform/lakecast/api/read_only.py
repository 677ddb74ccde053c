"""The read-only view of a broadcast state: what ``process_element`` sees
(:class:`ReadOnlyBroadcastState`). Reads delegate; every write raises."""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from lakecast.api.descriptors import MapStateDescriptor, ReadOnlyStateError
from lakecast.api.state import BroadcastState
from lakecast.api.table_state import TableMapState

if TYPE_CHECKING:
    import pyarrow as pa

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
