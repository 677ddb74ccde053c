"""The user API: what a function author imports (no Spark, no Delta).

- :mod:`~lakecast.api.descriptors`  MapStateDescriptor, OutputTag, UNMATCHED/HELD, errors
- :mod:`~lakecast.api.element`      BroadcastElement: one Delta version of a broadcast table
- :mod:`~lakecast.api.functions`    BroadcastProcessFunction, Context, ReadOnlyContext
- :mod:`~lakecast.api.state`        broadcast map states (dict-backed) ...
- :mod:`~lakecast.api.table_state`  ... and table-shaped (Arrow) ones
- :mod:`~lakecast.api.read_only`    the read-only view ``process_element`` sees
- :mod:`~lakecast.api.frozen`       deep-frozen values
- :mod:`~lakecast.api.enrich`       declarative vectorized enrichment (Lookup, enrich)
- :mod:`~lakecast.api.contracts`    TableContract: what each broadcast version must satisfy
- :mod:`~lakecast.api.keyed`        KeyedBroadcastProcessFunction, keyed contexts, timers
- :mod:`~lakecast.api.keyed_state`  keyed state descriptors, TTL, schema evolution
- :mod:`~lakecast.api.keyed_primitives`  the keyed state interfaces (ValueState, MapState,
  ...) the runtime implements
"""

from lakecast.api.contracts import BroadcastVersionRefused, TableContract
from lakecast.api.descriptors import (
    HELD,
    UNMATCHED,
    BroadcastOrderError,
    MapStateDescriptor,
    OutputTag,
    ReadOnlyStateError,
    StateDeclarationError,
)
from lakecast.api.element import BroadcastElement, order_elements
from lakecast.api.enrich import Enrichment, Lookup, enrich
from lakecast.api.frozen import FrozenDict, FrozenList
from lakecast.api.functions import BroadcastProcessFunction, Context, ReadOnlyContext
from lakecast.api.keyed import (
    KeyedBroadcastProcessFunction,
    KeyedContext,
    KeyedReadOnlyContext,
    OnTimerContext,
    TimeDomain,
    TimerRegistrationError,
)
from lakecast.api.keyed_primitives import (
    AggregatingState,
    KeyedStateAccess,
    ListState,
    MapState,
    ReducingState,
    ValueState,
)
from lakecast.api.keyed_state import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    ReducingStateDescriptor,
    StateSchemaError,
    StateTtlConfig,
    StateVisibility,
    UpdateType,
    ValueStateDescriptor,
)
from lakecast.api.read_only import ReadOnlyBroadcastState
from lakecast.api.state import BroadcastState, DictMapState
from lakecast.api.table_state import TableMapState

__all__ = [
    "HELD", "UNMATCHED", "AggregateFunction", "AggregatingState", "AggregatingStateDescriptor",
    "BroadcastElement", "BroadcastOrderError", "BroadcastProcessFunction", "BroadcastState",
    "BroadcastVersionRefused", "Context", "DictMapState", "Enrichment", "FrozenDict",
    "FrozenList", "KeyedBroadcastProcessFunction", "KeyedContext", "KeyedReadOnlyContext",
    "KeyedStateAccess", "ListState", "ListStateDescriptor", "Lookup", "MapState",
    "MapStateDescriptor", "OnTimerContext", "OutputTag",
    "ReadOnlyBroadcastState", "ReadOnlyContext", "ReadOnlyStateError",
    "ReducingState", "ReducingStateDescriptor", "StateDeclarationError", "StateSchemaError",
    "StateTtlConfig",
    "StateVisibility", "TableContract", "TableMapState", "TimeDomain",
    "TimerRegistrationError", "UpdateType", "ValueState", "ValueStateDescriptor", "enrich",
    "order_elements",
]
