"""``lakecast replay PIPELINE``: re-run committed batches into a separate table.

::

    lakecast replay enrichment --from 3 --to 7                     # audit: --state original
    lakecast replay enrichment --state latest                      # today's broadcast tables
    lakecast replay enrichment --state "2026-11-22 03:40:00" --into what_if
    lakecast replay fraud --from 12                                # keyed: from batch 11's state

``--from``/``--to``: committed batch ids (default: all); ``--state original`` (each
batch's own broadcast versions: must reproduce the output exactly; exit code 1 when it
does not), ``latest`` or a UTC timestamp. Rows go to ``--into`` (default
``<output>_replay``), replaced by each replay; a keyed pipeline's replay starts from its
keyed state as of the batch before ``--from``, copied to ``<into>_keyed_state``. See
:mod:`lakecast.replay.batches`.
"""

from __future__ import annotations

import argparse
from typing import Any

from lakecast.config import get_settings

#: exit code of an ``original`` replay that does not reproduce the output
MISMATCH = 1


def cmd_replay(args: argparse.Namespace) -> int:
    from lakecast.replay import batches as rp
    from lakecast.spark import get_spark
    from lakecast.tools.registry import find_pipeline

    factory = find_pipeline(args.pipeline, args.pipelines)
    if args.state not in (rp.ORIGINAL, rp.LATEST):
        rp.parse_time(args.state)  # a bad --state fails before Spark starts
    settings = get_settings()
    pipeline = factory(get_spark(app_name="lakecast-replay"), settings)
    into = args.into or f"{pipeline.spec.output_table}_replay"
    print(f"replaying {args.pipeline} (state {args.state}) into {into} "
          f"({settings.table_path(into)})", flush=True)

    def show(b: Any) -> None:
        orig = "" if b.original_rows is None else f" (original {b.original_rows})"
        print(f"batch {b.plan.batch_id}: events v{b.plan.events_start + 1}..v"
              f"{b.plan.events_end}, {b.events_in} events -> {b.rows} rows{orig} at "
              f"{rp.describe(b.state_version)}  [{b.seconds:.1f}s]", flush=True)

    batches = rp.replay(pipeline, into, first=args.first, last=args.last, state=args.state,
                        on_batch=show)
    ids = f"batches {batches[0].plan.batch_id}..{batches[-1].plan.batch_id}"
    if args.state != rp.ORIGINAL:
        print(f"replayed {ids}: {sum(b.rows for b in batches)} rows in {into}")
        return 0
    v = rp.compare(pipeline, into, batches)
    print(f"{'MATCH' if v.matched else 'MISMATCH'}: {ids} replayed {v.replayed} rows, "
          f"the original output has {v.original}; {v.missing} original rows not "
          f"reproduced, {v.extra} replayed rows not in the original, {v.gone} original "
          f"rows changed or deleted in {pipeline.spec.output_table} since")
    return 0 if v.matched else MISMATCH


def add_parser(sub: Any) -> None:
    """Add ``replay`` to the ``lakecast`` subcommands ``sub``."""
    p = sub.add_parser("replay", help="re-run committed batches into a separate table "
                                      "(audit, or what-if with other broadcast versions)",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pipeline", help="pipeline name (e.g. enrichment, fraud)")
    p.add_argument("--from", dest="first", type=int, default=None,
                   help="first committed batch id to replay (default: the first)")
    p.add_argument("--to", dest="last", type=int, default=None,
                   help="last committed batch id to replay (default: the last)")
    p.add_argument("--state", default="original",
                   help="broadcast state: original (each batch's own versions; an audit), "
                        "latest, or a UTC timestamp such as '2026-11-22 03:40:00'")
    p.add_argument("--into", default=None,
                   help="the replay table (default: <output table>_replay; replaced)")
    p.add_argument("--pipelines", default=None,
                   help="module with the PIPELINES mapping (default: $LAKECAST_PIPELINES, "
                        "else [tool.lakecast] pipelines in pyproject.toml)")
    p.set_defaults(fn=cmd_replay)
