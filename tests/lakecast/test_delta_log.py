"""The Delta log read through ``deltalake`` (no Spark): versions, commit info, ``txn``
versions, change data and a version's files, on local and ``s3a://`` tables."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import (
    CommitProperties,
    DeltaTable,
    PostCommitHookProperties,
    Transaction,
    write_deltalake,
)

from lakecast.delta import io as delta_io
from lakecast.delta import log
from tests.moto_s3 import moto_server

NO_CHECKPOINT = PostCommitHookProperties(create_checkpoint=False)


def _rows(*ids: int, name: str = "x") -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [name] * len(ids)})


def _commit(path: str, data: pa.Table, txn: tuple[str, int] | None = None,
            meta: str | None = None, **kw) -> None:
    props = CommitProperties(
        app_transactions=[Transaction(*txn)] if txn else None,
        custom_metadata={"userMetadata": meta} if meta else None)
    write_deltalake(path, data, mode="append", commit_properties=props,
                    post_commithook_properties=NO_CHECKPOINT, **kw)


def _log_file(path: str, version: int) -> Path:
    return Path(path) / "_delta_log" / f"{version:020d}.json"


def test_a_poll_reads_no_commit_a_checkpoint_covers(tmp_path):
    """Versions and recent commit infos come from the checkpoint and the newest commits:
    commit files the checkpoint covers can be garbled or gone (cold or warm handle)."""
    path = str(tmp_path / "t")
    write_deltalake(path, _rows(0), post_commithook_properties=NO_CHECKPOINT)
    empty = _rows()
    for i in range(1, 130):
        _commit(path, _rows(i) if i % 10 == 0 else empty)
    DeltaTable(path).create_checkpoint()  # at version 129
    for v in range(130, 140):
        _commit(path, empty, txn={131: ("app", 1), 135: ("app", 2)}.get(v))
    assert delta_io.latest_version(path) == 139
    # commits the checkpoint covers: one rewritten (a txn that was never there), one gone
    _log_file(path, 5).write_text('{"txn": {"appId": "app", "version": 99}}\n')
    _log_file(path, 6).unlink()
    assert delta_io.latest_version(path) == 139  # warm handle
    log.forget(path)
    assert delta_io.latest_version(path) == 139  # cold: checkpoint + 130..139
    assert delta_io.txn_versions(path, "app") == {1: 131, 2: 135}  # no commit file scan
    held = log._HANDLES[path]
    _commit(path, _rows(999), meta="tag")
    assert delta_io.latest_version(path) == 140
    assert log._HANDLES[path] is held  # the same handle; the version came from probing
    assert held.table.version() == 139  # the commit file (no log listing): read lazily
    info = delta_io.commit_info(path, 140)  # a reader of the snapshot brings it up to date
    assert held.table.version() == 140
    assert (info.version, info.operation, info.user_metadata) == (140, "WRITE", "tag")
    assert info.metrics["num_added_rows"] == "1"
    assert delta_io.commit_info(path, 139).timestamp_ms <= info.timestamp_ms
    assert delta_io.row_count(path, 140) == 14  # 0, 10, ..., 120, 999
    with pytest.raises(delta_io.DeltaIOError):
        delta_io.commit_info(path, 141)
    assert delta_io.commit_seconds(path, -1) is None


def test_latest_version_probes_a_burst_of_commits_and_readers_see_them(tmp_path):
    """Several commits between two polls: the probe walks to the newest; a reader of the
    snapshot after that (row count, commit info) sees every one of them."""
    path = str(tmp_path / "t")
    write_deltalake(path, _rows(0), post_commithook_properties=NO_CHECKPOINT)
    assert delta_io.latest_version(path) == 0
    for i in range(1, 4):
        _commit(path, _rows(i), meta=f"m{i}")
    assert delta_io.latest_version(path) == 3
    assert log._HANDLES[path].table.version() == 0
    assert delta_io.commit_info(path, 2).user_metadata == "m2"
    assert delta_io.row_count(path, 3) == 4
    _commit(path, _rows(4))
    assert [delta_io.latest_version(path) for _ in range(2)] == [4, 4]
    assert delta_io.txn_versions(path, "nobody") == {}


def test_a_table_deleted_or_written_anew_at_the_same_path_is_seen(tmp_path):
    path = str(tmp_path / "t")
    assert delta_io.latest_version(path) is None
    write_deltalake(path, _rows(1))
    for i in range(3):
        _commit(path, _rows(i))
    assert delta_io.latest_version(path) == 3
    shutil.rmtree(path)
    assert delta_io.latest_version(path) is None and not delta_io.table_exists(path)
    write_deltalake(path, _rows(7))
    assert delta_io.latest_version(path) == 0
    shutil.rmtree(path)
    write_deltalake(path, _rows(8))
    for i in range(5):  # same versions as before, other files
        _commit(path, _rows(i))
    assert delta_io.latest_version(path) == 5
    assert delta_io.commit_info(path, 0).metrics["num_added_rows"] == "1"


def test_appends_keep_one_handle_and_see_what_other_writers_committed(tmp_path):
    path = str(tmp_path / "t")
    assert delta_io.append_arrow(_rows(1), path, txn=("app", 0)) == 0  # creates it
    assert delta_io.append_arrow(_rows(2), path, txn=("app", 1)) == 1
    with log.write_handle(path) as kept:
        assert kept is not None and kept.version() == 1
    # another writer (another process: a handle of its own) commits the app's next txn and
    # one more append: the kept handle is behind, yet the retry is skipped, not written twice
    _commit(path, _rows(3), txn=("app", 2))
    _commit(path, _rows(4))
    assert delta_io.append_arrow(_rows(3), path, txn=("app", 2)) is None
    assert delta_io.append_arrow(_rows(5), path, txn=("app", 3)) == 4
    with log.write_handle(path) as again:
        assert again is kept and again.version() == 4  # the same handle, at the write
    assert sorted(DeltaTable(path).to_pyarrow_table().column("id").to_pylist()) == [
        1, 2, 3, 4, 5]
    assert delta_io.latest_version(path) == 4 and delta_io.txn_versions(path, "app") == {
        0: 0, 1: 1, 2: 2, 3: 4}
    # the table deleted and created anew at the same path: a new handle, no stale state
    shutil.rmtree(path)
    assert delta_io.append_arrow(_rows(9), path, txn=("app", 0)) == 0
    assert DeltaTable(path).to_pyarrow_table().column("id").to_pylist() == [9]


def test_txn_versions_map_each_app_version_to_its_commit(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, _rows(0))  # v0
    plan = {1: ("a", 10), 2: None, 3: ("b", 0), 4: ("a", 11), 5: None, 6: None,
            7: ("a", 15), 8: ("b", 2)}
    for v, txn in plan.items():
        _commit(path, _rows(v), txn=txn)
    assert delta_io.txn_versions(path, "a") == {10: 1, 11: 4, 15: 7}
    assert delta_io.txn_versions(path, "b") == {0: 3, 2: 8}  # 0: a checkpoint id too
    assert delta_io.txn_versions(path, "c") == {}
    assert delta_io.txn_versions(str(tmp_path / "none"), "a") == {}


def test_changes_come_from_deltalake_in_sparks_types_or_not_at_all(tmp_path):
    path = str(tmp_path / "cdf")
    write_deltalake(path, _rows(1, 2, 3), configuration={log.CDF_PROPERTY: "true"})
    _commit(path, _rows(4))  # v1: insert
    DeltaTable(path).delete("id = 2")  # v2: delete
    DeltaTable(path).update(predicate="id = 3", updates={"name": "'y'"})  # v3
    got = delta_io.read_changes_from_log(path, 1, 3)
    assert got is not None and set(got) == {1, 2, 3}
    assert got[1].to_pylist() == [{"id": 4, "name": "x", "_change_type": "insert"}]
    assert got[2].to_pylist() == [{"id": 2, "name": "x", "_change_type": "delete"}]
    assert sorted((r["_change_type"], r["name"]) for r in got[3].to_pylist()) == [
        ("update_postimage", "y"), ("update_preimage", "x")]
    assert got[3].schema.field("name").type == pa.string()  # not deltalake's string_view

    plain = str(tmp_path / "plain")  # no Change Data Feed: appends only
    write_deltalake(plain, _rows(1, 2))
    _commit(plain, _rows(3))
    assert delta_io.read_changes_from_log(plain, 1, 1)[1].column("id").to_pylist() == [3]
    DeltaTable(plain).optimize.compact()  # v2: files rearranged, no change rows
    DeltaTable(plain).vacuum(retention_hours=0, enforce_retention_duration=False,
                             dry_run=False)  # v3, v4
    assert [len(t) for t in delta_io.read_changes_from_log(plain, 2, 4).values()] == [0, 0, 0]
    assert delta_io.read_changes_from_log(plain, 1, 1) is None  # its file was vacuumed
    DeltaTable(plain).delete("id = 1")  # a rewrite: only Spark's reader says what changed
    assert delta_io.read_changes_from_log(plain, 5, 5) is None
    DeltaTable(path).alter.set_table_properties({"delta.appendOnly": "false"})
    assert delta_io.read_changes_from_log(path, 3, 4) is None  # a property change


def test_table_files_come_from_deltalakes_snapshot(tmp_path):
    path = str(tmp_path / "p")
    data = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "k": pa.array([1, 1, 2], pa.int64()),
                     "name": ["a", "b", "c"]})
    write_deltalake(path, data, partition_by=["k"])
    DeltaTable(path).delete("id = 2")
    files = delta_io.table_files(path, 1)
    assert files.read().sort_by("id").to_pylist() == [
        {"id": 1, "k": 1, "name": "a"}, {"id": 3, "k": 2, "name": "c"}]
    assert files.read(["id"], where={"k": 2}).to_pylist() == [{"id": 3}]
    assert sorted(p["k"] for p in files.partitions) == ["1", "2"]
    assert sorted(s["numRecords"] for s in files.stats) == [1, 1]
    assert files.num_rows == 2 and all(Path(f).is_file() for f in files.files)
    assert delta_io.table_files(path, 0).read().num_rows == 3  # time travel
    assert sum(delta_io.file_sizes(path, 1).values()) == sum(
        Path(f).stat().st_size for f in files.files)



@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 with a bucket ``lake``."""
    with moto_server("lake") as url:
        yield url


def test_s3a_tables_are_read_with_deltalake_without_spark(s3_endpoint, monkeypatch):
    monkeypatch.setenv("LAKECAST_SPARK_CONF", "")
    for k, v in {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "k",
                 "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    uri, opts = log.location("s3a://lake/t1")
    assert uri == "s3://lake/t1" and opts is not None and opts["AWS_ALLOW_HTTP"] == "true"
    assert delta_io.latest_version("s3a://lake/t1") is None
    write_deltalake(uri, _rows(1), storage_options=opts,
                    configuration={log.CDF_PROPERTY: "true"})
    write_deltalake(uri, _rows(2), mode="append", storage_options=opts,
                    commit_properties=CommitProperties(app_transactions=[Transaction("a", 5)]))
    assert delta_io.latest_version("s3a://lake/t1") == 1
    write_deltalake(uri, _rows(3), mode="append", storage_options=opts)
    assert delta_io.latest_version("s3a://lake/t1") == 2  # the handle's incremental update
    assert delta_io.commit_info("s3a://lake/t1", 1).operation == "WRITE"
    assert delta_io.txn_versions("s3a://lake/t1", "a") == {5: 1}
    changes = delta_io.read_changes_from_log("s3a://lake/t1", 1, 2)
    assert {v: t.column("id").to_pylist() for v, t in changes.items()} == {1: [2], 2: [3]}
    assert delta_io.row_count("s3a://lake/t1", 2) == 3
    assert [a["add"]["path"] for a in delta_io.commit_actions("s3a://lake/t1", 2)
            if "add" in a]
    with pytest.raises(delta_io.DirectReadUnsupported, match="local files only"):
        delta_io.table_files("s3a://lake/t1", 2)
