"""Taking a checkpoint of the tasks' broadcast state: the manifest job, the divergence
check, and the content job with the one Delta commit.

* :func:`task_manifest`: each of ``p`` tasks hashes its task-local state (one Spark job,
  nothing written);
* :func:`check_divergence`: every task reported every state, with one hash per state, or
  :class:`~lakecast.snapshots.CheckpointDivergenceError`;
* :func:`write_checkpoint`: a second job writes each distinct content once (the task that
  writes it is the lowest holding it), and the header, manifest and content rows commit
  together (:meth:`~lakecast.snapshots.table.SnapshotTable.write`: one Delta version).

The state a checkpoint writes is fixed when it is due (:class:`Captured`), so one taken in
the background does not see the state the next batches move to
(:class:`~lakecast.snapshots.runtime.SnapshottingRuntime`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakecast.runtime.tasks import TaskPlan
from lakecast.snapshots.checkpointer import CheckpointResult
from lakecast.snapshots.codec import FORMAT
from lakecast.snapshots.errors import CheckpointDivergenceError, SnapshotError
from lakecast.snapshots.records import CheckpointHeader, ManifestRow
from lakecast.snapshots.store import SnapshotStore, now_ms
from lakecast.snapshots.tasks import ENTRY_ARROW, MANIFEST_SCHEMA, content_task, manifest_task

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class Captured:
    """The state a checkpoint writes, fixed when it is due."""

    plan: TaskPlan
    version: dict[str, int]
    parallelism: int
    schemas: dict[str, str]


def task_manifest(spark: SparkSession, plan: TaskPlan, p: int) -> list[ManifestRow]:
    """Each of ``p`` tasks hashes its task-local state (one Spark job, no write)."""
    rows = spark.range(0, p, 1, p).mapInArrow(manifest_task(plan), MANIFEST_SCHEMA).collect()
    return sorted((ManifestRow(r["task"], r["state"], r["content_hash"], r["n_entries"],
                               {"bytes": r["bytes"], "schema": r["schema"], "pid": r["pid"],
                                "cache": r["cache"], "state_bytes": r["state_bytes"],
                                "rows": r["rows"]})
                   for r in rows), key=lambda m: (m.task, m.state))


def check_divergence(manifest: Sequence[ManifestRow], states: Mapping[str, Any], p: int,
                     checkpoint_id: int, *, batch_id: int | None = None,
                     pipeline: str | None = None) -> dict[str, tuple[int, str]]:
    """Every task reported every state with one hash per state, or raise (naming the
    state and which tasks hold which hash); returns state -> (writer task, hash)."""
    got = {(m.task, m.state) for m in manifest}
    missing = [(t, s) for t in range(p) for s in states if (t, s) not in got]
    if missing:
        raise SnapshotError(f"checkpoint {checkpoint_id}: tasks did not report {missing}")
    writers: dict[str, tuple[int, str]] = {}
    for s in states:
        by_hash: dict[str, list[int]] = {}
        for m in manifest:
            if m.state == s:
                by_hash.setdefault(m.content_hash, []).append(m.task)
        if len(by_hash) > 1:
            raise CheckpointDivergenceError(s, by_hash, checkpoint_id, batch_id=batch_id,
                                            pipeline=pipeline)
        (digest, tasks), = by_hash.items()
        writers[s] = (min(tasks), digest)
    return writers


def write_checkpoint(spark: SparkSession, store: SnapshotStore, at: Captured,
                     states: Mapping[str, Any], function: str, checkpoint_id: int, *,
                     batch_id: int, events_start: int, events_end: int,
                     manifest: list[ManifestRow]) -> CheckpointResult:
    """The content job and the one Delta commit of a checkpoint of state ``at``
    (``states``: the function's declared states; ``function``: its qualified name)."""
    from lakecast.delta import io as delta_io

    p = at.parallelism
    writers = check_divergence(manifest, states, p, checkpoint_id)
    created = now_ms()
    header = CheckpointHeader(
        checkpoint_id=checkpoint_id, pipeline=store.pipeline, batch_id=batch_id,
        events_start=events_start, events_end=events_end,
        state_version=at.version, parallelism=p, states=dict(states),
        table_schemas=at.schemas, function=function, created_at_ms=created, format=FORMAT,
    )
    content = (spark.range(0, p, 1, p)
               .mapInArrow(content_task(at.plan, checkpoint_id, writers, created),
                           _spark_schema()))
    rows = content.unionByName(store.small_rows(header, manifest))
    version = store.write(header, rows)
    info = delta_io.commit_info(store.path, version, spark)
    stored = int(info.metrics.get("numOutputBytes", 0))
    task0 = [m for m in manifest if m.task == 0]
    return CheckpointResult(
        header, manifest, version, stored, sum(int(m.meta["bytes"]) for m in task0),
        len({m.content_hash for m in manifest}), sorted({m.meta["pid"] for m in manifest}),
    )


def _spark_schema() -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(ENTRY_ARROW)
