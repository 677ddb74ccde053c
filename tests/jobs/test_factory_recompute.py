"""The ``output_sample_recomputed`` check (jobs/factory_recompute.py) on real outputs.

The scoring pipeline (broadcast) over two versions of ``models`` (retrained: other
coefficients, another challenger share) and the fraud pipeline (keyed) over three versions
of ``fraud_rules`` (a rule disabled, then enabled again with new thresholds) run on a small
lake; then the check passes on the honest outputs, fails when one row of the output is
changed on disk by a Delta UPDATE (naming table, batch, row key and column, with the
value read before the UPDATE as the expected one), and says there is nothing to recompute
before the first batch. The honest outputs themselves are checked against plain-Python
references in test_model_pipeline.py and test_fraud_pipeline.py (the same check also runs
there, through Dagster, after every run).
"""

from __future__ import annotations

import datetime as dt
import json
import random
from typing import Any

from dagster import AssetCheckSeverity

from dagster_lakecast.handle import PipelineHandle
from dagster_lakecast.recompute import recompute_sample
from dagster_lakecast.recompute_rows import compare_current, compare_group
from jobs.fraud.defs import FRAUD, FRAUD_ALERTS, FRAUD_RULES, TRANSACTIONS
from jobs.fraud.tables import append_transactions, write_rules
from jobs.scoring.pipeline import FEATURES, MODELS, PREDICTIONS, SCORING, SCORING_EVENTS
from jobs.scoring.training import MODELS_SCHEMA, SCORING_EVENTS_SCHEMA
from lakecast.delta import io as delta_io
from lakecast.pipeline.progress import progress_path, read_log
from tests.jobs.test_fraud_pipeline import BAD, RULE_VERSIONS
from tests.jobs.test_fraud_pipeline import batch_events as fraud_events

FRAUD_H = PipelineHandle.resolve(FRAUD)
SCORING_H = PipelineHandle.resolve(SCORING)

Row = dict[str, Any]
SEGMENTS = ("VIP", "REGULAR", "CHURNING")  # CHURNING has no model: unmatched


def models_version(i: int) -> list[Row]:
    """Champion and challenger of VIP and REGULAR; version ``i`` has other coefficients
    and another challenger share (a retraining)."""
    rows = []
    for s, segment in enumerate(SEGMENTS[:2]):
        for role, share in (("champion", 0.7 - 0.2 * i), ("challenger", 0.3 + 0.2 * i)):
            rows.append({
                "model_id": f"{segment}:{role}", "segment": segment, "role": role,
                "traffic_share": share, "features": list(FEATURES),
                "coefficients": [-0.3 + 0.1 * i + 0.05 * s, 0.2 - 0.05 * i, 0.01 * (i + 1)],
                "intercept": -0.5 + 0.4 * i + (0.1 if role == "challenger" else 0.0),
                "reg_param": 0.0, "max_iter": 5, "training_rows": 10, "positives": 5,
                "features_day": dt.date(2026, 1, 1 + i),
                "trained_at": dt.datetime(2026, 1, 2 + i, tzinfo=dt.UTC)})
    return rows


def scoring_events(i: int) -> list[Row]:
    rnd = random.Random(70 + i)
    return [{"event_id": 100 * i + j, "user_id": (u := rnd.randrange(30)),
             "segment": SEGMENTS[u % 3], "recency_days": float(rnd.randint(0, 6)),
             "frequency": float(rnd.randint(1, 20)), "monetary": rnd.uniform(0, 100),
             "ts": 10_000 * i + j} for j in range(25)]  # fmt: skip


def write(spark, path: str, rows: list[Row], schema: str, mode: str) -> None:
    cols = [c.split()[0] for c in schema.split(", ")]
    delta_io.write(spark.createDataFrame([tuple(r[c] for c in cols) for r in rows], schema),
                   path, mode=mode)


def committed(lake, name: str) -> list[tuple[int, dict[str, int], int]]:
    """(batch id, broadcast versions, main output rows) of every committed batch."""
    plans, commits = read_log(progress_path(lake.checkpoint_root, name))
    return [(p.batch_id, p.broadcast_versions, commits[p.batch_id].counts["output"])
            for p in plans if p.batch_id in commits]


def value_of(spark, lake, table: str, where: str, column: str) -> Any:
    (row,) = delta_io.read(spark, lake.table_path(table)).where(where).select(column).collect()
    return row[0]


def test_scoring_sample_recomputes_then_a_changed_prediction_fails(spark, lake):
    # before any batch: nothing to recompute
    empty = recompute_sample(SCORING_H, spark, lake)
    assert empty.passed and "no committed batch yet: nothing to recompute" in empty.description
    assert empty.metadata["rows_sampled"] == 0

    for i in range(2):  # models v0, then retrained v1; a batch after each
        write(spark, lake.table_path(MODELS), models_version(i), MODELS_SCHEMA, "overwrite")
        write(spark, lake.table_path(SCORING_EVENTS), scoring_events(i), SCORING_EVENTS_SCHEMA,
              "append")
        assert len(SCORING.build(spark, lake).run()) == 1
    batches = committed(lake, SCORING.name)
    assert [(b, v) for b, v, _ in batches] == [(0, {MODELS: 0}), (1, {MODELS: 1})]
    predictions = delta_io.read(spark, lake.table_path(PREDICTIONS)).count()
    assert predictions == sum(n for *_, n in batches) and predictions > 20

    r = recompute_sample(SCORING_H, spark, lake)
    assert r.passed, r.description
    m = r.metadata
    # every row is sampled (fewer than the bound); each recomputes and is found as written
    assert (m["rows_sampled"], m["rows_compared"], m["rows_matched"]) == (predictions,) * 3
    assert m["mismatch_count"] == 0 and m["mismatches"].value == []
    assert m["batches_covered"].value == [0, 1]
    assert m["versions_used"].value == {"0": {"versions": {MODELS: 0}},
                                        "1": {"versions": {MODELS: 1}}}
    assert m["row_key"].value[0] == "event_id"

    # a smaller sample: bounded and the same for the same seed
    small = recompute_sample(SCORING_H, spark, lake, sample=7)
    again = recompute_sample(SCORING_H, spark, lake, sample=7)
    assert small.passed and small.metadata["rows_sampled"] == 7
    assert small.metadata["keys_sampled"] == again.metadata["keys_sampled"] == 7

    # one prediction of batch 1 flipped on disk
    path = lake.table_path(PREDICTIONS)
    event_id = next(e["event_id"] for e in scoring_events(1) if e["segment"] != "CHURNING")
    before = value_of(spark, lake, PREDICTIONS, f"event_id = {event_id}", "prediction")
    spark.sql(f"UPDATE delta.`{path}` SET prediction = NOT prediction "
              f"WHERE event_id = {event_id}")
    bad = recompute_sample(SCORING_H, spark, lake)
    assert not bad.passed and bad.severity == AssetCheckSeverity.ERROR
    (mismatch,) = bad.mismatches
    assert (mismatch.table, mismatch.batch_id, mismatch.column, mismatch.actual_of) == (
        PREDICTIONS, 1, "prediction", "current")
    assert (mismatch.expected, mismatch.actual) == (before, not before)
    assert mismatch.key.startswith(f"event_id={event_id}, ")
    assert (f"{PREDICTIONS} batch 1 row event_id={event_id}, " in bad.description
            and "column prediction" in bad.description), bad.description
    assert bad.metadata["rows_matched"] == predictions - 1
    assert bad.metadata["mismatches"].value[0]["column"] == "prediction"


def test_fraud_keys_replayed_from_the_first_batch_then_a_changed_alert_fails(spark, lake):
    rules_path, tx_path = lake.table_path(FRAUD_RULES), lake.table_path(TRANSACTIONS)
    assert recompute_sample(FRAUD_H, spark, lake).passed  # no batch yet
    for i, rules in enumerate(RULE_VERSIONS):  # both rules; card_test disabled; re-enabled
        write_rules(spark, rules_path, rules)
        txs = fraud_events(i) + ([tx for tx, _ in BAD] if i == 0 else [])
        append_transactions(spark, tx_path, txs)
        assert len(FRAUD.build(spark, lake).run()) == 1
    batches = committed(lake, FRAUD.name)
    assert [v for _, v, _ in batches] == [{FRAUD_RULES: i} for i in range(3)]
    with_alerts = [b for b, _, n in batches if n]
    assert len(with_alerts) >= 2  # two rules versions at least

    r = recompute_sample(FRAUD_H, spark, lake)
    assert r.passed, r.description
    m = r.metadata
    alerts = [row.asDict() for row in delta_io.read(spark, lake.table_path(FRAUD_ALERTS))
              .collect()]
    users = {a["user_id"] for a in alerts}
    assert m["row_key"].value == ["user_id"] and m["keys_sampled"] == len(users)
    assert m["rows_sampled"] == len(alerts) and m["rows_matched"] == len(alerts)
    assert m["batches_covered"].value == with_alerts and m["batches_replayed"] == 1 + max(
        with_alerts)
    used = m["versions_used"].value
    plans, _ = read_log(progress_path(lake.checkpoint_root, FRAUD.name))
    assert used == {str(p.batch_id): {"processing_time": p.planned_at_ms,
                                      "watermark": used[str(p.batch_id)]["watermark"],
                                      "versions": p.broadcast_versions}
                    for p in plans if p.batch_id in with_alerts}
    # the watermark: the largest event time of the valid transactions so far
    for b in with_alerts:
        valid = [tx["ts"] for i in range(b + 1) for tx in fraud_events(i)]
        assert used[str(b)]["watermark"] == max(valid)

    # one alert's amount changed on disk
    target = max(alerts, key=lambda a: (a["large_tx_id"], a["rule_id"]))
    where = f"large_tx_id = {target['large_tx_id']} AND rule_id = '{target['rule_id']}'"
    spark.sql(f"UPDATE delta.`{lake.table_path(FRAUD_ALERTS)}` SET amount = amount + 1 "
              f"WHERE {where}")
    bad = recompute_sample(FRAUD_H, spark, lake)
    assert not bad.passed and bad.severity == AssetCheckSeverity.ERROR
    (mismatch,) = bad.mismatches
    batch = json.loads(target["_state_version"])[FRAUD_RULES]  # one rules version a batch
    assert (mismatch.batch_id, mismatch.key, mismatch.column) == (
        batch, f"user_id={target['user_id']!r}", "amount")
    assert (mismatch.expected, mismatch.actual) == (target["amount"], target["amount"] + 1)
    assert (f"{FRAUD_ALERTS} batch {batch} row user_id={target['user_id']!r}: column amount"
            in bad.description), bad.description


def test_rows_match_exactly_first_then_by_the_nearest_row():
    """The comparison alone (plain Python): an identical row is never displaced by a near
    one; a changed row is reported column by column; a row only one side has, as such."""
    cols = ["k", "x", "y"]
    expected = [{"k": 1, "x": 1.0, "y": "a"}, {"k": 1, "x": float("nan"), "y": "b"}]
    current = [{"k": 1, "x": float("nan"), "y": "c"}, {"k": 1, "x": 1.0, "y": "a"},
               {"k": 1, "x": 9.0, "y": "z"}]  # the last one: another batch's row
    matched, bad = compare_current("t", "k=1", [(4, r) for r in expected], current, cols)
    assert matched == 1
    assert [(m.batch_id, m.column, m.expected, m.actual, m.actual_of) for m in bad] == [
        (4, "y", "b", "c", "current")]
    assert bad[0].describe() == "t batch 4 row k=1: column y is 'c' (current) but recomputes to 'b'"
    matched, bad = compare_group("t", 2, "k=1", expected[:1], [*expected[:1], current[2]], cols)
    assert matched == 1 and [(m.column, m.expected, m.actual) for m in bad] == [
        (None, None, current[2])]
    assert "wrote a row the recomputation does not produce" in bad[0].describe()
    matched, bad = compare_group("t", 2, "k=1", expected, [], cols)
    assert matched == 0 and [(m.column, m.actual) for m in bad] == [(None, None)] * 2
