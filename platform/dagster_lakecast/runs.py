"""One writer per pipeline: the runs of a pipeline's writer jobs
(:attr:`~dagster_lakecast.handle.PipelineHandle.writers`: its micro-batch job, its
continuous job, other writers it names, its maintenance job) that are active.

The sensor requests nothing while a continuous run is active, and a run that starts while
another writer of the pipeline runs is refused with :class:`SecondWriterError`, which
names the active run, before it writes anything. Two writers started at once (two
launches of the job, the sensor's run and the continuous job) both see each other
running: the one that started first (its run record's start time, then its run id) is
the pipeline's writer and goes on, every later one is refused; a launched run that has
not started yet defers to the running one when it starts. (The engine also refuses a
batch planned concurrently by two processes, as a last resort:
``lakecast.pipeline.micro_batch.ConcurrentRunError``.)
"""

from __future__ import annotations

import math

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


def _started(instance: DagsterInstance, run: DagsterRun) -> tuple[float, str]:
    """A running run's place in line: its start time (a run marked running without one:
    first), then its run id."""
    record = instance.get_run_record_by_id(run.run_id)
    start = record.start_time if record is not None else None
    return (-math.inf if start is None else start, run.run_id)


def writing_before(instance: DagsterInstance, run_id: str,
                   writers: tuple[str, ...]) -> list[DagsterRun]:
    """The runs of ``writers`` that hold the pipeline before ``run_id``, earliest first:
    every other running one that started before it (a ``STARTING`` run that has not
    started yet defers to this one when it does)."""
    mine = _started(instance, DagsterRun(job_name="", run_id=run_id))
    if mine[0] == -math.inf:  # not started (a caller outside a run): everyone is before
        mine = (math.inf, run_id)
    before = []
    for other in active_runs(instance, writers, RUNNING, exclude_run_id=run_id):
        place = _started(instance, other)
        if other.status == DagsterRunStatus.STARTING and place[0] == -math.inf:
            continue
        if place < mine:
            before.append((place, other))
    return [r for _, r in sorted(before, key=lambda pr: pr[0])]


def refuse_second_writer(instance: DagsterInstance, run_id: str, job: str,
                         writers: tuple[str, ...], pipeline: str) -> None:
    """Raise :class:`SecondWriterError` when another run of ``writers`` (the pipeline's
    writer jobs) holds the pipeline: it runs and started before ``run_id``."""
    others = writing_before(instance, run_id, writers)
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
