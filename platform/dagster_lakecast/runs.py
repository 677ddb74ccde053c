"""One writer per pipeline: the runs of a pipeline's writer jobs
(:attr:`~dagster_lakecast.handle.PipelineHandle.writers`: its micro-batch job, its
continuous job, other writers it names, its maintenance job) that are active.

The sensor requests nothing while a continuous run is active, and a run that starts while
another writer of the pipeline runs is refused with :class:`SecondWriterError`, which
names the active run. (The engine also refuses a batch planned concurrently by two
processes, as a last resort: ``lakecast.pipeline.micro_batch.ConcurrentRunError``.)
"""

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, Failure, RunsFilter

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
                         writers: tuple[str, ...], pipeline: str) -> None:
    """Raise :class:`SecondWriterError` when another run of ``writers`` (the pipeline's
    writer jobs) is running."""
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
