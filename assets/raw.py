"""Raw-layer assets: the generator's Delta tables raw_users and raw_products, and
``events``, an observable source asset: the producer appends to it outside Dagster, and
each observation's data version is the table's newest Delta version (read from its
``_delta_log``, no Spark), so the UI shows when it changed. ``broadcast_versions_sensor``
records an observation whenever the version moves (:func:`events_observation`)."""

import warnings
from collections.abc import Iterator
from datetime import UTC, date, datetime
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetObservation,
    AssetSpec,
    BetaWarning,
    Config,
    DataVersion,
    MaterializeResult,
    MetadataValue,
    ObserveResult,
    multi_asset,
    observable_source_asset,
)
from dagster._core.definitions.data_version import DATA_VERSION_TAG

from assets import datagen
from assets.columns import column_metadata
from assets.common import table_metadata
from assets.tables import EVENTS, RAW_PRODUCTS, RAW_TABLES, RAW_USERS
from dagster_lakecast import LakecastSparkResource, LakeResource
from lakecast.config import Settings
from lakecast.delta import io as delta_io

RAW_GROUP = "raw"
NO_TABLE = "no table"
"""The data version of ``events`` while the Delta table does not exist."""


class RawDataConfig(Config):
    """Generator settings, used when a raw table is missing or ``regenerate`` is set."""

    scale: float = 1.0
    seed: int = datagen.DEFAULT_SEED
    days: int = datagen.DEFAULT_DAYS
    start: str = datagen.DATA_START.isoformat()
    regenerate: bool = False


@multi_asset(
    specs=[
        AssetSpec(
            RAW_USERS,
            group_name=RAW_GROUP,
            kinds={"spark", "delta"},
            metadata=column_metadata(RAW_USERS),
            description="Raw users as delivered (string timestamps, some malformed rows).",
        ),
        AssetSpec(
            RAW_PRODUCTS,
            group_name=RAW_GROUP,
            kinds={"spark", "delta"},
            metadata=column_metadata(RAW_PRODUCTS),
            description="Raw product catalog as delivered (some malformed rows).",
        ),
    ],
    name="raw_tables",
)
def raw_tables(
    context: AssetExecutionContext,
    config: RawDataConfig,
    pyspark: LakecastSparkResource,
    lake: LakeResource,
) -> Iterator[MaterializeResult]:
    """Register the raw tables written by ``assets.datagen`` (or a producer).

    Generates them (``events`` too) with the configured seed and scale only when one is
    missing or ``regenerate`` is true; otherwise reports their current Delta version.
    ``events`` is observed, not materialized: after a generation, one observation.
    """
    spark = pyspark.spark_session
    settings = lake.settings()
    missing = [t for t in RAW_TABLES if not delta_io.table_exists(settings.table_path(t), spark)]
    generated = bool(missing) or config.regenerate
    if generated:
        spec = datagen.GenSpec(
            scale=config.scale,
            seed=config.seed,
            days=config.days,
            start=date.fromisoformat(config.start),
        )
        context.log.info(f"generating raw tables {spec} (missing: {missing})")
        datagen.generate(spark, settings, spec)
        context.log_event(events_observation(settings))
    for name in (RAW_USERS, RAW_PRODUCTS):
        yield MaterializeResult(
            asset_key=name,
            metadata=table_metadata(spark, settings, name, {"generated": generated}),
        )


def observe_events_table(settings: Settings) -> tuple[DataVersion, dict[str, Any]]:
    """The events table's data version (its newest Delta version, from the log) and the
    observation's metadata: that version, its commit's time and operation, and the rows
    (from the log's file statistics)."""
    path = settings.table_path(EVENTS)
    version = delta_io.latest_version(path)
    meta: dict[str, Any] = {"dagster/uri": MetadataValue.path(path)}
    if version is None:
        return DataVersion(NO_TABLE), meta
    meta["delta_version"] = version
    rows = delta_io.row_count(path, version)
    if rows is not None:
        meta["dagster/row_count"] = rows
    try:
        commit = delta_io.commit_info(path, version)
    except delta_io.DeltaIOError:
        commit = None
    if commit is not None:
        when = datetime.fromtimestamp(commit.timestamp_ms / 1000, tz=UTC)
        meta["committed_at"] = MetadataValue.timestamp(when)
        meta["operation"] = commit.operation
    return DataVersion(str(version)), meta


def events_observation(settings: Settings) -> AssetObservation:
    """An observation of ``events`` as the asset's own observe function records it, for
    code that is not that function (the sensor, the generator)."""
    version, meta = observe_events_table(settings)
    return AssetObservation(asset_key=EVENTS, metadata=meta,
                            tags={DATA_VERSION_TAG: version.value})


# An observable source asset is the Dagster way to show a table written outside Dagster;
# Dagster 1.13 still calls the decorator beta, and turning it into an asset definition
# reads Dagster's own deprecated ``OpDefinition.version`` (nothing here uses it): silence
# exactly those two warnings.
warnings.filterwarnings(
    "ignore", message="Function `observable_source_asset` is currently in beta",
    category=BetaWarning,
)
warnings.filterwarnings(
    "ignore", message="Property `OpDefinition.version` is deprecated", category=DeprecationWarning,
    module="dagster._core.definitions.external_asset",
)


@observable_source_asset(
    key=EVENTS,
    group_name=RAW_GROUP,
    metadata=column_metadata(EVENTS),
    tags={"dagster/kind/delta": ""},
    description="Raw user events, appended by the producer outside Dagster (some malformed "
    "rows); observed: the data version is the table's Delta version. The Delta table is "
    "stored by ingest_day; the asset has no Dagster partitions.",
)
def events(lake: LakeResource) -> ObserveResult:
    """The events table's newest Delta version (from its log, no Spark)."""
    version, meta = observe_events_table(lake.settings())
    return ObserveResult(data_version=version, metadata=meta)
