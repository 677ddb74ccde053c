"""The one definition of freshness (benchmarks.freshness_watch), on real Delta tables
written by deltalake as a user's job would: appends, a compaction, rows that go nowhere."""

from __future__ import annotations

import time

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from benchmarks.freshness_watch import FreshnessWatch


def _commit(path: str, ids: list[int]) -> None:
    write_deltalake(path, pa.table({"event_id": pa.array(ids, pa.int64()),
                                    "v": pa.array([str(i) for i in ids])}), mode="append")
    time.sleep(0.02)  # distinct commit timestamps


def _ts(path: str) -> dict[int, int]:
    """version -> commit timestamp (ms), from deltalake's history (not the watcher's)."""
    return {h["version"]: int(h["timestamp"]) for h in DeltaTable(path).history()}


def test_a_commit_lands_with_the_first_output_commit_holding_any_of_its_rows(tmp_path):
    events, output = str(tmp_path / "events"), str(tmp_path / "out")
    _commit(events, [1, 2, 3])       # v0
    _commit(events, [4, 5, 6])       # v1
    _commit(events, [7, 8, 9])       # v2: its rows are in no output yet
    watch = FreshnessWatch(events, output)
    assert watch.output_ms(0) is None  # no output table yet
    _commit(output, [1, 2])          # v0: two of events v0's rows
    _commit(output, [3, 4])          # v1: the last of v0's, the first of v1's
    assert watch.output_ms(0) == _ts(output)[0]
    assert watch.output_ms(1) == _ts(output)[1]
    assert watch.latency_s(1) == (_ts(output)[1] - _ts(events)[1]) / 1000
    assert watch.output_ms(2) is None and watch.latency_s(2) is None
    # a compaction re-adds rows without changing data: not where rows land
    DeltaTable(output).optimize.compact()
    assert watch.output_ms(2) is None
    _commit(output, [5, 6, 9])       # v3: one of events v2's rows
    assert watch.output_ms(2) == _ts(output)[3]
    assert watch.output_ms(1) == _ts(output)[1]  # still the first that held one
    assert watch.output_ms(7) is None  # an events version not made yet
