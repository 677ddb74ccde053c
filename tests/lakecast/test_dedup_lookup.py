"""The cross-batch dedup's driver-side lookup (no Spark): retention, pruning, batch keys,
and the retention setting. Tables are written with delta-rs; the expected rows are
computed from the rows written."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from lakecast.config import ConfigError, get_settings, parse_duration
from lakecast.pipeline.dedup import EARLIER_BATCH, KEY, TIMES, DedupLookup, DedupSpec
from lakecast.pipeline.progress import BatchPlan

TS = pa.timestamp("us", tz="UTC")


def _day(d: int) -> datetime:
    return datetime(2026, 1, d, 10, tzinfo=UTC)


def _append(path: str, ids: list[int], days: list[int], **partition: str) -> None:
    cols = {"event_id": pa.array(ids, pa.int64()),
            "event_ts": pa.array([_day(d) for d in days], TS)}
    cols.update({k: pa.array([v] * len(ids)) for k, v in partition.items()})
    write_deltalake(path, pa.table(cols), mode="append",
                    partition_by=list(partition) or None)


@pytest.fixture
def lookup(tmp_path) -> DedupLookup:
    root = tmp_path
    # accepted events: main output (three appends, 5 days apart), side output (one)
    for ids, d in (([1, 2], 1), ([3, 4], 6), ([5, 6], 11)):
        _append(str(root / "main"), ids, [d] * len(ids))
    _append(str(root / "side"), [7], [9])
    # the events table is partitioned (as the producer's): v0 old events, v1 the batch
    _append(str(root / "events"), [1], [1], ingest_day="2026-01-01")
    _append(str(root / "events"), [1, 3, 4, 5, 7, 99], [1, 6, 6, 11, 9, 11],
            ingest_day="2026-01-11")
    spec = DedupSpec("event_id", "event_ts", timedelta(days=7))
    return DedupLookup(None, spec, lambda t: str(root / t), "events",  # type: ignore[arg-type]
                       ["main", "side"])


def test_retained_events_of_the_batch_keys(lookup, tmp_path):
    # the first append (01-01) ends before 01-04 - 1 s by its statistics: never read
    from deltalake import DeltaTable

    first = DeltaTable(str(tmp_path / "main"), version=0).file_uris()
    assert len(first) == 1
    Path(first[0]).unlink()
    prior = lookup.prior(BatchPlan(1, 0, 1, {}), {"main": 2, "side": 0})
    assert prior is not None and prior.found
    # watermark 01-11; retained from 01-04: ids 3..7; the batch's keys among them
    assert prior.watermark == _day(11)
    assert prior.retained == 5
    rows = {r[KEY]: r[TIMES] for r in prior.rows.to_pylist()}
    assert rows == {3: [_day(6)], 4: [_day(6)], 5: [_day(11)], 7: [_day(9)]}
    assert prior.summary() == {"watermark": _day(11).isoformat(),
                               "horizon": _day(4).isoformat(), "retained": 5,
                               "keys_found": 4}  # horizon: the watermark - 7 days


def test_as_of_the_recorded_versions(lookup):
    """Versions before the newest (a later append is not seen): the watermark is 01-06."""
    prior = lookup.prior(BatchPlan(1, 0, 1, {}), {"main": 1})
    assert prior is not None and prior.watermark == _day(6)
    assert {r[KEY] for r in prior.rows.to_pylist()} == {1, 3, 4}
    assert lookup.prior(BatchPlan(1, 0, 1, {}), {"main": -1}) is None  # no table yet


def test_no_shared_key_needs_no_join(lookup, tmp_path):
    _append(str(tmp_path / "events"), [100, 101], [12, 12], ingest_day="2026-01-12")
    prior = lookup.prior(BatchPlan(2, 1, 2, {}), {"main": 2, "side": 0})
    assert prior is not None and not prior.found and prior.summary()["keys_found"] == 0


def test_finish_rejected_names_the_reason_and_counts():
    spec = DedupSpec("event_id", "event_ts")
    assert spec.reason_text == "duplicate_event_id" and spec.retention == timedelta(days=7)
    lk = DedupLookup(None, spec, str, "events", ["main"])  # type: ignore[arg-type]
    rows = pa.table({"reason": ["nan_amount", EARLIER_BATCH, None, EARLIER_BATCH]})
    fixed, n = lk.finish_rejected(rows)
    assert n == 2
    assert fixed.column("reason").to_pylist() == [
        "nan_amount", "duplicate_event_id", None, "duplicate_event_id"]


def test_retention_setting():
    assert get_settings({}).dedup_retention == timedelta(days=7)
    env = {"LAKECAST_DEDUP_RETENTION": "36h"}
    assert get_settings(env).dedup_retention == timedelta(hours=36)
    assert parse_duration("90m") == timedelta(minutes=90)
    assert parse_duration("3600") == timedelta(hours=1)
    with pytest.raises(ConfigError, match="7d, 36h"):
        parse_duration("a week")


def test_a_compaction_after_the_recorded_version_is_read_instead(lookup, tmp_path):
    """OPTIMIZE after the commit rewrites the same rows (dataChange false): the lookup reads
    the compacted files (a VACUUM may have removed the old ones); a data-changing commit
    after the recorded version (a redone batch's own write) is never read."""
    from deltalake import DeltaTable

    main = str(tmp_path / "main")
    DeltaTable(main).optimize.compact()  # v3: the three files as one
    for f in DeltaTable(main, version=2).file_uris():
        Path(f).unlink()  # vacuumed
    _append(main, [3], [11])  # v4: a partial write of the batch being redone
    prior = lookup.prior(BatchPlan(1, 0, 1, {}), {"main": 2, "side": 0})
    assert prior is not None and prior.watermark == _day(11)
    rows = {r[KEY]: r[TIMES] for r in prior.rows.to_pylist()}
    assert rows == {3: [_day(6)], 4: [_day(6)], 5: [_day(11)], 7: [_day(9)]}
