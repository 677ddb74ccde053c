"""Names of state and outputs: :class:`MapStateDescriptor`, :class:`OutputTag`, the
built-in tags and the API's errors. Imported by every other API module; imports none."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from lakecast.errors import LakecastError

if TYPE_CHECKING:
    import pyarrow as pa


MissingPolicy = Literal["default", "unmatched", "hold"]
MISSING_POLICIES: tuple[str, ...] = ("default", "unmatched", "hold")


class ReadOnlyStateError(LakecastError):
    """A write was attempted on broadcast state through a read-only path."""


class BroadcastOrderError(LakecastError):
    """Broadcast elements of a table arrived with a gap in their versions."""


class StateDeclarationError(LakecastError):
    """A function used a broadcast state it did not declare (or declared twice)."""


@dataclass(frozen=True)
class MapStateDescriptor:
    """Names one broadcast map state of a function (PyFlink's ``MapStateDescriptor``).

    ``key_type`` / ``value_type`` are informational (Python types or Arrow types).
    ``key_columns`` makes the state *table-shaped*: values are rows (mappings of
    column -> value), stored column-wise in Arrow so that vectorized lookups
    (:meth:`lakecast.api.state.TableMapState.lookup`) never loop over rows in Python.
    """

    name: str
    key_type: Any = object
    value_type: Any = object
    key_columns: tuple[str, ...] = ()
    #: TTL of each map entry when used as KEYED map state (:mod:`lakecast.api.keyed`)
    ttl: Any = field(default=None, compare=False)
    #: a table-shaped state split into this many shards by its key, each task keeping
    #: only its shard (:mod:`lakecast.runtime.sharded_state`); ``None``: whole in each task
    shards: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise StateDeclarationError("a MapStateDescriptor needs a name")
        if isinstance(self.key_columns, str):
            object.__setattr__(self, "key_columns", (self.key_columns,))
        else:
            object.__setattr__(self, "key_columns", tuple(self.key_columns))
        if self.shards is not None:
            if isinstance(self.shards, bool) or not isinstance(self.shards, int) \
                    or self.shards < 1:
                raise StateDeclarationError(
                    f"state {self.name!r}: shards must be a whole number >= 1, got "
                    f"{self.shards!r}")
            if not self.key_columns:
                raise StateDeclarationError(
                    f"state {self.name!r}: shards={self.shards} needs key_columns (a "
                    "table-shaped state is split by its key)")

    @property
    def table_shaped(self) -> bool:
        return bool(self.key_columns)

    def enable_time_to_live(self, ttl_config: Any) -> MapStateDescriptor:
        """Give each entry of this (keyed) map state a TTL (a ``StateTtlConfig``)."""
        object.__setattr__(self, "ttl", ttl_config)
        return self


@dataclass(frozen=True)
class OutputTag:
    """Names a side output. ``schema=None`` means "same schema as the input events"."""

    name: str
    schema: pa.Schema | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").isalnum():
            raise ValueError(f"output tag name {self.name!r} must be alphanumeric/underscore")

    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OutputTag) and other.name == self.name


#: Built-in side output for events whose broadcast state (or key) is missing.
UNMATCHED = OutputTag("unmatched")
#: Built-in output for events held back to be retried with the next batch.
HELD = OutputTag("held")
