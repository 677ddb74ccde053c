"""The fraud pipeline declared through the factory (jobs/fraud.py), run through Dagster.

End to end on the test run's Spark session and a real Dagster instance: three runs of
``fraud_microbatch`` over three versions of ``fraud_rules`` (a rule disabled, then
enabled again with new thresholds), every alert compared with the plain-Python reference
of ``examples.fraud_detection`` (which knows nothing of Spark, Delta, Dagster or the
``enabled`` column: it is given the enabled rules of each batch's rules version); the
sensor's decisions between runs; a bad rules version failing the run with its table,
version and key. Then the definitions, through ``defs`` and Dagster's GraphQL API.
"""

from __future__ import annotations

import json
import math
from typing import Any

from dagster import AssetKey, DagsterInstance, SensorResult, SkipReason, build_sensor_context

from dagster_lakecast import VERSIONS_TAG
from dagster_lakecast.checks import counts_reconcile, events_freshness, newest_versions_refused
from dagster_lakecast.handle import PipelineHandle
from examples.common import Step, sorted_rows
from examples.fraud_detection import MINUTE, reference
from jobs.fraud.defs import (
    FRAUD,
    FRAUD_ALERTS,
    FRAUD_PIPELINE,
    FRAUD_REJECTED,
    FRAUD_REVIEW,
    FRAUD_RULES,
    TRANSACTIONS,
)
from jobs.fraud.tables import (
    RULES_SCHEMA,
    append_transactions,
    demo_transactions,
    rule,
    write_rules,
)
from lakecast.delta import io as delta_io
from lakecast.pipeline.progress import progress_path, read_log
from lakecast.runtime.executor import VERSION_COLUMN
from tests.assets.conftest import QUIET
from tests.assets.test_columns import (
    FRAUD_TABLES,
    assert_materializations_report_declared_columns,
    column_mismatches,
)

FRAUD_H = PipelineHandle.resolve(FRAUD)

Row = dict[str, Any]
CARD_TEST = rule("card_test", 1.0, 500.0, MINUTE, "BLOCK")
PROBE = rule("probe", 5.0, 200.0, 2 * MINUTE, "REVIEW")
#: the rules table before each batch: both on; card_test off and probe stricter; card_test
#: back on with other thresholds
RULE_VERSIONS = (
    [CARD_TEST, PROBE],
    [{**CARD_TEST, "enabled": False}, {**PROBE, "large_above": 300.0}],
    [{**CARD_TEST, "small_below": 2.0, "large_above": 400.0}, {**PROBE, "large_above": 300.0}],
)
#: invalid transactions of the first batch and why each is rejected
BAD = [
    ({"tx_id": 900, "user_id": None, "amount": 1.0, "merchant": "m1", "ts": 1_000}, "null_user_id"),
    ({"tx_id": 901, "user_id": "u1", "amount": -5.0, "merchant": "m1", "ts": 2_000},
     "negative_amount"),
    ({"tx_id": 902, "user_id": "u2", "amount": math.nan, "merchant": "m1", "ts": 3_000},
     "nan_amount"),
]  # fmt: skip


def batch_events(i: int) -> list[Row]:
    """Batch ``i``'s valid transactions (10 minutes of event time per batch)."""
    return demo_transactions(seed=300 + i, count=80, first_tx_id=1000 * i, start_ts=i * 10 * MINUTE)


# ------------------------------------------------------------------ the reference's inputs
def is_valid(tx: Row) -> bool:
    """Plain-Python validity (independent of jobs.fraud.defs.validate_transactions)."""
    if any(tx[c] is None for c in ("tx_id", "user_id", "merchant", "ts", "amount")):
        return False
    return not (math.isnan(tx["amount"]) or tx["amount"] < 0)


def enabled_rules(rules: list[Row]) -> list[Row]:
    """The reference's rules table: enabled rules only, without the column."""
    return [{k: v for k, v in r.items() if k != "enabled"} for r in rules if r["enabled"]]


def expected(
    batches: list[tuple[list[Row], list[Row]]], planned_at: list[int]
) -> dict[str, list[Row]]:

    """Reference alerts of ``(rules, transactions)`` per batch; a transaction sent twice in
    a batch counts once, invalid ones not at all."""
    steps = []
    for (rules, txs), now in zip(batches, planned_at, strict=True):
        seen: set[int] = set()
        valid = []
        for tx in txs:
            if is_valid(tx) and tx["tx_id"] not in seen:
                seen.add(tx["tx_id"])
                valid.append(tx)
        steps.append(Step(enabled_rules(rules), valid, now))
    return reference(steps)


# ------------------------------------------------------------------ helpers
def rows(spark, lake, table: str) -> list[Row]:
    return [r.asDict() for r in delta_io.read(spark, lake.table_path(table)).collect()]


def tick(instance: DagsterInstance, cursor: str | None) -> SensorResult | SkipReason:
    return FRAUD_PIPELINE.sensor(build_sensor_context(instance=instance, cursor=cursor))


def run_job(instance: DagsterInstance, tags: dict[str, str] | None = None):
    from jobs.definitions import defs

    job = defs.resolve_job_def(FRAUD_H.job_name)
    return job.execute_in_process(instance=instance, tags=tags, raise_on_error=False)


def run_check(instance: DagsterInstance, asset: str, name: str):
    """Run one asset check of the definitions on its own (as its Checks tab does)."""
    from dagster import AssetCheckKey, AssetKey, AssetSelection, Definitions, define_asset_job

    from jobs.definitions import defs

    key = AssetCheckKey(AssetKey(asset), name)
    job = define_asset_job("check_on_request", selection=AssetSelection.checks(key))
    merged = Definitions.merge(defs, Definitions(jobs=[job]))
    res = merged.resolve_job_def(job.name).execute_in_process(instance=instance,
                                                               raise_on_error=False)
    (evaluation,) = res.get_asset_check_evaluations()
    return evaluation


def skip_message(result: SensorResult | SkipReason) -> str:
    if isinstance(result, SkipReason):
        return result.skip_message or ""
    assert not result.run_requests, result.run_requests
    return result.skip_reason.skip_message if result.skip_reason else ""


def test_fraud_job_over_three_rules_versions_matches_the_reference(spark, lake):
    rules_path, tx_path = lake.table_path(FRAUD_RULES), lake.table_path(TRANSACTIONS)
    batches: list[tuple[list[Row], list[Row]]] = []
    with DagsterInstance.ephemeral() as instance:
        # no input table yet: the tick names the events table and what creates it
        said = skip_message(tick(instance, None))
        assert f"events table {TRANSACTIONS!r}" in said and "dg launch --assets" in said, said
        cursor = None
        for i, rules in enumerate(RULE_VERSIONS):
            write_rules(spark, rules_path, rules)
            txs = batch_events(i)
            if i == 0:  # invalid rows and a second copy of a transaction
                txs = txs + [tx for tx, _ in BAD] + [dict(txs[5])]
            append_transactions(spark, tx_path, txs)
            batches.append((rules, txs))
            # the sensor: new versions -> one run request, tagged with those versions
            result = tick(instance, cursor)
            assert isinstance(result, SensorResult), result
            (request,) = result.run_requests
            versions = json.loads(request.tags[VERSIONS_TAG])
            assert versions == {TRANSACTIONS: i, FRAUD_RULES: i}
            cursor = result.cursor
            res = run_job(instance, dict(request.tags))
            assert res.success
            meta = {
                m.asset_key.to_user_string(): {
                    k: v.value for k, v in m.materialization.metadata.items()
                }
                for m in res.get_asset_materialization_events()
            }
            assert set(meta) == {FRAUD_ALERTS, FRAUD_REVIEW, FRAUD_REJECTED}
            m = meta[FRAUD_ALERTS]
            assert m["batch_id"] == i and m["state_version"] == {FRAUD_RULES: i}
            assert m["events"] == len(txs)
            assert m["events"] == m["processed"] + m["rejected"]
            assert m["lag_versions"] == 0 and m["latency_seconds"] >= 0
            # the rules version applied is the newest, written before the transactions
            assert m["broadcast_versions_behind"] == 0 and m["broadcast_stale_seconds"] == 0
            assert m["broadcast_age"][FRAUD_RULES]["version"] == i
            assert m["broadcast_age_seconds"] >= m["latency_seconds"]
            assert m["state_bytes_total"] == m["state_bytes_per_task"] * m["parallelism"]
            assert [
                meta[t]["batch_rows"] for t in (FRAUD_ALERTS, FRAUD_REVIEW, FRAUD_REJECTED)
            ] == [m["outputs"], m["side_review"], m["rejected"]]
            checks = {e.check_name: e.passed for e in res.get_asset_check_evaluations()}
            # output_sample_recomputed is run on request, not after each run
            assert checks == {"counts_reconcile": True, "broadcast_versions_accepted": True,
                              "events_fresh": True}
            # caught up: nothing new
            assert "no new Delta versions" in skip_message(tick(instance, cursor))

        # the recomputation, run on request as from the UI: every sampled key replays exactly
        recomputed = run_check(instance, FRAUD_ALERTS, "output_sample_recomputed")
        assert recomputed.passed and recomputed.metadata["rows_matched"].value > 0, recomputed

        # every alert against the reference, with each batch's processing time (TTL clock)
        plans, _ = read_log(progress_path(lake.checkpoint_root, FRAUD.name))
        assert [p.broadcast_versions for p in plans] == [{FRAUD_RULES: i} for i in range(3)]
        want = expected(batches, [p.planned_at_ms for p in plans])
        alerts, review = rows(spark, lake, FRAUD_ALERTS), rows(spark, lake, FRAUD_REVIEW)
        batch_of = {tx["tx_id"]: b for b, (_, txs) in enumerate(batches) for tx in txs}
        for alert in alerts + review:  # lineage: the rules version of the alert's batch
            version = json.loads(alert.pop(VERSION_COLUMN))
            assert version == {FRAUD_RULES: batch_of[alert["large_tx_id"]]}
        assert want["block"] and want["review"]
        assert sorted_rows(alerts) == sorted_rows(want["block"])
        assert sorted_rows(review) == sorted_rows(want["review"])
        # the disabled rule mattered: enabled in batch 1 it would have alerted
        still_on = [batches[0], ([CARD_TEST, RULE_VERSIONS[1][1]], batches[1][1]), batches[2]]
        assert expected(still_on, [p.planned_at_ms for p in plans])["block"] != want["block"]
        assert not any(
            a["rule_id"] == "card_test" and batch_of[a["large_tx_id"]] == 1 for a in alerts
        )
        # rejected rows, each with its reason
        rejected = sorted(
            (r["reason"], json.loads(r["raw_record"])["tx_id"])
            for r in rows(spark, lake, FRAUD_REJECTED)
        )
        assert rejected == sorted(
            [(why, tx["tx_id"]) for tx, why in BAD]
            + [("duplicate_tx_id", batches[0][1][5]["tx_id"])]
        )

        # a bad rules version (rule_id 'probe' twice): a run request, and the run fails
        # naming table, version and key, with nothing written
        bad = spark.createDataFrame([tuple(RULE_VERSIONS[2][1].values())], RULES_SCHEMA)
        delta_io.write(bad, rules_path, mode="append")
        (request,) = tick(instance, cursor).run_requests
        before = {
            t: delta_io.latest_version(lake.table_path(t))
            for t in (FRAUD_ALERTS, FRAUD_REVIEW, FRAUD_REJECTED)
        }
        res = run_job(instance, dict(request.tags))
        assert not res.success
        failure = str(res.get_step_failure_events()[0].event_specific_data)
        assert f"{FRAUD_RULES}@v3" in failure and "rule_id='probe'" in failure, failure
        assert {t: delta_io.latest_version(lake.table_path(t)) for t in before} == before
        newest, refused = newest_versions_refused(FRAUD_H, lake)
        assert newest == {FRAUD_RULES: 3} and [r["version"] for r in refused] == [3]
        assert counts_reconcile(FRAUD_H, lake)[0]

        # freshness: caught up, then a transactions commit left unprocessed past the bound
        passed, problem, meta = events_freshness(FRAUD_H, lake)
        assert passed and problem is None and meta["unprocessed_versions"] == 0
        assert meta["processed_through_version"] == len(RULE_VERSIONS) - 1
        append_transactions(spark, tx_path, batch_events(len(RULE_VERSIONS)))
        committed = delta_io.commit_info(tx_path, len(RULE_VERSIONS)).timestamp_ms / 1000
        assert events_freshness(FRAUD_H, lake, now=committed + FRAUD.dagster.freshness_seconds)[0]
        passed, problem, meta = events_freshness(
            FRAUD_H, lake, now=committed + FRAUD.dagster.freshness_seconds + 60)
        assert not passed and meta["unprocessed_versions"] == 1
        assert meta["oldest_unprocessed_seconds"] == FRAUD.dagster.freshness_seconds + 60
        assert f"{TRANSACTIONS}: 1 version(s) after v2 unprocessed" in problem, problem
        assert FRAUD_H.sensor_name in problem
        assert FRAUD_H.job_name in problem

    # every table of the pipeline has the columns assets/columns.py declares for it
    assert not column_mismatches(spark, lake, FRAUD_TABLES)


def test_demo_fraud_assets_write_and_report_their_declared_columns(spark, lake):
    """The demo's input assets (jobs/fraud_tables.py), materialized through Dagster: their
    Delta tables and their materializations' column schemas are the declared ones."""
    from dagster import materialize

    from dagster_lakecast.resources import LakecastSparkResource, LakeResource
    from jobs.fraud.tables import fraud_rules, transactions

    result = materialize(
        [fraud_rules, transactions],
        resources={"pyspark": LakecastSparkResource(), "lake": LakeResource()},
        run_config={**QUIET, "ops": {"transactions": {"config": {"count": 40}}}},
    )
    assert result.success
    assert len(rows(spark, lake, TRANSACTIONS)) > 0 and len(rows(spark, lake, FRAUD_RULES)) > 0
    assert not column_mismatches(spark, lake, [FRAUD_RULES, TRANSACTIONS])
    assert_materializations_report_declared_columns(result)


def test_definitions_hold_the_fraud_pipeline():
    from jobs.definitions import defs

    job = defs.resolve_job_def("fraud_microbatch")
    assert {k.to_user_string() for k in job.asset_layer.selected_asset_keys} == {
        FRAUD_ALERTS,
        FRAUD_REVIEW,
        FRAUD_REJECTED,
    }
    sensor = defs.resolve_sensor_def("fraud_sensor")
    assert sensor.job_name == "fraud_microbatch"
    graph = defs.resolve_asset_graph()
    for table in (FRAUD_ALERTS, FRAUD_REVIEW):
        parents = graph.get(AssetKey(table)).parent_keys
        assert {k.to_user_string() for k in parents} == {TRANSACTIONS, FRAUD_RULES}
    checks = {(k.asset_key.to_user_string(), k.name) for k in graph.asset_check_keys}
    assert {
        (FRAUD_ALERTS, "counts_reconcile"),
        (FRAUD_ALERTS, "broadcast_versions_accepted"),
        (FRAUD_ALERTS, "events_fresh"),
        (FRAUD_ALERTS, "output_sample_recomputed"),
    } <= checks
    # the enrichment's sensor, also built by the factory, keeps its name and job
    assert defs.resolve_sensor_def("broadcast_versions_sensor").job_name == "enrichment_microbatch"

