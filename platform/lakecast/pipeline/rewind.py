"""Rewinds: go back to a committed (checkpointed) batch and roll the outputs back.

:func:`rewind` logs a ``restore`` row in the progress log, then every output table is
rolled back (Delta ``RESTORE``) to its version at that batch; processing resumes from the
batch's offsets with fresh batch ids (so the idempotent writes of the redone events are
never mistaken for the abandoned ones).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from lakecast.delta import io as delta_io
from lakecast.errors import LakecastError
from lakecast.pipeline.progress import BatchCommit, BatchPlan, ProgressLog

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# --------------------------------------------------------------------------- rewinds
def rewind(
    spark: SparkSession,
    log: ProgressLog,
    table_path: Callable[[str], str],
    batch_id: int,
    broadcast_versions: Mapping[str, int] | None = None,
) -> BatchPlan:
    """Go back to just after committed batch ``batch_id`` (a checkpoint's batch): log a
    rewind, roll every output table back to its version at that batch, commit the rewind.
    The next batch starts at that batch's events offset. Returns the rewind plan."""
    plans, commits = log.state()
    by_id = {p.batch_id: p for p in plans}
    target = by_id.get(batch_id)
    if target is None or batch_id not in commits or target.is_restore:
        raise LakecastError(f"batch {batch_id} is not a committed batch of {log.pipeline}; "
                            f"committed: {sorted(b for b in commits if not by_id[b].is_restore)}")
    if batch_id in log.abandoned():
        raise LakecastError(f"batch {batch_id} was abandoned by an earlier rewind")
    at = commits[batch_id].output_versions
    if not at:
        raise LakecastError(f"batch {batch_id} was committed without output versions (an "
                            "older progress log): cannot roll the outputs back to it")
    tables = set(at)
    for c in commits.values():
        tables |= set(c.output_versions)
    plan = BatchPlan(
        max(by_id) + 1, target.events_start, target.events_end,
        dict(broadcast_versions or target.broadcast_versions),
        restore_of=batch_id, rollback_to={t: at.get(t, -1) for t in sorted(tables)},
    )
    log.write_plan(plan)
    finish_rewind(spark, log, table_path, plan)
    return plan


def finish_rewind(spark: SparkSession, log: ProgressLog, table_path: Callable[[str], str],
                  plan: BatchPlan) -> None:
    """Roll the outputs back to ``plan.rollback_to`` (idempotent) and commit the rewind."""
    assert plan.rollback_to is not None
    now = {}
    for table, version in sorted(plan.rollback_to.items()):
        path = table_path(table)
        current = delta_io.latest_version(path, spark)
        if current is None:
            continue
        if version < 0:
            if delta_io.read(spark, path).limit(1).count():
                delta_io.delete(spark, path, "true")
        elif current != version:
            delta_io.restore_version(spark, path, version)
        now[table] = delta_io.latest_version(path, spark)
    log.write_commit(BatchCommit(plan.batch_id, {"rewind_to_batch": int(plan.restore_of or 0)},
                                 output_versions={t: v for t, v in now.items()
                                                  if v is not None}))
