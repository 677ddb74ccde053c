"""The worker-cache id of a function: stable across processes, never shared by another
lake, other code, or a table deleted and created again (no Spark: Delta logs written by
hand)."""

from __future__ import annotations

import json
import shutil

from lakecast.api.functions import BroadcastProcessFunction
from lakecast.runtime.broadcast import function_identity


class _A(BroadcastProcessFunction):
    def process_element(self, value, ctx):
        yield value


class _B(BroadcastProcessFunction):
    def process_element(self, value, ctx):
        yield {"other": value}


def _create(path, ts: int) -> None:
    """A valid empty Delta table whose first commit says it was made at ``ts`` (ms)."""
    log = path / "_delta_log"
    log.mkdir(parents=True)
    schema = {"type": "struct", "fields": [
        {"name": "k", "type": "long", "nullable": True, "metadata": {}}]}
    actions = [
        {"commitInfo": {"timestamp": ts, "operation": "CREATE TABLE"}},
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {"metaData": {"id": f"table-{ts}", "format": {"provider": "parquet", "options": {}},
                      "schemaString": json.dumps(schema), "partitionColumns": [],
                      "configuration": {}, "createdTime": ts}},
    ]
    (log / f"{0:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))


def test_identity_is_stable_and_names_code_tables_and_their_incarnation(tmp_path):
    t = tmp_path / "lake" / "dim"
    _create(t, 1_000)
    tables = {"dim": str(t)}
    first = function_identity(_A(), tables)
    assert function_identity(_A(), tables) == first  # another process computes the same
    assert function_identity(_B(), tables) != first  # other code
    assert function_identity(_A(), {"dim": str(tmp_path / "other" / "dim")}) != first
    shutil.rmtree(t)
    _create(t, 2_000)  # deleted and created again: versions restart from 0
    assert function_identity(_A(), tables) != first
    shutil.rmtree(t)
    assert function_identity(_A(), tables) not in (first,)  # no table yet
