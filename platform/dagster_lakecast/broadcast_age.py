"""How old the broadcast state a batch applied is, as per-batch Dagster metadata.

For each broadcast table of a batch's plan: the Delta version it applied, the commit time
of that version, and the table's newest version when the batch is recorded. Two numbers
plot per batch in the UI:

* ``broadcast_age_seconds``: the oldest applied version's age, from its commit to the
  batch's output commit (a dimension that has not changed for a day is a day old: not a
  fault, the state is simply that version);
* ``broadcast_stale_seconds``: how long a NEWER version had been committed and not yet
  applied when the batch's output committed (0 when every table is at its newest version;
  > 0 when the batch ran before a new version could apply, or a version was refused).

``broadcast_versions_behind`` counts those newer versions (committed by then) over all tables, and
``broadcast_age`` holds the per-table figures (JSON). Read from the ``_delta_log``
(no Spark).
"""

import time
from collections.abc import Callable, Mapping
from typing import Any

from dagster import MetadataValue

from lakecast.delta import io as delta_io

__all__ = ["broadcast_age"]


def _newer_before(path: str, version: int, newest: int | None, at: float,
                  limit: int = 100) -> list[float]:
    """Commit times of the versions after ``version`` committed by ``at`` (at most
    ``limit`` looked at: versions commit in order, so the scan stops at the first later)."""
    out: list[float] = []
    for v in range(version + 1, min(newest if newest is not None else version,
                                    version + limit) + 1):
        committed = delta_io.commit_seconds(path, v)
        if committed is None or committed > at:
            break
        out.append(committed)
    return out


def broadcast_age(
    table_path: Callable[[str], str],
    applied: Mapping[str, int | None],
    at: float | None = None,
) -> dict[str, Any]:
    """Metadata entries (see the module docstring) of a batch that applied ``applied``
    (broadcast table -> Delta version) and committed its output at ``at`` (epoch seconds;
    default now)."""
    at = time.time() if at is None else at
    per_table: dict[str, dict[str, Any]] = {}
    ages: list[float] = []
    stale: list[float] = [0.0]
    behind = 0
    for table, version in sorted(applied.items()):
        if version is None or version < 0:
            continue
        path = table_path(table)
        newest = delta_io.latest_version(path)
        committed = delta_io.commit_seconds(path, version)
        row: dict[str, Any] = {"version": version, "newest_version": newest}
        if committed is not None:
            row["age_seconds"] = round(max(0.0, at - committed), 3)
            ages.append(row["age_seconds"])
        newer = _newer_before(path, version, newest, at)
        if newer:
            behind += len(newer)
            row["stale_seconds"] = round(max(0.0, at - newer[0]), 3)
            stale.append(row["stale_seconds"])
        row["versions_behind"] = len(newer)
        per_table[table] = row
    out: dict[str, Any] = {
        "broadcast_age": MetadataValue.json(per_table),
        "broadcast_versions_behind": behind,
        "broadcast_stale_seconds": max(stale),
    }
    if ages:
        out["broadcast_age_seconds"] = max(ages)
    return out
