"""Feature flags / broadcast config: a small Delta table whose versions are broadcast.

``feature_flags(flag STRING, enabled BOOLEAN, value STRING, updated_at TIMESTAMP)``,
one row per flag, upserted with MERGE so each change is one small Delta version
(and one small broadcast element). CLI: ``lakecast flag set NAME VALUE``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from lakecast.delta import io as delta_io

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FLAGS_SCHEMA = "flag STRING, enabled BOOLEAN, value STRING, updated_at TIMESTAMP"


def set_flag(
    spark: SparkSession, path: str, flag: str, value: str, enabled: bool = True
) -> delta_io.MergeResult:
    """Create or change one flag; returns the MERGE outcome (its Delta version)."""
    if not flag or not flag.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"invalid flag name {flag!r}: use letters, digits, '_' or '-'")
    row = [(flag, enabled, value, datetime.now(UTC).replace(tzinfo=None))]
    df = spark.createDataFrame(row, FLAGS_SCHEMA)
    return delta_io.merge_upsert(
        spark, df, path, keys=["flag"], compare_columns=["enabled", "value"]
    )


def read_flags(spark: SparkSession, path: str) -> dict[str, tuple[bool, str]]:
    """All flags as ``{flag: (enabled, value)}`` (empty when the table does not exist)."""
    if delta_io.latest_version(path, spark) is None:
        return {}
    return {
        r["flag"]: (r["enabled"], r["value"])
        for r in delta_io.read(spark, path).collect()
    }
