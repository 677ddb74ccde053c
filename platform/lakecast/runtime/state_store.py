"""The broadcast states of one task-local function instance (:class:`StateStore`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lakecast.api.descriptors import MapStateDescriptor, StateDeclarationError
from lakecast.api.frozen import thaw
from lakecast.api.state import BroadcastState, DictMapState
from lakecast.api.table_state import TableMapState
from lakecast.runtime.sharded_state import ShardedTableState


# --------------------------------------------------------------------------- the store
class StateStore:
    """All broadcast states of one task-local function instance, plus applied versions."""

    def __init__(self, descriptors: Sequence[MapStateDescriptor],
                 namespace: str | None = None) -> None:
        """``namespace``: names the files of sharded states apart (the function id)."""
        self.states: dict[str, BroadcastState] = {}
        self.descriptors: dict[str, MapStateDescriptor] = {}
        for d in descriptors:
            if d.name in self.descriptors:
                raise StateDeclarationError(f"broadcast state {d.name!r} is declared twice")
            self.descriptors[d.name] = d
            self.states[d.name] = (ShardedTableState(d, namespace) if d.shards else
                                   TableMapState(d) if d.table_shaped else DictMapState(d))
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

    def begin_task(self) -> None:
        """A task starts: sharded states count the shards it reads from now on."""
        for s in self.states.values():
            if isinstance(s, ShardedTableState):
                s.touched = set()

    def prepare(self) -> None:
        """Build the shard files of sharded states' bases on this machine (a warm-up)."""
        for s in self.states.values():
            if isinstance(s, ShardedTableState):
                s.prepare()

    def shards_read(self) -> list[int]:
        """The shards of sharded states read since :meth:`begin_task`."""
        return sorted({i for s in self.states.values() if isinstance(s, ShardedTableState)
                       for i in s.touched})

    def snapshot(self) -> dict[str, dict[Any, Any]]:
        """Plain-Python copy of every state ``{name: {key: value}}`` (for tests and debugging)."""
        return {name: {k: thaw(v) for k, v in s.items()} for name, s in self.states.items()}
