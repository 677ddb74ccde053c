"""Helpers shared by the batch assets: table metadata and the quarantine table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dagster import MetadataValue

from assets.columns import COLUMN_SCHEMA, describe
from assets.tables import QUARANTINE
from lakecast.config import Settings
from lakecast.delta import io as delta_io

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

QUARANTINE_PARTITION_BY = ("asset",)
TABLE_POOL_PREFIX = "lakecast_delta_"
"""Dagster concurrency pool of the asset that writes Delta table T: ``lakecast_delta_<T>``.
The instance config (deploy/dagster/*.yaml) limits every pool to 1 (``pools:
default_limit``): one writer per table, whatever launched the run."""


def table_pool(table: str) -> str:
    """The concurrency pool of the one writer of Delta table ``table``."""
    return f"{TABLE_POOL_PREFIX}{table}"


def table_metadata(
    spark: SparkSession, settings: Settings, name: str, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Standard materialization metadata of the Delta table ``name``."""
    path = settings.table_path(name)
    df = delta_io.read(spark, path)
    return {
        "dagster/row_count": df.count(),
        COLUMN_SCHEMA: describe(df.schema, name),
        "dagster/uri": MetadataValue.path(path),
        "delta_version": delta_io.latest_version(path, spark),
        **(extra or {}),
    }


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def quarantine_predicate(asset: str, partitions: list[str] | None) -> str:
    """The quarantine rows owned by ``asset`` for ``partitions`` (None: unpartitioned)."""
    if partitions is None:
        return f"asset = {_sql_str(asset)} AND partition_key IS NULL"
    keys = ", ".join(_sql_str(p) for p in partitions)
    return f"asset = {_sql_str(asset)} AND partition_key IN ({keys})"


def write_quarantine(
    spark: SparkSession,
    settings: Settings,
    rows: DataFrame,
    asset: str,
    partitions: list[str] | None,
) -> int:
    """Replace the quarantine rows of ``asset`` for ``partitions`` with ``rows``.

    One atomic ``replaceWhere`` commit, so a rerun replaces instead of duplicating.
    Returns the quarantine table's version.
    """
    path = settings.table_path(QUARANTINE)
    predicate = quarantine_predicate(asset, partitions)
    return delta_io.retry_on_conflict(
        lambda: delta_io.replace_where(rows, path, predicate, partition_by=QUARANTINE_PARTITION_BY)
    )


def quarantine_count(
    spark: SparkSession, settings: Settings, asset: str, partitions: list[str] | None
) -> int:
    """How many quarantine rows ``asset`` owns for ``partitions``."""
    path = settings.table_path(QUARANTINE)
    if not delta_io.table_exists(path, spark):
        return 0
    return delta_io.read(spark, path).filter(quarantine_predicate(asset, partitions)).count()
