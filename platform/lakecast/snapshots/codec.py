"""Canonical serialization of broadcast state (what a checkpoint stores and hashes).

Serialization is canonical, so equal states hash equally on every task: table-shaped
states are sorted by their key columns and each row is a pickled tuple (the Arrow
schema is kept in the manifest); dict states are sorted by key, with dicts/sets put in
a canonical order. ``key`` is JSON for people (``lakecast snapshots show``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import pickle
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lakecast.api.frozen import thaw
from lakecast.api.state import BroadcastState
from lakecast.api.table_state import TableMapState

PICKLE_PROTOCOL = 5

# ============================================================================ canonical form
def encode_value(value: Any) -> Any:
    """A canonical, picklable form: mappings and sets sorted, containers tagged."""
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    if isinstance(value, Mapping):
        items = [(encode_value(k), encode_value(v)) for k, v in value.items()]
        return ("__d", tuple(sorted(items, key=lambda kv: repr(kv[0]))))
    if isinstance(value, set | frozenset):
        return ("__s", tuple(sorted((encode_value(v) for v in value), key=repr)))
    if isinstance(value, tuple) and not hasattr(value, "append"):
        return ("__t", tuple(encode_value(v) for v in value))
    if isinstance(value, list | tuple):  # lists and FrozenLists
        return ("__l", tuple(encode_value(v) for v in value))
    return ("__o", value)


def decode_value(value: Any) -> Any:
    if not isinstance(value, tuple):
        return value
    tag, body = value
    if tag == "__d":
        return {decode_value(k): decode_value(v) for k, v in body}
    if tag == "__s":
        return frozenset(decode_value(v) for v in body)
    if tag == "__t":
        return tuple(decode_value(v) for v in body)
    if tag == "__l":
        return [decode_value(v) for v in body]
    return body


def _key_json(key: Any) -> str:
    return json.dumps(thaw(key) if not isinstance(key, tuple) else list(key), default=str,
                      sort_keys=True)


def schema_text(schema: pa.Schema) -> str:
    return ";".join(f"{f.name}:{f.type}" for f in schema)


def schema_to_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_b64(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def _plain_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, f.type) for f in schema])


@dataclass
class SerializedState:
    """One task's state in canonical form: sorted keys/values and their SHA-256."""

    name: str
    kind: str  # "table" | "dict"
    keys: list[str]
    values: list[bytes]
    digest: str
    schema_b64: str | None = None
    key_columns: tuple[str, ...] = ()

    @property
    def n_entries(self) -> int:
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        return sum(len(k) for k in self.keys) + sum(len(v) for v in self.values)


def content_digest(kind: str, schema_text: str, keys: Iterable[str],
                   values: Iterable[bytes]) -> str:
    """SHA-256 of a state's canonical entries, in order (length-prefixed)."""
    h = hashlib.sha256(f"{kind}\n{schema_text}\n".encode())
    for k, v in zip(keys, values, strict=True):
        kb = k.encode()
        h.update(len(kb).to_bytes(4, "big"))
        h.update(kb)
        h.update(len(v).to_bytes(8, "big"))
        h.update(v)
    return h.hexdigest()


def serialize_state(name: str, state: BroadcastState) -> SerializedState:
    """The canonical serialization of one broadcast state (see the module doc)."""
    if isinstance(state, TableMapState):
        key_cols = list(state.key_columns)
        table = state.to_arrow()
        if state.schema is None or table.num_rows == 0:
            schema = _plain_schema(state.schema) if state.schema is not None else pa.schema([])
            return SerializedState(name, "table", [], [], content_digest(
                "table", schema_text(schema), [], []), schema_to_b64(schema), tuple(key_cols))
        schema = _plain_schema(table.schema)
        table = table.cast(schema)
        order = pc.sort_indices(table, sort_keys=[(c, "ascending") for c in key_cols])
        table = table.take(order)
        cols = [table.column(i).to_pylist() for i in range(table.num_columns)]
        rows = list(zip(*cols, strict=True))
        kidx = [table.schema.get_field_index(c) for c in key_cols]
        if len(kidx) == 1:
            keys = [json.dumps(r[kidx[0]], default=str) for r in rows]
        else:
            keys = [json.dumps([r[i] for i in kidx], default=str) for r in rows]
        values = [pickle.dumps(r, protocol=PICKLE_PROTOCOL) for r in rows]
        digest = content_digest("table", schema_text(schema), keys, values)
        return SerializedState(name, "table", keys, values, digest, schema_to_b64(schema),
                               tuple(key_cols))
    pairs = []
    for k, v in state.items():
        blob = pickle.dumps((encode_value(k), encode_value(v)), protocol=PICKLE_PROTOCOL)
        pairs.append((_key_json(k), blob))
    pairs.sort()
    keys = [k for k, _ in pairs]
    values = [v for _, v in pairs]
    return SerializedState(name, "dict", keys, values, content_digest("dict", "", keys, values))


def deserialize_state(kind: str, values: Sequence[bytes], schema_b64: str | None) -> Any:
    """The restorable content: an Arrow table (table states) or a dict (dict states)."""
    if kind == "table":
        schema = schema_from_b64(schema_b64) if schema_b64 else pa.schema([])
        rows = [pickle.loads(v) for v in values]
        if not rows:
            return schema.empty_table()
        cols = list(zip(*rows, strict=True))
        return pa.table([pa.array(c, f.type) for c, f in zip(cols, schema, strict=True)],
                        schema=schema)
    out = {}
    for v in values:
        k, val = pickle.loads(v)
        out[decode_value(k)] = decode_value(val)
    return out


def load_into(state: BroadcastState, kind: str, content: Any) -> None:
    """Replace ``state`` with restored ``content`` (from :func:`deserialize_state`)."""
    if kind == "table":
        assert isinstance(state, TableMapState)
        state.clear()
        if content.num_rows:
            state.put_table(content, replace=True)
        return
    state.clear()
    for k, v in content.items():
        state.put(k, v)
