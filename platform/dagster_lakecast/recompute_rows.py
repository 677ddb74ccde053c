"""Row comparison of the ``output_sample_recomputed`` check (:mod:`dagster_lakecast.recompute`),
in plain Python: the rows a recomputation expects against the rows a batch wrote and the
rows the output table holds now, column by column.

Rows are grouped by *row key* (the columns that tie an output row to its events). Within a
group, rows are matched one to one: an identical row first, else the candidate with the
most equal columns, whose differing columns are reported (:class:`Mismatch`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Row = dict[str, Any]

__all__ = ["Mismatch", "Row", "compare_current", "compare_group", "describe_key", "match_rows",
           "same_value"]


@dataclass(frozen=True)
class Mismatch:
    """One difference: a column of a row (``column`` ``None``: the whole row is missing
    from ``actual_of`` or was written without being recomputed)."""

    table: str
    batch_id: int
    key: str
    column: str | None
    expected: Any
    actual: Any
    #: what ``actual`` is: "written" (the batch's rows as committed) or "current" (the
    #: table's rows now)
    actual_of: str

    def describe(self) -> str:
        where = f"{self.table} batch {self.batch_id} row {self.key}"
        if self.column is None and self.expected is None:
            return (f"{where}: the batch wrote a row the recomputation does not produce "
                    f"({_short(self.actual)})")
        if self.column is None:
            return (f"{where}: the recomputed row is not in the {self.actual_of} rows "
                    f"({_short(self.expected)})")
        return (f"{where}: column {self.column} is {self.actual!r} ({self.actual_of}) but "
                f"recomputes to {self.expected!r}")

    def as_dict(self) -> dict[str, Any]:
        return {"table": self.table, "batch_id": self.batch_id, "key": self.key,
                "column": self.column, "expected": _jsonable(self.expected),
                "actual": _jsonable(self.actual), "actual_of": self.actual_of}


def _short(row: Any) -> str:
    text = repr(row)
    return text if len(text) <= 300 else text[:297] + "..."


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return repr(value)


def same_value(a: Any, b: Any) -> bool:
    """Equality of two column values (NaN equals NaN; lists and structs element-wise)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _differing(expected: Row, actual: Row, columns: Sequence[str]) -> list[str]:
    return [c for c in columns if not same_value(expected.get(c), actual.get(c))]


def describe_key(columns: Sequence[str], row: Mapping[str, Any]) -> str:
    """``col=value, ...`` of a row's key columns."""
    return ", ".join(f"{c}={row.get(c)!r}" for c in columns)


def match_rows(expected: Iterable[Row], actual: Iterable[Row], columns: Sequence[str]
               ) -> tuple[int, list[tuple[Row, Row | None, list[str]]], list[Row]]:
    """Match ``expected`` rows one to one with ``actual`` rows: (rows matched exactly,
    ``(expected, nearest actual or None, differing columns)`` of the others, the actual
    rows left over). Exact matches are taken first, so a near row never takes the place
    of an identical one."""
    pool = list(actual)
    rest: list[Row] = []
    matched = 0
    for row in expected:
        i = next((i for i, a in enumerate(pool) if not _differing(row, a, columns)), None)
        if i is None:
            rest.append(row)
        else:
            pool.pop(i)
            matched += 1
    unmatched: list[tuple[Row, Row | None, list[str]]] = []
    for row in rest:
        if not pool:
            unmatched.append((row, None, []))
            continue
        diffs = [_differing(row, a, columns) for a in pool]
        i = min(range(len(pool)), key=lambda j: len(diffs[j]))
        unmatched.append((row, pool.pop(i), diffs[i]))
    return matched, unmatched, pool


def compare_group(table: str, batch_id: int, key: str, expected: list[Row], written: list[Row],
                  columns: Sequence[str]) -> tuple[int, list[Mismatch]]:
    """The recomputed rows of one (batch, row key) against the rows the batch wrote, both
    ways: (rows matched, mismatches)."""
    matched, unmatched, extra = match_rows(expected, written, columns)
    out = [_mismatches(table, batch_id, key, e, a, cols, "written") for e, a, cols in unmatched]
    flat = [m for ms in out for m in ms]
    flat += [Mismatch(table, batch_id, key, None, None, row, "written") for row in extra]
    return matched, flat


def compare_current(table: str, key: str, expected: list[tuple[int, Row]],
                    current: list[Row], columns: Sequence[str]) -> tuple[int, list[Mismatch]]:
    """Recomputed rows ``(batch id, row)`` of one row key against the table's current rows
    of that key (which may also hold rows of batches not sampled: only missing or changed
    rows count): (rows found, mismatches)."""
    by_id: dict[Hashable, int] = {id(r): b for b, r in expected}
    matched, unmatched, _ = match_rows([r for _, r in expected], current, columns)
    flat = [m for e, a, cols in unmatched
            for m in _mismatches(table, by_id[id(e)], key, e, a, cols, "current")]
    return matched, flat


def _mismatches(table: str, batch_id: int, key: str, expected: Row, actual: Row | None,
                columns: list[str], actual_of: str) -> list[Mismatch]:
    if actual is None:
        return [Mismatch(table, batch_id, key, None, expected, None, actual_of)]
    return [Mismatch(table, batch_id, key, c, expected.get(c), actual.get(c), actual_of)
            for c in columns]
