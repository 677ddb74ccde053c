"""Deep-frozen values: broadcast state hands out values that cannot be mutated in place."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

from lakecast.api.descriptors import ReadOnlyStateError


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
