"""Which shard a key belongs to: Spark's own hash partitioning, computed in Python.

A sharded broadcast state (``Lookup(shards=N)``) keeps in each task only the rows whose
key falls in the task's shard, and each micro-batch routes the events to the tasks of
their keys' shards with ``events.repartition(N, *keys)`` (:func:`routing_columns`). Spark
puts a row in partition ``pmod(hash(keys), N)``, where ``hash`` is its ``Murmur3Hash``
(seed 42: ``hashLong`` for the integer keys, cast to ``bigint``; ``hashUnsafeBytes`` over
the UTF-8 bytes for strings; a null key column leaves the hash as it is). :func:`shard_of`
computes the same value with numpy, so a task finds its shard's rows of a table version
without a Spark job, and partition ``s`` of a routed batch holds the events of shard ``s``.
A test compares both with a real Spark session.

:func:`key_hash64` is another hash: the 64-bit one a shard's rows are sorted by on disk
(:mod:`lakecast.runtime.sharded_state`), never used for routing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from pyspark.sql import Column

#: Spark's seed of ``hash(...)`` and of ``HashPartitioning``
SEED = 42
_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)


def shardable(t: pa.DataType) -> bool:
    """Whether a key column of type ``t`` can be sharded (integers and strings)."""
    return (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t))


def canonical(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A key column as the hash sees it: integers as int64, strings as ``string``."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if pa.types.is_integer(arr.type):
        return arr if arr.type == pa.int64() else pc.cast(arr, pa.int64())
    if pa.types.is_large_string(arr.type):
        return pc.cast(arr, pa.string())
    if pa.types.is_string(arr.type):
        return arr
    raise TypeError(f"a sharded key must be an integer or a string column, not {arr.type}")


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k1(k: np.ndarray) -> np.ndarray:
    return _rotl(k * _C1, 15) * _C2


def _mix_h1(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    return _rotl(h ^ k, 13) * np.uint32(5) + np.uint32(0xE6546B64)


def _fmix(h: np.ndarray, length: np.ndarray | int) -> np.ndarray:
    h = h ^ np.asarray(length, dtype=np.uint32)
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def _hash_long(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """Spark's ``Murmur3_x86_32.hashLong`` of each int64 value with its row's seed."""
    u = values.astype(np.int64, copy=False).view(np.uint64)
    low = (u & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    high = (u >> np.uint64(32)).astype(np.uint32)
    h = _mix_h1(seed, _mix_k1(low))
    h = _mix_h1(h, _mix_k1(high))
    return _fmix(h, 8)


def _hash_strings(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    """Spark's ``Murmur3_x86_32.hashUnsafeBytes`` of each UTF-8 string with its row's seed:
    the 4-byte little-endian words, then each trailing byte on its own (as a signed byte),
    then the length (not the standard MurmurHash3 tail)."""
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=arr.offset + n + 1)
    offsets = offsets[arr.offset:].astype(np.int64)
    data_buf = arr.buffers()[2]
    data = (np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None
            else np.zeros(0, dtype=np.uint8))
    starts, lengths = offsets[:-1], offsets[1:] - offsets[:-1]
    words = lengths // 4
    h = seed.copy()
    for j in range(int(words.max()) if n else 0):
        rows = np.flatnonzero(words > j)
        at = starts[rows] + 4 * j
        k = (data[at].astype(np.uint32) | (data[at + 1].astype(np.uint32) << np.uint32(8))
             | (data[at + 2].astype(np.uint32) << np.uint32(16))
             | (data[at + 3].astype(np.uint32) << np.uint32(24)))
        h[rows] = _mix_h1(h[rows], _mix_k1(k))
    tails = lengths % 4
    for t in range(3):
        rows = np.flatnonzero(tails > t)
        if not len(rows):
            break
        byte = data[starts[rows] + 4 * words[rows] + t].view(np.int8).astype(np.int32)
        h[rows] = _mix_h1(h[rows], _mix_k1(byte.view(np.uint32)))
    return _fmix(h, lengths.astype(np.uint32))


def spark_hash(columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """Spark's ``hash(c1, c2, ...)`` (an int32 per row) of the key ``columns``, integers
    as ``bigint`` (see the module doc)."""
    cols = [canonical(c) for c in columns]
    n = len(cols[0]) if cols else 0
    h = np.full(n, SEED, dtype=np.uint32)
    for col in cols:
        valid = None if not col.null_count else np.asarray(pc.is_valid(col))
        if pa.types.is_integer(col.type):
            values = np.asarray(col.fill_null(0) if col.null_count else col)
            new = _hash_long(values, h)
        else:
            new = _hash_strings(col.fill_null("") if col.null_count else col, h)
        h = new if valid is None else np.where(valid, new, h)
    return h.view(np.int32)


def shard_of(columns: Sequence[pa.Array | pa.ChunkedArray], shards: int) -> np.ndarray:
    """The shard of each row: ``pmod(hash(keys), shards)``, the partition
    ``repartition(shards, *keys)`` puts it in."""
    return np.mod(spark_hash(columns).astype(np.int64), shards)


def key_hash64(columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """A 64-bit hash of each row's key (pandas' ``hash_array``, the same in every process),
    by which a shard's rows are sorted; equal keys, equal hashes."""
    from pandas.util import hash_array

    out: np.ndarray | None = None
    for col in (canonical(c) for c in columns):
        if pa.types.is_integer(col.type):
            values: Any = np.asarray(col.fill_null(0) if col.null_count else col)
        else:
            values = np.asarray(col.to_numpy(zero_copy_only=False), dtype=object)
        h = hash_array(values)
        out = h if out is None else (out * np.uint64(0x100000001B3)) ^ h
    assert out is not None
    return out


def routing_columns(names: Sequence[str], schema: Any,
                    keys: Sequence[pa.DataType | None] | None = None) -> list[Column]:
    """The Spark columns ``repartition`` routes events by: the event key columns of the
    events' Spark ``schema`` as the state's key columns' types ``keys`` (when known; else
    their own), integers as ``bigint`` (as :func:`shard_of` hashes them); a ``ValueError``
    names a column that is missing or of another type."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegralType, StringType

    fields = {f.name: f.dataType for f in schema.fields}
    out = []
    for n, key in zip(names, keys or [None] * len(names), strict=True):
        t = fields.get(n)
        if t is None:
            raise ValueError(f"the events have no column {n!r} to route them to the shards "
                             f"by (their columns: {sorted(fields)})")
        col = F.col(f"`{n}`")
        if key is not None and not shardable(key):
            raise ValueError(f"a sharded state's key matching the events' {n!r} is {key}: "
                             "shard a table by an integer or a string key")
        if key is not None:  # hashed as the table's key: its canonical type
            out.append(col.cast("bigint" if pa.types.is_integer(key) else "string"))
        elif isinstance(t, IntegralType):
            out.append(col.cast("bigint"))
        elif isinstance(t, StringType):
            out.append(col)
        else:
            raise ValueError(f"the events' column {n!r} is {t.simpleString()}: a sharded "
                             "state's key must be an integer or a string column")
    return out
