"""Canonical serialization of broadcast state (what a checkpoint stores and hashes).

Checkpoints hold *data*, never code: restoring one never unpickles anything.

* **table states** are sorted by their key columns and stored as Arrow IPC streams of
  up to :data:`CHUNK_ROWS` rows each (one entry row per chunk). Every chunk is a fresh
  ``take`` of the sorted table, so its bytes are canonical: equal states give equal
  bytes on every task, whatever their history (base + overlay, restored, rebuilt).
* **dict states** are stored one entry per key as typed JSON (:func:`encode_value`):
  ``(key, value)`` (:mod:`lakecast.api.typed`: mappings and sets in a canonical order,
  every non-JSON type tagged — tuple, set, bytes, datetime, Decimal...). Dataclass
  values are stored as their fields (restored as dicts); other objects cannot be
  checkpointed.

The content hash (SHA-256, :func:`content_digest`) covers the kind, the schema and the
stored bytes in order; a restore verifies it before decoding anything, and decoding
accepts only the formats above (:class:`~lakecast.snapshots.errors.UnreadableCheckpointError`
otherwise). ``key`` is JSON for people (``lakecast snapshots show``): the key of a dict
entry, the first and last key of a table chunk.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lakecast.api import typed
from lakecast.api.frozen import thaw
from lakecast.api.state import BroadcastState
from lakecast.api.table_state import TableMapState
from lakecast.snapshots.errors import SnapshotError, UnreadableCheckpointError

#: the checkpoint format this code writes and reads (older "pickle-v1" ones are skipped)
FORMAT = "typed-v2"
LEGACY_FORMAT = "pickle-v1"
#: rows per stored chunk of a table state
CHUNK_ROWS = 65_536


# ============================================================================ dict entries
def entry_bytes(key: Any, value: Any) -> bytes:
    """The stored bytes of one dict-state entry: canonical typed JSON of ``[key, value]``."""
    return typed.dumps((key, value))


def decode_entry(data: bytes) -> tuple[Any, Any]:
    """``(key, value)`` of :func:`entry_bytes`; :class:`ValueError` when ``data`` is not one."""
    pair = typed.loads(data)
    if not isinstance(pair, tuple) or len(pair) != 2:
        raise ValueError("not a (key, value) pair")
    return pair[0], pair[1]


def _key_json(key: Any) -> str:
    return json.dumps(thaw(key) if not isinstance(key, tuple) else list(key), default=str,
                      sort_keys=True)


# ============================================================================ Arrow
def schema_text(schema: pa.Schema) -> str:
    return ";".join(f"{f.name}:{f.type}" for f in schema)


def schema_to_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_b64(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def _plain_type(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def _plain_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, _plain_type(f.type)) for f in schema])


def ipc_bytes(table: pa.Table) -> bytes:
    """One Arrow IPC stream holding ``table``."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def read_chunk(data: bytes, schema: pa.Schema) -> pa.Table:
    """A table chunk stored by :func:`serialize_state`; :class:`ValueError` when ``data``
    is not an Arrow IPC stream of ``schema``."""
    try:
        table = pa.ipc.open_stream(pa.py_buffer(bytes(data))).read_all()
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"not an Arrow IPC stream ({e})") from e
    if table.schema != schema:
        raise ValueError(f"chunk schema {schema_text(table.schema)} is not the manifest's "
                         f"{schema_text(schema)}")
    return table


# ============================================================================ states
@dataclass
class SerializedState:
    """One task's state in canonical form: its stored rows (keys/values) and SHA-256."""

    name: str
    kind: str  # "table" | "dict"
    keys: list[str]
    values: list[bytes]
    digest: str
    schema_b64: str | None = None
    key_columns: tuple[str, ...] = ()
    n_entries: int = 0  # state entries (rows of a table state, keys of a dict state)

    @property
    def n_rows(self) -> int:
        """Stored entry rows (chunks of a table state, entries of a dict state)."""
        return len(self.values)

    @property
    def nbytes(self) -> int:
        return sum(len(k) for k in self.keys) + sum(len(v) for v in self.values)


def content_digest(kind: str, schema_text: str, keys: Iterable[str],
                   values: Iterable[bytes]) -> str:
    """SHA-256 of a state's stored rows, in order (length-prefixed)."""
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
        once = getattr(state, "computed_once", None)  # a sharded state: once per machine
        if once is not None:
            return _from_arrow(name, once(f"{FORMAT}:{name}", lambda: _to_arrow(
                _serialize_table(name, state))))
        return _serialize_table(name, state)
    pairs = []
    for k, v in state.items():
        try:
            blob = entry_bytes(k, v)
        except TypeError as e:
            raise SnapshotError(
                f"state {name!r}, key {_key_json(k)}: {e} cannot be checkpointed; store "
                "scalars, str, bytes, dicts, lists, tuples, sets, dates, Decimals or "
                "dataclasses (restored as dicts)") from None
        pairs.append((_key_json(k), blob))
    pairs.sort()
    keys = [k for k, _ in pairs]
    values = [v for _, v in pairs]
    return SerializedState(name, "dict", keys, values, content_digest("dict", "", keys, values),
                           n_entries=len(keys))


def _to_arrow(s: SerializedState) -> pa.Table:
    """A serialized table state as an Arrow table (its rows, the rest in the metadata)."""
    meta = {"digest": s.digest, "schema_b64": s.schema_b64 or "", "n_entries": str(s.n_entries),
            "key_columns": json.dumps(list(s.key_columns))}
    return pa.table({"key": pa.array(s.keys, pa.string()),
                     "value": pa.array(s.values, pa.large_binary())}).replace_schema_metadata(meta)


def _from_arrow(name: str, t: pa.Table) -> SerializedState:
    meta = {k.decode(): v.decode() for k, v in (t.schema.metadata or {}).items()}
    return SerializedState(name, "table", t.column("key").to_pylist(),
                           t.column("value").to_pylist(), meta["digest"],
                           meta["schema_b64"] or None, tuple(json.loads(meta["key_columns"])),
                           n_entries=int(meta["n_entries"]))


def _serialize_table(name: str, state: TableMapState) -> SerializedState:
    key_cols = list(state.key_columns)
    table = state.to_arrow()
    if state.schema is None or table.num_rows == 0:
        schema = _plain_schema(state.schema) if state.schema is not None else pa.schema([])
        return SerializedState(name, "table", [], [], content_digest(
            "table", schema_text(schema), [], []), schema_to_b64(schema), tuple(key_cols))
    schema = _plain_schema(table.schema)
    table = table.cast(schema)
    order = pc.sort_indices(table, sort_keys=[(c, "ascending") for c in key_cols])
    keys, values = [], []
    for lo in range(0, table.num_rows, CHUNK_ROWS):
        part = table.take(order.slice(lo, CHUNK_ROWS))  # fresh buffers: canonical bytes
        ends = part.select(key_cols).take([0, part.num_rows - 1]).to_pylist()
        keys.append(json.dumps([r[key_cols[0]] if len(key_cols) == 1 else
                                [r[c] for c in key_cols] for r in ends], default=str))
        values.append(ipc_bytes(part))
    digest = content_digest("table", schema_text(schema), keys, values)
    return SerializedState(name, "table", keys, values, digest, schema_to_b64(schema),
                           tuple(key_cols), n_entries=table.num_rows)


def deserialize_state(kind: str, values: Sequence[bytes], schema_b64: str | None) -> Any:
    """The restorable content: an Arrow table (table states) or a dict (dict states).
    Raises :class:`ValueError` naming the first stored row that is not in the format."""
    if kind == "table":
        schema = schema_from_b64(schema_b64) if schema_b64 else pa.schema([])
        parts = []
        for seq, v in enumerate(values):
            try:
                parts.append(read_chunk(v, schema))
            except ValueError as e:
                raise ValueError(f"entry seq {seq}: {e}") from None
        return pa.concat_tables(parts) if parts else schema.empty_table()
    out = {}
    for seq, v in enumerate(values):
        try:
            k, val = decode_entry(v)
        except (ValueError, TypeError) as e:  # JSON/UTF-8 errors are ValueErrors
            raise ValueError(f"entry seq {seq} is not typed JSON data ({e})") from None
        out[k] = val
    return out


def decode_content(checkpoint_id: int, state: str, kind: str, values: Sequence[bytes],
                   schema_b64: str | None) -> Any:
    """:func:`deserialize_state`, raising :class:`UnreadableCheckpointError` naming the
    checkpoint and state."""
    try:
        return deserialize_state(kind, values, schema_b64)
    except ValueError as e:
        raise UnreadableCheckpointError(
            f"checkpoint {checkpoint_id} is unreadable: state {state!r} {e}; only "
            f"{FORMAT} data is restored (never code)") from None


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


def readable_entries(kind: str, values: Sequence[bytes], schema_b64: str | None,
                     key_columns: Sequence[str]) -> list[tuple[str, Any]]:
    """``(key as JSON, value)`` of every entry of a stored content, in key order (for
    people: ``lakecast snapshots show`` / ``diff``). Raises :class:`ValueError`."""
    content = deserialize_state(kind, values, schema_b64)
    if kind == "table":
        rows = content.to_pylist()
        cols = list(key_columns)
        return [(json.dumps(r[cols[0]] if len(cols) == 1 else [r[c] for c in cols],
                            default=str), r) for r in rows]
    return sorted(((_key_json(k), thaw(v)) for k, v in content.items()), key=lambda kv: kv[0])
