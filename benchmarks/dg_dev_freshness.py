"""Freshness through the sensor of a new user's project under ``dg dev`` (issue 55 item 3).

    python -m benchmarks.dg_dev_freshness [--commits 10] [--every 20] [--events 1300]
                                          [--idle 120] [--project DIR] [--rebuild]
                                          [--spark-remote server] [--dequeue-seconds 1]

The project is the new-user test's (``tests/newuser``): ``create-dagster`` scaffolds it,
the README's ``uv add`` line installs Lakecast from this checkout, then ``lakecast setup``,
``dg scaffold defs`` and the user's ``defs.yaml``, ``fx.py`` and ``tables.py``. Nothing is
tuned: no ``DAGSTER_HOME`` (``dg dev``'s temporary instance, Dagster's defaults), the
project's Spark mode, the sensor as the Component declares it. The project is built once
per checkout commit under ``--project`` (outside any other project) and reused by later
runs (``--rebuild``: built again); each run starts from an empty lake.
``--spark-remote server`` puts ``LAKECAST_SPARK_REMOTE=server`` in the project's ``.env``
(the project's Lakecast Spark server, started on demand, stopped at the end), and
``--dequeue-seconds N`` a ``dagster.yaml`` in the project whose run queue is looked at
every N s (Dagster's default: 5; ``dg dev``'s instance reads the project folder's
``dagster.yaml``): tuned runs, recorded as such, that do not count for the targets.

A run: the user's assets write ``fx_rates`` and 20 payments and one batch runs (``dg
launch``, as the tutorial prints it); ``uv run dg dev`` starts and, once it serves, idles
``--idle`` s; then ``--commits`` commits of ``--events`` payments are appended with
``deltalake`` (what the project's ``payments`` asset does), ``--every`` s apart, each
delayed by its share of the sensor daemon's loop (:func:`benchmarks.common.phase_offsets`).
A commit's latency is read from the Delta logs of ``payments`` and ``payments_eur``
(:mod:`benchmarks.freshness_watch`); per commit, ``dg dev``'s instance splits it into the
sensor's tick, the run's launch and the run (:func:`benchmarks.freshness.sensor_breakdown`).

Everything listens on 127.0.0.1. Run it alone on the machine (through spark-lock).
JSON goes to ``benchmarks/results/dg_dev_freshness.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import PROJECT_ROOT, phase_offsets
from benchmarks.freshness_watch import FreshnessWatch
from benchmarks.registry import git_commit
from benchmarks.targets import DG_DEV_FRESHNESS as BENCH

#: the user's micro-batch job (the Component's name ``fx``)
JOB = "fx_microbatch"


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 1200) -> str:
    """Run ``cmd``; its output, or an error with it on a non-zero exit."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def user_shell(work: Path) -> tuple[str, dict[str, str]]:
    """uv and the user's environment (the new-user test's), without ``DAGSTER_HOME``."""
    from tests.newuser.test_new_user import user_env

    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if not uv:
        raise RuntimeError("uv is part of the dev dependencies: run `make setup`")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = user_env(work, uv)
    env.pop("DAGSTER_HOME")  # dg dev's own temporary instance, as a new user has
    return uv, env


def build_project(base: Path, uv: str, env: dict[str, str]) -> Path:
    """The new user's project under ``base``, set up as the README and the tutorial say."""
    from tests.newuser.test_new_user import (
        COMPONENT,
        CREATE_DAGSTER,
        HERE,
        TABLES,
        USER_FILES,
        readme_line,
    )

    project = base / "payments"
    shutil.rmtree(project, ignore_errors=True)
    _run([uv, "tool", "run", "--from", CREATE_DAGSTER, "create-dagster", "project",
          "payments", "--no-uv-sync"], base, env)
    _run(["bash", "-c", readme_line("uv add ")], project, env)
    _run([uv, "run", "lakecast", "setup"], project, env)
    _run([uv, "run", "dg", "scaffold", "defs", COMPONENT, "fx_payments"], project, env)
    for src, dst in USER_FILES.items():
        shutil.copy(HERE / "project" / src, project / dst)
    shutil.copy(HERE / "project" / TABLES[0], project / TABLES[1])
    return project


def _project(args: argparse.Namespace, uv: str, env: dict[str, str]) -> Path:
    """The project built at this checkout's commit (built again when it is not)."""
    base = Path(args.project).resolve()
    marker = base / "built_at"
    commit = git_commit(PROJECT_ROOT)
    if args.rebuild or not marker.exists() or marker.read_text() != str(commit):
        base.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        build_project(base, uv, env)
        marker.write_text(str(commit))
        print(f"project built in {time.monotonic() - t0:.0f} s", flush=True)
    project = base / "payments"
    for old in [project / "var", *project.glob(".tmp_dagster_home_*")]:
        shutil.rmtree(old, ignore_errors=True)
    dotenv = project / ".env"
    lines = [line for line in (dotenv.read_text().splitlines() if dotenv.exists() else [])
             if not line.startswith("LAKECAST_SPARK_REMOTE=")]
    if args.spark_remote:
        lines.append(f"LAKECAST_SPARK_REMOTE={args.spark_remote}")
    dotenv.write_text("".join(f"{line}\n" for line in lines))
    instance = project / "dagster.yaml"
    instance.unlink(missing_ok=True)
    if args.dequeue_seconds:
        instance.write_text("run_coordinator:\n  module: dagster.core.run_coordinator\n"
                            "  class: QueuedRunCoordinator\n  config:\n"
                            f"    dequeue_interval_seconds: {args.dequeue_seconds}\n")
    return project


def _append(lake: Path, first: int, n: int) -> int:
    """``n`` payments from id ``first``, appended as the project's ``payments`` asset does
    (pandas + deltalake); the new version."""
    import pandas as pd
    from deltalake import DeltaTable, write_deltalake

    from tests.newuser.project.tables import CURRENCIES

    ids = range(first, first + n)
    write_deltalake(str(lake / "payments"), pd.DataFrame({
        "payment_id": list(ids), "currency": [CURRENCIES[i % 5] for i in ids],
        "amount": [round(10.0 + i * 1.25, 2) for i in ids]}), mode="append")
    return DeltaTable(str(lake / "payments")).version()


def _wait_serving(proc: subprocess.Popen, url: str, log: Path, timeout: float = 300) -> None:
    from jobs.ui import serving

    deadline = time.monotonic() + timeout
    while not serving(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"dg dev did not serve {url}; see {log}")
        time.sleep(0.5)


def _wait_idle(home: Path, timeout: float = 120) -> None:
    """Until no run of the job is queued or active in ``dg dev``'s instance."""
    from dagster import DagsterInstance

    from dagster_lakecast.runs import active_runs

    with DagsterInstance.from_config(str(home)) as instance:
        deadline = time.monotonic() + timeout
        while active_runs(instance, (JOB,)) and time.monotonic() < deadline:
            time.sleep(1.0)


def measure(args: argparse.Namespace) -> dict:
    """One run (see the module doc)."""
    from benchmarks.freshness import sensor_breakdown, stop_group

    work = Path(args.project).resolve() / "shell"
    uv, env = user_shell(work)
    project = _project(args, uv, env)
    lake = project / "var" / "lake"
    t0 = time.monotonic()
    rates = {"USD": 0.9, "GBP": 1.15, "EUR": 1.0, "JPY": 0.0062}
    for asset, config in (("fx_rates", {"rates": rates}), ("payments", {"first": 0, "n": 20})):
        _run([uv, "run", "dg", "launch", "--assets", asset, "--config-json",
              json.dumps({"ops": {asset: {"config": config}}})], project, env)
    _run([uv, "run", "dg", "launch", "--job", JOB], project, env)
    print(f"tables and a first batch in {time.monotonic() - t0:.0f} s; starting dg dev",
          flush=True)
    log_path = work / "dg_dev.log"
    url = f"http://127.0.0.1:{args.port}"
    with open(log_path, "w") as log:
        dev = subprocess.Popen([uv, "run", "dg", "dev", "-h", "127.0.0.1", "-p", str(args.port)],
                               cwd=project, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    offsets = phase_offsets(args.commits)
    latencies: list[float] = []
    landed: list[tuple[int, int]] = []
    try:
        _wait_serving(dev, url, log_path)
        home = next(project.glob(".tmp_dagster_home_*"))
        print(f"dg dev serves {url}; idle {args.idle:.0f} s before the first commit",
              flush=True)
        time.sleep(args.idle)
        watch = FreshnessWatch(str(lake / "payments"), str(lake / "payments_eur"),
                               id_column="payment_id")
        start = time.monotonic()
        for i in range(args.commits):
            time.sleep(max(0.0, start + i * args.every + offsets[i] - time.monotonic()))
            version = _append(lake, 100_000 + i * args.events, args.events)
            deadline, lat = time.monotonic() + max(args.every, 120), None
            while lat is None and time.monotonic() < deadline:
                lat = watch.latency_s(version)
                if lat is None:
                    time.sleep(0.2)
            print(f"commit {i + 1}/{args.commits}: payments v{version} -> payments_eur "
                  f"after {lat if lat is None else round(lat, 2)} s", flush=True)
            if lat is not None:
                latencies.append(lat)
                done = watch.output_ms(version)
                committed = watch.events.get(version)
                if done is not None and committed is not None:
                    landed.append((committed[0], done))
        _wait_idle(home)
        breakdown = sensor_breakdown(project, landed, home=home, job=JOB)
    finally:
        stop_group(dev, timeout=60)
        if args.spark_remote == "server":
            subprocess.run([uv, "run", "lakecast", "server", "stop"], cwd=project, env=env,
                           capture_output=True, timeout=120)
    return {"commits": args.commits, "every_s": args.every, "events_per_commit": args.events,
            "idle_s": args.idle, "phase_offsets_s": offsets, "spark_remote": args.spark_remote,
            "dequeue_seconds": args.dequeue_seconds,
            "latencies_s": [round(x, 2) for x in latencies],
            "p50_s": round(statistics.median(latencies), 2) if latencies else None,
            "max_s": round(max(latencies), 2) if latencies else None,
            "first_after_idle_s": round(latencies[0], 2) if latencies else None,
            "breakdown": breakdown}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=10)
    parser.add_argument("--every", type=float, default=20.0)
    parser.add_argument("--events", type=int, default=1300, help="payments per commit")
    parser.add_argument("--idle", type=float, default=120.0,
                        help="idle seconds between dg dev serving and the first commit")
    parser.add_argument("--port", type=int, default=3336, help="dg dev's webserver port")
    parser.add_argument("--project", default=str(Path(tempfile.gettempdir())
                                                 / "lakecast-bench-dg-dev"),
                        help="where the user's project is built (outside any project)")
    parser.add_argument("--rebuild", action="store_true", help="build the project again")
    parser.add_argument("--spark-remote", default=None,
                        help="LAKECAST_SPARK_REMOTE in the project's .env (a tuned run)")
    parser.add_argument("--dequeue-seconds", type=int, default=None,
                        help="the run queue's interval in the project's dagster.yaml (tuned)")
    args = parser.parse_args(argv)
    BENCH.start()
    result = measure(args)
    BENCH.report(result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
