"""Running functions: the Spark-free cores, their in-memory harnesses, and the Spark
runtimes that implement :class:`lakecast.pipeline.contract.BatchRuntime`.

- :mod:`~lakecast.runtime.executor`        Spark-free core: apply elements, process events
- :mod:`~lakecast.runtime.state_store`     the broadcast states of one function instance
- :mod:`~lakecast.runtime.harness`         in-memory test harness (no Spark)
- :mod:`~lakecast.runtime.tasks`           what a Spark task runs (worker cache, accounting)
- :mod:`~lakecast.runtime.broadcast`       BroadcastRuntime: task-local state on Spark
- :mod:`~lakecast.runtime.jvm_state`       a pure enrich's task-local state in the executor JVM
- :mod:`~lakecast.runtime.joins`           ``execution="joins"``: a pure enrich as broadcast joins
- :mod:`~lakecast.runtime.lookup_plan`     a pure enrich's one-pass frame over either probe
- :mod:`~lakecast.runtime.result`          BroadcastResult: the views and accounting of one run
- :mod:`~lakecast.runtime.metrics`         task/run metrics, the state budget
- :mod:`~lakecast.runtime.keyed_backend`   keyed state of one task and its primitives
- :mod:`~lakecast.runtime.keyed_executor`  Spark-free keyed core; ``keyed_harness`` its harness
- :mod:`~lakecast.runtime.keyed_tasks`     what a keyed Spark task runs
- :mod:`~lakecast.runtime.keyed`           KeyedBroadcastRuntime: keyed state in Delta
"""

from lakecast.runtime.broadcast import BroadcastRuntime, process_with_broadcast_state
from lakecast.runtime.harness import BroadcastTestHarness
from lakecast.runtime.keyed import KeyedBroadcastRuntime, KeyedResult
from lakecast.runtime.keyed_harness import KeyedBroadcastTestHarness
from lakecast.runtime.metrics import (
    DEFAULT_STATE_BUDGET_BYTES,
    RunMetrics,
    StateBudgetWarning,
    TaskMetrics,
)
from lakecast.runtime.result import BroadcastResult

__all__ = [
    "DEFAULT_STATE_BUDGET_BYTES", "BroadcastResult", "BroadcastRuntime",
    "BroadcastTestHarness", "KeyedBroadcastRuntime", "KeyedBroadcastTestHarness",
    "KeyedResult", "RunMetrics", "StateBudgetWarning", "TaskMetrics",
    "process_with_broadcast_state",
]
