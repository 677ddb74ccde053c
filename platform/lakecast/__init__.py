"""Lakecast: Flink's broadcast-state pattern on Spark + Delta Lake.

The engine package is free of Dagster. Its folders are its architecture (see
``docs/architecture.md``); each layer imports only the layers above it:

- :mod:`lakecast.errors`, :mod:`lakecast.config`, :mod:`lakecast.spark`, :mod:`lakecast.jars`
  the base: errors, the one config, the one Spark session factory, JARs fetched once
- :mod:`lakecast.api`        what a function author imports: descriptors, functions,
  contexts, broadcast and keyed state, declarative enrichment (no Spark)
- :mod:`lakecast.delta`      the one Delta I/O layer and the broadcast source
- :mod:`lakecast.pipeline`   the runtime contract and the exactly-once micro-batch pipeline
- :mod:`lakecast.runtime`    executors, harnesses, and the broadcast and keyed runtimes
- :mod:`lakecast.snapshots`  checkpoints of broadcast state: restore, rescale, rewind
- :mod:`lakecast.build`      pipelines built whole (runtime + checkpointer + pipeline)
- :mod:`lakecast.tools`      the ``lakecast`` command, the data generator, feature flags

This module re-exports the user API."""

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
from lakecast.runtime.broadcast import BroadcastRuntime, process_with_broadcast_state
from lakecast.runtime.harness import BroadcastTestHarness
from lakecast.runtime.keyed_harness import KeyedBroadcastTestHarness
from lakecast.runtime.metrics import (
    DEFAULT_STATE_BUDGET_BYTES,
    RunMetrics,
    StateBudgetWarning,
    TaskMetrics,
)
from lakecast.runtime.result import BroadcastResult

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
