"""Pipelines built whole: the progress log, the runtime, its checkpointer and the
:class:`~lakecast.pipeline.micro_batch.MicroBatchPipeline` are constructed together here,
never patched afterwards.

* :func:`broadcast_pipeline`: a :class:`~lakecast.api.functions.BroadcastProcessFunction`
  on a :class:`~lakecast.snapshots.runtime.SnapshottingRuntime` (task-local state,
  checkpointed every N batches, restored on cold start) — or, ``execution="joins"``, a
  pure ``enrich(Lookup...)`` as broadcast joins on a plain
  :class:`~lakecast.runtime.broadcast.BroadcastRuntime`; broadcast versions pass the
  function's table contracts before they are planned
  (:class:`~lakecast.delta.validation.VersionGate`);
* :func:`keyed_pipeline`: a :class:`~lakecast.api.keyed.KeyedBroadcastProcessFunction` on
  a :class:`~lakecast.runtime.keyed.KeyedBroadcastRuntime` (keyed state in the spec's
  ``state_table``, versioned with the outputs); its table contracts must have the policy
  ``fail`` (the keyed runtime applies every version's changes, so it cannot skip a refused
  one): a refused version fails planning, naming table, version and reason.

Both lay their progress log (and snapshots) under ``checkpoint_root/<pipeline name>``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lakecast.api.functions import BroadcastProcessFunction
from lakecast.api.keyed import KeyedBroadcastProcessFunction
from lakecast.config import PipelinePaths
from lakecast.delta.validation import VersionGate
from lakecast.pipeline.micro_batch import MicroBatchPipeline, PipelineSpec, Validator
from lakecast.pipeline.progress import ProgressLog
from lakecast.runtime.broadcast import BroadcastRuntime
from lakecast.runtime.engine import choose_engine
from lakecast.runtime.keyed import KeyedBroadcastRuntime
from lakecast.snapshots.checkpointer import Checkpointer
from lakecast.snapshots.runtime import SnapshottingRuntime
from lakecast.snapshots.store import SnapshotStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def broadcast_pipeline(
    spark: SparkSession,
    spec: PipelineSpec,
    function: BroadcastProcessFunction,
    *,
    table_path: Callable[[str], str],
    checkpoint_root: str,
    validator: Validator | None = None,
    parallelism: int | None = None,
    checkpoint_every: int | None = 1,
    keep_checkpoints: int | None = 10,
    **runtime_options: Any,
) -> MicroBatchPipeline:
    """A broadcast pipeline over ``spec``'s tables. ``checkpoint_every``: checkpoint the
    broadcast state every N committed batches (``None``: never); ``keep_checkpoints``:
    retention; ``runtime_options`` go to the runtime (``timestamp_column``, ...);
    A pure ``enrich(Lookup...)`` keeps no state in the Python workers, so it takes no
    checkpoints: by default its task-local state lives in the executor JVM
    (:mod:`lakecast.runtime.jvm_state`; rebuilt there from the Delta versions the batch
    planned), and ``execution="joins"`` (:mod:`lakecast.runtime.joins`) runs each batch as
    Spark broadcast joins at those versions. ``jvm_lookups=False`` keeps a pure lookup's
    state in the Python workers, checkpointed like any other function's."""
    paths = PipelinePaths.under(checkpoint_root, spec.name)
    log = ProgressLog(spark, paths.progress, spec.name)
    store = SnapshotStore(spark, paths.snapshots, spec.name)
    checkpointer = (Checkpointer(store, log, every=checkpoint_every, keep=keep_checkpoints)
                    if checkpoint_every else None)
    tables = {t: table_path(t) for t in spec.broadcast_tables}
    gate = VersionGate(spark, tables, function.table_contracts())
    engine = choose_engine(spark, function, execution=runtime_options.pop("execution", "tasks"),
                           jvm_lookups=runtime_options.pop("jvm_lookups", None))
    runtime: BroadcastRuntime
    if engine.python_state:
        runtime = SnapshottingRuntime(spark, function, tables, store, parallelism=parallelism,
                                      checkpointer=checkpointer, reload_if=gate.reload_reason,
                                      engine=engine, **runtime_options)
    else:  # joins, or the executor JVM's state: nothing to checkpoint
        runtime = BroadcastRuntime(spark, function, tables, parallelism=parallelism,
                                   reload_if=gate.reload_reason, engine=engine,
                                   **runtime_options)
    return MicroBatchPipeline(spark, spec, table_path, log, runtime, validator,
                              version_gate=gate)


def keyed_pipeline(
    spark: SparkSession,
    spec: PipelineSpec,
    function: KeyedBroadcastProcessFunction,
    *,
    table_path: Callable[[str], str],
    checkpoint_root: str,
    validator: Validator | None = None,
    **runtime_options: Any,
) -> MicroBatchPipeline:
    """A keyed pipeline; its keyed state lives in ``spec.state_table``. Broadcast versions
    pass the function's table contracts (policy ``fail`` only) before they are planned.
    ``runtime_options`` go to the runtime (``key_groups``, ``timestamp_column``, ...)."""
    if spec.state_table is None:
        raise ValueError(f"{spec.name}: a keyed pipeline needs spec.state_table")
    contracts = list(function.table_contracts())
    lenient = [c.table for c in contracts if c.on_invalid != "fail"]
    if lenient:
        raise ValueError(
            f"{spec.name}: the table contracts of {lenient} have on_invalid="
            "'refuse_and_continue'; a keyed pipeline applies every broadcast version's "
            "changes to keyed state, so its contracts must declare on_invalid='fail'")
    log = ProgressLog(spark, PipelinePaths.under(checkpoint_root, spec.name).progress,
                      spec.name)
    tables = {t: table_path(t) for t in spec.broadcast_tables}
    gate = VersionGate(spark, tables, contracts) if contracts else None
    runtime = KeyedBroadcastRuntime(spark, function, tables, table_path(spec.state_table),
                                    engine=choose_engine(spark, function), **runtime_options)
    return MicroBatchPipeline(spark, spec, table_path, log, runtime, validator,
                              version_gate=gate)
