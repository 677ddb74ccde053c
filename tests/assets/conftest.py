"""Helpers for the batch-asset tests: run assets with Dagster's ``materialize``."""

from __future__ import annotations

from datetime import date

import pytest
from dagster import AssetSelection, DagsterInstance, ExecuteInProcessResult, materialize
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
)

from assets import BATCH_ASSETS, BATCH_CHECKS
from assets.datagen import GenSpec
from dagster_lakecast.resources import LakecastSparkResource, LakeResource

SMALL = GenSpec(scale=0.1, seed=11, days=3)
"""~200 users, ~20 products, ~5k events over 2026-01-01..2026-01-03."""
DAYS = [date.fromisoformat(k) for k in SMALL.day_keys]
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def run_assets(
    selection: AssetSelection,
    *,
    partition_key: str | None = None,
    partition_range: tuple[str, str] | None = None,
    instance: DagsterInstance | None = None,
) -> ExecuteInProcessResult:
    """Materialize ``selection`` (with its checks) in-process; every check must pass."""
    tags = None
    if partition_range is not None:
        tags = {
            ASSET_PARTITION_RANGE_START_TAG: partition_range[0],
            ASSET_PARTITION_RANGE_END_TAG: partition_range[1],
        }
    result = materialize(
        [*BATCH_ASSETS, *BATCH_CHECKS],
        selection=selection,
        resources={"pyspark": LakecastSparkResource(), "lake": LakeResource()},
        partition_key=partition_key,
        tags=tags,
        instance=instance,
        run_config=QUIET,
    )
    assert result.success
    evaluations = result.get_asset_check_evaluations()
    assert evaluations, "the asset checks ran"
    failed = [(e.asset_check_key, e.metadata) for e in evaluations if not e.passed]
    assert not failed, failed
    return result


DIMS = AssetSelection.groups("raw") | AssetSelection.assets("dim_users", "dim_products")
DIM_ONLY = AssetSelection.assets("dim_users", "dim_products")
SEGMENTS = AssetSelection.assets("user_features", "user_segments")


@pytest.fixture
def small_lake(spark, lake):
    """A temp lake with the SMALL raw data generated."""
    from assets import datagen

    datagen.generate(spark, lake, SMALL)
    return lake
