"""A small keyed pipeline for the runtime tests (also run as a subprocess by the kill test).

``Sessions`` keys events by ``user_id``: a running count and total per session (Value and
Reducing state), a ``big`` flag from a broadcast threshold, and an event-time timer that
closes the session ``GAP`` ms after its last event. :func:`reference` computes the same
outputs in plain Python from the documented batch semantics, independently of Lakecast.

    python -m tests.lakecast.keyed_job ROOT [COMPACT_EVERY]   # run ROOT until caught up
"""

from __future__ import annotations

import math
import operator
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from lakecast import MapStateDescriptor
from lakecast.api.keyed import KeyedBroadcastProcessFunction
from lakecast.api.keyed_state import ReducingStateDescriptor, ValueStateDescriptor
from lakecast.build import keyed_pipeline
from lakecast.delta import io as delta_io
from lakecast.pipeline.micro_batch import MicroBatchPipeline, PipelineSpec

GAP = 100
THRESHOLDS = MapStateDescriptor("thresholds", str, float)
COUNT = ValueStateDescriptor("count", int)
TOTAL = ReducingStateDescriptor("total", float, reduce_function=operator.add)
LAST_TS = ValueStateDescriptor("last_ts", int)
EVENTS_SCHEMA = "event_id long, user_id long, amount double, ts long"
OUT_COLUMNS = ["kind", "user_id", "event_id", "at", "count", "total", "big"]


class Sessions(KeyedBroadcastProcessFunction):
    key_by = "user_id"

    def state_descriptors(self):
        return [THRESHOLDS]

    def keyed_state_descriptors(self):
        return [COUNT, TOTAL, LAST_TS]

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        return pa.schema([("kind", pa.string()), ("user_id", pa.int64()),
                          ("event_id", pa.int64()), ("at", pa.int64()), ("count", pa.int64()),
                          ("total", pa.float64()), ("big", pa.bool_())])

    def process_broadcast_element(self, value, ctx):
        ctx.get_broadcast_state(THRESHOLDS).apply(value, key_columns="name",
                                                  value_columns="value")

    def process_element(self, value, ctx):
        count, total = ctx.get_state(COUNT), ctx.get_reducing_state(TOTAL)
        count.update((count.value() or 0) + 1)
        total.add(value["amount"])
        ctx.get_state(LAST_TS).update(value["ts"])
        ctx.timer_service().register_event_time_timer(value["ts"] + GAP)
        big = ctx.get_broadcast_state(THRESHOLDS).get("big", math.inf)
        yield {"kind": "event", "user_id": ctx.get_current_key(), "event_id": value["event_id"],
               "at": value["ts"], "count": count.value(), "total": total.get(),
               "big": value["amount"] >= big}

    def on_timer(self, timestamp, ctx):
        if ctx.get_state(LAST_TS).value() + GAP != timestamp:
            return  # a later event extended the session
        yield {"kind": "session_end", "user_id": ctx.get_current_key(), "event_id": None,
               "at": timestamp, "count": ctx.get_state(COUNT).value(),
               "total": ctx.get_reducing_state(TOTAL).get(), "big": None}
        for d in (COUNT, TOTAL, LAST_TS):
            ctx.get_keyed_state(d).clear()


def events_for(batch: int, n: int = 60) -> list[tuple[int, int, float, int]]:
    """Deterministic events of one batch: (event_id, user_id, amount, ts). User ``batch``
    sits the batch out, so its session closes when the batch's watermark passes."""
    rows = []
    for i in range(n):
        eid = batch * 1000 + i
        user = (eid * 7) % 11
        if user != batch:
            rows.append((eid, user, float((eid * 37) % 100), batch * 300 + (i * 13) % 200))
    return rows


def reference(batches: Iterable[tuple[list[tuple[int, int, float, int]], float]],
              states: list[dict[int, tuple[int, float, int]]] | None = None,
              ) -> list[tuple[Any, ...]]:
    """Expected outputs of Sessions, batch by batch: (events, big threshold) per batch.
    Per batch: each key's events in (ts, event_id) order, then the watermark becomes the
    max event time so far, then due timers fire in (time, key) order. ``states`` gets the
    keyed state after each batch: ``{user: (count, total, last ts)}``."""
    state: dict[int, dict[str, Any]] = {}
    timers: set[tuple[int, int]] = set()
    watermark = None
    out: list[tuple[Any, ...]] = []
    for events, big in batches:
        for eid, user, amount, ts in sorted(events, key=lambda e: (e[1], e[3], e[0])):
            s = state.setdefault(user, {"count": 0, "total": 0.0})
            s["count"] += 1
            s["total"] += amount
            s["last"] = ts
            timers.add((ts + GAP, user))
            out.append(("event", user, eid, ts, s["count"], s["total"], amount >= big))
        batch_max = max(e[3] for e in events)
        watermark = batch_max if watermark is None else max(watermark, batch_max)
        for t, user in sorted(x for x in timers if x[0] <= watermark):
            timers.discard((t, user))
            s = state.get(user)
            if s is not None and s["last"] + GAP == t:
                out.append(("session_end", user, None, t, s["count"], s["total"], None))
                del state[user]
        if states is not None:
            states.append({u: (s["count"], s["total"], s["last"]) for u, s in state.items()})
    return out


def rows(frame_rows: Iterable[Any]) -> list[tuple[Any, ...]]:
    """Output rows as comparable tuples (sorted)."""
    return sorted((tuple(r[c] for c in OUT_COLUMNS) for r in frame_rows), key=repr)


def write_thresholds(spark: Any, path: str, big: float, mode: str = "append") -> None:
    delta_io.write(spark.createDataFrame([("big", big)], "name string, value double"), path,
                   mode=mode)


def table_paths(root: str) -> Mapping[str, str]:
    return {t: f"{root}/{t}" for t in ("events", "thresholds", "sessions", "unmatched",
                                       "keyed_state", "_progress")}


def pipeline(spark: Any, root: str, parallelism: int | None = None,
             **runtime_options: Any) -> MicroBatchPipeline:
    """The keyed micro-batch pipeline over ``root`` (events -> sessions, exactly once);
    ``runtime_options`` go to the keyed runtime (e.g. ``compact_every``)."""
    paths = table_paths(root)
    spec = PipelineSpec("sessions", "events", ("thresholds",), "sessions",
                        side_outputs={"unmatched": "unmatched"}, max_versions_per_batch=1,
                        state_table="keyed_state")
    return keyed_pipeline(spark, spec, Sessions(), table_path=lambda t: paths[t],
                          checkpoint_root=paths["_progress"], timestamp_column="ts",
                          order_columns=("event_id",), key_groups=32, parallelism=parallelism,
                          **runtime_options)


def main(argv: list[str] | None = None) -> None:
    from lakecast.spark import get_spark

    args = argv or sys.argv[1:]
    root = args[0]
    options = {"compact_every": int(args[1])} if len(args) > 1 else {}
    spark = get_spark(app_name="keyed-job")
    for r in pipeline(spark, root, **options).run():
        print(f"batch {r.plan.batch_id}: {r.counts}", flush=True)


if __name__ == "__main__":
    main()
