"""One element of the broadcast stream: one version of one broadcast table.

:class:`BroadcastElement` is what ``process_broadcast_element`` receives. Elements have a
total, deterministic order (:func:`order_elements`): commit order within a table; across
tables by commit timestamp, then table name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    import pandas as pd

CHANGE_TYPE = "_change_type"
_UPSERT_TYPES = ("insert", "update_postimage")
def split_changes(element: BroadcastElement) -> tuple[pa.Table, pa.Table]:
    """(upsert rows, delete rows) of an element, without the change-type column."""
    rows = element.rows
    if CHANGE_TYPE not in rows.column_names:
        return rows, rows.slice(0, 0)
    ct = rows.column(CHANGE_TYPE)
    ups = rows.filter(pc.is_in(ct, pa.array(_UPSERT_TYPES))).drop_columns([CHANGE_TYPE])
    dels = rows.filter(pc.equal(ct, "delete")).drop_columns([CHANGE_TYPE])
    return ups, dels

ElementKind = Literal["changes", "full"]
CHANGE_TYPES = ("insert", "update_postimage", "delete")


@dataclass(frozen=True, eq=False)
class BroadcastElement:
    """One version of one broadcast table.

    ``kind="changes"``: ``rows`` holds the version's changes with a ``_change_type``
    column (``insert`` / ``update_postimage`` / ``delete``; pre-images are dropped).
    ``kind="full"``: ``rows`` is the whole table as of ``version`` (no ``_change_type``
    column) and ``reason`` says why a full element was sent.
    """

    table: str
    version: int
    commit_timestamp: int
    kind: ElementKind
    rows: pa.Table
    reason: str = ""
    operation: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return self.rows.num_rows

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes)

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema of :attr:`rows`."""
        return self.rows.schema

    def upserts(self) -> pa.Table:
        """Rows that are current after this version (inserts and update post-images)."""
        return split_changes(self)[0]

    def deletes(self) -> pa.Table:
        """Rows deleted by this version."""
        return split_changes(self)[1]

    def order_key(self) -> tuple[int, str, int]:
        return (self.commit_timestamp, self.table, self.version)

    def __repr__(self) -> str:
        why = f", reason={self.reason!r}" if self.reason else ""
        return (
            f"BroadcastElement({self.table}@v{self.version}, {self.kind}, "
            f"{self.num_rows} rows, ts={self.commit_timestamp}{why})"
        )

    @classmethod
    def of(
        cls,
        table: str,
        version: int,
        rows: pa.Table | pd.DataFrame | Sequence[Mapping[str, Any]],
        *,
        kind: ElementKind = "full",
        change_type: str | Sequence[str] | None = None,
        commit_timestamp: int | None = None,
        reason: str = "",
    ) -> BroadcastElement:
        """Build an element by hand (tests, the harness). ``change_type`` fills the
        ``_change_type`` column of a ``changes`` element (one value or one per row)."""
        if isinstance(rows, pa.Table):
            t = rows
        elif hasattr(rows, "columns") and hasattr(rows, "dtypes"):
            t = pa.Table.from_pandas(rows, preserve_index=False)
        else:
            t = pa.Table.from_pylist(list(rows))
        if kind == "changes" and CHANGE_TYPE not in t.column_names:
            ct = change_type or "insert"
            values = [ct] * t.num_rows if isinstance(ct, str) else list(ct)
            bad = set(values) - set(CHANGE_TYPES)
            if bad:
                raise ValueError(f"unknown change types {bad}; use one of {CHANGE_TYPES}")
            t = t.append_column(CHANGE_TYPE, pa.array(values, pa.string()))
        ts = version if commit_timestamp is None else commit_timestamp
        reason = reason or ("built by hand" if kind == "full" else "")
        return cls(table, version, ts, kind, t, reason)

def order_elements(elements: Iterable[BroadcastElement]) -> list[BroadcastElement]:
    """Total deterministic order: commit order within a table, then (timestamp, table)."""
    by_table: dict[str, list[BroadcastElement]] = {}
    for e in elements:
        by_table.setdefault(e.table, []).append(e)
    keyed: list[tuple[tuple[int, str, int], BroadcastElement]] = []
    for table, items in by_table.items():
        items.sort(key=lambda e: e.version)
        ts = None
        for e in items:  # a table's effective timestamps never go backwards
            ts = e.commit_timestamp if ts is None else max(ts, e.commit_timestamp)
            keyed.append(((ts, table, e.version), e))
    keyed.sort(key=lambda kv: kv[0])
    return [e for _, e in keyed]
