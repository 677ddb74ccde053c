"""Forged checkpoint metadata (issue 43 item 1): a checkpoint whose header, manifest or an
Arrow schema in them was rewritten is refused like one with damaged files — skipped for
the previous complete checkpoint with one line naming checkpoint, part and reason, and
counted in what the runtime reports for the run's metadata. Forges each part."""

from __future__ import annotations

import base64
import json
import re
import uuid

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from lakecast.snapshots.checkpointer import snapshot_path
from lakecast.snapshots.errors import RefusedCheckpointError
from lakecast.snapshots.records import parse_header, parse_manifest_row
from lakecast.snapshots.runtime import SnapshottingRuntime
from lakecast.snapshots.store import SnapshotStore
from lakecast.snapshots.table import HEADER, MANIFEST
from tests.lakecast.test_snapshots import RulesWithHistory, _events, _rules

#: bytes that are no Arrow schema: the IPC reader takes the first 4 bytes as a length
#: (the issue's "Expected to read 1452606592 metadata bytes, but only read 93")
NOT_A_SCHEMA = base64.b64encode(b"\xff\xff\xff\xff" + b"\x80\x00\x94V" + b"\x00" * 89).decode()


def _set_meta(spark, store: SnapshotStore, where: str, meta: str) -> None:
    DeltaTable.forPath(spark, store.path).update(where, {"meta": F.lit(meta)})


def _header_meta(spark, store: SnapshotStore, cid: int) -> dict:
    (row,) = (spark.read.format("delta").load(store.path)
              .where(f"checkpoint_id = {cid} AND kind = '{HEADER}'").select("meta").collect())
    return json.loads(row[0])


def test_forged_header_manifest_and_schemas_are_refused_and_skipped(spark, lake):
    path = lake.table_path("rules")
    _rules(spark, path, [(1, 0.1), (2, 0.2), (3, 0.3)])
    store = SnapshotStore(spark, snapshot_path(lake, "forged-meta"), "forged-meta")
    rt = SnapshottingRuntime(spark, RulesWithHistory(), {"rules": path}, store,
                             parallelism=2, function_id=f"fm-{uuid.uuid4().hex[:6]}")
    rt.process(_events(spark, 2)).main.count()
    for cid in range(6):
        rt.checkpoint(cid, batch_id=cid, events_start=cid - 1, events_end=cid)

    # 5: a header with a key Lakecast never writes (the TypeError)
    head = _header_meta(spark, store, 5)
    _set_meta(spark, store, f"checkpoint_id = 5 AND kind = '{HEADER}'",
              json.dumps({**head, "payload": "x"}))
    # 4: the Arrow schema of a table state replaced by other bytes (the ArrowInvalid)
    (m4,) = [m for m in store.manifest(4) if m.task == 0 and m.state == "rules"]
    _set_meta(spark, store, f"checkpoint_id = 4 AND kind = '{MANIFEST}' AND task = 0 "
                            "AND state = 'rules'", json.dumps({**m4.meta, "schema": NOT_A_SCHEMA}))
    # 3: a broadcast table's schema in the header replaced by other bytes
    head = _header_meta(spark, store, 3)
    _set_meta(spark, store, f"checkpoint_id = 3 AND kind = '{HEADER}'",
              json.dumps({**head, "table_schemas": {"rules": NOT_A_SCHEMA}}))
    # 2: a manifest row with an extra field
    (m2,) = [m for m in store.manifest(2) if m.task == 1 and m.state == "history"]
    _set_meta(spark, store, f"checkpoint_id = 2 AND kind = '{MANIFEST}' AND task = 1 "
                            "AND state = 'history'", json.dumps({**m2.meta, "payload": 1}))
    # 1: a header that is not JSON at all
    _set_meta(spark, store, f"checkpoint_id = 1 AND kind = '{HEADER}'", "{not json")

    got = store.resolve(parallelism=2)
    assert got is not None and got.header.checkpoint_id == 0
    tail = "; skipped for the previous complete checkpoint"
    assert got.skipped == [
        "checkpoint 5 refused: its header carries field(s) ['payload'] that Lakecast never "
        "writes" + tail,
        "checkpoint 4 refused: its schema of state 'rules' (task 0) is not an Arrow schema ("
        + got.skipped[1].split("is not an Arrow schema (", 1)[1],
        "checkpoint 3 refused: its schema of table 'rules' in the header is not an Arrow "
        "schema (" + got.skipped[2].split("is not an Arrow schema (", 1)[1],
        "checkpoint 2 refused: its manifest row of task 1 state 'history' carries field(s) "
        "['payload'] that Lakecast never writes" + tail,
        "checkpoint 1 refused: its header is not JSON (" + got.skipped[4].split("JSON (", 1)[1],
    ]
    assert all(s.endswith(tail) and "\n" not in s for s in got.skipped)
    assert store.refusals == [5, 4, 3, 2, 1]

    # a cold runtime restores checkpoint 0, computes the same outputs and reports the
    # refusals (its before_commit report becomes the batch's metadata)
    cold = SnapshottingRuntime(spark, RulesWithHistory(), {"rules": path}, store,
                               parallelism=2, function_id=f"fm-{uuid.uuid4().hex[:6]}")
    rows = cold.process(_events(spark, 2)).main.collect()
    assert sorted((r["event_id"], r["threshold"], r["seen"]) for r in rows) == [
        (i, {1: 0.1, 2: 0.2, 3: 0.3}[1 + i % 3], "0") for i in range(12)]
    report = cold.before_commit(None, None)  # no checkpointer: only the restore report
    assert report["restored_from_checkpoint"] == 0
    assert report["skipped_checkpoints"] == report["refused_checkpoints"] == 5

    # every checkpoint refused: the state is rebuilt from the broadcast table
    head = _header_meta(spark, store, 0)
    _set_meta(spark, store, f"checkpoint_id = 0 AND kind = '{HEADER}'",
              json.dumps({**head, "parallelism": "2"}))
    rebuilt = SnapshottingRuntime(spark, RulesWithHistory(), {"rules": path}, store,
                                  parallelism=2, function_id=f"fm-{uuid.uuid4().hex[:6]}")
    rows = rebuilt.process(_events(spark, 2)).main.collect()
    assert rebuilt.restored is None and len(rebuilt.restore_skipped) == 6
    assert rebuilt.restore_skipped[-1].startswith(
        "checkpoint 0 refused: its header field(s) ['parallelism'] do not have the types")
    assert sorted((r["event_id"], r["threshold"]) for r in rows) == [
        (i, {1: 0.1, 2: 0.2, 3: 0.3}[1 + i % 3]) for i in range(12)]


@pytest.mark.parametrize(("meta", "reason"), [
    ('["a list"]', "header is a JSON list, not an object"),
    ('{"pipeline": "p"}', "header lacks field(s) ['batch_id', "),
    (None, "header is empty"),
])
def test_header_parsing_refuses_what_lakecast_never_writes(meta, reason):
    with pytest.raises(RefusedCheckpointError, match="^" + re.escape(
            f"checkpoint 9 refused: its {reason}")):
        parse_header(9, meta, 1)


def test_manifest_parsing_refuses_wrong_types():
    with pytest.raises(RefusedCheckpointError,
                       match=r"checkpoint 3 refused: its manifest row of task 0 state 's': "
                             r"field\(s\) \['rows'\] do not have the types"):
        parse_manifest_row(3, 0, "s", "h", 1, json.dumps({"rows": "1"}))
    with pytest.raises(RefusedCheckpointError, match="has a missing or negative column"):
        parse_manifest_row(3, -1, "s", "h", 1, "{}")
    ok = parse_manifest_row(3, 0, "s", "h", 2, json.dumps({"rows": 1, "schema": None}))
    assert (ok.task, ok.stored_rows, ok.n_entries) == (0, 1, 2)
