"""Where a continuous-mode batch of :mod:`benchmarks.freshness` spends its time: a probe,
not a benchmark (no target).

The storefront pipeline on a Lakecast Spark server of its own (Spark Connect, as
``enrichment_continuous`` runs it; its Spark UI on, on 127.0.0.1, for the stage figures),
over the freshness benchmark's lake (scale 0.5), caught up and warmed. Then ``--batches``
times: 1,300 events appended with deltalake (as a user's asset writes them), one batch
(``pipeline.run(max_batches=1)``), and per batch:

* ``phases_s`` — the pipeline's own laps (plan, read, state, job, check, write, commit);
* ``rpc`` — the client's wait on the server by kind, from a profile of the batch:
  ``analyze`` (schema requests: ``df.columns``, ``df.schema``) with their callers, and
  ``execute`` (the batch's Spark job, its rows back as Arrow);
* ``spark_jobs`` — the Spark jobs the server ran in the batch's window (its REST API):
  each job's duration and its stages (tasks, duration, executor run time).

``--producer spark`` appends the events as the freshness benchmark's commits every 20 s
do instead: ``assets.producer`` through the pipeline's own server. ``--pause S`` waits S
seconds with nothing to do before each batch, and each batch reports its cold tasks (what
a batch after an idle period costs). Each producer's run (and pause) is kept in the
output under its name.

``PYTHONPATH=. ../shared/tools/spark-lock .venv/bin/python -m benchmarks.continuous_phases``
writes ``benchmarks/results/freshness.phases.json``.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.common import dagster_home

ROOT = Path("var/bench/continuous_phases").resolve()
OUT = Path(__file__).resolve().parent / "results" / "freshness.phases.json"
UI_PORT = 4077
EVENTS = 1300


def _rpc(prof: cProfile.Profile) -> dict[str, Any]:
    """The client's time waiting on the server, by kind (analyze, execute), and who asked
    for each analysis (the caller outside PySpark)."""
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    out: dict[str, Any] = {"analyze_calls": 0, "analyze_s": 0.0, "execute_s": 0.0}
    for (file, _line, name), (_cc, calls, _tt, cum, _callers) in stats.items():
        if file.endswith("connect/client/core.py") and name == "_analyze":
            out["analyze_calls"], out["analyze_s"] = calls, round(cum, 3)
        if file.endswith("connect/client/core.py") and name == "_execute_and_fetch":
            out["execute_s"] = round(out["execute_s"] + cum, 3)
    by_caller: dict[str, float] = {}
    for (file, _line, name), row in stats.items():
        if not (file.endswith("connect/dataframe.py") and name in ("columns", "schema")):
            continue
        for caller, (_cc, _nc, _tt, cum) in row[4].items():
            if "site-packages" not in caller[0]:
                where = f"{Path(caller[0]).parent.name}/{Path(caller[0]).name}:{caller[2]}"
                by_caller[where] = round(by_caller.get(where, 0.0) + cum, 3)
    out["analyze_by_caller_s"] = dict(sorted(by_caller.items(), key=lambda kv: -kv[1]))
    return out


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:  # 127.0.0.1 only
        return json.load(r)


def _ms(stamp: str | None) -> float | None:
    if not stamp:
        return None
    return datetime.strptime(stamp.replace("GMT", "+0000"),
                             "%Y-%m-%dT%H:%M:%S.%f%z").timestamp() * 1000


def _spark_jobs(t0_ms: float, t1_ms: float) -> list[dict[str, Any]]:
    """The server's Spark jobs submitted in [t0, t1], with their stages."""
    base = f"http://127.0.0.1:{UI_PORT}/api/v1/applications"
    app = _get(base)[0]["id"]
    stages = {s["stageId"]: s for s in _get(f"{base}/{app}/stages")}
    jobs = []
    for job in sorted(_get(f"{base}/{app}/jobs"), key=lambda j: j["jobId"]):
        start, end = _ms(job.get("submissionTime")), _ms(job.get("completionTime"))
        if start is None or not t0_ms <= start <= t1_ms:
            continue
        rows = []
        for sid in sorted(job["stageIds"]):
            s = stages.get(sid)
            if s is None or s.get("status") == "SKIPPED":
                continue
            s0, s1 = _ms(s.get("submissionTime")), _ms(s.get("completionTime"))
            rows.append({"stage": sid, "name": s["name"][:60], "tasks": s["numTasks"],
                         "seconds": None if None in (s0, s1) else round((s1 - s0) / 1000, 3),
                         "executor_run_s": round(s["executorRunTime"] / 1000, 3)})
        jobs.append({"job": job["jobId"], "seconds": None if end is None else
                     round((end - start) / 1000, 3), "stages": rows})
    return jobs


def main(argv: list[str] | None = None) -> int:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    from benchmarks.freshness import project_server
    from benchmarks.sensor_freshness import bench_env, build_lake

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--producer", choices=("deltalake", "spark"), default="deltalake",
                    help="who appends the events: deltalake in this process (as a user's "
                         "asset), or assets.producer through the pipeline's own server (as "
                         "benchmarks.freshness's commits every 20 s)")
    ap.add_argument("--reuse-lake", action="store_true",
                    help="the lake of the last run, caught up (not built anew)")
    ap.add_argument("--pause", type=float, default=0.0,
                    help="seconds with nothing to do before each batch (kept under its "
                         "own name in the output): what a batch after an idle period costs")
    args = ap.parse_args(argv)
    reuse = args.reuse_lake and (ROOT / "lake").is_dir()
    dagster_home(ROOT, clean=not reuse)
    os.environ["LAKECAST_SPARK_CONF"] = f"spark.ui.enabled=true;spark.ui.port={UI_PORT}"
    with project_server() as server:
        os.environ.update(bench_env(ROOT, server.url, None))
        if not reuse:
            build_lake(0.5)
        from assets import producer
        from jobs.storefront.pipeline import build_pipeline
        from lakecast.config import get_settings
        from lakecast.delta import io as delta_io
        from lakecast.spark import get_spark

        settings = get_settings()
        spark = get_spark(settings=settings)
        pipe = build_pipeline(spark, settings)
        pipe.run()
        pipe.warm_up()
        path = settings.table_path("events")
        table = DeltaTable(path).to_pyarrow_table()
        template = table.slice(table.num_rows - EVENTS)
        next_id = int(pc.max(table.column("event_id")).as_py()) + 1
        batches = []
        for i in range(args.batches):
            ids = pa.array(np.arange(next_id, next_id + EVENTS, dtype=np.int64))
            next_id += EVENTS
            if args.producer == "spark":
                version = producer.append_events(spark, settings, EVENTS, seed=5000 + i).version
            else:
                version = delta_io.append_arrow(
                    template.set_column(template.schema.get_field_index("event_id"),
                                        "event_id", ids), path)
            time.sleep(args.pause)
            t0 = time.time()
            prof = cProfile.Profile()
            prof.enable()
            result = pipe.run(max_batches=1)[0]
            prof.disable()
            t1 = time.time()
            time.sleep(1.0)  # the UI's listener catches up
            batches.append({"batch": i, "events_version": version,
                            "wall_s": round(t1 - t0, 3), "engine": result.state_engine,
                            "cold_tasks": result.cold_tasks,
                            "cold_build_s": round(result.cold_build_seconds, 3),
                            "phases_s": {k: round(v, 3) for k, v in result.phases.items()},
                            "rpc": _rpc(prof),
                            "spark_jobs": _spark_jobs(t0 * 1000, t1 * 1000)})
            print(json.dumps({k: batches[-1][k] for k in ("batch", "wall_s", "cold_tasks",
                                                              "phases_s")}), flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    old = json.loads(OUT.read_text()) if OUT.exists() else {}
    name = args.producer + (f"-pause{args.pause:g}" if args.pause else "")
    runs = {k: v for k, v in old.get("producers", {}).items() if k != name}
    runs[name] = {"git_commit": commit, "pause_s": args.pause, "batches": batches}
    OUT.write_text(json.dumps({"probe": "benchmarks.continuous_phases",
                               "events_per_batch": EVENTS, "scale": 0.5,
                               "producers": runs}, indent=2) + "\n")
    print(f"-> {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
