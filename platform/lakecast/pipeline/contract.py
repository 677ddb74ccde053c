"""The one runtime contract: what :class:`~lakecast.pipeline.micro_batch.MicroBatchPipeline`
needs from a runtime, and nothing else.

A runtime processes one batch of events at the batch's planned state version and returns
a :class:`BatchOutput`: the main output, the side outputs, and one *accounting row per
task* (at least ``task`` and ``events_in``: the events that task consumed). The pipeline
reconciles from those rows, the same way for every runtime: events read = events the
tasks consumed + events rejected by validation.

Around the batch, a runtime gets four hooks:

* :meth:`BatchRuntime.before_commit` after the outputs are counted and reconciled, before
  anything of the batch is written (e.g. check that every task holds the same broadcast
  state); raising fails the batch with nothing written or committed;
* :meth:`BatchRuntime.commit_state` after the outputs are written and before the batch
  commits (e.g. the keyed runtime appends to its state table, versioned with the outputs);
* :meth:`BatchRuntime.after_commit` after the batch committed (e.g. checkpoint the
  broadcast state); returns what it did, for logs and metadata;
* :meth:`BatchRuntime.on_rewind` when the pipeline was rewound to a checkpoint.

A continuous run adds three: :meth:`BatchRuntime.warm_up` builds the task-local state
before the first batch, :meth:`BatchRuntime.defer_checkpoints` lets checkpoints run
beside the next batches and :meth:`BatchRuntime.settle` waits for them.

:class:`BaseRuntime` gives every hook but :meth:`~BatchRuntime.process_batch` a no-op
default; :class:`~lakecast.runtime.broadcast.BroadcastRuntime` (and its checkpointing
subclass :class:`~lakecast.snapshots.runtime.SnapshottingRuntime`) and
:class:`~lakecast.runtime.keyed.KeyedBroadcastRuntime` derive from it.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lakecast.api.element import BroadcastElement
    from lakecast.pipeline.progress import BatchPlan

#: name of the internal side output that carries one accounting row per task
TASK_SIDE = "_task"


class BatchMetrics(Protocol):
    """What the pipeline reads of a batch's metrics (the runtime's
    :class:`~lakecast.runtime.metrics.RunMetrics`)."""

    budget_bytes: int

    @property
    def parallelism(self) -> int: ...

    @property
    def broadcast_updates_applied(self) -> int: ...

    @property
    def state_bytes_per_task(self) -> int: ...

    @property
    def executors(self) -> list[str]: ...

    def summary(self) -> dict[str, Any]:
        """Aggregate numbers of the batch (at least ``cold_tasks``)."""
        ...


@runtime_checkable
class BatchOutput(Protocol):
    """The one-pass output of one batch (lazy DataFrames over one computation)."""

    state_version: dict[str, int]
    new_elements: list[BroadcastElement]

    @property
    def main(self) -> DataFrame:
        """Main output rows."""
        ...

    def side(self, name: str) -> DataFrame:
        """Rows of the side output ``name``."""
        ...

    @property
    def side_output_names(self) -> list[str]:
        """The function's side outputs (internal ones excluded)."""
        ...

    def persist(self) -> BatchOutput:
        """Make every view and :meth:`task_rows` come from one computation."""
        ...

    def unpersist(self) -> None: ...

    def output_counts(self) -> dict[str | None, int]:
        """Rows per output (``None``: main; internal outputs excluded), in one action."""
        ...

    def task_rows(self) -> list[dict[str, Any]]:
        """One accounting row per task: ``task``, ``events_in`` and runtime-specific
        numbers."""
        ...

    def summary(self) -> dict[str, int]:
        """Runtime-specific counts of the batch (added to the batch's counts)."""
        ...

    def metrics(self) -> BatchMetrics:
        """Per-task and aggregate metrics (from :meth:`task_rows`)."""
        ...


@runtime_checkable
class CollectableOutput(Protocol):
    """A :class:`BatchOutput` that can bring all its outputs to the driver in one action
    (small batches are then counted and written without further Spark jobs)."""

    def collect(self, extra: DataFrame | None = None) -> Any:
        """Run the batch once; the outputs as Arrow (``main``, ``side(name)``,
        ``output_counts()``, ``task_rows``) and, from the same job, the rows of ``extra``
        (``.extra``)."""
        ...


@runtime_checkable
class BatchRuntime(Protocol):
    """Runs a function over micro-batches with task-local broadcast state."""

    function_id: str

    #: where the task-local state lives (``"jvm"``, ``"python"``, ``"joins"``, ``"keyed"``)
    #: and why it was chosen: each batch's metadata names both
    state_engine: str
    state_engine_reason: str

    def process_batch(self, events: DataFrame, plan: BatchPlan) -> BatchOutput:
        """The batch at ``plan.broadcast_versions`` (lazy: nothing runs until an action).
        Must be deterministic for a given plan, so a redo computes the same output."""
        ...

    def before_commit(self, output: BatchOutput, plan: BatchPlan) -> Mapping[str, Any] | None:
        """Check hook, after reconciliation and before any output is written (raise to
        fail the batch: nothing of it is then visible); returns a summary or ``None``."""
        ...

    def commit_state(self, output: BatchOutput) -> None:
        """Persist runtime state that is versioned with the outputs (after they are
        written, before the batch commits). Idempotent."""
        ...

    def after_commit(self, plan: BatchPlan) -> Mapping[str, Any] | None:
        """Checkpoint hook, after the batch committed; returns a summary or ``None``."""
        ...

    def on_rewind(self, plan: BatchPlan) -> None:
        """Restore hook: the pipeline was rewound to ``plan.restore_of``."""
        ...

    def warm_up(self, events: Callable[[], DataFrame],
                until: Mapping[str, int]) -> int | None:
        """Build the task-local state at ``until`` before a first batch (``events`` gives
        the batches' input, for its schema; called only by a runtime that warms up);
        returns the tasks that were cold, ``None`` when there is nothing to warm."""
        ...

    def defer_checkpoints(self) -> bool:
        """Take checkpoints in the background from now on; whether this runtime can (then
        call :meth:`settle` before the process ends)."""
        ...

    def settle(self) -> Mapping[str, Any] | None:
        """Wait for background work (a checkpoint); its summary, ``None`` if none ran."""
        ...

    def close(self) -> None: ...


class BaseRuntime(BatchRuntime):
    """A :class:`BatchRuntime` whose hooks do nothing until a subclass overrides them;
    :meth:`process_batch` it must implement."""

    @abstractmethod
    def process_batch(self, events: DataFrame, plan: BatchPlan) -> BatchOutput:
        """The batch at ``plan.broadcast_versions`` (see :class:`BatchRuntime`)."""

    def before_commit(self, output: BatchOutput, plan: BatchPlan) -> Mapping[str, Any] | None:
        """Nothing to check."""
        return None

    def commit_state(self, output: BatchOutput) -> None:
        """Nothing to persist."""

    def after_commit(self, plan: BatchPlan) -> Mapping[str, Any] | None:
        """No checkpoints."""
        return None

    def on_rewind(self, plan: BatchPlan) -> None:
        """Nothing to restore."""

    def warm_up(self, events: Callable[[], DataFrame],
                until: Mapping[str, int]) -> int | None:
        """No task-local state to warm."""
        return None

    def defer_checkpoints(self) -> bool:
        """No checkpoints to defer."""
        return False

    def settle(self) -> Mapping[str, Any] | None:
        """No background work."""
        return None

    def close(self) -> None:
        """Nothing to release."""
