"""Checkpoints are data, never code: typed round trips, refused payloads (a crafted pickle
that would create a file), and no ``pickle.loads`` anywhere in the engine."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import pickle
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from lakecast.api.state import DictMapState
from lakecast.api.table_state import TableMapState
from lakecast.snapshots.checkpointer import snapshot_path
from lakecast.snapshots.codec import (
    content_digest,
    decode_content,
    load_into,
    schema_from_b64,
    schema_text,
    serialize_state,
)
from lakecast.snapshots.errors import SnapshotError, UnreadableCheckpointError
from lakecast.snapshots.runtime import SnapshottingRuntime
from lakecast.snapshots.store import SnapshotStore
from tests.lakecast.test_snapshots import HISTORY, RULES, RulesWithHistory, _events, _rules

ROOT = Path(__file__).resolve().parents[2]


class _OpensAFile:
    """Unpickling this creates (truncates) ``path``: what an attacker would plant."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@dataclasses.dataclass(frozen=True)
class Rule:
    name: str
    limit: float


def test_dict_states_round_trip_as_typed_json():
    s = DictMapState(HISTORY)
    value = {"f": 1.5, "i": 2, "b": True, "n": None, "s": "x", "bytes": b"\x00\xff",
             "when": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC), "day": dt.date(2026, 1, 2),
             "dec": decimal.Decimal("1.10"), "set": {3, 1}, "tuple": (1, "a"), "list": [1, [2]],
             "nested": {"z": {"y": [1.0]}}, "nan_free": -0.0}
    s.put("v", value)
    s.put((1, "k"), Rule("r", 2.5))  # tuple key; a dataclass is stored as its fields
    ser = serialize_state("history", s)
    assert ser.n_entries == 2 and all(v.startswith(b'{"t":[') for v in ser.values)
    back = DictMapState(HISTORY)
    load_into(back, "dict", decode_content(0, "history", "dict", ser.values, None))
    got = back.get("v")
    assert got == {**value, "set": frozenset({1, 3})} and isinstance(got["tuple"], tuple)
    assert isinstance(got["dec"], decimal.Decimal) and got["when"].tzinfo is not None
    assert back.get((1, "k")) == {"name": "r", "limit": 2.5}
    assert serialize_state("history", back).digest == ser.digest  # equal state, equal hash

    bad = DictMapState(HISTORY)
    bad.put("obj", object())
    with pytest.raises(SnapshotError, match=r"state 'history', key \"obj\": a builtins.object "
                                            r"value cannot be checkpointed"):
        serialize_state("history", bad)


def test_crafted_pickle_payloads_are_refused_and_never_run(tmp_path):
    target = tmp_path / "pwned"
    payload = pickle.dumps(_OpensAFile(str(target)), protocol=5)
    with pytest.raises(UnreadableCheckpointError,
                       match="checkpoint 7 is unreadable: state 'history' entry seq 0 is not "
                             "typed JSON data"):
        decode_content(7, "history", "dict", [payload], None)
    t = TableMapState(RULES)
    t.put_table(pa.table({"rule_id": [1], "threshold": [0.5]}), replace=True)
    ser = serialize_state("rules", t)
    with pytest.raises(UnreadableCheckpointError,
                       match="state 'rules' entry seq 0: not an Arrow IPC stream"):
        decode_content(7, "rules", "table", [payload], ser.schema_b64)
    assert not target.exists()


def test_the_engine_never_unpickles():
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "platform").rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if "pickle.loads" in line]
    assert hits == []


def _forge(spark, store: SnapshotStore, cid: int, state: str, payload: bytes) -> None:
    """Replace entry 0 of ``state`` in checkpoint ``cid`` with ``payload`` AND re-hash it,
    as an attacker who can write the checkpoint root would (the hash cannot protect)."""
    from delta.tables import DeltaTable

    (m,) = [m for m in store.manifest(cid) if m.state == state and m.task == 0]
    t = store.entries(cid, state, m.content_hash)
    keys, values = t.column("key").to_pylist(), t.column("value").to_pylist()
    values[0] = payload
    kind = store.header(cid).states[state]["kind"]
    text = schema_text(schema_from_b64(m.meta["schema"])) if kind == "table" else ""
    forged = content_digest(kind, text, keys, values)
    table = DeltaTable.forPath(spark, store.path)
    where = f"checkpoint_id = {cid} AND state = '{state}'"
    table.update(f"{where} AND kind = 'entry' AND seq = 0", {"value": F.lit(bytearray(payload))})
    table.update(where, {"content_hash": F.lit(forged)})


def test_a_forged_checkpoint_is_refused_the_restore_falls_back_and_runs_no_code(
        spark, lake, tmp_path):
    path = lake.table_path("rules")
    _rules(spark, path, [(1, 0.1), (2, 0.2), (3, 0.3)])
    store = SnapshotStore(spark, snapshot_path(lake, "forged"), "forged")
    rt = SnapshottingRuntime(spark, RulesWithHistory(), {"rules": path}, store,
                             parallelism=2, function_id=f"forged-{uuid.uuid4().hex[:6]}")
    rt.process(_events(spark, 2)).main.count()
    for cid in (0, 1, 2):
        rt.checkpoint(cid, batch_id=cid, events_start=cid - 1, events_end=cid)
    target = tmp_path / "pwned"
    payload = pickle.dumps(_OpensAFile(str(target)), protocol=5)
    _forge(spark, store, 2, "history", payload)  # a dict state
    _forge(spark, store, 1, "rules", payload)  # a table state

    got = store.resolve(parallelism=2)
    assert got is not None and got.header.checkpoint_id == 0
    assert len(got.skipped) == 2
    assert got.skipped[0].startswith("checkpoint 2 is unreadable: state 'history' entry seq 0 "
                                     "is not typed JSON data")
    assert got.skipped[1].startswith("checkpoint 1 is unreadable: state 'rules' entry seq 0: "
                                     "not an Arrow IPC stream")
    assert not target.exists()

    # a cold runtime restores checkpoint 0 and computes the same outputs
    cold = SnapshottingRuntime(spark, RulesWithHistory(), {"rules": path}, store,
                               parallelism=2, function_id=f"forged-{uuid.uuid4().hex[:6]}")
    rows = cold.process(_events(spark, 2)).main.collect()
    assert cold.restored.header.checkpoint_id == 0 and len(cold.restore_skipped) == 2
    assert sorted((r["event_id"], r["threshold"], r["seen"]) for r in rows) == [
        (i, {1: 0.1, 2: 0.2, 3: 0.3}[1 + i % 3], "0") for i in range(12)]
    assert not target.exists()
