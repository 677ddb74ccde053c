"""The ``lakecast`` command: live inputs and lake inspection for the embedded default.

::

    lakecast produce --rate 400 --every 5 --batches 12    # 400 events/s, a commit every 5 s
    lakecast produce --batch-size 2000 --every 5          # 2000 events per commit
    lakecast flag set vip_discount 15                      # change broadcast config
    lakecast flag set vip_discount 15 --disabled
    lakecast flag list
    lakecast versions                                      # newest Delta version per table
    lakecast snapshots list | show ID | diff A B | restore ID   # broadcast state checkpoints
    lakecast server start | stop | status                  # the Lakecast Spark server
    lakecast cluster up | down | status | add-worker       # a local standalone cluster
    lakecast replay enrichment --from 3 --to 7 --state original|latest|TIMESTAMP

Paths come from :mod:`lakecast.config` (``LAKECAST_LAKE_ROOT`` etc.).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from lakecast.config import get_settings
from lakecast.delta import io as delta_io
from lakecast.errors import LakecastError

FEATURE_FLAGS = "feature_flags"
DEFAULT_RATE = 200.0
"""``lakecast produce``'s default rate: events per second."""


def _spark():
    from lakecast.spark import get_spark

    return get_spark(app_name="lakecast-cli")


def batch_size(args: argparse.Namespace) -> int:
    """Events per commit: ``--batch-size``, or ``--rate`` (events per second) x ``--every``."""
    if args.batch_size is not None:
        size = args.batch_size
    else:
        size = round((DEFAULT_RATE if args.rate is None else args.rate) * args.every)
    if size < 1:
        raise ValueError(
            f"produce: {size} events per commit (--rate {args.rate} x --every {args.every}); "
            "give --batch-size N, or a --rate and --every whose product is at least 1"
        )
    return size


def cmd_produce(args: argparse.Namespace) -> int:
    from lakecast.tools import producer

    size = batch_size(args)
    if args.batches < 1 or args.every < 0:
        raise ValueError("produce: --batches must be >= 1 and --every >= 0")
    settings = get_settings()
    spark = _spark()
    for i in range(args.batches):
        t0 = time.monotonic()
        res = producer.append_events(spark, settings, size, seed=args.seed + i)
        ids = (f"ids {res.first_written}..{res.last_written}" if res.rows else "no rows")
        took = time.monotonic() - t0
        late = f"; behind: the commit took {took:.1f}s > --every {args.every:g}s" if (
            i + 1 < args.batches and took > args.every) else ""
        print(
            f"[{i + 1}/{args.batches}] events v{res.version}: produced {res.produced} events, "
            f"dropped {res.dropped} (their users had churned or not signed up yet), "
            f"appended {res.rows} rows ({ids}; {res.duplicates} deliberate duplicates){late}",
            flush=True,
        )
        if i + 1 < args.batches:
            time.sleep(max(0.0, args.every - took))
    return 0


def cmd_flag(args: argparse.Namespace) -> int:
    from lakecast.tools import flags

    settings = get_settings()
    path = settings.table_path(FEATURE_FLAGS)
    spark = _spark()
    if args.action == "set":
        res = flags.set_flag(spark, path, args.name, args.value, enabled=not args.disabled)
        state = "unchanged" if res.changed == 0 and not res.created else "written"
        print(f"flag {args.name}={args.value} ({'disabled' if args.disabled else 'enabled'}): "
              f"{state}, {FEATURE_FLAGS} v{res.version}")  # fmt: skip
    else:
        current = flags.read_flags(spark, path)
        if not current:
            print("no flags yet (lakecast flag set NAME VALUE)")
        for name, (enabled, value) in sorted(current.items()):
            print(f"{name:24} {value:>12}  {'enabled' if enabled else 'disabled'}")
    return 0


def cmd_versions(args: argparse.Namespace) -> int:
    from pathlib import Path

    from lakecast.delta import objstore

    settings = get_settings()
    root = Path(settings.lake_root)
    if objstore.is_object_store(settings.lake_root):
        names = objstore.table_names(settings.lake_root, settings)
    else:
        names = (sorted(p.name for p in root.iterdir() if (p / "_delta_log").is_dir())
                 if root.is_dir() else [])
    if not names:
        print(f"no Delta tables under {settings.lake_root}")
        return 0
    print(f"{'table':28} {'version':>8}  last operation")
    for name in names:
        path = settings.table_path(name)
        v = delta_io.latest_version(path)
        info = delta_io.commit_info(path, v) if v is not None else None
        if info is None:
            continue
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(info.timestamp_ms / 1000))
        print(f"{name:28} {v:>8}  {info.operation} {when} UTC")
    return 0


def cmd_server(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from lakecast.server import Server

    server = Server.from_settings()
    server = replace(server, host=args.host or server.host, port=args.port or server.port)
    if args.action == "start":
        running = server.pid() is not None
        print(f"{'already running' if running else 'starting'}: Lakecast Spark server on "
              f"{server.url} (log {server.log_file})", flush=True)
        server.start()
        print(f"serving on {server.url} (pid {server.pid()}); attach with "
              f"LAKECAST_SPARK_REMOTE={server.url}")
    elif args.action == "stop":
        print("stopped" if server.stop() else f"not running ({server.url})")
    else:
        print(server.status())
        return 0 if server.pid() is not None else 3
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    from lakecast.cluster import Cluster

    cluster = Cluster.from_settings()
    if args.action == "up":
        print(f"starting: master {cluster.master_url}, {args.workers} worker(s), the Lakecast "
              f"Spark server on {cluster.server.url} (logs in {cluster.folder})", flush=True)
        cluster.up(workers=args.workers)
        print(cluster.status())
        print(f"attach with LAKECAST_SPARK_REMOTE={cluster.server.url}")
    elif args.action == "add-worker":
        if cluster.pid("master") is None:
            raise ValueError("no cluster runs: start it with `lakecast cluster up`")
        print(f"worker-{cluster.add_worker()} registered; "
              f"{cluster.alive_workers()} worker(s) ALIVE")
    elif args.action == "down":
        stopped = cluster.down()
        print(f"stopped: {', '.join(stopped)}" if stopped else "not running")
    else:
        print(cluster.status())
        return 0 if cluster.pid("master") is not None else 3
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lakecast", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "produce", help="append generated events to the events table, one commit per --every s",
        description="Append generated events to the events table: one Delta commit every "
        "--every seconds, --batches times. Events whose user has churned (about a third: "
        "~35% of the generated users churn; also any not signed up yet) are dropped by "
        "the generator, so a commit holds fewer rows than events produced; each line "
        "says how many were dropped. Event ids continue after the table's largest "
        "event_id, so they never overlap.",
    )  # fmt: skip
    size = p.add_mutually_exclusive_group()
    size.add_argument("--rate", type=float, default=None,
                      help=f"events produced per second (default {DEFAULT_RATE:g}); each "
                           "commit holds rate x every events, minus the dropped ones")
    size.add_argument("--batch-size", type=int, default=None,
                      help="events produced per commit (instead of --rate)")
    p.add_argument("--every", type=float, default=5.0, help="seconds between commits")
    p.add_argument("--batches", type=int, default=10, help="number of commits")
    p.add_argument("--seed", type=int, default=1000, help="generator seed of the first commit")
    p.set_defaults(fn=cmd_produce)
    f = sub.add_parser("flag", help="set or list feature flags (a broadcast table)")
    fsub = f.add_subparsers(dest="action", required=True)
    fs = fsub.add_parser("set")
    fs.add_argument("name")
    fs.add_argument("value")
    fs.add_argument("--disabled", action="store_true")
    fsub.add_parser("list")
    f.set_defaults(fn=cmd_flag)
    v = sub.add_parser("versions", help="newest Delta version of every table in the lake")
    v.set_defaults(fn=cmd_versions)
    srv = sub.add_parser("server", help="the Lakecast Spark server (Spark Connect + Delta, "
                                        "127.0.0.1): start, stop, status")
    srv.add_argument("action", choices=["start", "stop", "status"])
    srv.add_argument("--host", default=None, help="bind address (default LAKECAST_SERVER_HOST "
                     "or 127.0.0.1; another address needs LAKECAST_SERVER_TOKEN and TLS)")
    srv.add_argument("--port", type=int, default=None,
                     help="port (default LAKECAST_SERVER_PORT or 15002)")
    srv.set_defaults(fn=cmd_server)
    cl = sub.add_parser("cluster", help="a local Spark standalone cluster (master, workers, "
                                        "the Lakecast Spark server as driver; 127.0.0.1)")
    cl.add_argument("action", choices=["up", "down", "status", "add-worker"])
    cl.add_argument("--workers", type=int, default=2, help="workers to start (up)")
    cl.set_defaults(fn=cmd_cluster)
    from lakecast.tools.snapshot_cli import add_parser as add_snapshots

    add_snapshots(sub)
    from lakecast.tools.replay_cli import add_parser as add_replay

    add_replay(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except (LakecastError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
