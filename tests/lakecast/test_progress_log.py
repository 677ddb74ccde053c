"""The progress log without Spark: delta-rs appends, exactly once, incremental reads."""

from __future__ import annotations

import shutil
from pathlib import Path

from lakecast.pipeline.progress import (
    BatchCommit,
    BatchPlan,
    ProgressLog,
    read_log,
    read_position,
)


def _plan(batch_id: int, end: int) -> BatchPlan:
    return BatchPlan(batch_id, end - 1, end, {"dims": batch_id}, planned_at_ms=1000 + batch_id)


def test_appends_are_exactly_once_and_reads_are_incremental(tmp_path: Path) -> None:
    path = str(tmp_path / "progress")
    log = ProgressLog(None, path, "p")  # no Spark session: nothing here needs one
    log.write_plan(_plan(0, 1))
    log.write_plan(_plan(0, 1))  # a retried plan row: skipped by its txn
    log.write_commit(BatchCommit(0, {"events_in": 5}, committed_at_ms=2000))
    plans, commits = log.state()
    assert [p.batch_id for p in plans] == [0] and commits[0].counts == {"events_in": 5}

    # the rows read before are kept: deleting the data files read so far does not break
    # the next read of the same log object, which reads only the new commits' files
    read = {f: f.read_bytes() for f in (tmp_path / "progress").glob("*.parquet")}
    log.write_plan(_plan(1, 2))
    log.write_commit(BatchCommit(1, {"events_in": 7}, committed_at_ms=3000))
    for f in read:
        f.unlink()
    plans, commits = log.state()
    assert [(p.batch_id, p.events_end) for p in plans] == [(0, 1), (1, 2)]
    assert {b: c.counts["events_in"] for b, c in commits.items()} == {0: 5, 1: 7}
    for f, data in read.items():
        f.write_bytes(data)
    assert read_log(path) == log.state()  # a full read (another process) agrees
    # what was read is kept parsed: a read after another commit parses only its rows
    first = log.state()[0][0]
    log.write_plan(_plan(2, 3))
    plans, _ = log.state()
    assert plans[0] is first and [p.batch_id for p in plans] == [0, 1, 2]

    # a log deleted and recreated is read again whole, not mixed with the rows kept
    # (with more versions than the one read, so version numbers alone cannot tell)
    shutil.rmtree(tmp_path / "progress")
    other = ProgressLog(None, path, "p")
    for b in range(5):
        other.write_plan(_plan(b, 10 + b))
    plans, commits = log.state()
    assert [p.events_end for p in plans] == [10, 11, 12, 13, 14] and not commits


def test_read_log_keeps_what_it_read(tmp_path: Path) -> None:
    """A sensor's or a check's reads (read_log, no Spark) read only the commits since the
    last read of the same log in the process, as the pipeline's own log does."""
    path = str(tmp_path / "progress")
    log = ProgressLog(None, path, "p")  # type: ignore[arg-type]
    assert read_log(path) == ([], {})
    log.write_plan(_plan(0, 1))
    log.write_commit(BatchCommit(0, {"events_in": 5}, committed_at_ms=2000))
    assert read_log(path) == log.state()
    for f in (tmp_path / "progress").glob("*.parquet"):  # read already: not read again
        f.unlink()
    log.write_plan(_plan(1, 2))
    plans, commits = read_log(path)
    assert [p.batch_id for p in plans] == [0, 1] and list(commits) == [0]
    assert read_position(path)[0] == plans[1]  # batch 1 planned, not committed


def test_a_log_written_with_the_old_count_key_reads_in_todays_names(tmp_path: Path) -> None:
    """Logs written before the main output's count was named ``output`` say ``enriched``:
    they are read as ``output``; today's logs are written with ``output``."""
    path = str(tmp_path / "progress")
    log = ProgressLog(None, path, "p")
    log.write_plan(_plan(0, 1))
    log.write_commit(BatchCommit(0, {"events_in": 5, "enriched": 4, "unmatched": 1},
                                 committed_at_ms=2000))  # as an older Lakecast wrote it
    log.write_plan(_plan(1, 2))
    log.write_commit(BatchCommit(1, {"events_in": 3, "output": 3}, committed_at_ms=3000))
    for _, commits in (log.state(), read_log(path)):
        assert commits[0].counts == {"events_in": 5, "output": 4, "unmatched": 1}
        assert commits[1].counts == {"events_in": 3, "output": 3}
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    rows = DeltaTable(path).to_pyarrow_table()
    commits_rows = rows.filter(pc.equal(rows["kind"], "commit")).to_pylist()
    stored = {r["batch_id"]: r["counts"] for r in commits_rows}
    assert '"enriched": 4' in stored[0] and '"output": 3' in stored[1]  # stored as written
