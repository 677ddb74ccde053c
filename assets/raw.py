"""Raw-layer assets: the generator's Delta tables raw_users, raw_products and events."""

from collections.abc import Iterator
from datetime import date

from dagster import AssetExecutionContext, AssetSpec, Config, MaterializeResult, multi_asset

from assets.columns import column_metadata
from assets.common import table_metadata
from assets.resources import LakecastSparkResource, LakeResource
from lakecast.delta import io as delta_io
from lakecast.tables import EVENTS, RAW_PRODUCTS, RAW_TABLES, RAW_USERS
from lakecast.tools import datagen

RAW_GROUP = "raw"


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
        AssetSpec(
            EVENTS,
            group_name=RAW_GROUP,
            kinds={"spark", "delta"},
            metadata=column_metadata(EVENTS),
            description="Raw user events, appended by the producer (some malformed rows). "
            "The Delta table is stored by ingest_day; the asset has no Dagster partitions.",
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
    """Register the raw tables written by ``lakecast.tools.datagen`` (or a producer).

    Generates them with the configured seed and scale only when one is missing
    or ``regenerate`` is true; otherwise reports their current Delta version.
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
    for name in RAW_TABLES:
        yield MaterializeResult(
            asset_key=name,
            metadata=table_metadata(spark, settings, name, {"generated": generated}),
        )
