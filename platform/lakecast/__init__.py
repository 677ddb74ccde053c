"""Lakecast: Flink's broadcast-state pattern on Spark + Delta Lake.

The engine package is free of Dagster. Its parts:

- :mod:`lakecast.config`      one place for lake paths and settings (env overrides)
- :mod:`lakecast.spark`       the one Spark session factory (local Delta JARs)
- :mod:`lakecast.delta_io`    the one Delta I/O layer (write, MERGE, versions, CDF)

The broadcast state engine (see ``docs/engine.md``):

- :mod:`lakecast.api`         MapStateDescriptor, OutputTag, BroadcastProcessFunction, contexts
- :mod:`lakecast.state`       broadcast map states (dict / Arrow table), read-only views
- :mod:`lakecast.source`      Delta versions -> ordered BroadcastElements (CDF or full)
- :mod:`lakecast.executor`    the Spark-free core shared by harness and runtime
- :mod:`lakecast.enrich`      declarative vectorized enrichment (Lookup, enrich)
- :mod:`lakecast.runtime`     task-local state on Spark (BroadcastRuntime)
- :mod:`lakecast.harness`     in-memory test harness
- :mod:`lakecast.metrics`     task/run metrics and the state-size budget

Keyed broadcast processing (see ``docs/keyed.md``):

- :mod:`lakecast.keyed`           KeyedBroadcastProcessFunction, keyed contexts, timers
- :mod:`lakecast.keyed_state`     Value/List/Map/Reducing/Aggregating state, TTL, evolution
- :mod:`lakecast.keyed_executor`  the Spark-free keyed core
- :mod:`lakecast.keyed_runtime`   keyed state in Delta by key group, on Spark
- :mod:`lakecast.keyed_harness`   in-memory test harness for keyed functions
"""

from lakecast.api.descriptors import (
    HELD,
    UNMATCHED,
    BroadcastOrderError,
    MapStateDescriptor,
    OutputTag,
    ReadOnlyStateError,
    StateDeclarationError,
)
from lakecast.api.element import BroadcastElement
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
from lakecast.delta.source import read_broadcast_elements
from lakecast.runtime.broadcast import (
    BroadcastResult,
    BroadcastRuntime,
    process_with_broadcast_state,
)
from lakecast.runtime.harness import BroadcastTestHarness
from lakecast.runtime.keyed_harness import KeyedBroadcastTestHarness
from lakecast.runtime.metrics import (
    DEFAULT_STATE_BUDGET_BYTES,
    RunMetrics,
    StateBudgetWarning,
    TaskMetrics,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_STATE_BUDGET_BYTES",
    "HELD",
    "UNMATCHED",
    "AggregateFunction",
    "AggregatingStateDescriptor",
    "BroadcastElement",
    "BroadcastOrderError",
    "BroadcastProcessFunction",
    "BroadcastResult",
    "BroadcastRuntime",
    "BroadcastState",
    "BroadcastTestHarness",
    "Context",
    "DictMapState",
    "Enrichment",
    "FrozenDict",
    "FrozenList",
    "KeyedBroadcastProcessFunction",
    "KeyedBroadcastTestHarness",
    "KeyedContext",
    "KeyedReadOnlyContext",
    "ListStateDescriptor",
    "Lookup",
    "MapStateDescriptor",
    "OnTimerContext",
    "OutputTag",
    "ReadOnlyBroadcastState",
    "ReadOnlyContext",
    "ReadOnlyStateError",
    "ReducingStateDescriptor",
    "RunMetrics",
    "StateBudgetWarning",
    "StateDeclarationError",
    "StateSchemaError",
    "StateTtlConfig",
    "StateVisibility",
    "TableMapState",
    "TaskMetrics",
    "TimeDomain",
    "TimerRegistrationError",
    "UpdateType",
    "ValueStateDescriptor",
    "enrich",
    "process_with_broadcast_state",
    "read_broadcast_elements",
]
