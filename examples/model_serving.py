"""Seed 002: ML model distribution via broadcast state, with "Exercise 1: Add Model Metrics".

The Delta table ``segment_model`` ``{segment, weight, bias, model_version}`` holds a
tiny linear model per user segment (every row of a release carries its
``model_version``). Events ``{event_id, user_id, segment, amount, ts}`` are keyed by
``user_id``; each is scored ``weight * amount + bias`` with its segment's model and
tagged with the ``model_version`` used. A keyed ValueState counts each user's
predictions; when a broadcast element brings a new model version, the task first sums
and resets its counters (``apply_to_keyed_state``) and reports the old version's count
on the side output ``model_reports`` (``{task, model_version, predictions}``, only when
there were predictions), then applies the new model — the seed's "log metrics BEFORE
updating the model". Events of a segment without a model go to ``unmatched``.

Run it on Spark: ``.venv/bin/python -m examples.model_serving``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from examples.common import Row, SparkDriver, Step, run_on_spark, sorted_rows
from lakecast.api.descriptors import UNMATCHED, MapStateDescriptor, OutputTag
from lakecast.api.element import BroadcastElement
from lakecast.api.keyed import KeyedBroadcastProcessFunction, KeyedContext, KeyedReadOnlyContext
from lakecast.api.keyed_state import ValueStateDescriptor

TABLE = "segment_model"
MODEL = MapStateDescriptor("segment_model", str, dict)
#: keyed: predictions made for the user with the current model version
PREDICTIONS = ValueStateDescriptor("prediction_count", int)
REPORTS = OutputTag("model_reports", pa.schema([
    ("task", pa.int64()), ("model_version", pa.int64()), ("predictions", pa.int64())]))

TABLE_SCHEMA = "segment string, weight double, bias double, model_version long"
EVENT_SCHEMA = "event_id long, user_id string, segment string, amount double, ts long"
PREDICTION_FIELDS = [("score", pa.float64()), ("model_version", pa.int64())]


def current_version(models: Any) -> int | None:
    """The model version in force: the newest version among the segments' rows."""
    versions = [m["model_version"] for m in models.values()]
    return max(versions) if versions else None


class ModelServer(KeyedBroadcastProcessFunction):
    """Scores events with the broadcast model; counts predictions per model version."""

    key_by = "user_id"

    def state_descriptors(self) -> list[MapStateDescriptor]:
        return [MODEL]

    def keyed_state_descriptors(self) -> list[ValueStateDescriptor]:
        return [PREDICTIONS]

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        return pa.schema([*input_schema, *PREDICTION_FIELDS])

    def output_tags(self) -> list[OutputTag]:
        return [REPORTS]

    def process_broadcast_element(self, value: BroadcastElement, ctx: KeyedContext) -> None:
        models = ctx.get_broadcast_state(MODEL)
        old = current_version(models)
        incoming = set(value.upserts().column("model_version").to_pylist())
        if old is not None and incoming - {old}:
            total = 0

            def take(user: Any, count: Any) -> None:
                nonlocal total
                total += count.value() or 0
                count.clear()

            ctx.apply_to_keyed_state(PREDICTIONS, take)
            if total:
                ctx.output(REPORTS, {"task": ctx.task_index(), "model_version": old,
                                     "predictions": total})
        models.apply(value, key_columns="segment")

    def process_element(self, value: Row, ctx: KeyedReadOnlyContext) -> Iterator[Row]:
        model = ctx.get_broadcast_state(MODEL).get(value["segment"])
        if model is None:
            ctx.output(UNMATCHED, value)
            return
        count = ctx.get_state(PREDICTIONS)
        count.update((count.value() or 0) + 1)
        yield {**value, "score": model["weight"] * value["amount"] + model["bias"],
               "model_version": model["model_version"]}


# ------------------------------------------------------------------------------ data
SEGMENTS = ("VIP", "REGULAR", "NEW")
USERS = tuple(f"user-{i}" for i in range(1, 9))


def release(version: int, params: dict[str, tuple[float, float]]) -> list[Row]:
    """One model release: a row per segment, all tagged ``version``."""
    return [{"segment": s, "weight": w, "bias": b, "model_version": version}
            for s, (w, b) in params.items()]


#: the model table over time (None: unchanged); "CHURNING" has no model until v3
MODEL_VERSIONS: tuple[list[Row] | None, ...] = (
    release(1, {"VIP": (0.5, 1.0), "REGULAR": (0.25, 0.5), "NEW": (0.1, 0.0)}),
    None,
    release(2, {"VIP": (0.75, 1.0), "REGULAR": (0.25, 1.5), "NEW": (0.2, 0.25)}),
    None,
    None,
    release(3, {"VIP": (1.0, 0.0), "REGULAR": (0.5, 0.5), "NEW": (0.2, 0.25),
                "CHURNING": (0.05, 2.0)}),
    release(4, {"VIP": (1.25, 0.0), "REGULAR": (0.5, 0.75), "NEW": (0.3, 0.0),
                "CHURNING": (0.05, 2.5)}),
    None,
)


def generate(seed: int = 2, events_per_step: int = 30) -> list[Step]:
    """A deterministic scenario: :data:`MODEL_VERSIONS` while user events flow (a
    release with no events in between: v3 -> v4 reports nothing for tasks without
    predictions)."""
    rnd = random.Random(seed)
    steps, event_id = [], 0
    for i, models in enumerate(MODEL_VERSIONS):
        n = 0 if i == 5 else events_per_step
        events = []
        for j in range(n):
            event_id += 1
            events.append({"event_id": event_id, "user_id": rnd.choice(USERS),
                           "segment": rnd.choice((*SEGMENTS, "CHURNING")),
                           "amount": float(rnd.randint(1, 400)), "ts": i * 10_000 + j * 100})
        steps.append(Step(table=models, events=events, processing_time=i * 10_000))
    return steps


# ------------------------------------------------------------------------------ reference
def reference(steps: Sequence[Step]) -> dict[str, list[Row]]:
    """Expected ``{"predictions", "unmatched", "reports"}`` on one task, in plain Python
    (the per-task split of reports depends on where the runtime puts each key)."""
    model: dict[str, Row] = {}
    version: int | None = None
    since_swap = 0
    out: dict[str, list[Row]] = {"predictions": [], "unmatched": [], "reports": []}
    for step in steps:
        if step.table is not None:
            new_version = max(r["model_version"] for r in step.table)
            if version is not None and new_version != version:
                if since_swap:
                    out["reports"].append({"task": 0, "model_version": version,
                                           "predictions": since_swap})
                since_swap = 0
            model = {r["segment"]: r for r in step.table}
            version = new_version
        for e in sorted(step.events, key=lambda e: (e["ts"], e["event_id"])):
            m = model.get(e["segment"])
            if m is None:
                out["unmatched"].append(dict(e))
                continue
            since_swap += 1
            out["predictions"].append({**e, "score": m["weight"] * e["amount"] + m["bias"],
                                       "model_version": m["model_version"]})
    return out


# ------------------------------------------------------------------------------ Spark
def spark_driver(spark: Any, root: str) -> SparkDriver:
    return SparkDriver(spark, ModelServer(), root=root, table=TABLE, key="segment",
                       table_schema=TABLE_SCHEMA, event_schema=EVENT_SCHEMA,
                       order_columns=("event_id",), side_tags=(REPORTS.name, UNMATCHED.name))


def main() -> None:
    """Run the scenario on Spark + Delta and print a summary."""
    steps = generate()
    out = run_on_spark(spark_driver, steps)
    reports = out.side.get(REPORTS.name, [])
    expected = reference(steps)
    print(f"model_serving: {len(steps)} batches, {len(out.main)} predictions, "
          f"{len(out.side.get(UNMATCHED.name, []))} unmatched events")
    for version, n in sorted(Counter(p["model_version"] for p in out.main).items()):
        print(f"  model v{version}: {n} predictions")
    for r in sorted(reports, key=lambda r: (r["model_version"], r["task"])):
        print(f"  report: model v{r['model_version']} made {r['predictions']} predictions "
              f"on task {r['task']}")
    totals: Counter[int] = Counter()
    for r in reports:
        totals[r["model_version"]] += r["predictions"]
    same = (sorted_rows(out.main) == sorted_rows(expected["predictions"])
            and totals == Counter({r["model_version"]: r["predictions"]
                                   for r in expected["reports"]}))
    print(f"matches the plain-Python reference: {same}")


if __name__ == "__main__":
    main()
