"""``lakecast replay`` of the keyed ``fraud`` pipeline: batches re-run from the keyed state
as of the batch before ``--from`` (copied to a scratch table), at their original rules
versions (an audit: the BLOCK alerts reproduced exactly, batch by batch) and at the
newest rules (checked against the plain-Python reference of ``examples.fraud_detection``,
through the helpers of ``tests/jobs/test_fraud_pipeline.py``); nothing of the pipeline is
written. One lake for the module (its own environment, so not in ``test_replay.py``):
four batches over three rules versions, ``card_test`` disabled in the second."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

import pandas as pd
import pytest

from examples.common import sorted_rows
from jobs.fraud.pipeline import FRAUD, FRAUD_ALERTS, FRAUD_RULES, TRANSACTIONS
from jobs.fraud.tables import append_transactions, write_rules
from lakecast.config import get_settings
from lakecast.delta import io as delta_io
from lakecast.pipeline.progress import progress_path, read_log
from lakecast.replay import batches as rp
from lakecast.runtime.executor import VERSION_COLUMN
from lakecast.tools import cli
from tests.jobs.test_fraud_pipeline import BAD, RULE_VERSIONS, batch_events, expected, rows

Row = dict[str, Any]
REPLAY = f"{FRAUD_ALERTS}_replay"


@pytest.fixture(scope="module")
def fraud_lake(spark, tmp_path_factory):
    """The fraud pipeline run over four batches: the first three each after a new rules
    version (both rules on; card_test disabled, probe stricter; card_test back with other
    thresholds), the last at the third; the first batch with invalid transactions and a
    second copy of one. Yields the settings, the ``(rules, transactions)`` of each batch
    and the plans' times."""
    root = tmp_path_factory.mktemp("replay_keyed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAKECAST_LAKE_ROOT", str(root / "lake"))
        mp.setenv("LAKECAST_CHECKPOINT_ROOT", str(root / "checkpoints"))
        mp.setenv("DAGSTER_HOME", str(root / "dagster_home"))
        lake = get_settings()
        lake.ensure_local_dirs()
        pipeline = FRAUD.build(spark, lake)
        batches: list[tuple[list[Row], list[Row]]] = []
        for i, rules in enumerate([*RULE_VERSIONS, None]):
            if rules is not None:
                write_rules(spark, lake.table_path(FRAUD_RULES), rules)
            rules = rules or RULE_VERSIONS[-1]
            txs = batch_events(i)
            if i == 0:
                txs = txs + [tx for tx, _ in BAD] + [dict(txs[5])]
            append_transactions(spark, lake.table_path(TRANSACTIONS), txs)
            batches.append((rules, txs))
            [result] = pipeline.run()
            assert result.state_version == {FRAUD_RULES: min(i, len(RULE_VERSIONS) - 1)}
        plans, _ = read_log(progress_path(lake.checkpoint_root, FRAUD.name))
        yield lake, batches, [p.planned_at_ms for p in plans]


def footprint(lake) -> dict[str, tuple[int, int]]:
    """Every file of the lake and checkpoints (size, mtime) but the replays' tables."""
    out = {}
    for top in (lake.lake_root, lake.checkpoint_root):
        for d, _, files in os.walk(top):
            rel = os.path.relpath(d, top)
            if rel.split(os.sep)[0].startswith((REPLAY, "what_if")):
                continue
            for f in files:
                st = os.stat(os.path.join(d, f))
                out[os.path.join(d, f)] = (st.st_size, st.st_mtime_ns)
    return out


def by_batch(alerts: list[Row], batch_of: dict[int, int]) -> dict[int, list[Row]]:
    """Alerts by the batch of their large transaction (each batch its own tx ids)."""
    out: dict[int, list[Row]] = defaultdict(list)
    for a in alerts:
        out[batch_of[a["large_tx_id"]]].append(a)
    return out


def replayed(spark, lake, table: str) -> dict[int, list[Row]]:
    out: dict[int, list[Row]] = defaultdict(list)
    for r in rows(spark, lake, table):
        out[r.pop(rp.REPLAY_BATCH)].append(r)
    return out


def test_original_replay_reproduces_the_block_alerts_batch_by_batch(spark, fraud_lake,
                                                                   capsys):
    lake, batches, planned = fraud_lake
    batch_of = {tx["tx_id"]: b for b, (_, txs) in enumerate(batches) for tx in txs}
    before = footprint(lake)
    state_table = FRAUD.state_table
    assert state_table is not None and any(state_table in p for p in before)
    original = by_batch(rows(spark, lake, FRAUD_ALERTS), batch_of)
    # from a middle batch: the keyed state of the batches before it matters (merchants
    # seen), the same batches from empty state alert otherwise
    alone = expected(batches[2:], planned[2:])["block"]
    assert sorted_rows(alone) != sorted_rows(
        [{k: v for k, v in a.items() if k != VERSION_COLUMN} for a in original[2] + original[3]])
    for args, ids in ((["--from", "2"], [2, 3]), ([], [0, 1, 2, 3])):
        assert cli.main(["replay", "fraud", "--state", "original", *args]) == 0
        out = capsys.readouterr().out
        assert f"MATCH: batches {ids[0]}..{ids[-1]}" in out, out
        assert "0 original rows not reproduced, 0 replayed rows not in the original" in out
        got = replayed(spark, lake, REPLAY)
        assert sorted(got) == [b for b in ids if original[b]]
        for b in ids:
            assert sorted_rows(got[b]) == sorted_rows(original[b]), b
        assert sum(len(got[b]) for b in ids) > 0 and original[2]
    assert footprint(lake) == before
    assert delta_io.latest_version(lake.table_path(f"{REPLAY}_keyed_state")) is not None


def test_latest_replay_applies_the_newest_rules_to_every_batch(spark, fraud_lake, capsys):
    lake, batches, planned = fraud_lake
    batch_of = {tx["tx_id"]: b for b, (_, txs) in enumerate(batches) for tx in txs}
    before = footprint(lake)
    assert cli.main(["replay", "fraud", "--state", "latest", "--into", "what_if"]) == 0
    assert f"{FRAUD_RULES}@v2" in capsys.readouterr().out
    got = replayed(spark, lake, "what_if")
    newest = RULE_VERSIONS[-1]
    want = by_batch(expected([(newest, txs) for _, txs in batches], planned)["block"],
                    batch_of)
    assert sum(map(len, want.values())) > 0
    assert sorted(got) == sorted(b for b in want if want[b])
    for b, alerts in got.items():
        assert {a.pop(VERSION_COLUMN) for a in alerts} == {f'{{"{FRAUD_RULES}":2}}'}
        assert sorted_rows(alerts) == sorted_rows(want[b]), b
    # card_test, disabled in batch 1, would have fired there with today's rules
    original = by_batch(rows(spark, lake, FRAUD_ALERTS), batch_of)
    assert any(a["rule_id"] == "card_test" for a in got[1])
    assert not any(a["rule_id"] == "card_test" for a in original[1])
    assert footprint(lake) == before


def test_keyed_replay_errors(spark, fraud_lake, capsys):
    lake, _, _ = fraud_lake
    at = delta_io.commit_info(lake.table_path(FRAUD_RULES), 0).timestamp_ms
    v0 = str(pd.Timestamp(at, unit="ms"))
    cases = [
        (["--from", "2", "--state", v0], f"has seen {FRAUD_RULES}@v1: keyed state cannot go "
                                         "back to older broadcast versions"),
        (["--into", "fraud"], "fraud_keyed_state is a table of pipeline 'fraud'"),
    ]
    for args, message in cases:
        assert cli.main(["replay", "fraud", *args]) == 2, args
        assert message in capsys.readouterr().err
