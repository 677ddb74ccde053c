"""Freshness through the real sensor path, on the Lakecast Spark server (issue 14's targets).

``python -m benchmarks.sensor_freshness [--commits 10] [--every 30] [--events 1300]
[--idle 120]``

1. builds a demo lake (scale ``--scale``) through the batch assets, over a Lakecast
   Spark server (``lakecast.server``; started if none runs);
2. runs one catch-up micro-batch, then starts ``dagster dev`` as ``make ui`` does
   (``python -m jobs.ui``: webserver + daemon, the ``broadcast_versions_sensor`` every
   ``LAKECAST_SENSOR_INTERVAL_SECONDS``, 3 s by default), each run a process of its own
   attached to the server, and leaves it idle ``--idle`` s once the UI serves;
3. appends ``--commits`` events commits of ~``--events`` events, ``--every`` seconds apart,
   each delayed by its share of the sensor daemon's 5 s loop
   (:func:`benchmarks.common.phase_offsets`: the commits meet every phase of the loop, as
   a user's do), then one broadcast-only change (a feature flag; the sensor starts no run
   for it) and launches one run by hand (``dagster job execute``): a run that finds no new events;
4. reports, from the Delta logs and the Dagster instance:

   - events commit -> first ``enriched_events`` commit holding those events: p50, max;
   - per commit, where the time went: commit -> the sensor's run created (``tick_s``),
     created -> started (``launch_s``: the queue, the run's process and its code
     location's imports), started -> the output commit (``run_s``);
   - run time (Dagster's start -> end) of the run that found nothing new;
   - cold tasks in each run's first batch, and the gap since the previous run ended.

Everything listens on 127.0.0.1. Run it alone on the machine (through spark-lock).
JSON goes to ``benchmarks/results/sensor_freshness.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import dagster_home, phase_offsets
from benchmarks.freshness_watch import FreshnessWatch
from benchmarks.targets import SENSOR_FRESHNESS as BENCH
from lakecast.config import get_settings

#: the repository root (this example project's folder)
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def bench_env(root: Path, url: str, interval: int | None) -> dict[str, str]:
    """The environment of a benchmark lake under ``root`` on the server at ``url``
    (``interval``: the sensor interval; ``None``: the project's default, as ``make ui``)."""
    env = {
        **os.environ,
        "LAKECAST_LAKE_ROOT": str(root / "lake"),
        "LAKECAST_CHECKPOINT_ROOT": str(root / "checkpoints"),
        "DAGSTER_HOME": str(root / "dagster_home"),
        "LAKECAST_SPARK_REMOTE": url,
    }
    env.pop("LAKECAST_SENSOR_INTERVAL_SECONDS", None)
    if interval is not None:
        env["LAKECAST_SENSOR_INTERVAL_SECONDS"] = str(interval)
    return env


def build_lake(scale: float) -> None:
    """The demo's batch half (raw -> dims -> segments) on this process's settings."""
    from assets import datagen, flags
    from jobs.demo.tour import (
        dagster_instance,
        generate_raw,
        materialize_dimensions,
        materialize_segments,
    )
    from lakecast.spark import get_spark

    settings = get_settings()
    spec = datagen.GenSpec(scale=scale, seed=datagen.DEFAULT_SEED)
    instance = dagster_instance(settings)
    generate_raw(settings, spec)
    materialize_dimensions(instance)
    materialize_segments(instance, spec.day_keys[0], spec.day_keys[-1])
    flags.set_flag(get_spark(settings=settings), settings.table_path("feature_flags"),
                   "vip_discount", "10")


def _wait_for_output(watch: FreshnessWatch, events_version: int, timeout: float
                     ) -> float | None:
    """Seconds from the events commit ``events_version`` to the first ``enriched_events``
    commit holding one of its rows, read from the Delta logs
    (:mod:`benchmarks.freshness_watch`); ``None``: not landed within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        latency = watch.latency_s(events_version)
        if latency is not None:
            return latency
        time.sleep(0.2)
    return None


def run_records(dagster_home: str) -> list[dict]:
    """Runs of enrichment_microbatch: start, end, status and first-batch cold tasks."""
    from dagster import AssetKey, DagsterInstance, RunsFilter

    os.environ["DAGSTER_HOME"] = dagster_home
    instance = DagsterInstance.get()
    records = instance.get_run_records(RunsFilter(job_name="enrichment_microbatch"))
    cold: dict[str, int] = {}
    for ev in instance.fetch_materializations(AssetKey("enriched_events"), limit=1000).records:
        meta = ev.asset_materialization.metadata if ev.asset_materialization else {}
        if "run_first_batch_cold_tasks" in meta:  # on the run's last batch
            cold[ev.run_id] = int(meta["run_first_batch_cold_tasks"].value)
    out = []
    for r in sorted(records, key=lambda r: r.start_time or 0):
        out.append({"run_id": r.dagster_run.run_id, "status": r.dagster_run.status.value,
                    "start": r.start_time, "end": r.end_time,
                    "seconds": (r.end_time - r.start_time) if r.start_time and r.end_time
                    else None, "first_batch_cold_tasks": cold.get(r.dagster_run.run_id)})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=10)
    parser.add_argument("--every", type=float, default=30.0)
    parser.add_argument("--events", type=int, default=1300)
    parser.add_argument("--scale", type=float, default=0.5)
    parser.add_argument("--interval", type=int, default=None,
                        help="sensor interval (s); default: the project's")
    parser.add_argument("--idle", type=float, default=120.0,
                        help="idle seconds between the UI serving and the first commit")
    parser.add_argument("--port", type=int, default=3333, help="dagster webserver port")
    parser.add_argument("--root", default=str(PROJECT_ROOT / "var" / "bench" / "freshness"))
    args = parser.parse_args(argv)
    BENCH.start()

    from benchmarks.freshness import project_server

    root = Path(args.root).resolve()  # DAGSTER_HOME must be absolute
    dagster_home(root)
    with project_server() as server:  # stopped at the end if this run started it
        return _measure(args, root, server.url)


def _measure(args: argparse.Namespace, root: Path, url: str) -> int:
    """The benchmark proper, on the Spark server at ``url`` (see the module doc)."""
    env = bench_env(root, url, args.interval)
    os.environ.update(env)
    settings = get_settings()
    t0 = time.monotonic()
    build_lake(args.scale)
    print(f"lake built in {time.monotonic() - t0:.0f}s", flush=True)
    subprocess.run([sys.executable, "-m", "jobs.storefront.microbatch"], cwd=PROJECT_ROOT, env=env,
                   check=True, stdout=subprocess.DEVNULL)  # catch up: outputs + checkpoint
    print("catch-up batch done; starting dagster dev (make ui)", flush=True)

    from assets import flags, producer
    from assets.tables import EVENTS
    from benchmarks.freshness import consumer_ready, sensor_breakdown, start_consumer, stop_group
    from lakecast.delta import io as delta_io
    from lakecast.spark import get_spark

    dev = start_consumer("sensor", root, env, args.port)
    latencies: list[float] = []
    landed: list[tuple[int, int]] = []  # (events commit ms, output commit ms)
    offsets = phase_offsets(args.commits)
    try:
        deadline = time.monotonic() + 600
        while not consumer_ready("sensor", root):
            if dev.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dagster dev did not serve; see {root / 'sensor.log'}")
            time.sleep(0.5)
        print(f"UI ready; idle {args.idle:.0f} s before the first commit", flush=True)
        time.sleep(args.idle)
        spark = get_spark(settings=settings)
        from jobs.storefront.microbatch import ENRICHED_EVENTS

        watch = FreshnessWatch(settings.table_path(EVENTS),
                               settings.table_path(ENRICHED_EVENTS))
        start = time.monotonic()
        for i in range(args.commits):
            time.sleep(max(0.0, start + i * args.every + offsets[i] - time.monotonic()))
            res = producer.append_events(spark, settings, args.events, seed=5000 + i)
            lat = _wait_for_output(watch, res.version, timeout=max(args.every, 120))
            print(f"commit {i + 1}/{args.commits}: events v{res.version} ({res.rows} events) "
                  f"-> enriched after {lat if lat is None else round(lat, 2)} s", flush=True)
            if lat is not None:
                latencies.append(lat)
                done = watch.output_ms(res.version)
                if done is not None:
                    landed.append((delta_io.commit_info(settings.table_path(EVENTS),
                                                        res.version).timestamp_ms, done))
        # a broadcast-only change: the sensor starts no run for it (no new events, no
        # work); a run launched anyway finds nothing new, which is the no-op run measured
        flags.set_flag(spark, settings.table_path("feature_flags"), "vip_discount", "12")
        time.sleep((args.interval or settings.sensor_interval_seconds) + 5)
        subprocess.run([str(Path(sys.executable).parent / "dagster"), "job", "execute",
                        "-m", "jobs.definitions", "-j", "enrichment_microbatch"],
                       cwd=PROJECT_ROOT, env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        stop_group(dev, timeout=60)
    runs = run_records(str(root / "dagster_home"))
    noop = [r for r in runs if r["first_batch_cold_tasks"] is None and r["seconds"]]
    gaps = [None] + [round(b["start"] - a["end"], 1) if a["end"] and b["start"] else None
                     for a, b in itertools.pairwise(runs)]
    for r, g in zip(runs, gaps, strict=True):
        r["gap_since_previous_s"] = g
    result = {
        "commits": args.commits, "every_s": args.every, "events_per_commit": args.events,
        "idle_s": args.idle,
        "phase_offsets_s": offsets, "sensor_interval_override_s": args.interval,
        "sensor_interval_s": settings.sensor_interval_seconds,
        "latencies_s": [round(x, 2) for x in latencies],
        "p50_s": round(statistics.median(latencies), 2) if latencies else None,
        "max_s": round(max(latencies), 2) if latencies else None,
        "noop_run_seconds": [round(r["seconds"], 2) for r in noop],
        # per commit: commit -> run created (tick), created -> started (queue, process
        # and code location load), started -> output commit (the run's own work)
        "breakdown": sensor_breakdown(root, landed),
        "runs": runs,
    }
    BENCH.report(result)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))
    print(f"{'run':10} {'status':9} {'seconds':>8} {'gap':>6} {'cold':>5}")
    for r in runs:
        gap, cold = r["gap_since_previous_s"], r["first_batch_cold_tasks"]
        print(f"{r['run_id'][:8]:10} {r['status']:9} {r['seconds'] or 0:8.2f} "
              f"{'-' if gap is None else gap:>6} {'-' if cold is None else cold:>5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
