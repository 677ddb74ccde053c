"""Checkpoints are data, never code: typed round trips, refused payloads (a crafted pickle
that would create a file), and no ``pickle.loads`` anywhere in the engine."""

from __future__ import annotations

import ast
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


#: modules whose loaders run code from bytes, and the names that load
UNPICKLERS = {"pickle": {"load", "loads", "Unpickler"}, "_pickle": {"load", "loads", "Unpickler"},
              "cloudpickle": {"load", "loads"}, "dill": {"load", "loads"},
              "joblib": {"load"}, "shelve": {"open"}, "marshal": {"load", "loads"},
              "pandas": {"read_pickle"}}


def unpickling_calls(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` of every way ``source`` can unpickle: a call of a loader of
    :data:`UNPICKLERS` (through its module, an alias, or a from-import), any
    ``read_pickle`` call, and ``allow_pickle=True`` (numpy)."""
    tree = ast.parse(source)
    modules: dict[str, str] = {}  # local name -> module
    loaders: set[str] = set()  # local names bound to a loader
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                modules[a.asname or a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            root = node.module.split(".")[0]
            for a in node.names:
                if a.name in UNPICKLERS.get(root, ()):
                    loaders.add(a.asname or a.name)
                if a.name in UNPICKLERS:  # from x import pickle
                    modules[a.asname or a.name] = a.name
    hits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = (f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name)
                else "")
        base = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
            else _imported(f.value) if isinstance(f, ast.Attribute) else None
        if (name in loaders and isinstance(f, ast.Name)) or name == "read_pickle" or (
                base is not None and name in UNPICKLERS.get(modules.get(base, base), ())):
            hits.append((node.lineno, ast.unparse(f)))
        hits += [(node.lineno, "allow_pickle=True") for k in node.keywords
                 if k.arg == "allow_pickle" and not (isinstance(k.value, ast.Constant)
                                                     and k.value.value is False)]
    return hits


def _imported(node: ast.expr) -> str | None:
    """``m`` of ``__import__("m")`` / ``importlib.import_module("m")`` (else ``None``)."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return None
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return str(node.args[0].value) if name in ("__import__", "import_module") else None


def test_the_scan_finds_every_way_to_unpickle():
    source = """
import pickle, cloudpickle as cp
import pandas as pd, numpy as np
from pickle import loads
from pickle import load as ld
from lakecast import helpers
pickle.load(f); pickle.loads(b); cp.loads(b); loads(b); ld(f); pd.read_pickle(p)
np.load(p, allow_pickle=True); pickle.Unpickler(f).load(); helpers.read_pickle(p)
__import__("pickle").loads(b); importlib.import_module("dill").load(f)
np.load(p); json.loads(s); helpers.load(p)
"""
    found = sorted(what for _, what in unpickling_calls(source))
    assert found == sorted(["pickle.load", "pickle.loads", "cp.loads", "loads", "ld",
                            "pd.read_pickle", "allow_pickle=True",
                            "pickle.Unpickler", "helpers.read_pickle",
                            "__import__('pickle').loads",
                            "importlib.import_module('dill').load"])


def test_the_engine_never_unpickles():
    hits = [f"{p.relative_to(ROOT)}:{line} {what}" for p in (ROOT / "platform").rglob("*.py")
            for line, what in unpickling_calls(p.read_text())]
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


def test_a_content_hash_read_from_the_lake_never_becomes_sql_text(spark, lake):
    """A hash (or state name) with SQL in it filters as a literal: no row matches, where a
    pasted filter (``... AND content_hash = 'x' OR '1'='1'``) would return every entry."""
    path = lake.table_path("rules")
    _rules(spark, path, [(1, 0.1), (2, 0.2)])
    store = SnapshotStore(spark, snapshot_path(lake, "literal"), "literal")
    rt = SnapshottingRuntime(spark, RulesWithHistory(), {"rules": path}, store,
                             parallelism=1, function_id=f"literal-{uuid.uuid4().hex[:6]}")
    rt.process(_events(spark, 1)).main.count()
    rt.checkpoint(0, batch_id=0, events_start=-1, events_end=0)
    (m,) = [m for m in store.manifest(0) if m.state == "rules"]
    stored = store.entries(0, "rules").num_rows
    assert stored > 0 and store.entries(0, "rules", m.content_hash).num_rows == stored
    assert store.entries(0, "rules", "x' OR '1'='1").num_rows == 0
    assert store.entries(0, "x' OR '1'='1", None).num_rows == 0
