"""A micro-batch's new events: the inserts of an append-only Delta table's version range."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from lakecast.delta import io as delta_io
from lakecast.errors import LakecastError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakecast.pipeline.progress import BatchPlan


class AppendOnlyError(LakecastError):
    """The events table was rewritten (deletes/updates) inside a batch's range."""


def read_new_events(spark: SparkSession, path: str, table: str, plan: BatchPlan
                    ) -> tuple[DataFrame, int | None]:
    """The plan's new events in the table ``table`` at ``path``, and how many rows the
    Delta log says they are (the ``numRecords`` statistics of the range's ``add`` actions,
    read without Spark; ``None`` when a file has none). That count is independent of the
    read, so the batch reconciles against it. One pass over the range's commits also
    checks that it only appends (else :class:`AppendOnlyError`)."""
    from pyspark.sql import functions as F

    if plan.events_start < 0:
        return (delta_io.read(spark, path, version=plan.events_end),
                delta_io.row_count(path, plan.events_end))
    rows: int | None = 0
    for version in range(plan.events_start + 1, plan.events_end + 1):
        for action in delta_io.commit_actions(path, version, spark):
            if "cdc" in action or ("remove" in action
                                   and action["remove"].get("dataChange", True)):
                raise AppendOnlyError(
                    f"{table} version {version} deletes or updates rows; the micro-batch "
                    f"reads an append-only events table (reprocessing rewritten events "
                    f"would duplicate output). Reset the pipeline's outputs and progress "
                    f"log, or append instead of overwriting."
                )
            add = action.get("add")
            if add is not None and add.get("dataChange", True) and rows is not None:
                n = json.loads(add.get("stats") or "{}").get("numRecords")
                rows = None if n is None else rows + int(n)
    changes = delta_io.read_changes(spark, path, plan.events_start + 1, plan.events_end)
    return changes.filter(F.col("_change_type") == "insert").drop(
        "_change_type", "_commit_version", "_commit_timestamp"
    ), rows


def rejected_rows(rejected: DataFrame, plan: BatchPlan, reason: str) -> DataFrame:
    """Rejected events (``reason``: the column saying why) as (reason, raw_record JSON,
    batch_id)."""
    from pyspark.sql import functions as F

    return rejected.select(
        F.col(reason).alias("reason"),
        F.to_json(F.struct(*[c for c in rejected.columns if c != reason])).alias("raw_record"),
        F.lit(plan.batch_id).alias("batch_id"),
    )
