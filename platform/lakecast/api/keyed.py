"""Keyed broadcast processing: Flink's ``KeyedBroadcastProcessFunction`` with keyed state.

::

    RULES = MapStateDescriptor("rules", str, dict)
    LAST = ValueStateDescriptor("last_amount", float).enable_time_to_live(
        StateTtlConfig.new_builder(dt.timedelta(days=7)).build())

    class Detector(KeyedBroadcastProcessFunction):
        key_by = "user_id"

        def state_descriptors(self):          # broadcast state (same on every task)
            return [RULES]

        def keyed_state_descriptors(self):    # keyed state (one copy per key)
            return [LAST]

        def process_broadcast_element(self, value, ctx):
            ctx.get_broadcast_state(RULES).apply(value, key_columns="rule_id")

        def process_element(self, value, ctx):
            last = ctx.get_state(LAST)
            if last.value() is not None and ...:
                yield {...}
            last.update(value["amount"])
            ctx.timer_service().register_event_time_timer(ctx.timestamp() + 60_000)

        def on_timer(self, timestamp, ctx):
            ctx.get_state(LAST).clear()

Events are keyed by :attr:`KeyedBroadcastProcessFunction.key_by` (or
:meth:`~KeyedBroadcastProcessFunction.get_key`). ``process_element`` and ``on_timer`` see
read-only broadcast state and read-write keyed state of the current key;
``process_broadcast_element`` sees read-write broadcast state and may visit every key's
state held by the task with :meth:`KeyedContext.apply_to_keyed_state`. Registering a
timer there raises :class:`TimerRegistrationError`, as in Flink (a broadcast element has
no key). Keyed state descriptors, TTL and serialization live in :mod:`lakecast.api.keyed_state`;
the primitives' interfaces in :mod:`lakecast.api.keyed_primitives`. The contexts are
implemented by the runtime, which hands them its keyed state (a
:class:`~lakecast.api.keyed_primitives.KeyedStateAccess`) when it runs the function: the
Spark-free executor (:mod:`lakecast.runtime.keyed_executor`), the Spark runtime
(:mod:`lakecast.runtime.keyed`) and the in-memory harness (:mod:`lakecast.runtime.keyed_harness`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

from lakecast.api.descriptors import MapStateDescriptor
from lakecast.api.functions import BroadcastProcessFunction, Context, ReadOnlyContext
from lakecast.api.keyed_primitives import (
    AggregatingState,
    KeyedStateAccess,
    ListState,
    MapState,
    ReducingState,
    ValueState,
)
from lakecast.api.keyed_state import (
    AggregatingStateDescriptor,
    KeyedStateDescriptor,
    ListStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from lakecast.errors import LakecastError


class TimerRegistrationError(LakecastError):
    """A timer was registered where there is no current key (the broadcast side)."""


class TimeDomain(enum.Enum):
    """The time domain of a timer (Flink's ``TimeDomain``)."""

    EVENT_TIME = "event_time"
    PROCESSING_TIME = "processing_time"


class TimerService:
    """Timers of the current key (Flink's ``TimerService``). Times are epoch milliseconds.

    Event-time timers fire once the watermark passes them, processing-time timers once
    the processing time does; a micro-batch advances both at its end (the watermark from
    its events, the processing time fixed when the batch was planned, so a retry is
    deterministic). Registering the same time twice yields one timer.
    """

    def current_processing_time(self) -> int:
        raise NotImplementedError

    def current_watermark(self) -> int | None:
        raise NotImplementedError

    def register_event_time_timer(self, timestamp: int) -> None:
        raise NotImplementedError

    def register_processing_time_timer(self, timestamp: int) -> None:
        raise NotImplementedError

    def delete_event_time_timer(self, timestamp: int) -> None:
        raise NotImplementedError

    def delete_processing_time_timer(self, timestamp: int) -> None:
        raise NotImplementedError


class KeyedReadOnlyContext(ReadOnlyContext):
    """What ``process_element`` sees: read-only broadcast state, the current key, its
    keyed state (read-write) and its timers."""

    def keyed_state_access(self) -> KeyedStateAccess:
        """The task's keyed state, as the runtime hands it over (a function author uses
        :meth:`get_state` and its siblings)."""
        raise NotImplementedError

    def get_current_key(self) -> Any:
        """The key of the element (a scalar, or a tuple for several key columns)."""
        return self.keyed_state_access().current_key

    def task_index(self) -> int:
        """Index of the parallel task running this (Spark partition id; 0 in the harness)."""
        raise NotImplementedError

    def timer_service(self) -> TimerService:
        raise NotImplementedError

    def get_keyed_state(self, descriptor: KeyedStateDescriptor | MapStateDescriptor) -> Any:
        """The current key's state (a :class:`~lakecast.api.keyed_primitives.State`) for
        any declared keyed descriptor."""
        return self.keyed_state_access().view(descriptor)

    def get_state(self, descriptor: ValueStateDescriptor) -> ValueState:
        return self.get_keyed_state(descriptor)

    def get_list_state(self, descriptor: ListStateDescriptor) -> ListState:
        return self.get_keyed_state(descriptor)

    def get_map_state(self, descriptor: MapStateDescriptor) -> MapState:
        return self.get_keyed_state(descriptor)

    def get_reducing_state(self, descriptor: ReducingStateDescriptor) -> ReducingState:
        return self.get_keyed_state(descriptor)

    def get_aggregating_state(self, descriptor: AggregatingStateDescriptor) -> AggregatingState:
        return self.get_keyed_state(descriptor)


class OnTimerContext(KeyedReadOnlyContext):
    """What ``on_timer`` sees: a :class:`KeyedReadOnlyContext` plus the timer's domain.
    ``timestamp()`` is the timer's time."""

    def time_domain(self) -> TimeDomain:
        raise NotImplementedError


KeyedStateFunction = Callable[[Any, Any], None]
"""``fn(key, state)`` applied by :meth:`KeyedContext.apply_to_keyed_state` to every key."""


class KeyedContext(Context):
    """What ``process_broadcast_element`` sees: read-write broadcast state and access to
    the keyed state of every key the task holds."""

    def apply_to_keyed_state(
        self, descriptor: KeyedStateDescriptor | MapStateDescriptor, function: KeyedStateFunction
    ) -> None:
        """Call ``function(key, state)`` for every key of this task that has state
        ``descriptor`` (in key order). The function may read, update or clear the state."""
        raise NotImplementedError

    def timer_service(self) -> TimerService:
        """Raises on registration: a broadcast element has no key to own a timer."""
        raise NotImplementedError

    def task_index(self) -> int:
        """Index of the parallel task running this (Spark partition id; 0 in the harness)."""
        raise NotImplementedError


class KeyedBroadcastProcessFunction(BroadcastProcessFunction):
    """Base class of a keyed broadcast function. Override what you need.

    * :attr:`key_by` — event column(s) the events are keyed by (or override :meth:`get_key`);
    * :meth:`state_descriptors` — broadcast states (as in :class:`BroadcastProcessFunction`);
    * :meth:`keyed_state_descriptors` — keyed states (Value/List/Map/Reducing/Aggregating);
    * :meth:`process_element` — one event of the current key; yields outputs;
    * :meth:`process_broadcast_element` — apply a broadcast element (deterministically);
    * :meth:`on_timer` — a timer of the current key fired; yields outputs.

    :attr:`visits_keyed_state_on_broadcast`: ``True`` (default) when
    ``process_broadcast_element`` may call ``apply_to_keyed_state`` — the runtime then
    loads every key's state in a batch that brings new broadcast elements. Set it to
    ``False`` to load only the keys a batch needs; calling ``apply_to_keyed_state`` then
    raises instead of silently visiting a subset.
    """

    Context: ClassVar[type[Context]] = KeyedContext
    ReadOnlyContext: ClassVar[type[ReadOnlyContext]] = KeyedReadOnlyContext
    OnTimerContext: ClassVar[type[OnTimerContext]] = OnTimerContext

    key_by: ClassVar[str | tuple[str, ...]] = ()
    visits_keyed_state_on_broadcast: ClassVar[bool] = True

    def key_columns(self) -> tuple[str, ...]:
        """The key column names (from :attr:`key_by`)."""
        k = self.key_by
        cols = (k,) if isinstance(k, str) else tuple(k)
        if not cols:
            raise TypeError(f"{type(self).__name__} must set key_by (the event key column(s))")
        return cols

    def get_key(self, value: Mapping[str, Any]) -> Hashable:
        """The key of an event: the key column's value, or a tuple of several."""
        cols = self.key_columns()
        return value[cols[0]] if len(cols) == 1 else tuple(value[c] for c in cols)

    def keyed_state_descriptors(self) -> Sequence[KeyedStateDescriptor | MapStateDescriptor]:
        """Declare the keyed states (one copy per key)."""
        return ()

    def process_element(self, value: Any, ctx: KeyedReadOnlyContext) -> Iterable[Any] | None:  # type: ignore[override]
        raise NotImplementedError(f"{type(self).__name__} must implement process_element")

    def process_broadcast_element(self, value: Any, ctx: KeyedContext) -> Iterable[Any] | None:  # type: ignore[override]
        return None

    def on_timer(self, timestamp: int, ctx: OnTimerContext) -> Iterable[Any] | None:
        """A timer registered for the current key fired (no-op by default)."""
        return None

    @classmethod
    def is_vectorized(cls) -> bool:
        return False  # keyed functions are per element: state is per key


__all__ = [
    "AggregatingStateDescriptor",
    "KeyedBroadcastProcessFunction",
    "KeyedContext",
    "KeyedReadOnlyContext",
    "ListStateDescriptor",
    "OnTimerContext",
    "ReducingStateDescriptor",
    "TimeDomain",
    "TimerRegistrationError",
    "TimerService",
    "ValueStateDescriptor",
]
