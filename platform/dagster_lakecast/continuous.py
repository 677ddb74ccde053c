"""``<name>_continuous``: one long run that processes each events commit as it lands, for
every pipeline the factory declares (broadcast or keyed).

For freshness, where ``<name>_microbatch`` (a run per sensor tick) is too slow: the run
keeps one warm Spark session (its tasks' broadcast state stays warm), watches the Delta
logs of the events and broadcast tables without Spark every ``poll_seconds`` and starts a
batch as soon as a new version commits. While nothing commits, it runs a small Spark job
every ``KEEP_WARM_SECONDS`` that finds the tasks' state warm, so that Spark does not stop
the Python workers holding it (it stops those idle for a minute) and the next batch after a
quiet spell runs warm. Each committed batch is one materialization of
every output asset, with the same metadata as the micro-batch job
(:mod:`dagster_lakecast.metadata`).

It stops between two batches when the run is terminated from the UI: Dagster's interrupt
(SIGINT/SIGTERM to the run worker) is held while a batch runs, so the batch in progress
commits whole, then the run ends as canceled. It also ends after ``max_seconds``. A
``kill -9`` cuts a batch short: it committed nothing, and the next run of either job
redoes it with the same plan. While it is active the sensor requests no micro-batch run,
and a run of any writer of the pipeline that starts beside it is refused
(:mod:`dagster_lakecast.runs`).

Without the UI: ``dagster job execute -m <module> -j <name>_continuous --config run.yaml``
(``ops: {<name>_continuous_loop: {config: {max_seconds: 600}}}``).
"""

import signal
import threading
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from dagster import (
    Config,
    DagsterExecutionInterruptedError,
    DagsterRunStatus,
    Failure,
    JobDefinition,
    OpExecutionContext,
    Out,
    Output,
    in_process_executor,
    job,
    op,
)
from pydantic import Field

from dagster_lakecast.handle import PipelineHandle
from dagster_lakecast.inputs import missing_inputs, missing_message
from dagster_lakecast.metadata import log_batch, record_batch, record_missed, table_versions
from dagster_lakecast.resources import LakecastSparkResource, LakeResource
from dagster_lakecast.runs import refuse_second_writer
from dagster_lakecast.tags import EXCLUSIVE_TAG, QUIET_RUN_LOGS
from lakecast.config import Settings
from lakecast.errors import LakecastError
from lakecast.pipeline.micro_batch import BatchResult
from lakecast.spark import is_connect

__all__ = ["ContinuousConfig", "declare_continuous", "run_totals"]


#: Spark stops a Python worker that its executor has left idle for a minute (its
#: PythonWorkerFactory's fixed idle timeout), and the task-local state it held goes with
#: it; an idle continuous run builds the state again (a no-op in warm workers) more often
KEEP_WARM_SECONDS = 40.0


class ContinuousConfig(Config):
    """How long a continuous run lasts and how often it looks at the Delta logs."""

    max_seconds: float = Field(default=3600.0, description="End the run after this long "
                               "(checked between batches).")
    poll_seconds: float = Field(default=0.05, description="How often to read the Delta "
                                "logs' versions while idle (a local lake: a stat per "
                                "table; object storage: requests per table, so raise "
                                "it there).")
    max_batches: int | None = Field(default=None, description="End after this many batches.")
    parallelism: int | None = Field(
        default=None, description="Tasks per batch (default: the declaration's).")


class StopRequest:
    """While entered (main thread only), SIGINT and SIGTERM set :attr:`requested` instead of
    interrupting: the loop finishes the batch in progress, then stops."""

    def __init__(self) -> None:
        self.requested = False
        self._saved: dict[int, object] = {}

    def _handle(self, signum: int, _frame: object) -> None:
        self.requested = True

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._saved[sig] = signal.getsignal(sig)
                signal.signal(sig, self._handle)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def _terminating(context: OpExecutionContext) -> bool:
    run = context.instance.get_run_by_id(context.run_id)
    return run is not None and run.status == DagsterRunStatus.CANCELING


def run_totals(results: list[BatchResult]) -> dict[str, Any]:
    """A continuous run's totals: batches, each engine count summed, cold tasks."""
    totals: dict[str, Any] = {"batches": len(results)}
    for r in results:
        for key, value in r.counts.items():
            if isinstance(value, int | float):
                totals[key] = totals.get(key, 0) + value
    totals["cold_tasks"] = sum(r.cold_tasks for r in results)
    totals["batch_seconds_max"] = round(max((r.seconds for r in results), default=0.0), 3)
    return totals


def _numeric(values: Mapping[str, Any]) -> dict[str, int | float]:
    return {k: v for k, v in values.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


def wait_for_inputs(context: OpExecutionContext, pipe: PipelineHandle,
                    settings: Settings, deadline: float, poll_seconds: float) -> bool:
    """Wait until every input table exists (said once, with what creates them); ``False``
    when the run's time ends (or it is terminated) first."""
    missing = missing_inputs(pipe, settings)
    if missing:
        context.log.warning(missing_message(pipe, settings, missing) + " The continuous run "
                            "waits for them.")
    while missing:
        if time.monotonic() >= deadline or _terminating(context):
            context.log.info(f"continuous run ends: {', '.join(missing)} never appeared")
            return False
        time.sleep(max(poll_seconds, 0.5))
        missing = missing_inputs(pipe, settings)
    return True


def declare_continuous(pipe: PipelineHandle) -> JobDefinition:
    """The continuous job of ``pipe`` (see the module docstring)."""

    @op(name=f"{pipe.name}_continuous_loop",
        out=Out(dict, description="The run's totals (also in its log)."),
        description=f"Process every new {pipe.decl.events_table} commit of the {pipe.name} "
                    "pipeline as soon as it lands, until terminated or max_seconds.")
    def continuous_loop(context: OpExecutionContext, config: ContinuousConfig,
                        pyspark: LakecastSparkResource, lake: LakeResource) -> Output[dict]:
        refuse_second_writer(context.instance, context.run_id, pipe.continuous_job_name,
                             pipe.writers, pipe.name)
        settings = lake.settings()
        deadline = time.monotonic() + config.max_seconds
        if not wait_for_inputs(context, pipe, settings, deadline, config.poll_seconds):
            totals = run_totals([])
            return Output(totals, metadata=_numeric(totals))
        record_missed(context, pipe, settings)
        spark = pyspark.session_for(pipe.name)
        try:
            pipeline = pipe.decl.build(spark, settings, parallelism=config.parallelism)
        except LakecastError as e:
            raise Failure(description=str(e)) from e
        results: list[BatchResult] = []
        seen: dict[str, int | None] | None = None
        next_status_check = 0.0
        t0 = time.monotonic()
        cold = pipeline.warm_up()  # the first batch then finds its task-local state built
        last_task = time.monotonic()
        # checkpoints run beside the next batches instead of between two of them
        deferred = pipeline.defer_checkpoints()
        context.log.info(f"task-local state warmed in {time.monotonic() - t0:.1f}s ({cold} "
                         f"task(s) were cold); watching {list(table_versions(pipe, settings))}"
                         f" for up to {config.max_seconds:.0f}s")
        with StopRequest() as stop:
            try:
                while time.monotonic() < deadline and not stop.requested:
                    if config.max_batches is not None and len(results) >= config.max_batches:
                        break
                    now = time.monotonic()
                    if now >= next_status_check:  # the UI's Terminate, in the run's status
                        if _terminating(context):
                            context.log.info("terminated: stopping between two batches")
                            break
                        next_status_check = now + 1.0
                    versions = table_versions(pipe, settings)
                    if versions == seen:
                        if now - last_task >= KEEP_WARM_SECONDS:  # idle: keep it warm
                            pipeline.warm_up()
                            last_task = time.monotonic()
                        time.sleep(config.poll_seconds)
                        continue
                    done = pipeline.run(max_batches=1,
                                        on_batch=lambda r: log_batch(context.log, r))
                    if not done:  # nothing to do at these versions (broadcast-only change)
                        seen = versions
                        continue
                    last_task = time.monotonic()
                    record_batch(context, pipe, settings, done[0])
                    results += done
            except BaseException as e:
                if is_connect(spark):  # do not leave the batch's jobs running on the server
                    spark.interruptAll()
                if isinstance(e, LakecastError):  # e.g. a checkpoint that failed behind
                    raise Failure(description=str(e)) from e
                raise
        if deferred:  # the last checkpoint started: the run ends when it is written
            try:
                last = pipeline.settle()
            except LakecastError as e:
                raise Failure(description=str(e)) from e
            if last:
                context.log.info(f"checkpoint written in the background: {last}")
        totals = run_totals(results)
        if pipe.decl.hooks.run_metadata is not None:
            totals.update(_numeric(pipe.decl.hooks.run_metadata(results)))
        if stop.requested:
            context.log.info(f"interrupted after {len(results)} batch(es), none cut short: "
                             f"{totals}")
            raise DagsterExecutionInterruptedError()
        context.log.info(f"continuous run ends: {totals}")
        return Output(totals, metadata=_numeric(totals))

    @job(name=pipe.continuous_job_name,
         description=f"Continuous mode of the {pipe.name} pipeline: one warm run that "
                     f"processes each {pipe.decl.events_table} commit as it lands. Terminate it "
                     "from the UI to stop.",
         tags={EXCLUSIVE_TAG: pipe.continuous_job_name}, config=QUIET_RUN_LOGS,
         executor_def=in_process_executor)
    def continuous_job() -> None:
        continuous_loop()

    return continuous_job
