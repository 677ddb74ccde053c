"""A small sharded enrichment pipeline (also run as a subprocess by the kill test).

``enrich(Lookup("dim", key="user_id", shards=N))`` over ROOT's tables, checkpointing every
batch; :func:`reference` computes what each committed batch must have written from the
Delta versions its plan pinned, with pandas and deltalake, independently of Lakecast.

    python -m tests.lakecast.sharded_job ROOT SHARDS   # run ROOT until caught up
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

import pandas as pd

from lakecast import Lookup, enrich
from lakecast.build import broadcast_pipeline
from lakecast.pipeline.micro_batch import MicroBatchPipeline, PipelineSpec

COLUMNS = ["segment", "ltv"]


def table_paths(root: str) -> Mapping[str, str]:
    return {t: f"{root}/{t}" for t in ("events", "dim", "enriched", "_progress")}


def pipeline(spark: Any, root: str, shards: int) -> MicroBatchPipeline:
    """The pipeline over ``root``, its lookup in ``shards`` shards."""
    paths = table_paths(root)
    spec = PipelineSpec("sharded", "events", ("dim",), "enriched", max_versions_per_batch=1)
    fn = enrich(Lookup("dim", key="user_id", columns=COLUMNS, defaults={"segment": "NEW"},
                       shards=shards))
    return broadcast_pipeline(spark, spec, fn, table_path=lambda t: paths[t],
                              checkpoint_root=paths["_progress"], checkpoint_every=1,
                              function_id=f"sharded-{shards}")


def reference(root: str, plans: list[Any]) -> pd.DataFrame:
    """What the committed batches ``plans`` must have written: each batch's events (its
    events version) left-joined with ``dim`` at the version its plan pinned."""
    from deltalake import DeltaTable

    paths = table_paths(root)
    out = []
    for plan in plans:
        version = plan.broadcast_versions["dim"]
        dim = DeltaTable(paths["dim"], version=version).to_pandas()[["user_id", *COLUMNS]]
        events = DeltaTable(paths["events"], version=plan.events_end).to_pandas()
        if plan.events_start >= 0:  # the rows of the batch's versions only
            before = DeltaTable(paths["events"], version=plan.events_start).to_pandas()
            events = events[~events.event_id.isin(before.event_id)]
        joined = events.merge(dim, on="user_id", how="left")
        joined["segment"] = joined["segment"].fillna("NEW")
        joined["v"] = json.dumps({"dim": version}, sort_keys=True)
        out.append(joined)
    return pd.concat(out, ignore_index=True)


def main(argv: list[str] | None = None) -> None:
    from lakecast.spark import get_spark

    root, shards = (argv or sys.argv[1:])[:2]
    spark = get_spark(app_name="sharded-job")
    def say(r: Any) -> None:  # each batch as it commits (a later one may be killed)
        print(f"batch {r.plan.batch_id}: shards_per_task {r.shards_per_task} rows_routed "
              f"{r.rows_routed} parallelism {r.parallelism}", flush=True)

    pipeline(spark, root, int(shards)).run(on_batch=say)


if __name__ == "__main__":
    main()
