"""Sharded broadcast state (``Lookup(shards=N)``): each task keeps only its shard.

Without Spark: the hash against Spark's own known values, and a sharded enrichment in the
test harness over versions that update, delete and add keys, equal to a pandas model.
With Spark (marked by the fixtures they use): the hash and the routing equal to Spark's
``hash`` and ``repartition``, and a sharded enrichment over Delta versions whose tasks each
hold one shard (state bytes per task near the table's over the tasks).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from lakecast.api import BroadcastElement
from lakecast.api.enrich import Lookup, enrich
from lakecast.runtime.harness import BroadcastTestHarness
from lakecast.runtime.sharded_state import ShardedTableState
from lakecast.runtime.shards import _hash_long, shard_of, spark_hash


def test_the_hash_is_spark_murmur3_on_its_known_values():
    # Spark's Murmur3_x86_32Suite (seed 0): hashLong of these values
    known = {0: 1669671676, -42: -846261623, 42: 1871679806,
             -(2**63): 1366273829, 2**63 - 1: -2106506049}
    got = _hash_long(np.array(list(known), dtype=np.int64),
                     np.zeros(len(known), dtype=np.uint32)).view(np.int32)
    assert got.tolist() == list(known.values())
    # integer widths hash alike (routed as bigint); a null column leaves the seed (42)
    assert spark_hash([pa.array([7], pa.int8())]) == spark_hash([pa.array([7], pa.int64())])
    assert spark_hash([pa.array([None], pa.int64())]).tolist() == [42]


def _dimension(n: int, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"k": np.arange(n, dtype=np.int64) * 7 - 50,
                         "name": [f"n{i}-é" * (i % 3 + 1) for i in range(n)],
                         "score": rng.integers(0, 1000, n).astype(np.int64)})


def _versions() -> list[tuple[str, pd.DataFrame]]:
    """A dimension's versions as changes: updates, deletes, adds, a key deleted and
    added back."""
    return [
        ("update_postimage", pd.DataFrame({"k": [-50, 20, 650], "name": ["a", "b", "c"],
                                            "score": [1, 2, 3]})),
        ("delete", pd.DataFrame({"k": [-43, 650, 13], "name": [None] * 3,
                                 "score": [None] * 3})),
        ("insert", pd.DataFrame({"k": [100_000, 100_007], "name": ["x", "y"],
                                 "score": [5, 6]})),
        ("insert", pd.DataFrame({"k": [650], "name": ["back"], "score": [9]})),
    ]


def _model(dim: pd.DataFrame, upto: int) -> dict[int, tuple[str, int]]:
    state = {int(r.k): (r.name, int(r.score)) for r in dim.itertuples()}
    for kind, rows in _versions()[:upto]:
        for r in rows.itertuples():
            if kind == "delete":
                state.pop(int(r.k), None)
            else:
                state[int(r.k)] = (r.name, int(r.score))
    return state


def test_a_sharded_enrichment_equals_a_pandas_model_over_versions(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    dim = _dimension(400)
    fn = enrich(Lookup("dim", key="k", shards=4, defaults={"score": -1}))
    schema = pa.Schema.from_pandas(dim, preserve_index=False)
    h = BroadcastTestHarness(fn, tables=["dim"], table_schemas={"dim": schema})
    h.process_broadcast_element(BroadcastElement.of("dim", 0, pa.Table.from_pandas(
        dim, schema=schema, preserve_index=False)))
    probe = np.concatenate([dim.k.to_numpy(), [100_000, 100_007, 650, 3, 999_999]])
    for upto in range(len(_versions()) + 1):
        if upto:
            kind, rows = _versions()[upto - 1]
            h.process_broadcast_element(BroadcastElement.of(
                "dim", upto, pa.Table.from_pandas(rows, schema=schema, preserve_index=False),
                kind="changes", change_type=kind))
        out = h.process_elements([{"k": int(k)} for k in probe])
        model = _model(dim, upto)
        want = [{"k": int(k), "name": model.get(int(k), (None, -1))[0],
                 "score": model.get(int(k), (None, -1))[1]} for k in probe]
        assert out == want, f"after version {upto}"
    state = h.executor.store.states["dim"]
    assert isinstance(state, ShardedTableState)
    whole = state.to_arrow().to_pandas().sort_values("k").reset_index(drop=True)
    model = _model(dim, len(_versions()))
    assert dict(zip(whole.k, zip(whole.name, whole.score, strict=True), strict=True)) == model


def test_a_task_reads_only_the_shards_of_its_keys(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    dim = _dimension(4000)
    fn = enrich(Lookup("dim", key="k", shards=8))
    h = BroadcastTestHarness(fn, tables=["dim"])
    h.process_broadcast_element(BroadcastElement.of("dim", 0, pa.Table.from_pandas(
        dim, preserve_index=False)))
    keys = dim.k.to_numpy()
    mine = keys[shard_of([pa.array(keys)], 8) == 3]
    state = h.executor.store.states["dim"]
    h.executor.store.begin_task()
    out = h.process_elements([{"k": int(k)} for k in mine])
    assert len(out) == len(mine) and all(r["name"] is not None for r in out)
    assert h.executor.store.shards_read() == [3]
    whole = pa.Table.from_pandas(dim, preserve_index=False).nbytes
    assert state.nbytes() < 1.5 * whole / 8  # this task's share: one shard of eight


def test_shards_are_declared_on_a_key():
    with pytest.raises(ValueError, match="shards must be a whole number"):
        Lookup("dim", key="k", shards=0)
    with pytest.raises(ValueError, match="share their event key columns"):
        enrich(Lookup("a", key="k", shards=2), Lookup("b", key="j", shards=2))
