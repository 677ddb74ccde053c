"""Pre-registered benchmark targets: verdicts, the JSON a run writes, every declaration."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks import targets
from benchmarks.registry import Benchmark, Measure, Rule, key, ratio, sides

BENCH = Benchmark("demo", "python -m benchmarks.demo", (
    Measure("ratio_x", 1.2, "<=", "x", "F.broadcast",
            Rule(repeats=4, statistic="median", order="rotated", first_run_counts=False),
            value=ratio("a.mine_s", "a.theirs_s"),
            sides=sides(mine_s="a.mine_s", theirs_s="a.theirs_s")),
    Measure("throughput", 2000.0, ">=", "events/s", "2,000 events/s", value=key("b.eps")),
    Measure("absent", 1.0, "<=", "s", "not measured in this run", value=key("c.p50_s")),
))


def test_verdicts_follow_the_declared_comparison():
    rows = {r["measure"]: r for r in BENCH.evaluate(
        {"a": {"mine_s": 6.0, "theirs_s": 5.0}, "b": {"eps": 2500}})}
    assert rows["ratio_x"]["value"] == pytest.approx(1.2)
    assert rows["ratio_x"]["verdict"] == "PASS"  # <= is inclusive
    assert rows["ratio_x"]["sides"] == {"mine_s": 6.0, "theirs_s": 5.0}
    assert rows["throughput"]["verdict"] == "PASS"
    assert rows["absent"]["verdict"] == "NOT RUN" and rows["absent"]["value"] is None

    rows = {r["measure"]: r for r in BENCH.evaluate(
        {"a": {"mine_s": 6.1, "theirs_s": 5.0}, "b": {"eps": 1999}})}
    assert rows["ratio_x"]["verdict"] == "FAIL"
    assert rows["throughput"]["verdict"] == "FAIL"


def test_report_writes_value_target_verdict_sides_rule_and_run(tmp_path, capsys):
    start = BENCH.start()
    out = BENCH.report({"a": {"mine_s": 7.0, "theirs_s": 5.0}, "extra": 1}, start,
                       name="demo_run", results_dir=tmp_path)
    written = json.loads((tmp_path / "demo_run.json").read_text())
    assert written == json.loads(json.dumps(out, default=str))
    assert written["extra"] == 1  # the benchmark's own figures are kept
    assert written["passed"] is False
    first = written["verdicts"][0]
    assert first["measure"] == "ratio_x" and first["verdict"] == "FAIL"
    assert first["target"] == 1.2 and first["op"] == "<=" and first["value"] == pytest.approx(1.4)
    assert first["rule"] == {"repeats": 4, "statistic": "median", "order": "rotated",
                             "first_run_counts": False, "note": ""}
    run = written["run"]
    assert run["cores"] >= 1 and len(run["load_average_before_start"]) == 3
    assert run["command"].startswith("python -m benchmarks.demo")
    assert run["date"] == start.date
    assert run["git_commit"] is None or len(run["git_commit"].split("+")[0]) == 40
    # this machine (Linux) reports the host's share of the CPU time during the run
    assert run["cpu_steal_fraction"] is None or 0 <= run["cpu_steal_fraction"] <= 1
    printed = capsys.readouterr().out
    assert "FAIL    ratio_x: 1.400 x (target <= 1.2; vs F.broadcast)" in printed
    assert "NOT RUN throughput" in printed


def test_passed_needs_a_measured_value_and_every_measured_pass(tmp_path):
    assert BENCH.report({}, name="none", results_dir=tmp_path)["passed"] is False
    ok = {"a": {"mine_s": 1.0, "theirs_s": 5.0}, "b": {"eps": 3000}}
    assert BENCH.report(ok, name="ok", results_dir=tmp_path)["passed"] is True


def test_a_run_off_the_targets_conditions_never_passes(tmp_path, capsys):
    small = Benchmark("demo", "cmd", BENCH.measures,
                      conditions=lambda r: None if r.get("scale") == 1 else "scale 0.1")
    ok = {"a": {"mine_s": 1.0, "theirs_s": 5.0}, "b": {"eps": 3000}}
    assert small.report({**ok, "scale": 1}, name="s1", results_dir=tmp_path)["passed"]
    out = small.report({**ok, "scale": 0.1}, name="s2", results_dir=tmp_path)
    assert out["passed"] is False and out["off_target_conditions"] == "scale 0.1"
    assert "not at the targets' conditions: scale 0.1" in capsys.readouterr().out
    assert targets.DELTA_LOG_POLL.conditions({"commits": 19_999}) is not None
    assert targets.DELTA_LOG_POLL.conditions({"commits": 20_000}) is None
    full = {"keys": 200_000, "events_per_batch": 100_000, "batches": 10,
            "sides": {"tws": {"extra": {"api_requested": "transformWithState"}}}}
    assert targets.KEYED_STATE.conditions(full) is None
    assert targets.KEYED_STATE.conditions({**full, "keys": 10_000}) is not None
    pandas = {**full, "sides": {"tws": {"extra": {
        "api_requested": "transformWithStateInPandas"}}}}
    assert "transformWithStateInPandas" in targets.KEYED_STATE.conditions(pandas)
    assert targets.SNAPSHOTS.conditions({"entries": 1_000_000, "p": 4}) is None
    assert targets.SNAPSHOTS.conditions({"entries": 50_000, "p": 4}) is not None


def test_an_unknown_comparison_is_refused():
    with pytest.raises(ValueError, match="op"):
        Measure("m", 1.0, "=<", "x", "side")


def test_every_benchmark_declares_the_issue_targets():
    declared = {b.name: {m.name: (m.op, m.target) for m in b.measures} for b in targets.ALL}
    assert set(declared) == {"delta_log_poll", "broadcast_enrichment", "keyed_state",
                             "snapshots", "freshness", "sensor_freshness",
                             "dg_dev_freshness", "pipeline", "cluster", "soak",
                             "sharded_state"}
    assert declared["broadcast_enrichment"] == {
        "a_tasks_over_f_broadcast": ("<=", 1.2), "a_transform_over_f_broadcast_sql": ("<=", 1.2),
        "b_cold_rebuild_1m_s": ("<=", 2.0), "b_delta_append_over_batch_join": ("<=", 0.33),
        "b_no_sink_over_stream_static": ("<=", 0.33),
        "b_exactly_once_over_stream_static": ("<=", 0.33)}
    assert declared["keyed_state"] == {"lakecast_over_tws_total": ("<=", 0.5),
                                       "lakecast_over_jvm_aggregation_total": ("<=", 0.5)}
    assert declared["snapshots"] == {"first_checkpoint_over_plain_write": ("<=", 2.0),
                                     "restore_over_cold_read": ("<=", 2.0)}
    for name in ("sensor_freshness", "dg_dev_freshness"):
        assert declared[name] == {"sensor_p50_s": ("<=", 8.0), "sensor_max_s": ("<=", 20.0)}
    assert {k: v for k, v in declared["freshness"].items() if k.startswith("continuous")} == {
        "continuous_p50_s": ("<=", 0.5), "continuous_p99_s": ("<=", 1.5),
        "continuous_sustained_p99_s": ("<=", 2.0),
        "continuous_sustained_lag_growing": ("<=", 0.0)}  # "no growing lag" (False = 0)
    assert declared["delta_log_poll"]["poll_p50_ms"] == ("<=", 20.0)
    assert declared["sharded_state"] == {"warm_batch_over_shuffle_join": ("<=", 1.5),
                                         "warm_batch_over_stream_static": ("<=", 0.5),
                                         "checkpoint_over_delta_write": ("<=", 1.5)}


def test_declarations_read_the_benchmarks_result_shapes():
    """Sample result dicts shaped as each benchmark writes them give the values."""
    def values(bench: Benchmark, result: dict) -> dict[str, float | None]:
        return {r["measure"]: r["value"] for r in bench.evaluate(result)}

    be = values(targets.BROADCAST_ENRICHMENT, {
        "a": {"ratio": 1.1, "lakecast_median_s": 11.0, "bhj_median_s": 10.0,
              "transform_ratio": 1.15},
        "b": {"exactly_once": {"ratio": 0.3}, "enrichment_only": {"ratio": 0.4}, "ratio": 0.45,
              "cold_rebuild_median_s": 0.9, "cold_rebuild_s": [0.8, 0.9, 1.1]}})
    assert be == {"a_tasks_over_f_broadcast": 1.1, "a_transform_over_f_broadcast_sql": 1.15,
                  "b_cold_rebuild_1m_s": 0.9, "b_delta_append_over_batch_join": 0.45,
                  "b_no_sink_over_stream_static": 0.4,
                  "b_exactly_once_over_stream_static": 0.3}
    snap = values(targets.SNAPSHOTS, {"first_checkpoint_s": 4.0, "first_plain_write_s": 1.6,
                                      "checkpoint_runs_s": [4.0, 1.0, 1.0],
                                      "plain_delta_write_s": 0.5,
                                      "restore_total_s": 1.0, "plain_delta_read_s": 2.0})
    assert snap == {"first_checkpoint_over_plain_write": 2.5, "restore_over_cold_read": 0.5}
    keyed = values(targets.KEYED_STATE, {"ratios_lakecast_over_tws": {"total_s": 0.4},
                                         "ratios_lakecast_over_agg": {"total_s": 1.6}})
    assert keyed == {"lakecast_over_tws_total": 0.4, "lakecast_over_jvm_aggregation_total": 1.6}
    fresh = values(targets.FRESHNESS, {
        "sensor": {"p50_s": 12.0, "max_s": 31.0},
        "continuous": {"p50_s": 0.8, "latencies_s": [0.5] * 99 + [4.0]}})
    assert fresh["continuous_p99_s"] == 0.5  # 99th of 100: the last one is the p100
    assert fresh["sensor_max_s"] == 31.0 and fresh["continuous_sustained_p99_s"] is None
    sustained = values(targets.FRESHNESS, {"sustained": {"p99_s": 1.9, "lag_growing": True}})
    assert sustained["continuous_sustained_p99_s"] == 1.9
    assert sustained["continuous_sustained_lag_growing"] == 1.0  # growing: FAIL (<= 0)
    bench = targets.FRESHNESS
    tuned = {"every_s": 20, "events_per_commit": 1300, "sensor": {},
             "sensor_interval_override_s": 2, "idle_s": 120}
    assert "overridden" in bench.conditions(tuned)
    assert "idle" in bench.conditions({**tuned, "sensor_interval_override_s": None, "idle_s": 5})
    assert bench.conditions({**tuned, "sensor_interval_override_s": None}) is None
    # a sustained phase counts at the declared load only (2,000 events/s, every 2 s, 10 min)
    load = {"every_s": 20, "events_per_commit": 1300,
            "sustained": {"events_per_s": 2000, "commit_every_s": 2.0, "minutes": 10.0}}
    assert bench.conditions(load) is None
    short = {**load, "sustained": {**load["sustained"], "minutes": 0.5}}
    assert "10 min" in bench.conditions(short)
    # the sensor benchmarks of their own: the same defaults, two idle minutes
    untuned = {**tuned, "sensor_interval_override_s": None}
    for bench in (targets.SENSOR_FRESHNESS, targets.DG_DEV_FRESHNESS):
        assert bench.conditions(untuned) is None, bench.name
        assert "idle" in bench.conditions({**untuned, "idle_s": 20}), bench.name
        assert "1,300" in bench.conditions({**untuned, "events_per_commit": 500}), bench.name
    assert "overridden" in targets.SENSOR_FRESHNESS.conditions(tuned)
    assert "LAKECAST_SPARK_REMOTE" in targets.DG_DEV_FRESHNESS.conditions(
        {**untuned, "spark_remote": "server"})
    assert "queue" in targets.DG_DEV_FRESHNESS.conditions({**untuned, "dequeue_seconds": 1})
    dg_dev = values(targets.DG_DEV_FRESHNESS, {"p50_s": 9.5, "max_s": 21.0})
    assert dg_dev == {"sensor_p50_s": 9.5, "sensor_max_s": 21.0}
    soak = values(targets.SOAK, {"targets": {"runs": True, "kills": False}})
    assert soak["runs"] == 1.0 and soak["kills"] == 0.0 and soak["restore"] is None


def test_a_target_change_carries_its_sentence():
    moved = Measure("m", 1.0, "<=", "s", "side",
                    history=("2030-01-02: from 2 s to 1 s, the warm-up is no longer timed.",))
    assert moved.verdict(1.0) == "PASS" and moved.history[0].startswith("2030-01-02")
    assert all(isinstance(m.history, tuple) for b in targets.ALL for m in b.measures)
    with pytest.raises(TypeError, match="history"):
        Measure("m", 1.0, "<=", "s", "side", history="one sentence, not a tuple")  # type: ignore[arg-type]


def test_steal_fraction_is_the_stolen_share_of_the_cpu_time_between_two_readings():
    from benchmarks.registry import cpu_times, steal_fraction

    assert steal_fraction((100, 1_000), (150, 2_000)) == 0.05
    assert steal_fraction((100, 1_000), (100, 1_000)) is None  # no time passed
    assert steal_fraction(None, (1, 2)) is None
    now = cpu_times()
    if os.path.exists("/proc/stat"):  # Linux: stolen <= total, both counted since boot
        assert now is not None and 0 <= now[0] <= now[1]


def test_every_run_is_appended_to_the_history_and_the_official_figure_is_a_median(
        tmp_path, monkeypatch):
    from benchmarks import registry
    from benchmarks.official import official
    from benchmarks.registry import Start

    quiet = Start((0.1, 0.1, 0.1), 0.0, "2026-12-02T00:00:00", None, 0.02)
    busy = Start((1.9, 1.9, 1.9), 0.0, "2026-12-02T00:00:01", None, 0.9)
    monkeypatch.setattr(registry, "git_commit", lambda root=None: "a" * 40)
    for mine, start in ((7.0, quiet), (5.5, quiet), (9.0, busy), (5.9, quiet)):
        BENCH.report({"a": {"mine_s": mine, "theirs_s": 5.0}}, start, results_dir=tmp_path)
    lines = [json.loads(s) for s in (tmp_path / "demo.history.jsonl").read_text().splitlines()]
    assert len(lines) == 4  # every run, passing or not
    assert [h["verdicts"]["ratio_x"] for h in lines] == ["FAIL", "PASS", "FAIL", "PASS"]
    assert [h["counts"] for h in lines] == [True, True, False, True]
    assert "busy before the start" in lines[2]["why_not"][-1]  # a busy machine: not counted
    out = {m["measure"]: m for m in official(BENCH, results_dir=tmp_path)["measures"]}
    # the three quiet runs: 1.4, 1.1, 1.18 -> median 1.18 (PASS), spread 1.1-1.4
    assert out["ratio_x"]["value"] == pytest.approx(1.18)
    assert out["ratio_x"]["verdict"] == "PASS"
    assert out["ratio_x"]["spread"] == pytest.approx([1.1, 1.4])
    assert out["absent"]["verdict"] == "NOT OFFICIAL"
    with pytest.raises(ValueError, match="at least 3 runs"):
        official(BENCH, runs=2, results_dir=tmp_path)
    # a run of a checkout with local changes is kept in the history, and never counts
    monkeypatch.setattr(registry, "git_commit", lambda root=None: "b" * 40 + "+dirty")
    BENCH.report({"a": {"mine_s": 5.0, "theirs_s": 5.0}}, quiet, results_dir=tmp_path)
    last = json.loads((tmp_path / "demo.history.jsonl").read_text().splitlines()[-1])
    assert last["counts"] is False and "not a clean commit" in last["why_not"][0]
    assert official(BENCH, results_dir=tmp_path)["git_commit"] == "a" * 40


def test_sensor_commits_meet_every_phase_of_the_daemons_loop():
    from benchmarks.common import SENSOR_LOOP_S, phase_offsets

    offsets = phase_offsets(10)
    assert sorted(offsets) == [SENSOR_LOOP_S * k / 10 for k in range(10)]
    assert offsets != sorted(offsets)  # no phase tied to a place in the run (e.g. the first)
    assert phase_offsets(10) == offsets  # the same in every run
