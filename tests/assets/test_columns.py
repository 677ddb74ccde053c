"""Column descriptions: every asset declares its columns, and they match its Delta table."""

from __future__ import annotations

from dagster import AssetKey

from assets.columns import COLUMN_SCHEMA, COLUMNS
from dagster_lakecast.handle import PipelineHandle
from jobs.definitions import defs
from lakecast.delta import io as delta_io
from tests.assets.conftest import DIMS, SEGMENTS, SMALL, run_assets


def _declared() -> dict[str, list[tuple[str, str, str | None]]]:
    graph = defs.resolve_asset_graph()
    out = {}
    for key in graph.get_all_asset_keys():
        schema = graph.get(key).metadata.get(COLUMN_SCHEMA)
        assert schema is not None, f"{key.to_user_string()} declares no {COLUMN_SCHEMA}"
        out[key.to_user_string()] = [(c.name, c.type, c.description) for c in schema.columns]
    return out


def test_every_asset_declares_described_columns():
    declared = _declared()
    assert set(declared) == set(COLUMNS)
    for table, columns in declared.items():
        assert columns, table
        undescribed = [n for n, _, d in columns if not (d and d.strip())]
        assert not undescribed, f"{table}: no description for {undescribed}"
    events = defs.resolve_asset_graph().get(AssetKey("events"))
    assert events.partitions_def is None
    assert "partitioned by" not in events.description and "no Dagster" in events.description


def _spark_columns(spark, lake, table) -> list[tuple[str, str]]:
    from dagster_lakecast.maintenance import factory_tables
    from jobs.definitions import PIPELINES

    factory = [t for p in PIPELINES for t in factory_tables(PipelineHandle.resolve(p.declaration))]
    paths = {t.name: t.path(lake) for t in factory}
    df = delta_io.read(spark, paths.get(table, lake.table_path(table)))
    return [(f.name, f.dataType.simpleString()) for f in df.schema.fields]


#: tables whose columns tests/jobs/test_fraud_pipeline.py checks against its own run (the
#: fraud pipeline's inputs and outputs): running that pipeline here once more would cost ~1 min
FRAUD_TABLES = frozenset(
    {"fraud_rules", "transactions", "fraud_alerts", "fraud_review", "fraud_rejected",
     "fraud_progress", "fraud_keyed_state"})
#: likewise the scoring pipeline's tables (tests/jobs/test_model_pipeline.py)
MODEL_TABLES = frozenset(
    {"models", "scoring_events", "predictions", "scoring_unmatched", "predictions_rejected",
     "scoring_progress", "scoring_snapshots"})


def column_mismatches(spark, lake, tables) -> dict[str, list[tuple[str, str]]]:
    """Tables among ``tables`` whose Delta columns differ from their declared columns (the
    table's actual columns), checked in ``lake``."""
    declared = _declared()
    mismatches = {}
    for table in tables:
        actual = _spark_columns(spark, lake, table)
        if [(n, t) for n, t, _ in declared[table]] != actual:
            mismatches[table] = actual
    return mismatches


def assert_materializations_report_declared_columns(*results) -> None:
    """Every materialization in ``results`` reports its table's declared columns, with the
    declared descriptions."""
    declared = _declared()
    for result in results:
        for event in result.get_asset_materialization_events():
            table = event.asset_key.to_user_string()
            schema = event.materialization.metadata[COLUMN_SCHEMA].schema
            got = [(c.name, c.type, c.description) for c in schema.columns]
            assert got == declared[table], table


def test_declared_columns_match_the_tables_and_materializations(spark, small_lake):
    from assets import flags
    from jobs.storefront.microbatch import build_pipeline

    lake = small_lake
    dims = run_assets(DIMS)
    segs = run_assets(SEGMENTS, partition_range=(SMALL.day_keys[0], SMALL.day_keys[-1]))
    flags.set_flag(spark, lake.table_path("feature_flags"), "vip_discount", "10")
    build_pipeline(spark, lake).run()

    declared = _declared()
    assert set(declared) >= FRAUD_TABLES | MODEL_TABLES
    assert not column_mismatches(spark, lake, set(declared) - FRAUD_TABLES - MODEL_TABLES)
    # materializations report the table's schema with the same descriptions
    assert_materializations_report_declared_columns(dims, segs)
