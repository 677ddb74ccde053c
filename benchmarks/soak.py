"""30-minute soak of the sensor path with kills: a commit every 10 s, a run killed every ~5
min, the Spark server killed once.

``python -m benchmarks.soak [--minutes 30] [--every 10] [--events 1500] [--kill-every 300]
[--server-kill-at 0.25] [--flag-every 100] [--maintain-every 10] [--retention-hours 0]
[--fraud-ttl 10m] [--checkpoint-every 5] [--keep-checkpoints 3] [--tx 200] [--interval 15]
[--port 3335] [--scale 0.5] [--root var/bench/soak]``

Builds a demo lake on the Lakecast Spark server (started if none runs, stopped at the end
only then), catches it up, starts ``dagster dev`` (``broadcast_versions_sensor`` every
``--interval`` s; ``fraud_sensor`` too; ``lake_maintenance`` and ``fraud_maintenance``
scheduled every ``--maintain-every`` min with a VACUUM retention of ``--retention-hours``,
never below what rewinds need; the fraud function's merchant TTL ``--fraud-ttl`` and the
enrichment's checkpoints every ``--checkpoint-every`` batches, ``--keep-checkpoints``
kept, so that the keyed state and the snapshot table reach their plateau within the soak);
then for ``--minutes``: an events commit and a ``--tx`` transactions commit (the keyed
fraud pipeline) every ``--every`` s, a broadcast change every ``--flag-every`` s (in turn:
``feature_flags``, ``dim_products`` through ``dimension_refresh_job``, the next
``user_segments`` partition day through Dagster; see :mod:`benchmarks.soak_parts`), and
every ``--kill-every`` s a ``kill -9`` of the STARTED ``enrichment_microbatch`` run's
process tree (pid from its engine event). Once, at ``--server-kill-at`` x ``--minutes``
(0: never), a ``kill -9`` of the Lakecast Spark server's JVM itself (pid file under
``var/server``) while an ``enrichment_microbatch`` run is STARTED with a batch planned and
not committed, and no producer write is in flight (the producer waits meanwhile, at most
``SERVER_KILL_WINDOW_S``); then ``lakecast server start`` as an operator would, in the
environment the soak was started with; the producer reconnects, and the run kills wait
until the batch the server kill cut is committed (the recovery is the server kill's
alone). Every 20 s: RSS of the dagster dev tree without its runs, per process (dev,
webserver, daemon, code server), of the runs, of the Spark server's tree. Each minute,
and within 10 s of each maintenance run's end: keyed state keys/bytes, snapshot table and
checkpoint root bytes, the Spark server JVM's RSS and live heap (``jcmd GC.run``, a full
GC, then ``GC.heap_info``), its Python workers' RSS.
It waits (<= 5 min) for a run to catch up the last version, stops ``dagster dev`` and checks:
runs not killed succeeded within ``max_seconds`` + 60 s; one materialization of each output
per committed batch; events in == rows of the three outputs, each event_id as often out as
in; memory flat (:func:`_memory`: median of the last third of the samples <= 1.2 x the
middle third's + 32 MiB) for dagster dev's processes (in all and each of dev, webserver,
daemon, code server) over the whole soak, and for the Spark server (its tree's RSS, the
JVM's RSS and live heap, its Python workers' RSS) over the samples of the server that ran
last (the one restarted after the server kill); every enriched row equals the broadcast
tables at its ``_state_version``; the maintenance runs of both pipelines succeeded; the
fraud keyed state stays bounded (its live state bytes plateau, and its table's data files
after each maintenance run do not grow), and so do the snapshot table's data files
(:func:`benchmarks.soak_parts.storage_bounded`; the ``_delta_log`` is reported apart);
restoring the newest checkpoint, redoing the abandoned batches as planned and catching up
gives the same outputs, row for row (:func:`benchmarks.soak_parts.check_restore`); after
the server kill (:func:`_server_kill_report`) the killed run ended, a run started after the
restart succeeded, the batch the kill interrupted was committed (the time from the kill to
that commit is the recovery time), the server's old processes are gone and every run the
kill caught ended. Runs the server kill caught (and runs started while it was down) count
as killed, not failed.

Everything listens on 127.0.0.1; the whole soak is bounded (``--minutes`` + 15 min). Run
it alone on the machine (through spark-lock). JSON goes to ``benchmarks/results/soak.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common import dagster_home
from benchmarks.freshness import consumer_ready, project_server, start_consumer, stop_group
from benchmarks.sensor_freshness import bench_env, build_lake
from benchmarks.soak_parts import (
    BroadcastChanges,
    FraudFeed,
    check_lineage,
    check_restore,
    maintenance_runs,
    minute_sample,
    series,
    storage_bounded,
)
from benchmarks.targets import SOAK as BENCH
from lakecast.config import get_settings
from lakecast.server import SERVER_CLASS

#: the repository root (this example project's folder)
PROJECT_ROOT = Path(__file__).resolve().parents[1]

SLACK_S = 60.0  # one batch past a run's max_seconds
SAMPLE_S = 20.0  # RSS sampling period
KILL_RETRY_S = 20.0
MAINTAINED_POLL_S = 10.0  # how often to look for a maintenance run that just ended
SERVER_KILL_WINDOW_S = 180.0  # how long the server kill waits for a run mid-batch
LAKECAST = str(Path(sys.executable).with_name("lakecast"))  # the operator's command
#: dagster dev's processes by a marker of their command line (the dev process: its pid)
DAGSTER_ROLES = (("webserver", "dagster_webserver"), ("daemon", "dagster._daemon"),
                 ("code_server", "code-server start"), ("code_server", " api grpc"))
DAGSTER_JUDGED = ("dagster_mib", "dagster_dev_mib", "dagster_webserver_mib",
                  "dagster_daemon_mib", "dagster_code_server_mib")
#: the Spark server's figures (the 20 s samples' tree RSS; the rest: the minute samples)
SERVER_JUDGED = ("spark_mib", "driver_jvm_mib", "driver_live_heap_mib", "python_workers_mib")
ACTIVE_STATUSES = ("STARTING", "STARTED", "CANCELING")


Procs = dict[int, tuple[int, int, str]]


def _procs() -> Procs:
    """pid -> (parent pid, RSS bytes, command line) of every process, from /proc."""
    page, out = os.sysconf("SC_PAGE_SIZE"), {}
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            out[int(d.name)] = (int(f[1]), int(f[21]) * page, cmd)
    return out


def _tree(pid: int | None, procs: Procs) -> set[int]:
    """``pid`` and its descendants (alive ones)."""
    out, todo = set(), [pid] if pid in procs else []
    while todo:
        p = todo.pop()
        out.add(p)
        todo += [c for c, v in procs.items() if v[0] == p and c not in out]
    return out


def _run_pid(instance: Any, run_id: str) -> int | None:
    """The pid of a run's process (the code server starts it with multiprocessing, so its
    command line does not name the run; its first engine event gives the pid)."""
    from dagster import DagsterEventType

    for e in instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT):
        data = e.dagster_event.engine_event_data if e.dagster_event else None
        if data is not None and "pid" in data.metadata:
            return int(data.metadata["pid"].value)
    return None


def _kill_started(instance: Any, log: str, mid_batch: bool,
                  exclude: frozenset[str] = frozenset()) -> dict | None:
    """``kill -9`` the process tree of the STARTED micro-batch run, if one runs
    (``mid_batch``: only while the progress log has a batch planned and not committed;
    not a run in ``exclude``: the server kill's)."""
    from dagster import DagsterRunStatus, RunsFilter

    from jobs.storefront.pipeline import MICROBATCH_JOB
    from lakecast.pipeline.progress import read_position

    pending = read_position(log)[0]
    if mid_batch and pending is None:
        return None
    for rec in instance.get_run_records(RunsFilter(
            job_name=MICROBATCH_JOB, statuses=[DagsterRunStatus.STARTED]), limit=3):
        if rec.dagster_run.run_id in exclude:
            continue
        pid, procs = _run_pid(instance, rec.dagster_run.run_id), _procs()
        victims = sorted(_tree(pid, procs))
        for p in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        return {"run_id": rec.dagster_run.run_id, "pid": pid,
                "processes": [procs[p][2][:80] for p in victims],
                "run_age_s": round(time.time() - (rec.start_time or time.time()), 1),
                "pending_batch": pending.batch_id if pending else None} if victims else None
    return None


def _role(pid: int, dev_pid: int, cmd: str) -> str:
    """Which of dagster dev's processes ``pid`` is (:data:`DAGSTER_ROLES`)."""
    if pid == dev_pid:
        return "dev"
    return next((role for role, marker in DAGSTER_ROLES if marker in cmd), "other")


def _sample(dev_pid: int, spark_pid: int | None) -> dict[str, Any]:
    """RSS (MiB) of the dagster dev tree without the runs (the code server's multiprocessing
    children and theirs), in all and per process (:func:`_role`), of the runs, and of the
    Spark server's tree (``spark_pid``: which server it was)."""
    procs = _procs()
    dev = _tree(dev_pid, procs)
    runs = set().union(*(_tree(p, procs) for p in dev if "spawn_main" in procs[p][2]))

    def mib(pids: set[int]) -> float:
        return round(sum(procs[p][1] for p in pids) / 2**20, 1)

    roles: dict[str, set[int]] = {}
    for p in dev - runs:
        roles.setdefault(_role(p, dev_pid, procs[p][2]), set()).add(p)
    return {"dagster_mib": mib(dev - runs), "runs_mib": mib(runs),
            **{f"dagster_{r}_mib": mib(roles.get(r, set()))
               for r in ("dev", "webserver", "daemon", "code_server", "other")},
            "spark_mib": mib(_tree(spark_pid, procs)), "spark_pid": spark_pid}


def _server_kill_victim(instance: Any, log: str) -> dict | None:
    """The STARTED micro-batch run while the progress log has a batch planned and not
    committed (the run is mid-batch), else ``None``."""
    from dagster import DagsterRunStatus, RunsFilter

    from jobs.storefront.pipeline import MICROBATCH_JOB
    from lakecast.pipeline.progress import read_position

    pending = read_position(log)[0]
    if pending is None:
        return None
    for rec in instance.get_run_records(RunsFilter(
            job_name=MICROBATCH_JOB, statuses=[DagsterRunStatus.STARTED]), limit=1):
        return {"run_id": rec.dagster_run.run_id, "pending_batch": pending.batch_id,
                "run_age_s": round(time.time() - (rec.start_time or time.time()), 1)}
    return None


def _kill_server(server: Any, env: dict[str, str], instance: Any, victim: dict) -> dict:
    """``kill -9`` the Spark server's JVM, then ``lakecast server start`` (in ``env``, the
    soak's own start environment) as an operator would; what happened, with the epoch
    times of the kill and of the server serving again."""
    from dagster import DagsterRunStatus, RunsFilter

    procs = _procs()
    pid = server.pid()
    tree = _tree(pid, procs)
    jvm = next((p for p in sorted(tree) if SERVER_CLASS in procs[p][2]
                and "java" in procs[p][2].split(" ", 1)[0]), pid)
    active = [{"run_id": r.dagster_run.run_id, "job": r.dagster_run.job_name}
              for r in instance.get_run_records(RunsFilter(statuses=[
                  DagsterRunStatus[s] for s in ACTIVE_STATUSES]))]
    t_kill = time.time()
    os.kill(jvm, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while server.pid() is not None and time.monotonic() < deadline:  # reaps our own child
        time.sleep(0.1)
    gone_s = round(time.time() - t_kill, 1)
    out = subprocess.run([LAKECAST, "server", "start"], cwd=PROJECT_ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    t_up = time.time()
    if out.returncode != 0:
        raise RuntimeError(f"`lakecast server start` after the server kill failed (exit "
                           f"{out.returncode}): {(out.stdout + out.stderr)[-1500:]}")
    return {**victim, "jvm_pid": jvm, "jvm_cmd": procs[jvm][2][:100],
            "old_tree": {p: procs[p][2] for p in tree}, "active_runs": active,
            "kill_epoch": t_kill, "up_epoch": t_up, "dead_after_s": gone_s,
            "restart_s": round(t_up - t_kill, 1), "restart_exit": out.returncode,
            "restart_output": out.stdout.strip()[-300:], "new_pid": server.pid()}


def _maintained(instance: Any) -> int:
    """How many maintenance runs (of either pipeline) have succeeded."""
    from dagster import DagsterRunStatus, RunsFilter

    from jobs.fraud.defs import FRAUD_PIPELINE
    from jobs.storefront.pipeline import MAINTENANCE_JOB

    return sum(instance.get_runs_count(RunsFilter(
        job_name=job, statuses=[DagsterRunStatus.SUCCESS]))
        for job in (MAINTENANCE_JOB, FRAUD_PIPELINE.handle.maintenance_job_name))


def _committed(log: str, after: int) -> dict[int, int]:
    """Batch id -> events_end of the batches (not rewinds) committed after batch ``after``."""
    from lakecast.pipeline.progress import read_log

    plans, commits = read_log(log)
    return {p.batch_id: p.events_end for p in plans
            if p.batch_id in commits and p.batch_id > after and not p.is_restore}


def _flat(xs: list[float]) -> dict[str, Any]:
    """Min/max; flat: median of the last third <= 1.2 x the middle third's + 32 MiB."""
    n = len(xs)
    if n < 3:
        return {"min": min(xs, default=None), "max": max(xs, default=None), "flat": False}
    mid, last = statistics.median(xs[n // 3:2 * n // 3]), statistics.median(xs[2 * n // 3:])
    return {"min": min(xs), "max": max(xs), "mid": round(mid, 1), "last": round(last, 1),
            "flat": last <= 1.2 * mid + 32}


def _memory(rec: dict[str, Any]) -> dict[str, Any]:
    """Memory flatness (:func:`_flat`): dagster dev's processes (:data:`DAGSTER_JUDGED`)
    over every 20 s sample; the Spark server's figures (:data:`SERVER_JUDGED`) over the
    samples of the server process that ran last (after the server kill: the restarted one;
    a new JVM's figures cannot continue the killed one's). Reported, not judged: the runs'
    RSS (runs come and go), dagster dev's other processes, the JVM's committed heap (G1's
    sizing)."""
    samples, minute = rec["samples"], rec["minute"]
    last_pid = next((s["spark_pid"] for s in reversed(samples) if s.get("spark_pid")), None)
    server = [s for s in samples if s.get("spark_pid") == last_pid]
    server_min = [m for m in minute if m.get("spark_pid") == last_pid]
    figures = {k: _flat([s[k] for s in samples if s.get(k) is not None])
               for k in (*DAGSTER_JUDGED, "dagster_other_mib", "runs_mib")}
    figures["spark_mib"] = _flat([s["spark_mib"] for s in server])
    for k in ("driver_jvm_mib", "driver_live_heap_mib", "driver_heap_committed_mib",
              "python_workers_mib"):
        figures[k] = _flat([m[k] for m in server_min if m.get(k) is not None])
    judged = (*DAGSTER_JUDGED, *SERVER_JUDGED)
    return {"flat": all(figures[k]["flat"] for k in judged), "judged": list(judged),
            "not_flat": [k for k in judged if not figures[k]["flat"]],
            "rule": "flat: median of the last third of the samples <= 1.2 x the middle "
                    "third's + 32 MiB (at least 3 samples)",
            "server_pid": last_pid,
            "server_samples_from_s": server[0]["t_s"] if server else None,
            "server_samples": len(server), "server_minute_samples": len(server_min),
            "heap_errors": sorted({m["driver_heap_error"] for m in minute
                                   if m.get("driver_heap_error")})[:3],
            "figures": figures}


def _server_kill_report(sk: dict[str, Any] | None, instance: Any, log: str
                        ) -> tuple[dict[str, Any], frozenset[str]]:
    """Did the pipeline recover from the server kill; and the runs it excuses (those
    active at the kill, and those started while the server was down)."""
    from jobs.storefront.pipeline import MICROBATCH_JOB
    from lakecast.pipeline.progress import read_log

    if not sk or "kill_epoch" not in sk:
        return {"ok": False, **(sk or {"skipped": "no server kill scheduled"})}, frozenset()
    k, up = sk["kill_epoch"], sk["up_epoch"]
    recs = {r.dagster_run.run_id: r for r in instance.get_run_records()}
    excused = {sk["run_id"], *(a["run_id"] for a in sk["active_runs"])}
    excused |= {i for i, r in recs.items() if r.start_time and k <= r.start_time <= up}

    def status(run_id: str) -> str | None:
        r = recs.get(run_id)
        return r.dagster_run.status.value if r else None

    after = sorted((r for r in recs.values() if r.dagster_run.job_name == MICROBATCH_JOB
                    and r.start_time and r.start_time > up
                    and r.dagster_run.status.value == "SUCCESS"), key=lambda r: r.start_time)
    first = after[0] if after else None
    commit = read_log(log)[1].get(sk["pending_batch"])
    procs = _procs()
    orphans = [cmd[:100] for p, cmd in sk["old_tree"].items()
               if p in procs and procs[p][2] == cmd]
    caught = [{"run_id": i[:8], "job": recs[i].dagster_run.job_name if i in recs else None,
               "status": status(i)} for i in sorted(excused)]
    out = {key: sk[key] for key in ("run_id", "pending_batch", "run_age_s", "jvm_pid",
                                    "jvm_cmd", "dead_after_s", "restart_s", "restart_exit",
                                    "new_pid", "at_s")}
    out.update({
        "killed_run_status": status(sk["run_id"]), "runs_caught": caught,
        "first_success_after_restart": None if first is None else {
            "run_id": first.dagster_run.run_id[:8],
            "started_s": round(first.start_time - k, 1),
            "ended_s": round((first.end_time or k) - k, 1)},
        "successes_after_restart": len(after),
        "pending_batch_committed": commit is not None,
        "recovery_s": None if commit is None else round(commit.committed_at_ms / 1000 - k, 1),
        "orphans": orphans})
    out["ok"] = (out["restart_exit"] == 0 and first is not None and commit is not None
                 and not orphans and out["killed_run_status"] not in (None, *ACTIVE_STATUSES)
                 and not any(c["status"] in ACTIVE_STATUSES for c in caught))
    return out, frozenset(excused)


def _past_deadline(*_: object) -> None:
    raise TimeoutError("the soak ran past its hard deadline")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=10.0, help="s between events commits")
    parser.add_argument("--events", type=int, default=1500)
    parser.add_argument("--kill-every", type=float, default=300.0)
    parser.add_argument("--server-kill-at", type=float, default=0.25,
                        help="kill -9 the Spark server once, at this fraction of --minutes "
                             "(0: never)")
    parser.add_argument("--flag-every", type=float, default=100.0,
                        help="s between broadcast changes (flag, dim_products, segments)")
    parser.add_argument("--maintain-every", type=int, default=10,
                        help="lake_maintenance schedule period (min)")
    parser.add_argument("--retention-hours", type=int, default=0,
                        help="VACUUM retention of the scheduled maintenance (h; rewinds "
                             "still keep what they need)")
    parser.add_argument("--fraud-ttl", default="10m", help="the fraud function's merchant TTL")
    parser.add_argument("--checkpoint-every", type=int, default=5,
                        help="enrichment checkpoint interval (batches)")
    parser.add_argument("--keep-checkpoints", type=int, default=3,
                        help="enrichment checkpoints kept")
    parser.add_argument("--tx", type=int, default=200, help="transactions per fraud commit")
    parser.add_argument("--interval", type=int, default=15, help="sensor interval (s)")
    parser.add_argument("--port", type=int, default=3335, help="dagster webserver port")
    parser.add_argument("--scale", type=float, default=0.5)
    parser.add_argument("--root", default=str(PROJECT_ROOT / "var" / "bench" / "soak"))
    args = parser.parse_args(argv)
    BENCH.start()

    hard = time.monotonic() + (args.minutes + 15) * 60  # the phases end by then
    signal.signal(signal.SIGALRM, _past_deadline)  # backstop: clean up if one hangs
    signal.alarm(int((args.minutes + 20) * 60))
    launch_env = dict(os.environ)  # the server's restart: the operator's environment
    with project_server() as server:
        return _soak(args, server, hard, launch_env)


def _soak(args: argparse.Namespace, server: Any, hard: float,
          launch_env: dict[str, str]) -> int:
    """Build, catch up, run the soak under ``dagster dev``, then report (see the module doc)."""
    from dagster import DagsterInstance, RunsFilter

    from assets import datagen, producer
    from dagster_lakecast.runs import active_runs
    from jobs.fraud.defs import FRAUD_PIPELINE
    from jobs.storefront.microbatch import ENRICHMENT
    from jobs.storefront.pipeline import MICROBATCH_JOB
    from lakecast.pipeline.progress import progress_path
    from lakecast.spark import get_spark

    root = Path(args.root)
    dagster_home(root)
    env = {**bench_env(root, server.url, args.interval),
           "LAKECAST_MAINTENANCE_CRON": f"*/{args.maintain_every} * * * *",
           "LAKECAST_MAINTENANCE_RETENTION_HOURS": str(args.retention_hours),
           "FRAUD_MERCHANT_TTL": args.fraud_ttl,
           "LAKECAST_CHECKPOINT_EVERY": str(args.checkpoint_every),
           "LAKECAST_KEEP_CHECKPOINTS": str(args.keep_checkpoints)}
    os.environ.update(env)
    settings = get_settings()
    build_lake(args.scale)
    spark = get_spark(settings=settings)
    fraud = FraudFeed(spark, settings)
    last_day = datagen.GenSpec(scale=args.scale, seed=datagen.DEFAULT_SEED).day_keys[-1]
    changes = BroadcastChanges(spark, settings, env, last_day)
    subprocess.run([sys.executable, "-m", "jobs.storefront.microbatch"], cwd=PROJECT_ROOT, env=env,
                   check=True, stdout=subprocess.DEVNULL)  # catch up: outputs + checkpoint
    log = progress_path(settings.checkpoint_root, ENRICHMENT.name)
    first = max(_committed(log, -1), default=-1)  # the catch-up's last batch
    print(f"lake built and caught up (batch {first}); starting dagster dev", flush=True)
    rec: dict[str, Any] = {"commits": [], "broadcast_changes": changes.done, "kills": [],
                           "kills_skipped": [], "samples": [], "minute": [],
                           "fraud_commits": fraud.commits, "caught_up": False,
                           "server_kill": None}
    t0 = time.monotonic()

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f}s] {msg}", flush=True)

    pool = ThreadPoolExecutor(max_workers=2)  # Spark writes, off the loop that kills
    dev = start_consumer("sensor", root, env, args.port)  # dagster dev; its log: <root>/sensor.log
    try:
        while not consumer_ready("sensor", root):
            if dev.poll() is not None or time.monotonic() > t0 + 300:
                raise RuntimeError(f"dagster dev did not serve; see {root / 'sensor.log'}")
            time.sleep(0.5)
        with DagsterInstance.from_config(str(root / "dagster_home")) as instance:
            def commit() -> None:
                res = producer.append_events(spark, settings, args.events,
                                             seed=7000 + len(rec["commits"]))
                rec["commits"].append({"version": res.version, "rows": res.rows})
                say(f"commit {len(rec['commits'])}: events v{res.version} ({res.rows} rows)")

                c = fraud.commit(args.tx)
                say(f"transactions v{c['version']} ({c['rows']} rows)")

            def flag() -> None:  # a broadcast change: flag, dim_products, user_segments
                say(f"broadcast change: {changes.step()}")

            t0, rec["t0_epoch"] = time.monotonic(), time.time()
            end = min(t0 + args.minutes * 60, hard)
            due = {"commit": t0, "flag": t0 + args.flag_every, "kill": t0 + args.kill_every,
                   "sample": t0, "status": t0 + 60, "minute": t0, "maintained": t0}
            maintained = _maintained(instance)
            kill_since: float | None = None
            writing: dict[str, Future | None] = {"commit": None, "flag": None}  # in `pool`
            server_kill_due = (t0 + args.server_kill_at * args.minutes * 60
                               if args.server_kill_at > 0 else None)
            server_kill = ""  # "", then "pending" (the producer waits), "done" or "skipped"
            spared: frozenset[str] = frozenset()  # the server kill's run: no process kill
            awaited: int | None = None  # the batch the server kill cut, until committed
            while (now := time.monotonic()) < end:
                if server_kill_due is not None and not server_kill and now >= server_kill_due:
                    server_kill = "pending"
                    say("server kill due: waiting for a run mid-batch, no write in flight")
                for task, every in ((commit, args.every), (flag, args.flag_every)):
                    name = task.__name__
                    if (w := writing[name]) is not None and w.done():
                        writing[name] = w.result()  # None, or raises what the task raised
                    held = server_kill == "pending" and (  # broadcast changes wait at once
                        name == "flag" or now - (server_kill_due or now)
                        > SERVER_KILL_WINDOW_S / 2)
                    if writing[name] is None and now >= due[name] and not held:
                        due[name] += every
                        writing[name] = pool.submit(task)
                if server_kill == "pending":
                    hit = (None if any(w is not None for w in writing.values())
                           else _server_kill_victim(instance, log))
                    if hit is not None:
                        say(f"kill -9 the Spark server (pid {server.pid()}) under run "
                            f"{hit['run_id'][:8]} (running {hit['run_age_s']} s, pending "
                            f"batch {hit['pending_batch']}); `lakecast server start`")
                        sk = _kill_server(server, launch_env, instance, hit)
                        rec["server_kill"] = {**sk, "at_s": round(now - t0, 1)}
                        spark = get_spark(settings=settings)  # the old session died with it
                        fraud.spark = changes.spark = spark
                        spared, server_kill = frozenset({hit["run_id"]}), "done"
                        awaited = hit["pending_batch"]
                        say(f"Spark server serving again after {sk['restart_s']} s "
                            f"(pid {sk['new_pid']}); producer resumes")
                        now = time.monotonic()
                        due["commit"], due["flag"] = max(due["commit"], now), max(due["flag"], now)
                        due["minute"] = now  # the new server's first sample
                        if kill_since is not None:
                            kill_since = now
                    elif now - (server_kill_due or now) > SERVER_KILL_WINDOW_S:
                        why = (f"no run mid-batch without a write in flight within "
                               f"{SERVER_KILL_WINDOW_S:.0f} s")
                        rec["server_kill"] = {"skipped_at_s": round(now - t0, 1), "reason": why}
                        server_kill = "skipped"
                        say(f"server kill skipped: {rec['server_kill']['reason']}")
                if now >= due["kill"]:
                    due["kill"] += args.kill_every
                    kill_since = now
                if (kill_since is not None and awaited is not None
                        and awaited in _committed(log, -1)):
                    awaited, kill_since = None, now  # recovered: process kills go on
                if kill_since is not None and server_kill != "pending" and awaited is None:
                    # (not until the server kill's batch is redone) every other one mid-batch
                    hit = _kill_started(instance, log, len(rec["kills"]) % 2 == 1
                                        and now - kill_since < KILL_RETRY_S / 2, spared)
                    if hit is not None:
                        rec["kills"].append({**hit, "at_s": round(now - t0, 1)})
                        say(f"kill -9 run {hit['run_id'][:8]} (pid {hit['pid']}, "
                            f"{len(hit['processes'])} processes, running {hit['run_age_s']} s, "
                            f"pending batch {hit['pending_batch']})")
                        kill_since = None
                    elif now - kill_since > KILL_RETRY_S:
                        rec["kills_skipped"].append(round(now - t0, 1))
                        say(f"kill skipped: no run to kill within {KILL_RETRY_S:.0f} s")
                        kill_since = None
                if now >= due["sample"]:
                    due["sample"] += SAMPLE_S
                    if due["sample"] <= now:  # late (the server kill's restart): no burst
                        due["sample"] = now + SAMPLE_S
                    sample = _sample(dev.pid, server.pid())
                    rec["samples"].append({"t_s": round(now - t0, 1), **sample})
                if now >= due["maintained"]:  # a storage sample right after maintenance
                    due["maintained"] += MAINTAINED_POLL_S
                    done = _maintained(instance)
                    if done > maintained:
                        due["minute"] = now
                    maintained = done
                if now >= due["minute"]:
                    due["minute"] += 60
                    procs, spark_pid = _procs(), server.pid()
                    rec["minute"].append({"t_s": round(now - t0, 1), "spark_pid": spark_pid,
                                          **minute_sample(settings, procs,
                                                          _tree(spark_pid, procs), spark_pid)})
                if now >= due["status"]:  # every minute
                    due["status"] += 60
                    n = Counter(r.dagster_run.status.value for r in instance.get_run_records(
                        RunsFilter(job_name=MICROBATCH_JOB)))
                    s = rec["samples"][-1]
                    say(f"status: runs {n['SUCCESS']} succeeded, {n['FAILURE']} failed, "
                        f"{len(rec['kills'])} killed, {len(spared)} under the server kill; "
                        f"{len(_committed(log, first))} batches "
                        f"committed; RSS dagster {s['dagster_mib']:.0f} MiB (+runs "
                        f"{s['runs_mib']:.0f}), spark {s['spark_mib']:.0f} MiB")
                time.sleep(0.25)
            for w in writing.values():
                if w is not None:
                    w.result()
            commit()  # events after the last broadcast change: the outputs must show it
            say("producer stopped; waiting for the last version to be processed")
            last = rec["commits"][-1]["version"] if rec["commits"] else -1
            wait_end = min(time.monotonic() + 300, hard)
            while time.monotonic() < wait_end:
                if (max(_committed(log, first).values(), default=-1) >= last
                        and not active_runs(instance, (MICROBATCH_JOB,
                                                       FRAUD_PIPELINE.handle.job_name))):
                    rec["caught_up"] = True
                    break
                time.sleep(2.0)
            say(f"caught up: {rec['caught_up']}; stopping dagster dev")
    finally:  # the whole group: webserver, daemon, code server, runs
        pool.shutdown(cancel_futures=True)
        stop_group(dev)
    return _report(args, root, rec, _committed(log, first), get_spark(settings=settings), env,
                   log)


def _report(args: argparse.Namespace, root: Path, rec: dict[str, Any],
            committed: dict[int, int], spark: Any, env: dict[str, str], log: str) -> int:
    """Check the targets from the Dagster instance and the Delta tables; print, write JSON."""
    from dagster import AssetKey, DagsterInstance, RunsFilter
    from pyspark.sql import functions as F

    from assets.tables import EVENTS
    from jobs.definitions import FRAUD_PIPELINE
    from jobs.storefront.microbatch import MicroBatchRunConfig
    from jobs.storefront.pipeline import MAINTENANCE_JOB, MICROBATCH_JOB, OUTPUTS

    killed = {k["run_id"]: "process" for k in rec["kills"]}
    runs, mats = [], {}
    with DagsterInstance.from_config(str(root / "dagster_home")) as instance:
        server_kill, excused = _server_kill_report(rec["server_kill"], instance, log)
        killed.update({i: "server" for i in excused if i not in killed})
        for r in sorted(instance.get_run_records(RunsFilter(job_name=MICROBATCH_JOB)),
                        key=lambda r: r.start_time or 0):
            op_cfg = ((r.dagster_run.run_config or {}).get("ops", {})
                      .get("enrichment_microbatch_assets", {}).get("config", {}))
            max_s = op_cfg.get("max_seconds", MicroBatchRunConfig().max_seconds)
            secs = (r.end_time - r.start_time) if r.start_time and r.end_time else None
            runs.append({"run_id": r.dagster_run.run_id, "status": r.dagster_run.status.value,
                         "seconds": None if secs is None else round(secs, 1),
                         "bound_s": None if max_s is None else max_s + SLACK_S,
                         "killed": r.dagster_run.run_id in killed,
                         "killed_by": killed.get(r.dagster_run.run_id)})
        for asset, _ in OUTPUTS:
            page = instance.fetch_materializations(AssetKey(asset), limit=10_000)  # the max
            assert not page.has_more, f"more than 10000 materializations of {asset}"
            ids = Counter(int(m.metadata["batch_id"].value) for m in (
                e.asset_materialization for e in page.records) if m and "batch_id" in m.metadata)
            mats[asset] = {"missing": sorted(set(committed) - set(ids)),
                           "duplicated": sorted(b for b, n in ids.items() if n > 1),
                           "unexpected": sorted(set(ids) - set(committed)),
                           "recorded": len(ids)}
        maintenance = maintenance_runs(instance, excused)
        fraud_recs = instance.get_run_records(RunsFilter(job_name=FRAUD_PIPELINE.job.name))
        fraud_runs = Counter(r.dagster_run.status.value for r in fraud_recs
                             if r.dagster_run.run_id not in excused)
        fraud_server_killed = Counter(r.dagster_run.status.value for r in fraud_recs
                                      if r.dagster_run.run_id in excused)
    ok = [r for r in runs if r["status"] == "SUCCESS"]
    summary = {
        "total": len(runs), "succeeded": len(ok),
        "over_bound": [r["run_id"] for r in ok if r["bound_s"] and r["seconds"] > r["bound_s"]],
        "failed_killed": sum(r["killed_by"] == "process" and r["status"] == "FAILURE"
                             for r in runs),
        "server_killed": {r["run_id"][:8]: r["status"] for r in runs
                          if r["killed_by"] == "server"},
        "failed_not_killed": [r["run_id"] for r in runs if not r["killed"]
                              and r["status"] in ("FAILURE", "CANCELED")],
        "still_active": [r["run_id"] for r in runs if r["seconds"] is None],
    }

    def load(t: str) -> Any:
        return spark.read.format("delta").load(get_settings().table_path(t))

    outs = {t: load(t) for t, _ in OUTPUTS}
    ids_out = [outs[t].select("event_id") for t, _ in OUTPUTS[:2]]  # accepted events
    accepted = ids_out[0].unionAll(ids_out[1])
    rejected = outs[OUTPUTS[2][0]].select(
        F.get_json_object("raw_record", "$.event_id").cast("long").alias("event_id"))
    n_in = load(EVENTS).groupBy("event_id").agg(F.count(F.lit(1)).alias("n_in"))
    n_out = (accepted.unionAll(rejected).groupBy(F.col("event_id").alias("oid"))
             .agg(F.count(F.lit(1)).alias("n_out")))
    counts = {"events": load(EVENTS).count(), **{t: df.count() for t, df in outs.items()},
              "accepted_repeated_ids": accepted.count() - accepted.distinct().count(),
              "event_ids_in_out_mismatch": n_in.join(
                  n_out, F.col("event_id").eqNullSafe(F.col("oid")), "full").filter(
                  F.coalesce("n_in", F.lit(0)) != F.coalesce("n_out", F.lit(0))).count()}
    memory = _memory(rec)
    minute = {k: series(rec["minute"], k) for k in (
        "driver_jvm_mib", "driver_live_heap_mib", "driver_heap_committed_mib",
        "python_workers_mib", "python_workers", "snapshot_bytes",
        "checkpoint_root_bytes", "fraud_state_keys", "fraud_state_live_keys",
        "fraud_state_state_bytes", "fraud_state_disk_bytes", "fraud_state_log_bytes",
        "snapshot_log_bytes")}
    def ended(job: str) -> list[float]:  # maintenance runs' ends on the samples' clock
        return [r["end_time"] - rec["t0_epoch"] for r in maintenance["runs"]
                if r["job"] == job and r["status"] == "SUCCESS" and r["end_time"]]

    bounded = storage_bounded(rec["minute"], "fraud_state_disk_bytes", "fraud_state_log_bytes",
                              ended(FRAUD_PIPELINE.handle.maintenance_job_name),
                              state="fraud_state_state_bytes")
    snapshot_data = storage_bounded(rec["minute"], "snapshot_bytes", "snapshot_log_bytes",
                                    ended(MAINTENANCE_JOB))
    lineage = check_lineage(spark, get_settings())
    restore = check_restore(spark, get_settings(), env)  # last: it rewrites the outputs
    changed = {c["table"] for c in rec["broadcast_changes"]
               if c["version"] != c.get("version_before")}
    targets = {
        "runs": (not summary["over_bound"] and not summary["failed_not_killed"]
                 and not summary["still_active"] and summary["succeeded"] > 0
                 and rec["caught_up"]),
        "kills": bool(rec["kills"]) and summary["failed_killed"] == len(rec["kills"]),
        "materializations": bool(committed) and not any(
            m["missing"] or m["duplicated"] or m["unexpected"] for m in mats.values()),
        "counts": (counts["events"] == sum(counts[t] for t, _ in OUTPUTS)
                   and not counts["accepted_repeated_ids"]
                   and not counts["event_ids_in_out_mismatch"]),
        "memory": memory["flat"],  # dagster dev's processes and the Spark server's
        "broadcast_changes": changed == {"feature_flags", "dim_products", "user_segments"},
        "lineage": lineage["ok"] and all(
            len(v) > 1 for v in lineage["versions_seen"].values()),
        "maintenance": maintenance["ok"],
        "restore": restore["ok"],
        "keyed_state": (minute["fraud_state_keys"]["n"] > 0 and fraud_runs["SUCCESS"] > 0
                        and not fraud_runs["FAILURE"]),
        "fraud_state_bounded": bounded["bounded"],
        "snapshot_data_bounded": snapshot_data["bounded"],
        "server_kill": server_kill["ok"],
    }
    result = {"args": vars(args), "runs_summary": summary, "batches_committed": len(committed),
              "materializations": mats, "counts": counts, "memory": memory,
              "per_minute": minute, "lineage": lineage, "maintenance": maintenance,
              "restore": restore, "fraud_runs": fraud_runs,
              "fraud_runs_server_killed": fraud_server_killed,
              "fraud_state_storage": bounded, "targets": targets, "runs": runs,
              **rec, "server_kill": server_kill, "server_kill_record": rec["server_kill"]}
    BENCH.report(result)
    print(f"{'run':10} {'status':9} {'seconds':>8} {'bound':>6} killed")
    for r in runs:
        print(f"{r['run_id'][:8]:10} {r['status']:9} {r['seconds'] or 0:8.1f} "
              f"{r['bound_s'] or 0:6.0f} {r['killed_by'] or ''}")
    details = {"runs": summary, "kills": {"landed": len(rec["kills"]),
                                          "skipped": rec["kills_skipped"]},
               "materializations": {"committed": len(committed), **mats},
               "counts": counts, "memory": memory, "broadcast_changes": rec["broadcast_changes"],
               "lineage": lineage, "maintenance": maintenance,
               "restore": {k: v for k, v in restore.items() if k != "catch_up_stderr"},
               "keyed_state": {"fraud_runs": fraud_runs,
                               "server_killed": fraud_server_killed,
                               **{k: v for k, v in minute.items() if "fraud" in k}},
               "fraud_state_bounded": bounded, "snapshot_data_bounded": snapshot_data,
               "server_kill": server_kill}
    print("per minute:", json.dumps(minute))
    for name, passed in targets.items():
        print(f"{'PASS' if passed else 'FAIL'} {name}: {json.dumps(details[name])}")
    return 0 if all(targets.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
