"""Where a function's task-local state lives: the one place that chooses.

:func:`choose_engine` takes the function and the caller's wishes (``execution``,
``jvm_lookups``) and returns an :class:`EngineChoice`: the engine and a one-line reason,
which every batch's metadata names (``state_engine``, ``state_engine_reason``). The
pipeline builder (:mod:`lakecast.build`) chooses once and hands the choice to the runtime
it builds; a runtime constructed directly chooses with the same function.

* ``"keyed"``: a :class:`~lakecast.api.keyed.KeyedBroadcastProcessFunction` (keyed state
  in Delta, :mod:`lakecast.runtime.keyed`);
* ``"joins"``: ``execution="joins"``, a pure ``enrich(Lookup...)`` as Spark broadcast
  joins (:mod:`lakecast.runtime.joins`), no task-local state;
* ``"jvm"``: a pure ``enrich(Lookup...)`` whose state the executor JVM holds
  (:mod:`lakecast.runtime.jvm_state`), when the session can run the JVM lookup — also one
  that overrides only ``transform`` / ``output_schema``: its transform then runs
  vectorized in the Python workers after the JVM's lookups
  (:mod:`lakecast.runtime.lookup_transform`), said once in the log;
* ``"python"``: task-local state in the Python workers (checkpointed by
  :class:`~lakecast.snapshots.runtime.SnapshottingRuntime`): any other function,
  ``jvm_lookups=False``, or no JVM lookup in this session (said once, with the reason).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from lakecast.api.keyed import KeyedBroadcastProcessFunction
from lakecast.runtime.joins import not_joinable
from lakecast.runtime.jvm_state import say_once, unavailable
from lakecast.runtime.lookup_transform import PYTHON_HOOKS, transforms

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

StateEngine = Literal["python", "jvm", "joins", "keyed"]
Execution = Literal["tasks", "joins"]
EXECUTIONS: tuple[str, ...] = ("tasks", "joins")


@dataclass(frozen=True)
class EngineChoice:
    """A state engine and why it was chosen (one line, for a batch's metadata)."""

    engine: StateEngine
    reason: str

    @property
    def python_state(self) -> bool:
        """Whether the Python workers hold the broadcast state (what checkpoints keep)."""
        return self.engine == "python"


KEYED = EngineChoice("keyed", "a keyed function: keyed state in Delta, broadcast state in "
                              "the Python workers by key group")
JOINS = EngineChoice("joins", "execution='joins': each batch runs as Spark broadcast joins")
JVM = EngineChoice("jvm", "a pure enrich(Lookup...): its state in the executor JVM")
JVM_TRANSFORM = EngineChoice("jvm", "an enrich(Lookup...) whose only Python is its transform: "
                                    "lookups in the executor JVM, transform vectorized in "
                                    "the Python workers")
SHARDED = EngineChoice("python", "sharded lookups: each task reads its shard, memory-mapped "
                                "by the Python workers")
#: the functions whose split (lookups in the JVM, transform in Python) was logged
_TOLD: set[str] = set()
#: a pure lookup kept in the Python workers because its runtime checkpoints them
CHECKPOINTED = EngineChoice("python", "a checkpointing runtime: its state in the Python "
                                      "workers")


def choose_engine(spark: SparkSession, function: object, *, execution: str = "tasks",
                  jvm_lookups: bool | None = None) -> EngineChoice:
    """The engine of ``function`` (see the module doc). ``jvm_lookups``: ``True``
    requires the JVM (a ``ValueError`` says why it cannot), ``False`` refuses it, ``None``
    takes it when it can. Raises ``ValueError`` for an unknown ``execution`` and for
    ``execution="joins"`` of a function that is not a pure lookup."""
    if isinstance(function, KeyedBroadcastProcessFunction):
        return KEYED
    if execution not in EXECUTIONS:
        raise ValueError(f"execution must be one of {EXECUTIONS}, got {execution!r}")
    why = not_joinable(function)
    if execution == "joins":
        if why:
            raise ValueError(f"execution='joins': {why}")
        return JOINS
    if jvm_lookups is False:
        return EngineChoice("python", "jvm_lookups=False")
    lookups = getattr(function, "lookups", None) or []
    if getattr(function, "routing", lambda: None)() is not None or any(
            getattr(lk, "shards", None) for lk in lookups):
        if jvm_lookups:
            raise ValueError("jvm_lookups=True: sharded lookups keep their shards in the "
                             "Python workers")
        return SHARDED
    transformed = transforms(function)
    if why and not transformed:
        if jvm_lookups:
            raise ValueError(f"jvm_lookups=True: {why}; only transform and output_schema "
                             "may be overridden to keep the lookups in the JVM")
        return EngineChoice("python", f"the function runs in Python ({why})")
    missing = unavailable(spark)
    if missing is not None:
        if jvm_lookups:
            raise ValueError(f"jvm_lookups=True: {missing}")
        say_once(missing)
        return EngineChoice("python", f"JVM lookups unavailable: {missing}")
    if transformed:
        name = type(function).__name__
        if name not in _TOLD:
            _TOLD.add(name)
            log.info("%s: its lookups run in the executor JVM, its transform over each Arrow "
                     "batch in the Python workers (overriding %s would run the whole function "
                     "in the Python workers)", name, ", ".join(PYTHON_HOOKS))
        return JVM_TRANSFORM
    return JVM


def python_engine(function: object, *, execution: str = "tasks",
                  jvm_lookups: bool | None = None) -> EngineChoice:
    """The engine of a runtime that checkpoints the Python workers' state (built without a
    choice handed to it): ``"python"`` and why; ``ValueError`` for wishes it cannot keep."""
    if execution != "tasks":
        raise ValueError(f"execution={execution!r}: a checkpointing runtime runs its "
                         "state in the Python workers' tasks")
    if jvm_lookups:
        raise ValueError("jvm_lookups=True: a checkpointing runtime keeps its state in the "
                         "Python workers")
    if jvm_lookups is False:
        return EngineChoice("python", "jvm_lookups=False")
    why = not_joinable(function)
    return EngineChoice("python", f"the function runs in Python ({why})") if why \
        else CHECKPOINTED
