"""The ``lakecast`` command: live inputs and lake inspection for the embedded default.

::

    lakecast produce --rate 2000 --every 5 --batches 12   # append events (the fast stream)
    lakecast flag set vip_discount 15                      # change broadcast config
    lakecast flag set vip_discount 15 --disabled
    lakecast flag list
    lakecast versions                                      # newest Delta version per table
    lakecast snapshots list | show ID | diff A B | restore ID   # broadcast state checkpoints
    lakecast server start | stop | status                  # the Lakecast Spark server

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


def _spark():
    from lakecast.spark import get_spark

    return get_spark(app_name="lakecast-cli")


def cmd_produce(args: argparse.Namespace) -> int:
    from lakecast.tools import datagen

    settings = get_settings()
    spark = _spark()
    for i in range(args.batches):
        t0 = time.monotonic()
        res = datagen.append_events(spark, settings, args.rate, seed=args.seed + i)
        print(
            f"[{i + 1}/{args.batches}] appended {res.rows} events "
            f"(ids {res.first_event_id}..{res.last_event_id}) -> events v{res.version}",
            flush=True,
        )
        if i + 1 < args.batches:
            time.sleep(max(0.0, args.every - (time.monotonic() - t0)))
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

    settings = get_settings()
    root = Path(settings.lake_root)
    names = (
        sorted(p.name for p in root.iterdir() if (p / "_delta_log").is_dir())
        if root.is_dir() else []
    )
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
    from lakecast.server import Server

    server = Server.from_settings()
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lakecast", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("produce", help="append events to the events table at a rate")
    p.add_argument("--rate", type=int, default=1000, help="events per batch")
    p.add_argument("--every", type=float, default=5.0, help="seconds between batches")
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--seed", type=int, default=1000)
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
    srv.set_defaults(fn=cmd_server)
    from lakecast.tools.snapshot_cli import add_parser as add_snapshots

    add_snapshots(sub)
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
