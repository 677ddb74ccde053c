"""``enrichment_continuous``: one long run that enriches each events commit as it lands.

For freshness, where ``enrichment_microbatch`` (a run per sensor tick) is too slow: the
run keeps one warm Spark session — its tasks' broadcast state stays warm — watches the
Delta logs of the events and broadcast tables without Spark (a directory listing every
``poll_seconds``) and starts a batch as soon as a new version commits. Each committed
batch is one materialization of the three output assets, with the same metadata as the
factory-built ``enrichment_microbatch`` (:mod:`jobs.factory_metadata`, :mod:`jobs.batch_metadata`).

It stops between two batches when the run is terminated from the UI: Dagster's interrupt
(SIGINT/SIGTERM to the run worker) is held while a batch runs, so the batch in progress
commits whole, then the run ends as canceled. It also ends after ``max_seconds``. A
``kill -9`` cuts a batch short: it committed nothing, and the next run of either job
redoes it with the same plan. While it is active the sensor requests no
``enrichment_microbatch`` run, and a run of either job that starts beside it is refused
(:mod:`jobs.runs`).

Without the UI: ``dagster job execute -m jobs.definitions -j enrichment_continuous
--config run.yaml`` (``ops: {enrichment_continuous_loop: {config: {max_seconds: 600}}}``).
"""

import signal
import threading
import time
from types import TracebackType

from dagster import (
    Config,
    DagsterExecutionInterruptedError,
    DagsterRunStatus,
    OpExecutionContext,
    Out,
    Output,
    job,
    op,
)
from pydantic import Field

from assets.resources import LakecastSparkResource, LakeResource
from jobs.enrichment_pipeline import (
    DEFAULT_CHECKPOINT_EVERY,
    ENRICHMENT,
    build_pipeline,
    pipeline_versions,
    summarize,
)
from jobs.factory_metadata import log_batch, record_batch, record_missed
from jobs.microbatch import ENRICHMENT_DECLARATION
from jobs.runs import CONTINUOUS_JOB, QUIET_RUN_LOGS, refuse_second_writer
from lakecast.pipeline.micro_batch import BatchResult
from lakecast.spark import is_connect


class ContinuousConfig(Config):
    """How long the continuous run lasts and how often it looks at the Delta logs."""

    max_seconds: float = Field(default=3600.0, description="End the run after this long "
                               "(checked between batches).")
    poll_seconds: float = Field(default=0.25, description="How often to list the Delta "
                                "logs for new versions while idle.")
    max_batches: int | None = Field(default=None, description="End after this many batches.")
    checkpoint_every: int = Field(
        default=DEFAULT_CHECKPOINT_EVERY,
        description="Checkpoint the broadcast state every N batches (a "
        "checkpoint hashes every task's state before the batch writes: off most batches' "
        "path; a cold start restores the last one and applies the versions since).")


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


@op(
    out=Out(dict, description="The run's totals (also in its log)."),
    description="Enrich every new events commit as soon as it lands, until terminated or "
                "max_seconds.",
)
def enrichment_continuous_loop(
    context: OpExecutionContext, config: ContinuousConfig, pyspark: LakecastSparkResource,
    lake: LakeResource,
) -> Output[dict]:
    refuse_second_writer(context.instance, context.run_id, CONTINUOUS_JOB)
    settings = lake.settings()
    record_missed(context, ENRICHMENT_DECLARATION, settings)
    spark = pyspark.session_for(ENRICHMENT.name)
    pipeline = build_pipeline(spark, settings, checkpoint_every=config.checkpoint_every)
    results: list[BatchResult] = []
    deadline = time.monotonic() + config.max_seconds
    seen: dict[str, int | None] | None = None
    next_status_check = 0.0
    t0 = time.monotonic()
    cold = pipeline.warm_up()  # the first batch then finds its task-local state built
    context.log.info(f"task-local state warmed in {time.monotonic() - t0:.1f}s "
                     f"({cold} task(s) were cold); watching {list(pipeline_versions(settings))} "
                     f"for up to {config.max_seconds:.0f}s")
    with StopRequest() as stop:
        try:
            while time.monotonic() < deadline and not stop.requested:
                if config.max_batches is not None and len(results) >= config.max_batches:
                    break
                now = time.monotonic()
                if now >= next_status_check:  # the UI's Terminate, seen in the run's status
                    if _terminating(context):
                        context.log.info("terminated: stopping between two batches")
                        break
                    next_status_check = now + 1.0
                versions = pipeline_versions(settings)
                if versions == seen:
                    time.sleep(config.poll_seconds)
                    continue
                done = pipeline.run(max_batches=1,
                                    on_batch=lambda r: log_batch(context.log, r))
                if not done:  # nothing to do at these versions (e.g. broadcast-only change)
                    seen = versions
                    continue
                record_batch(context, ENRICHMENT_DECLARATION, settings, done[0])
                results += done
        except BaseException:
            if is_connect(spark):  # do not leave the batch's jobs running on the server
                spark.interruptAll()
            raise
    if stop.requested:
        context.log.info(f"interrupted after {len(results)} batch(es), none cut short: "
                         f"{summarize(results)}")
        raise DagsterExecutionInterruptedError()
    totals = summarize(results)
    context.log.info(f"continuous run ends: {totals}")
    return Output(totals, metadata={k: v for k, v in totals.items()
                                    if isinstance(v, int | float)})


@job(
    name=CONTINUOUS_JOB,
    description="Continuous mode: one warm run that enriches each events commit as it lands "
                "(see jobs/continuous.py). Terminate it from the UI to stop.",
    tags={"lakecast/exclusive": CONTINUOUS_JOB},
    config=QUIET_RUN_LOGS,
)
def enrichment_continuous() -> None:
    enrichment_continuous_loop()
