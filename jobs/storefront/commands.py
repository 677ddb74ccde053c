"""The storefront's own ``lakecast`` commands (registered through
:data:`jobs.registry.COMMANDS`)::

    lakecast produce --rate 400 --every 5 --batches 12    # 400 events/s, a commit every 5 s
    lakecast produce --batch-size 2000 --every 5          # 2000 events per commit
    lakecast flag set vip_discount 15                      # change broadcast config
    lakecast flag set vip_discount 15 --disabled
    lakecast flag list
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from jobs.storefront.enrichment import FEATURE_FLAGS
from lakecast.config import get_settings

DEFAULT_RATE = 200.0
"""``lakecast produce``'s default rate: events per second."""


def _spark() -> Any:
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
    from assets import producer

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
    from assets import flags

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



def add_commands(sub: Any) -> None:
    """Add ``produce`` and ``flag`` to the ``lakecast`` subcommands ``sub``."""
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
