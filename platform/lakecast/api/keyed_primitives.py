"""The keyed state a function author holds: interfaces, as in PyFlink's
``pyflink.datastream.state``.

``ctx.get_state(descriptor)`` and its siblings (:class:`~lakecast.api.keyed.KeyedReadOnlyContext`)
return a :class:`ValueState`, :class:`ListState`, :class:`MapState`,
:class:`ReducingState` or :class:`AggregatingState`: a view of the *current key's* state.
The contexts get it from the :class:`KeyedStateAccess` the runtime hands them at run time
(its keyed state backend, :mod:`lakecast.runtime.keyed_backend`, implements all of these),
so the API knows no runtime. Descriptors, TTL and schema evolution are in
:mod:`lakecast.api.keyed_state`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Iterator, Mapping
from typing import Any


class State(ABC):
    """A keyed state of the current key."""

    @abstractmethod
    def clear(self) -> None:
        """Remove this state of the current key."""


class ValueState(State):
    """One value of the current key."""

    @abstractmethod
    def value(self) -> Any:
        """The value (``None``: none, or expired)."""

    @abstractmethod
    def update(self, value: Any) -> None:
        """Set the value (``None`` clears it)."""


class AppendingState(State):
    """State that takes values one at a time and gives back what it holds."""

    @abstractmethod
    def get(self) -> Any:
        """What the current key holds."""

    @abstractmethod
    def add(self, value: Any) -> None:
        """Add ``value``."""


class ListState(AppendingState):
    """A list of values of the current key (TTL per element)."""

    @abstractmethod
    def get(self) -> list[Any]:
        """The values, oldest first."""

    @abstractmethod
    def add_all(self, values: Iterable[Any]) -> None:
        """Append ``values``."""

    @abstractmethod
    def update(self, values: Iterable[Any]) -> None:
        """Replace the values by ``values``."""

    def __iter__(self) -> Iterator[Any]:
        return iter(self.get())


class ReducingState(AppendingState):
    """One value of the current key, folded with the descriptor's ``reduce_function``."""


class AggregatingState(AppendingState):
    """An accumulator of the current key; ``get()`` returns the aggregate's result."""


class MapState(State):
    """A map of the current key (TTL per entry)."""

    @abstractmethod
    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value of ``key`` (``default``: none, or expired)."""

    @abstractmethod
    def contains(self, key: Hashable) -> bool:
        """Whether ``key`` has a value."""

    @abstractmethod
    def put(self, key: Hashable, value: Any) -> None:
        """Set the value of ``key``."""

    @abstractmethod
    def put_all(self, entries: Mapping[Any, Any]) -> None:
        """Set the values of ``entries``."""

    @abstractmethod
    def remove(self, key: Hashable) -> None:
        """Remove ``key``."""

    @abstractmethod
    def items(self) -> list[tuple[Any, Any]]:
        """The ``(key, value)`` pairs."""

    @abstractmethod
    def keys(self) -> list[Any]:
        """The keys."""

    @abstractmethod
    def values(self) -> list[Any]:
        """The values."""

    @abstractmethod
    def is_empty(self) -> bool:
        """Whether the map holds nothing."""

    def __contains__(self, key: Hashable) -> bool:
        return self.contains(key)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())


class KeyedStateAccess(ABC):
    """What the contexts need of a task's keyed state: the runtime hands one over (its
    keyed state backend) when it runs a function."""

    current_key: Hashable | None

    @abstractmethod
    def view(self, descriptor: Any) -> State:
        """The state of ``descriptor`` (declared in ``keyed_state_descriptors()``),
        scoped to the current key."""

    @abstractmethod
    def keys_with(self, descriptor: Any) -> list[Hashable]:
        """The keys holding state ``descriptor``, in a deterministic order."""

    @abstractmethod
    def set_current_key(self, key: Hashable) -> None:
        """Scope every view to ``key``."""

    @abstractmethod
    def clear_current_key(self) -> None:
        """No current key: views then raise."""


__all__ = ["AggregatingState", "AppendingState", "KeyedStateAccess", "ListState",
           "MapState", "ReducingState", "State", "ValueState"]
