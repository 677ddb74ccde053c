"""``make demo`` (``python -m jobs.demo``): the batch layer end to end on the embedded lake.

1. point Dagster at ``settings.dagster_home`` (runs persist in its SQLite storage);
2. generate scale-1 raw data into ``settings.lake_root`` (deterministic, seed 7);
3. materialize raw -> dim_users/dim_products, then user_features and user_segments for
   every generated day in ONE run (single-run backfill), with all asset checks;
4. print each table's Delta version and row count, and the segment sizes;
5. the storefront micro-batch live (:mod:`jobs.demo.live`), then the fraud-rules
   pipeline over two rules versions and the model-scoring pipeline over two trainings of
   ``models`` (:mod:`jobs.demo.pipelines`).

Re-runnable: the raw data is regenerated identically, so the second run's MERGEs
change nothing.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from datetime import date, timedelta

from dagster import DagsterInstance, ExecuteInProcessResult
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
)

from assets import datagen
from assets.segments import segment_counts
from assets.tables import ALL_TABLES, QUARANTINE
from jobs.definitions import daily_segment_refresh_job, defs, dimension_refresh_job
from jobs.demo.live import reset_demo_lake, run_live
from jobs.demo.pipelines import fraud_tour, reset_pipeline, scoring_tour
from jobs.fraud.defs import FRAUD, FRAUD_PIPELINE
from jobs.instance import ensure_instance
from jobs.scoring.pipeline import SCORING, SCORING_PIPELINE
from lakecast.config import Settings, get_settings
from lakecast.delta import io as delta_io
from lakecast.server import Server

RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}


def dagster_instance(settings: Settings) -> DagsterInstance:
    """The persistent instance in ``settings.dagster_home`` (created if needed)."""
    ensure_instance(settings)
    os.environ["DAGSTER_HOME"] = settings.dagster_home
    return DagsterInstance.get()


def generate_raw(settings: Settings, spec: datagen.GenSpec) -> dict[str, int]:
    """Write the raw tables; return their Delta versions."""
    from lakecast.spark import get_spark

    return datagen.generate(get_spark(settings=settings), settings, spec)


def _run(
    instance: DagsterInstance, job_name: str, tags: dict[str, str] | None = None
) -> ExecuteInProcessResult:
    """Execute the named asset job of ``defs`` (its assets' checks included) in-process."""
    result = defs.resolve_job_def(job_name).execute_in_process(
        instance=instance, tags=tags, run_config=RUN_CONFIG
    )
    failed = [e.asset_check_key for e in result.get_asset_check_evaluations() if not e.passed]
    if failed:
        raise RuntimeError(f"asset checks failed: {failed}")
    return result


def materialize_dimensions(instance: DagsterInstance) -> ExecuteInProcessResult:
    """One run of ``dimension_refresh_job``: raw tables (registered, not regenerated) ->
    dim_users, dim_products + checks."""
    return _run(instance, dimension_refresh_job.name)


def materialize_segments(
    instance: DagsterInstance, first_day: str, last_day: str
) -> ExecuteInProcessResult:
    """One run of ``daily_segment_refresh_job`` over the partition range
    ``first_day``..``last_day`` (days in order) + checks."""
    return _run(
        instance,
        daily_segment_refresh_job.name,
        tags={ASSET_PARTITION_RANGE_START_TAG: first_day, ASSET_PARTITION_RANGE_END_TAG: last_day},
    )


def summary(settings: Settings) -> str:
    """A text table of every batch table's Delta version and rows, and the segment sizes."""
    from lakecast.spark import get_spark

    spark = get_spark(settings=settings)
    lines = [f"Lakecast batch layer - lake {settings.lake_root}", ""]
    lines.append(f"{'table':<15}{'delta version':>14}{'rows':>12}")
    lines.append("-" * 41)
    for name in ALL_TABLES:
        path = settings.table_path(name)
        version = delta_io.latest_version(path, spark)
        rows = delta_io.read(spark, path).count() if version is not None else 0
        lines.append(f"{name:<15}{'-' if version is None else version:>14}{rows:>12,}")
    lines += ["", f"{'segment':<15}{'users':>12}", "-" * 27]
    for segment, n in segment_counts(spark, settings).items():
        lines.append(f"{segment:<15}{n:>12,}")
    q = delta_io.read(spark, settings.table_path(QUARANTINE)).groupBy("asset", "reason").count()
    lines += ["", f"{'quarantine: asset':<22}{'reason':<24}{'rows':>8}", "-" * 54]
    for r in q.orderBy("asset", "reason").collect():
        lines.append(f"{r['asset']:<22}{r['reason']:<24}{r['count']:>8,}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the batch demo on the embedded lake and print the summary."""
    del argv
    started = time.monotonic()
    settings = get_settings()
    spec = datagen.GenSpec(scale=1.0, seed=datagen.DEFAULT_SEED)
    instance = dagster_instance(settings)
    print(f"==> Dagster home {settings.dagster_home}", flush=True)
    removed = (reset_demo_lake(settings) + reset_pipeline(settings, FRAUD)
               + reset_pipeline(settings, SCORING))
    if removed:
        print(f"==> reset the demo's tables in {settings.lake_root} ({len(removed)} tables; "
              "the Dagster run history is kept)", flush=True)  # fmt: skip
    print(f"==> generating raw data ({spec.n_users} users, {spec.n_products} products, "
          f"~{spec.n_events:,} event draws over {spec.days} days)", flush=True)  # fmt: skip
    generate_raw(settings, spec)
    print("==> materializing raw -> dim_users, dim_products", flush=True)
    materialize_dimensions(instance)
    first, last = spec.day_keys[0], spec.day_keys[-1]
    print(f"==> materializing user_features, user_segments {first}...{last} in one run",
          flush=True)  # fmt: skip
    materialize_segments(instance, first, last)
    print()
    print(summary(settings))
    print()
    next_day = (date.fromisoformat(last) + timedelta(days=1)).isoformat()
    live = run_live(settings, instance, lambda day: materialize_segments(instance, day, day),
                    next_day)  # fmt: skip
    print()
    print(f"Lakecast micro-batch - enriched events by the user_segments version that enriched "
          f"them (v{live.segments_v1} before the daily job, v{live.segments_v2} after)")
    print()
    print(live.summary)
    if live.delay_seconds is not None:
        print(f"\ndelay from the user_segments v{live.segments_v2} commit to the first event "
              f"enriched with it: {live.delay_seconds:.1f}s ({live.runs} sensor-triggered runs)")
    fraud_job, scoring_job = FRAUD_PIPELINE.handle.job_name, SCORING_PIPELINE.handle.job_name
    print(f"\n==> the fraud-rules pipeline ({fraud_job}): two {FRAUD.broadcast_tables[0]} "
          "versions, a run after each", flush=True)  # fmt: skip
    for line in fraud_tour(instance):
        print(line)
    print(f"\n==> the model-scoring pipeline ({scoring_job}): {SCORING.broadcast_tables[0]} "
          "trained twice (Spark MLlib, champion and challenger per segment), a run after each",
          flush=True)  # fmt: skip
    for line in scoring_tour(instance):
        print(line)
    print(f"\ndone in {time.monotonic() - started:.0f}s; runs are in {settings.dagster_home} "
          "(`make ui` to browse them)")  # fmt: skip
    server = Server.from_settings(settings)
    if server.pid() is not None:  # started on demand (LAKECAST_SPARK_REMOTE=server)
        print(f"the Lakecast Spark server stays up for `make ui` and later runs: "
              f"{server.status()}; `make server-stop` stops it")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
