"""The Dagster Definitions object ``defs`` that ``workspace.yaml`` loads."""

from __future__ import annotations

from dagster import (
    AssetSelection,
    Definitions,
    build_schedule_from_partitioned_job,
    define_asset_job,
    in_process_executor,
)

from assets import BATCH_ASSETS, BATCH_CHECKS
from assets.raw import RAW_GROUP, events
from assets.resources import LakecastSparkResource, LakeResource
from jobs.continuous import enrichment_continuous
from jobs.fraud import FRAUD_PIPELINE
from jobs.fraud_tables import fraud_rules, transactions
from jobs.maintenance import INTERNAL_TABLE_SPECS, lake_maintenance, lake_maintenance_job
from jobs.microbatch import ENRICHMENT_PIPELINE
from jobs.model_training import SCORING_EVENTS_SPEC, models
from jobs.runs import QUIET_RUN_LOGS
from jobs.scoring import SCORING_PIPELINE
from lakecast.tables import DIM_PRODUCTS, DIM_USERS, USER_FEATURES, USER_SEGMENTS

dimension_refresh_job = define_asset_job(
    "dimension_refresh_job",
    selection=AssetSelection.groups(RAW_GROUP).materializable()
    | AssetSelection.assets(DIM_USERS, DIM_PRODUCTS),
    description="Register the raw tables, MERGE-refresh dim_users and dim_products, and run "
    "their checks.",
    config=QUIET_RUN_LOGS,
)

daily_segment_refresh_job = define_asset_job(
    "daily_segment_refresh_job",
    # daily partitions: from the assets
    selection=AssetSelection.assets(USER_FEATURES, USER_SEGMENTS),
    description="Features and segments of users for one day (or a range, in one run) "
    "and their checks.",
    # Runs of this job MERGE into one table: a tag_concurrency_limits entry for this tag
    # (limit 1) in dagster.yaml serializes `dagster job backfill`'s per-partition runs.
    tags={"lakecast/exclusive": "user_segments"},
)

daily_segment_refresh = build_schedule_from_partitioned_job(
    daily_segment_refresh_job,
    name="daily_segment_refresh",
    hour_of_day=1,
    minute_of_hour=0,
    description="Every day at 01:00 UTC, segment users for the day that just ended.",
)

#: pipelines declared through the factory (jobs/factory.py): job, assets, sensor, checks each;
#: the enrichment's maintenance is lake_maintenance_job (its declaration names it)
FACTORY_PIPELINES = (ENRICHMENT_PIPELINE, FRAUD_PIPELINE, SCORING_PIPELINE)
FACTORY_MAINTENANCE = [p.maintenance for p in FACTORY_PIPELINES if p.maintenance is not None]

# Steps run in the run's process: they share its one Spark session (lakecast.spark.get_spark)
# instead of starting a JVM per step, as the default multiprocess executor would.
defs = Definitions(
    executor=in_process_executor,
    assets=[*BATCH_ASSETS, events, *INTERNAL_TABLE_SPECS, *(p.assets for p in FACTORY_PIPELINES),
            fraud_rules, transactions, models, SCORING_EVENTS_SPEC,
            *(s for m in FACTORY_MAINTENANCE for s in m.specs)],
    asset_checks=[*BATCH_CHECKS, *(c for p in FACTORY_PIPELINES for c in p.checks)],
    jobs=[dimension_refresh_job, daily_segment_refresh_job, enrichment_continuous,
          lake_maintenance_job, *(p.job for p in FACTORY_PIPELINES),
          *(m.job for m in FACTORY_MAINTENANCE)],
    schedules=[daily_segment_refresh, lake_maintenance,
               *(m.schedule for m in FACTORY_MAINTENANCE)],
    sensors=[p.sensor for p in FACTORY_PIPELINES],
    resources={
        "pyspark": LakecastSparkResource(),
        "lake": LakeResource(),
    },
)
