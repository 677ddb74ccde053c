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
from assets.tables import DIM_PRODUCTS, DIM_USERS, USER_FEATURES, USER_SEGMENTS
from dagster_lakecast import QUIET_RUN_LOGS, LakecastSparkResource, LakeResource
from jobs.fraud.defs import FRAUD_PIPELINE
from jobs.fraud.tables import fraud_rules, transactions
from jobs.scoring.pipeline import SCORING_PIPELINE
from jobs.scoring.training import SCORING_EVENTS_SPEC, models
from jobs.storefront.microbatch import ENRICHMENT_PIPELINE

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

#: pipelines declared through dagster_lakecast's factory: each brings its micro-batch job,
#: continuous job, output assets, sensor, checks, maintenance job and schedule
PIPELINES = (ENRICHMENT_PIPELINE, FRAUD_PIPELINE, SCORING_PIPELINE)

# Steps run in the run's process: they share its one Spark session (lakecast.spark.get_spark)
# instead of starting a JVM per step, as the default multiprocess executor would.
defs = Definitions.merge(
    Definitions(
        executor=in_process_executor,
        assets=[*BATCH_ASSETS, events, fraud_rules, transactions, models, SCORING_EVENTS_SPEC],
        asset_checks=BATCH_CHECKS,
        jobs=[dimension_refresh_job, daily_segment_refresh_job],
        schedules=[daily_segment_refresh],
        resources={"pyspark": LakecastSparkResource(), "lake": LakeResource()},
    ),
    *(p.definitions() for p in PIPELINES),
)
