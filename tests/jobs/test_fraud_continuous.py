"""``fraud_continuous``: the factory's continuous job for a keyed pipeline, tested like the
storefront's (``test_runs_that_end``): one run processes each transactions commit as it
lands (a rules version changed in between applies from the next batch on), records one
materialization per committed batch and output, keeps the sensor quiet while active, and
stops between two batches when terminated. Every alert equals the plain-Python reference of
``examples.fraud_detection`` given each batch's enabled rules and processing time."""

from __future__ import annotations

import threading
import time

from dagster import AssetKey, DagsterInstance, build_sensor_context

from examples.common import sorted_rows
from jobs.fraud.defs import (
    FRAUD,
    FRAUD_ALERTS,
    FRAUD_PIPELINE,
    FRAUD_REVIEW,
    FRAUD_RULES,
    TRANSACTIONS,
)
from jobs.fraud.tables import append_transactions, write_rules
from lakecast.delta import io as delta_io
from lakecast.pipeline.progress import progress_path, read_log
from lakecast.runtime.executor import VERSION_COLUMN
from tests.jobs.microbatch_lake import skip_message
from tests.jobs.test_fraud_pipeline import RULE_VERSIONS, Row, batch_events, expected, rows
from tests.jobs.test_runs_that_end import RESOURCES

OUTPUTS = (FRAUD_ALERTS, FRAUD_REVIEW, "fraud_rejected")


def _committed(lake) -> dict[int, object]:
    path = progress_path(lake.checkpoint_root, FRAUD.name)
    if delta_io.latest_version(path) is None:
        return {}
    _, commits = read_log(path)
    return commits


def _batch_ids(instance: DagsterInstance, asset: str) -> list[int]:
    records = instance.fetch_materializations(AssetKey(asset), limit=100).records
    return sorted(int(r.asset_materialization.metadata["batch_id"].value) for r in records)


def test_fraud_continuous_processes_each_commit_and_stops_when_terminated(spark, lake):
    rules_path, tx_path = lake.table_path(FRAUD_RULES), lake.table_path(TRANSACTIONS)
    batches: list[tuple[list[Row], list[Row]]] = [(RULE_VERSIONS[0], batch_events(0))]
    write_rules(spark, rules_path, RULE_VERSIONS[0])
    append_transactions(spark, tx_path, batches[0][1])
    seen: dict[str, object] = {}

    def produce_then_terminate(instance: DagsterInstance) -> None:
        deadline = time.monotonic() + 180
        runs = []
        while not runs and time.monotonic() < deadline:
            runs = instance.get_runs()
            time.sleep(0.2)
        for i in (1, 2):  # a rules version, then transactions, while the run watches
            while len(_committed(lake)) < i and time.monotonic() < deadline:
                time.sleep(0.1)
            write_rules(spark, rules_path, RULE_VERSIONS[i])
            txs = batch_events(i)
            append_transactions(spark, tx_path, txs)
            batches.append((RULE_VERSIONS[i], txs))
        while len(_committed(lake)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        seen["sensor"] = FRAUD_PIPELINE.sensor(build_sensor_context(instance=instance))
        instance.report_run_canceling(runs[0], message="terminated by the test")

    with DagsterInstance.ephemeral() as instance:
        helper = threading.Thread(target=produce_then_terminate, args=(instance,))
        helper.start()
        res = FRAUD_PIPELINE.continuous.execute_in_process(
            instance=instance, resources=RESOURCES,
            run_config={"ops": {"fraud_continuous_loop": {"config": {
                "max_seconds": 240, "poll_seconds": 0.1}}}})
        helper.join()
        assert res.success
        # the sensor requested nothing while the continuous run was active
        tick = seen["sensor"]
        assert not getattr(tick, "run_requests", None)
        message = skip_message(tick)
        assert "fraud_continuous" in message and "still active" in message, message
        committed = sorted(_committed(lake))
        assert committed == [0, 1, 2]  # one batch per transactions commit
        for asset in OUTPUTS:  # one materialization per committed batch and output
            assert _batch_ids(instance, asset) == committed, asset
        totals = res.output_for_node("fraud_continuous_loop")
        assert totals["batches"] == 3
        assert totals["events_in"] == sum(len(txs) for _, txs in batches)

    plans, _ = read_log(progress_path(lake.checkpoint_root, FRAUD.name))
    plans = [p for p in plans if not p.is_restore]
    assert [p.broadcast_versions for p in plans] == [{FRAUD_RULES: i} for i in range(3)]
    want = expected(batches, [p.planned_at_ms for p in plans])
    alerts, review = rows(spark, lake, FRAUD_ALERTS), rows(spark, lake, FRAUD_REVIEW)
    for alert in alerts + review:
        alert.pop(VERSION_COLUMN)
    assert want["block"] or want["review"]
    assert sorted_rows(alerts) == sorted_rows(want["block"])
    assert sorted_rows(review) == sorted_rows(want["review"])
