"""Seed 002 (model serving with per-task metrics): harness and Spark vs the reference."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from examples.common import HarnessDriver, Outputs, SparkDriver, Step, sorted_rows
from examples.model_serving import (
    PREDICTIONS,
    REPORTS,
    TABLE,
    ModelServer,
    generate,
    reference,
    release,
    spark_driver,
)
from lakecast.api.descriptors import UNMATCHED
from tests.examples.helpers import run_stepwise

V1 = release(1, {"VIP": (0.5, 1.0), "NEW": (0.1, 0.0)})
V2 = release(2, {"VIP": (2.0, 0.0), "NEW": (0.1, 0.0)})


def driver(task: int = 0) -> HarnessDriver:
    d = HarnessDriver(ModelServer(), table=TABLE, key="segment", order_columns=("event_id",))
    d.harness.executor.task_index = task
    return d


def event(event_id: int, user: str, segment: str, amount: float) -> dict:
    return {"event_id": event_id, "user_id": user, "segment": segment, "amount": amount,
            "ts": event_id * 100}


def expected(steps: Sequence[Step]) -> tuple[list[dict], list[dict], list[dict]]:
    ref = reference(steps)
    return (sorted_rows(ref["predictions"]), sorted_rows(ref["unmatched"]),
            sorted_rows(ref["reports"]))


def actual(out: Outputs) -> tuple[list[dict], list[dict], list[dict]]:
    return (sorted_rows(out.main), sorted_rows(out.side.get(UNMATCHED.name, [])),
            sorted_rows(out.side.get(REPORTS.name, [])))


def report_totals(reports: Sequence[dict]) -> Counter[int]:
    totals: Counter[int] = Counter()
    for r in reports:
        totals[r["model_version"]] += r["predictions"]
    return totals


def test_generated_scenario_matches_reference_after_every_step() -> None:
    steps = generate()
    out = run_stepwise(driver(), steps, expected, actual)
    predictions, unmatched, reports = actual(out)
    assert {p["model_version"] for p in predictions} == {1, 2, 4}
    assert unmatched
    # every report counts exactly the predictions made with the version it names
    made = Counter(p["model_version"] for p in predictions)
    assert report_totals(reports) == Counter({1: made[1], 2: made[2]})


def test_model_swap_reports_old_version_before_applying_the_new_one() -> None:
    d = driver()
    d.step(Step(V1, [event(1, "a", "VIP", 10.0), event(2, "b", "NEW", 50.0),
                     event(3, "a", "VIP", 4.0), event(4, "c", "OTHER", 1.0)], 0))
    h = d.harness
    assert [h.keyed_state(PREDICTIONS, u) for u in ("a", "b", "c")] == [2, 1, None]
    d.step(Step(V2, [event(5, "a", "VIP", 10.0)], 1_000))
    assert d.outputs.side[REPORTS.name] == [{"task": 0, "model_version": 1, "predictions": 3}]
    assert [(p["event_id"], p["score"], p["model_version"]) for p in d.outputs.main] == [
        (1, 6.0, 1), (2, 5.0, 1), (3, 3.0, 1), (5, 20.0, 2)]
    assert d.outputs.side[UNMATCHED.name] == [event(4, "c", "OTHER", 1.0)]
    # counters were reset by the swap; only the v2 prediction is counted
    assert h.keys(PREDICTIONS) == ["a"] and h.keyed_state(PREDICTIONS, "a") == 1


def test_no_report_when_the_old_version_made_no_predictions() -> None:
    steps = [Step(V1, [], 0), Step(V2, [event(1, "a", "VIP", 1.0)], 1_000),
             Step(release(3, {"VIP": (1.0, 1.0)}), [], 2_000)]
    out = driver().run(steps)
    assert out.side[REPORTS.name] == [{"task": 0, "model_version": 2, "predictions": 1}]
    assert actual(out) == expected(steps)


def test_per_task_reports_sum_to_the_predictions_of_the_old_model() -> None:
    """Two tasks, each holding half of the users, see the same model versions."""
    steps = generate()
    users = sorted({e["user_id"] for s in steps for e in s.events})
    task_of = {u: i % 2 for i, u in enumerate(users)}
    tasks = [driver(0), driver(1)]
    for s in steps:
        for t, d in enumerate(tasks):
            d.step(Step(s.table, [e for e in s.events if task_of[e["user_id"]] == t],
                        s.processing_time))
    reports = [r for d in tasks for r in d.outputs.side[REPORTS.name]]
    predictions = [p for d in tasks for p in d.outputs.main]
    assert sorted_rows(predictions) == expected(steps)[0]
    assert {(r["task"], r["model_version"]) for r in reports} == {(0, 1), (1, 1), (0, 2),
                                                                  (1, 2)}
    for d in tasks:  # each task reports what it predicted itself
        mine = Counter(p["model_version"] for p in d.outputs.main)
        assert report_totals(d.outputs.side[REPORTS.name]) == Counter({1: mine[1], 2: mine[2]})
    assert report_totals(reports) == report_totals(reference(steps)["reports"])


def test_spark_runtime_matches_reference(spark, lake) -> None:
    steps = generate()
    d: SparkDriver = spark_driver(spark, lake.lake_root)
    out = d.run(steps)
    predictions, unmatched, reports = actual(out)
    want_predictions, want_unmatched, want_reports = expected(steps)
    assert predictions == want_predictions
    assert unmatched == want_unmatched
    # reports are per Spark task: at most one per (task, version), summing to the reference
    assert len({(r["task"], r["model_version"]) for r in reports}) == len(reports)
    assert all(r["task"] >= 0 and r["predictions"] > 0 for r in reports)
    assert report_totals(reports) == report_totals(want_reports)
