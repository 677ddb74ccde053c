"""``lakecast snapshots list | show | diff | restore``: inspect and restore checkpoints.

::

    lakecast snapshots list                      # checkpoints, sizes, state versions, status
    lakecast snapshots show 7 --state dim_products --limit 20
    lakecast snapshots diff 5 7                  # keys added / removed / changed per state
    lakecast snapshots restore 5                 # rewind the pipeline to checkpoint 5
    lakecast snapshots restore --timestamp "2026-11-22 03:40:00"

``--pipeline`` picks the pipeline (default ``enrichment``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

from lakecast.config import get_settings
from lakecast.snapshots.errors import SnapshotError
from lakecast.snapshots.listing import diff, readable, summaries
from lakecast.snapshots.store import SnapshotStore


def _human(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n = n / 1024  # type: ignore[assignment]
    return str(n)


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000))


def pipeline_of(args: argparse.Namespace) -> str:
    """``--pipeline``, else the one pipeline with snapshots under a local checkpoint root
    (a clear error naming the choices when there are none or several)."""
    if args.pipeline:
        return args.pipeline
    root = Path(get_settings().checkpoint_root.removeprefix("file:"))
    found = sorted(p.parent.name for p in root.glob("*/snapshots")) if root.is_dir() else []
    if len(found) == 1:
        return found[0]
    raise SnapshotError(f"name the pipeline with --pipeline: {len(found)} pipelines have "
                        f"snapshots under {root}" + (f" ({', '.join(found)})" if found else ""))


def _store(args: argparse.Namespace) -> SnapshotStore:
    from lakecast.snapshots.checkpointer import snapshot_path
    from lakecast.spark import get_spark

    settings = get_settings()
    args.pipeline = pipeline_of(args)
    spark = get_spark(app_name="lakecast-cli")
    store = SnapshotStore(spark, snapshot_path(settings, args.pipeline), args.pipeline)
    if not store.exists():
        raise SnapshotError(f"pipeline {args.pipeline!r} has no checkpoints yet ({store.path}); "
                            "they are written after each committed micro-batch")
    return store


def cmd_list(args: argparse.Namespace) -> int:
    store = _store(args)
    rows = summaries(store)
    print(f"{'id':>5} {'batch':>5} {'events v':>8} {'p':>3} {'entries':>9} {'stored':>10} "
          f"{'p x state':>10} {'delta v':>7}  {'created (UTC)':19}  state version / status")
    for s in rows:
        h = s.header
        status = "complete" if s.complete else f"INCOMPLETE: {s.problem}"
        print(f"{h.checkpoint_id:>5} {h.batch_id:>5} {h.events_end:>8} {h.parallelism:>3} "
              f"{s.entries:>9} {_human(s.stored_bytes):>10} "
              f"{_human(h.parallelism * s.state_bytes):>10} "
              f"{s.delta_version if s.delta_version is not None else '-':>7}  "
              f"{_when(h.created_at_ms):19}  {json.dumps(h.state_version, sort_keys=True)} "
              f"{status}")
    headerless = sorted(set(store.checkpoint_ids()) - {s.header.checkpoint_id for s in rows})
    for cid in headerless:
        print(f"{cid:>5}  INCOMPLETE: no header row (never restored)")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    store = _store(args)
    header = store.header(args.checkpoint_id)
    manifest = [m for m in store.manifest(args.checkpoint_id) if m.task == args.task]
    if not manifest:
        raise SnapshotError(f"checkpoint {args.checkpoint_id} has no manifest for task "
                            f"{args.task} (parallelism {header.parallelism})")
    if args.state and args.state not in {m.state for m in manifest}:
        raise SnapshotError(f"checkpoint {args.checkpoint_id} has no state {args.state!r}; "
                            f"states: {sorted(m.state for m in manifest)}")
    print(f"checkpoint {header.checkpoint_id}: batch {header.batch_id}, events "
          f"({header.events_start}, {header.events_end}], state version "
          f"{json.dumps(header.state_version, sort_keys=True)}, p={header.parallelism}, "
          f"task {args.task}, created {_when(header.created_at_ms)} UTC")
    for m in manifest:
        if args.state and m.state != args.state:
            continue
        kind = header.states[m.state]["kind"]
        print(f"\n[{m.state}] {kind} state, {m.n_entries} entries, hash {m.content_hash[:16]}")
        entries = readable(store, args.checkpoint_id, m)
        shown = entries[:args.limit]
        width = max([len(k) for k, _ in shown] + [3])
        for k, v in shown:
            print(f"  {k:<{width}}  {json.dumps(v, default=str)}")
        if len(entries) > len(shown):
            print(f"  ... {len(entries) - len(shown)} more (--limit)")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    store = _store(args)
    ha, hb = store.header(args.a), store.header(args.b)
    print(f"checkpoint {args.a} {json.dumps(ha.state_version, sort_keys=True)} -> "
          f"checkpoint {args.b} {json.dumps(hb.state_version, sort_keys=True)}")
    print(f"{'state':24} {'added':>7} {'removed':>8} {'changed':>8}  keys")
    for state, d in diff(store, args.a, args.b).items():
        sample = [f"+{k}" for k in d["added"]] + [f"-{k}" for k in d["removed"]] + [
            f"~{k}" for k in d["changed"]]
        more = f" ... ({len(sample) - args.limit} more)" if len(sample) > args.limit else ""
        print(f"{state:24} {len(d['added']):>7} {len(d['removed']):>8} {len(d['changed']):>8}  "
              f"{' '.join(sample[:args.limit])}{more}")
    return 0


def parse_timestamp(text: str) -> int:
    """Epoch ms of ``YYYY-MM-DD HH:MM[:SS]`` (UTC) or of an epoch-ms number."""
    if text.isdigit():
        return int(text)
    for fmt in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"):
        try:
            d = dt.datetime.strptime(text, fmt).replace(tzinfo=dt.UTC)
            return int(d.timestamp() * 1000)
        except ValueError:
            continue
    raise SnapshotError(f"cannot read timestamp {text!r}; use 'YYYY-MM-DD HH:MM:SS' (UTC)")


def cmd_restore(args: argparse.Namespace) -> int:
    from lakecast.snapshots.checkpointer import restore_checkpoint
    from lakecast.spark import get_spark

    if args.checkpoint_id is None and args.timestamp is None:
        raise SnapshotError("name a checkpoint id or --timestamp (see `lakecast snapshots list`)")
    ts = parse_timestamp(args.timestamp) if args.timestamp else None
    spark = get_spark(app_name="lakecast-cli")
    args.pipeline = pipeline_of(args)
    plan, restored = restore_checkpoint(spark, get_settings(), args.pipeline,
                                        args.checkpoint_id, ts)
    for msg in restored.skipped:
        print(f"warning: {msg}")
    h = restored.header
    print(f"restored checkpoint {h.checkpoint_id}: pipeline {args.pipeline!r} rewound to after "
          f"batch {h.batch_id} (events version {h.events_end}, state version "
          f"{json.dumps(h.state_version, sort_keys=True)}); outputs rolled back to "
          f"{json.dumps(plan.rollback_to, sort_keys=True)}. The next run restores this state "
          f"and resumes with batch {plan.batch_id + 1}.")
    return 0


def add_parser(sub: Any) -> None:
    """Register ``snapshots`` on the ``lakecast`` parser."""
    s = sub.add_parser("snapshots", help="list, show, diff or restore broadcast state checkpoints")
    s.add_argument("--pipeline", default=None,
                   help="the pipeline (default: the one with snapshots under the "
                   "checkpoint root)")
    ssub = s.add_subparsers(dest="action", required=True)
    ls = ssub.add_parser("list", help="checkpoints with sizes, state versions and status")
    ls.set_defaults(fn=cmd_list)
    sh = ssub.add_parser("show", help="the state content at a checkpoint")
    sh.add_argument("checkpoint_id", type=int)
    sh.add_argument("--state", default=None)
    sh.add_argument("--task", type=int, default=0)
    sh.add_argument("--limit", type=int, default=20)
    sh.set_defaults(fn=cmd_show)
    df = ssub.add_parser("diff", help="keys added / removed / changed between two checkpoints")
    df.add_argument("a", type=int)
    df.add_argument("b", type=int)
    df.add_argument("--limit", type=int, default=10)
    df.set_defaults(fn=cmd_diff)
    rs = ssub.add_parser("restore", help="rewind the pipeline to a checkpoint")
    rs.add_argument("checkpoint_id", type=int, nargs="?", default=None)
    rs.add_argument("--timestamp", default=None,
                    help="newest complete checkpoint created at or before (UTC)")
    rs.set_defaults(fn=cmd_restore)
