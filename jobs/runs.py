"""One writer per pipeline: the runs of the enrichment jobs (and of any factory-built
pipeline's writers, :attr:`jobs.declaration.PipelineDeclaration.writers`) that are active.

``enrichment_microbatch`` (sensor-requested, bounded) and ``enrichment_continuous``
(always on) write the same tables, and ``lake_maintenance_job`` rewrites them (compaction,
VACUUM). The sensor requests nothing while a continuous
run is active, and a run that starts while another writer of the pipeline runs is
refused with :class:`SecondWriterError`, which names the active run. (The engine
also refuses a batch planned concurrently by two processes, as a last resort:
``lakecast.pipeline.micro_batch.ConcurrentRunError``.)
"""

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, Failure, RunsFilter

#: default run config of the frequent jobs: their runs print only warnings and errors to the
#: terminal of ``dagster dev`` (the default prints every event, ~20 lines a run); every event
#: and log line is still stored and shown on the run's page. A launch may override it.
QUIET_RUN_LOGS = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}

MICROBATCH_JOB = "enrichment_microbatch"
CONTINUOUS_JOB = "enrichment_continuous"
#: rewrites the pipeline's tables (OPTIMIZE, VACUUM: :mod:`jobs.maintenance`)
MAINTENANCE_JOB = "lake_maintenance_job"
WRITER_JOBS = (MICROBATCH_JOB, CONTINUOUS_JOB, MAINTENANCE_JOB)

#: runs that hold (or are about to hold) the pipeline
ACTIVE = [
    DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
]  # fmt: skip
#: runs that may be writing right now (a queued run writes nothing yet)
RUNNING = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


class SecondWriterError(Failure):
    """Another run of the pipeline is writing: this one is refused (nothing written)."""


def active_runs(instance: DagsterInstance, jobs: tuple[str, ...],
                statuses: list[DagsterRunStatus] = ACTIVE,
                exclude_run_id: str | None = None) -> list[DagsterRun]:
    """Runs of ``jobs`` in ``statuses``, newest first, without ``exclude_run_id``."""
    runs = []
    for job in jobs:
        records = instance.get_run_records(RunsFilter(job_name=job, statuses=statuses), limit=5)
        runs += [r.dagster_run for r in records if r.dagster_run.run_id != exclude_run_id]
    return runs


def refuse_second_writer(instance: DagsterInstance, run_id: str, job: str,
                         writers: tuple[str, ...] = WRITER_JOBS,
                         pipeline: str = "enrichment") -> None:
    """Raise :class:`SecondWriterError` when another run of ``writers`` (default: the
    enrichment's writer jobs) is running."""
    others = active_runs(instance, writers, RUNNING, exclude_run_id=run_id)
    if others:
        other = others[0]
        raise SecondWriterError(
            description=(
                f"{job} refused: run {other.run_id} of {other.job_name} is writing the "
                f"{pipeline} pipeline's tables ({other.status.value}); one writer at a time. "
                f"Wait for it to end, or terminate it (UI: Runs → {other.run_id[:8]} → "
                f"Terminate), then launch this job again."
            )
        )
