"""The small rows of a checkpoint — its header and manifest — and their strict parsing.

A checkpoint's header and manifest rows are read back from files anyone who can write
the checkpoint root can rewrite. Parsing them accepts exactly what Lakecast writes: a
JSON object with the known fields and types, Arrow schemas that parse. Anything else
(a field it never writes, a schema replaced by other bytes, a wrong type) raises
:class:`~lakecast.snapshots.errors.RefusedCheckpointError` naming the checkpoint, the
part and the reason, and the checkpoint is skipped like one with damaged files.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, fields
from typing import Any

import pyarrow as pa

from lakecast.snapshots.codec import LEGACY_FORMAT
from lakecast.snapshots.errors import RefusedCheckpointError

STATE_KINDS = ("table", "dict")


@dataclass(frozen=True)
class CheckpointHeader:
    """What a checkpoint belongs to."""

    checkpoint_id: int
    pipeline: str
    batch_id: int
    events_start: int
    events_end: int
    state_version: dict[str, int]
    parallelism: int
    states: dict[str, dict[str, Any]]  # name -> {"kind", "key_columns"}
    table_schemas: dict[str, str]  # table -> schema (base64 IPC)
    function: str
    created_at_ms: int
    format: str = LEGACY_FORMAT  # headers without one were written with pickled values

    def meta(self) -> str:
        d = {k: v for k, v in self.__dict__.items() if k not in ("checkpoint_id",
                                                                  "created_at_ms")}
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_row(cls, checkpoint_id: int, meta: str | None,
                 created_at_ms: int | None) -> CheckpointHeader:
        """The header stored as ``meta``, parsed strictly (:func:`parse_header`)."""
        return parse_header(checkpoint_id, meta, created_at_ms)


@dataclass(frozen=True)
class ManifestRow:
    task: int
    state: str
    content_hash: str
    n_entries: int
    meta: dict[str, Any]

    @property
    def stored_rows(self) -> int:
        """Entry rows of its content (chunks of a table state, entries of a dict state)."""
        return int(self.meta.get("rows", self.n_entries))


#: header fields stored in ``meta`` (``format`` may be absent: a legacy header)
HEADER_FIELDS = frozenset(f.name for f in fields(CheckpointHeader)) - {
    "checkpoint_id", "created_at_ms"}
#: manifest ``meta`` fields and their JSON types (``schema``: base64 IPC or null)
MANIFEST_META: dict[str, tuple[type, ...]] = {
    "bytes": (int,), "schema": (str, type(None)), "pid": (int,), "cache": (str, type(None)),
    "state_bytes": (int,), "rows": (int,)}


def _refuse(cid: int, part: str, reason: str) -> RefusedCheckpointError:
    return RefusedCheckpointError(cid, part, reason)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _str_map(v: Any, values: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and values(x) for k, x in v.items())


def parse_schema(text: Any) -> pa.Schema:
    """The Arrow schema stored as base64 IPC ``text``; :class:`ValueError` if it is not one."""
    if not isinstance(text, str):
        raise ValueError(f"is a {type(text).__name__}, not base64 text")
    try:
        raw = base64.b64decode(text, validate=True)
        return pa.ipc.read_schema(pa.py_buffer(raw))
    except (binascii.Error, pa.ArrowException, OSError, ValueError) as e:
        raise ValueError(f"is not an Arrow schema ({str(e).splitlines()[0][:120]})") from None


def parse_header(cid: int, meta: str | None, created_at_ms: int | None) -> CheckpointHeader:
    """The header of checkpoint ``cid`` from its stored JSON, or
    :class:`RefusedCheckpointError` (part ``header`` or ``schema``)."""
    if not meta:
        raise _refuse(cid, "header", "is empty")
    try:
        d = json.loads(meta)
    except (ValueError, TypeError) as e:
        raise _refuse(cid, "header", f"is not JSON ({e})") from None
    if not isinstance(d, dict):
        raise _refuse(cid, "header", f"is a JSON {type(d).__name__}, not an object")
    extra = sorted(set(d) - HEADER_FIELDS)
    if extra:
        raise _refuse(cid, "header", f"carries field(s) {extra} that Lakecast never writes")
    missing = sorted(HEADER_FIELDS - {"format"} - set(d))
    if missing:
        raise _refuse(cid, "header", f"lacks field(s) {missing}")
    checks = {
        "pipeline": lambda v: isinstance(v, str), "function": lambda v: isinstance(v, str),
        "format": lambda v: isinstance(v, str), "batch_id": _is_int,
        "events_start": _is_int, "events_end": _is_int,
        "parallelism": lambda v: _is_int(v) and v >= 1,
        "state_version": lambda v: _str_map(v, _is_int),
        "table_schemas": lambda v: _str_map(v, lambda x: isinstance(x, str)),
        "states": lambda v: _str_map(v, _state_decl),
    }
    bad = sorted(k for k, ok in checks.items() if k in d and not ok(d[k]))
    if bad:
        raise _refuse(cid, "header", f"field(s) {bad} do not have the types Lakecast writes")
    if not _is_int(created_at_ms):
        raise _refuse(cid, "header", "has no creation time")
    for table, text in d["table_schemas"].items():
        try:
            parse_schema(text)
        except ValueError as e:
            raise _refuse(cid, "schema", f"of table {table!r} in the header {e}") from None
    return CheckpointHeader(checkpoint_id=cid, created_at_ms=int(created_at_ms), **d)


def _state_decl(v: Any) -> bool:
    return (isinstance(v, dict) and set(v) == {"kind", "key_columns"}
            and v["kind"] in STATE_KINDS and isinstance(v["key_columns"], list)
            and all(isinstance(c, str) for c in v["key_columns"]))


def parse_manifest_row(cid: int, task: Any, state: Any, content_hash: Any, n_entries: Any,
                       meta: str | None) -> ManifestRow:
    """One manifest row of checkpoint ``cid``, or :class:`RefusedCheckpointError` (part
    ``manifest`` or ``schema``)."""
    where = f"row of task {task} state {state!r}"
    if not (_is_int(task) and task >= 0 and isinstance(state, str)
            and isinstance(content_hash, str) and _is_int(n_entries) and n_entries >= 0):
        raise _refuse(cid, "manifest", f"{where} has a missing or negative column")
    try:
        m = json.loads(meta) if meta else {}
    except (ValueError, TypeError) as e:
        raise _refuse(cid, "manifest", f"{where}: meta is not JSON ({e})") from None
    if not isinstance(m, dict):
        raise _refuse(cid, "manifest", f"{where}: meta is a JSON {type(m).__name__}")
    extra = sorted(set(m) - set(MANIFEST_META))
    if extra:
        raise _refuse(cid, "manifest",
                      f"{where} carries field(s) {extra} that Lakecast never writes")
    bad = sorted(k for k, v in m.items() if not isinstance(v, MANIFEST_META[k])
                 or isinstance(v, bool))
    if bad:
        raise _refuse(cid, "manifest", f"{where}: field(s) {bad} do not have the types "
                                       "Lakecast writes")
    if m.get("schema") is not None:
        try:
            parse_schema(m["schema"])
        except ValueError as e:
            raise _refuse(cid, "schema", f"of state {state!r} (task {task}) {e}") from None
    return ManifestRow(task, state, content_hash, n_entries, m)
