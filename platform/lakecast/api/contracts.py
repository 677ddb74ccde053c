"""What a function requires of each version of a broadcast table: :class:`TableContract`.

A function declares one contract per broadcast table
(:meth:`lakecast.api.functions.BroadcastProcessFunction.table_contracts`; an
:class:`~lakecast.api.enrich.Enrichment` derives them from its lookups). Before a version
of the table reaches task state, the table *as of that version* is checked
(:func:`check_version`): the declared columns exist, the key columns are never null and
name one row each, and the contract's own row checks pass. A version that fails is
refused as a whole; ``on_invalid`` says what the pipeline does then:

* ``"refuse_and_continue"`` (default): the state stays at the last good version, the
  pipeline keeps processing with it and reports the refused version and its reasons;
* ``"fail"``: the batch fails before anything is written.

Spark-free: the checks take a ``pyarrow.Table``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from lakecast.errors import LakecastError

InvalidVersionPolicy = Literal["refuse_and_continue", "fail"]
INVALID_VERSION_POLICIES: tuple[str, ...] = ("refuse_and_continue", "fail")

RowCheck = Callable[[pa.Table, str, int], list[str]]
"""``check(table_at_version, table_name, version)`` -> reasons (empty: the rows are usable).
Each reason names the table, version, key and value, and the fix."""

#: at most this many offending keys are quoted in a reason
SAMPLE = 5


class BroadcastVersionRefused(LakecastError):
    """A broadcast table version failed its contract and the table's policy is ``fail``."""


@dataclass(frozen=True)
class TableContract:
    """Requirements on every version of broadcast table ``table``.

    ``key_columns``: one row per key, never null. ``columns``: columns the function
    reads (besides the keys). ``checks``: extra row checks (:data:`RowCheck`).
    ``on_invalid``: ``"refuse_and_continue"`` | ``"fail"``.
    """

    table: str
    key_columns: tuple[str, ...]
    columns: tuple[str, ...] = ()
    checks: tuple[RowCheck, ...] = ()
    on_invalid: InvalidVersionPolicy = "refuse_and_continue"

    def __post_init__(self) -> None:
        for name in ("key_columns", "columns", "checks"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = (value,)
            object.__setattr__(self, name, tuple(value))
        if not self.key_columns:
            raise ValueError(f"TableContract({self.table!r}) needs key_columns")
        if self.on_invalid not in INVALID_VERSION_POLICIES:
            raise ValueError(f"on_invalid must be one of {INVALID_VERSION_POLICIES}, "
                             f"got {self.on_invalid!r}")

    @property
    def required_columns(self) -> tuple[str, ...]:
        """Key columns, then used columns (no repeats)."""
        return tuple(dict.fromkeys((*self.key_columns, *self.columns)))


def _keys_text(contract: TableContract) -> str:
    return ", ".join(contract.key_columns)


def _key_repr(row: dict[str, object], keys: Sequence[str]) -> str:
    return ", ".join(f"{k}={row[k]!r}" for k in keys)


def check_version(contract: TableContract, rows: pa.Table | None, schema: pa.Schema,
                  version: int) -> list[str]:
    """Reasons why version ``version`` of ``contract.table`` (its rows ``rows`` and
    ``schema``) cannot be applied; empty when it can. ``rows`` may be ``None`` when the
    schema alone already refuses it."""
    name, keys = contract.table, list(contract.key_columns)
    missing = [c for c in contract.required_columns if c not in schema.names]
    if missing:
        cols = ", ".join(repr(c) for c in missing)
        return [f"{name}@v{version}: column(s) {cols} missing from the table's schema (the "
                f"function uses them); write a version of {name} that has column(s) {cols}"]
    if rows is None:
        raise ValueError("check_version needs the rows when the schema has every column")
    reasons = []
    nulls = None
    for k in keys:
        null = pc.is_null(rows.column(k))
        nulls = null if nulls is None else pc.or_(nulls, null)
    n_null = int(pc.sum(nulls).as_py() or 0)
    if n_null:
        reasons.append(f"{name}@v{version}: {n_null} row(s) with a null key "
                       f"({_keys_text(contract)}); write a version of {name} without null "
                       f"{_keys_text(contract)}")
    keyed = rows.select(keys).filter(pc.invert(nulls)) if n_null else rows.select(keys)
    counts = keyed.group_by(keys).aggregate([([], "count_all")])
    counts = counts.filter(pc.greater(counts.column("count_all"), 1))
    if counts.num_rows:
        sample = counts.slice(0, SAMPLE).to_pylist()
        quoted = "; ".join(f"{_key_repr(r, keys)} ({r['count_all']} rows)" for r in sample)
        more = f" and {counts.num_rows - SAMPLE} more" if counts.num_rows > SAMPLE else ""
        reasons.append(f"{name}@v{version}: {counts.num_rows} duplicate key(s): "
                       f"{quoted}{more}; write a version of {name} with one row per "
                       f"{_keys_text(contract)}")
    for check in contract.checks:
        reasons.extend(check(rows, name, version))
    return reasons
