"""Broadcast versions checked before they touch task state: :class:`VersionGate`.

The gate holds the function's :class:`~lakecast.api.contracts.TableContract` s and checks
a broadcast table *as of* a version (read without Spark when safe). It serves two
callers:

* planning (:meth:`VersionGate.plan`): each table's planned version is its newest version
  that passes; newer versions that fail are *refused* (:class:`RefusedVersion`, returned
  for the plan to record) — or, with the table's policy ``fail``, planning raises
  :class:`~lakecast.api.contracts.BroadcastVersionRefused` before anything is written;
* the runtime (:meth:`VersionGate.reload_reason`): when the state moves from version ``a``
  to ``b`` across a refused version, the changes of ``a+1..b`` cannot be applied (they
  were written against a table the state never held), so the table is reloaded whole at
  ``b``.

Results are cached per (table, version): a Delta version never changes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakecast.api.contracts import BroadcastVersionRefused, TableContract, check_version
from lakecast.delta import io as delta_io

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RefusedVersion:
    """A broadcast table version that failed its contract, and why."""

    table: str
    version: int
    reasons: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"table": self.table, "version": self.version, "reasons": list(self.reasons)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RefusedVersion:
        return cls(str(d["table"]), int(d["version"]), tuple(d["reasons"]))


class VersionGate:
    """Checks versions of the broadcast tables ``{name: path}`` against ``contracts``."""

    def __init__(self, spark: SparkSession | None, tables: Mapping[str, str],
                 contracts: Sequence[TableContract]) -> None:
        unknown = sorted({c.table for c in contracts} - set(tables))
        if unknown:
            raise ValueError(f"table contracts for {unknown}, which are not broadcast tables "
                             f"of the pipeline ({sorted(tables)})")
        self.spark = spark
        self.tables = dict(tables)
        self.contracts = {c.table: c for c in contracts}
        self._cache: dict[tuple[str, int], tuple[str, ...]] = {}

    def _read(self, table: str, version: int) -> tuple[pa.Table | None, pa.Schema]:
        path = self.tables[table]
        try:
            files = delta_io.table_files(path, version)
        except delta_io.DirectReadUnsupported:
            if self.spark is None:
                raise
            frame = delta_io.read(self.spark, path, version=version)
            return frame.toArrow(), frame.limit(0).toArrow().schema
        required = self.contracts[table].required_columns
        if any(c not in files.schema.names for c in required):
            return None, files.schema
        return files.read(), files.schema

    def reasons(self, table: str, version: int) -> tuple[str, ...]:
        """Why ``table@version`` is refused (empty: it passes, or has no contract)."""
        contract = self.contracts.get(table)
        if contract is None:
            return ()
        key = (table, version)
        if key not in self._cache:
            rows, schema = self._read(table, version)
            self._cache[key] = tuple(check_version(contract, rows, schema, version))
            if self._cache[key]:
                log.warning("broadcast %s@v%d refused: %s", table, version,
                            " | ".join(self._cache[key]))
        return self._cache[key]

    def newest_good(self, table: str, applied: int | None, latest: int
                    ) -> tuple[int | None, list[RefusedVersion]]:
        """The newest version in ``(applied, latest]`` that passes (``applied`` when none
        does) and the versions refused on the way down from ``latest``."""
        refused = []
        lowest = 0 if applied is None else applied + 1
        for v in range(latest, lowest - 1, -1):
            why = self.reasons(table, v)
            if not why:
                return v, refused
            refused.append(RefusedVersion(table, v, why))
        return applied, refused

    def plan(self, applied: Mapping[str, int], latest: Mapping[str, int]
             ) -> tuple[dict[str, int], list[RefusedVersion]]:
        """The state version to plan (``{table: version}``; a table with no good version
        yet is left out) and the refused versions, oldest first. Raises
        :class:`BroadcastVersionRefused` when a refused table's policy is ``fail``."""
        chosen: dict[str, int] = {}
        refused: list[RefusedVersion] = []
        for table in sorted(latest):
            prev = applied.get(table)
            if prev is not None and latest[table] <= prev:
                chosen[table] = latest[table]
                continue
            version, bad = self.newest_good(table, prev, latest[table])
            if version is not None:
                chosen[table] = version
            refused.extend(sorted(bad, key=lambda r: r.version))
        failing = [r for r in refused if self.contracts[r.table].on_invalid == "fail"]
        if failing:
            lines = "\n".join(f"- {why}" for r in failing for why in r.reasons)
            raise BroadcastVersionRefused(
                f"broadcast version(s) refused with policy 'fail' "
                f"({', '.join(f'{r.table}@v{r.version}' for r in failing)}); nothing was "
                f"planned or written:\n{lines}\nFix the table(s) as said, or declare "
                f"on_invalid='refuse_and_continue' to keep the last good version.")
        return chosen, refused

    def reload_reason(self, table: str, start: int, end: int) -> str | None:
        """A reason to reload ``table`` whole at ``end`` instead of applying its changes
        after ``start``: a version in between was refused (or cannot be checked)."""
        if table not in self.contracts or end <= start + 1:
            return None
        bad = []
        for v in range(start + 1, end):
            try:
                if self.reasons(table, v):
                    bad.append(v)
            except delta_io.DeltaIOError as e:
                return (f"{table}: version {v} between the applied v{start} and v{end} cannot "
                        f"be checked ({e}); reloaded whole at v{end}")
        if not bad:
            return None
        return (f"{table}: refused version(s) {bad} lie between the applied v{start} and "
                f"v{end}; their changes were never applied, so the table is reloaded whole "
                f"at v{end}")
