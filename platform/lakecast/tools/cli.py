"""The ``lakecast`` command: live inputs and lake inspection for the embedded default.

::

    lakecast setup                                         # fetch the Delta JARs once
    lakecast versions                                      # newest Delta version per table
    lakecast snapshots list | show ID | diff A B | restore ID   # broadcast state checkpoints
    lakecast server start | stop | status                  # the Lakecast Spark server
    lakecast cluster up | down | status | add-worker       # a local standalone cluster
    lakecast replay enrichment --from 3 --to 7 --state original|latest|TIMESTAMP

Paths come from :mod:`lakecast.config` (``LAKECAST_LAKE_ROOT`` etc.). A project adds
commands of its own (e.g. the example project's ``lakecast produce`` and ``lakecast flag``)
through its pipelines module's ``COMMANDS`` (:mod:`lakecast.tools.registry`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from lakecast.config import get_settings
from lakecast.delta import io as delta_io
from lakecast.errors import LakecastError


def cmd_setup(args: argparse.Namespace) -> int:
    from lakecast import jars
    from lakecast.errors import SetupError
    from lakecast.jvm.build import build, built_jar

    settings = get_settings()
    kept = jars.setup(force=args.force)
    # the JAR the package ships beside the Delta JARs (compiled with javac when none
    # matches); without either, pure lookups run in the Python workers: a warning
    try:
        build(settings, force=args.force)
    except SetupError as e:
        print(f"warning: {e}", file=sys.stderr)
    print(f"Delta {jars.jar_delta_version(kept) or '?'} JARs ready in {settings.jars_dir} "
          f"({len(kept)} files); project folder {settings.project_root}, lake "
          f"{settings.lake_root}")
    jar = built_jar(settings)
    print(f"JVM lookup JAR: {jar}" if jar else
          "JVM lookup JAR: none (no matching shipped JAR, no JDK): pure lookups run in "
          "the Python workers")
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
    st = sub.add_parser("setup", help="fetch Delta Lake's JARs once into the JAR cache "
                                      "(Maven; LAKECAST_JARS_DIR)")
    st.add_argument("--force", action="store_true", help="fetch again")
    st.set_defaults(fn=cmd_setup)
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
    from lakecast.tools.registry import add_project_commands

    add_project_commands(sub)
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
