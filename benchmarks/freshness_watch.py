"""Freshness as every freshness benchmark measures it: from the Delta logs, from outside.

The latency of an events commit is the commit timestamp of the first output commit that
holds any of its rows (an added data file with one of the commit's event ids) minus the
events commit's timestamp, both read from the tables' Delta logs (in-commit timestamps
where the table has them) by the benchmark's process, never by the pipeline's: no
progress log, no run record, nothing the pipeline says about itself.

:class:`FreshnessWatch` reads each table's log incrementally (each commit file once) and
each added file's id column once (pyarrow, that column only), so a watcher polling every
0.2 s does not take more CPU from the side it measures as the tables grow. Files a commit
adds without changing data (``dataChange: false``: compaction, ``OPTIMIZE``) hold rows an
earlier commit added: they are not where rows land.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

import numpy as np


class _Log:
    """One local Delta table's commits, read once each: per version its commit
    timestamp (ms) and the sorted ids of the rows its data-changing files add."""

    def __init__(self, path: str, id_column: str) -> None:
        self.path, self.id_column = path, id_column
        self.commits: dict[int, tuple[int, np.ndarray]] = {}
        self._next = 0

    def _ids(self, version: int) -> np.ndarray:
        import pyarrow.parquet as pq

        from lakecast.delta import io as delta_io

        parts = [pq.read_table(Path(self.path) / unquote(a["add"]["path"]),
                               columns=[self.id_column]).column(0).to_numpy()
                 for a in delta_io.commit_actions(self.path, version)
                 if "add" in a and a["add"].get("dataChange", True)]
        ids = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        return np.sort(ids[~np.isnan(ids)] if ids.dtype.kind == "f" else ids)

    def read_new(self) -> None:
        """Read the commits made since the last call."""
        from lakecast.delta import io as delta_io

        newest = delta_io.latest_version(self.path)
        if newest is None or newest < self._next:
            return
        infos = delta_io.commit_infos(self.path, self._next, newest)
        for v in range(self._next, newest + 1):
            self.commits[v] = (infos[v].timestamp_ms, self._ids(v))
        self._next = newest + 1

    def get(self, version: int) -> tuple[int, np.ndarray] | None:
        if version not in self.commits:
            self.read_new()
        return self.commits.get(version)


class FreshnessWatch:
    """Latencies of the commits of ``events`` into ``output`` (local Delta tables; the
    rows matched on ``id_column``), by :func:`latency_s` (see the module doc)."""

    def __init__(self, events: str, output: str, id_column: str = "event_id") -> None:
        self.events, self.output = _Log(events, id_column), _Log(output, id_column)

    def output_ms(self, version: int) -> int | None:
        """The commit timestamp (ms) of the first ``output`` commit holding a row of the
        events commit ``version`` (``None``: none holds one yet)."""
        got = self.events.get(version)
        if got is None or not len(got[1]):
            return None
        ids = got[1]
        lo, hi = ids[0], ids[-1]
        self.output.read_new()
        for v in sorted(self.output.commits):
            ts, out = self.output.commits[v]
            if not len(out) or out[-1] < lo or out[0] > hi:
                continue
            i = np.searchsorted(out, ids)
            if np.any(out[np.minimum(i, len(out) - 1)] == ids):
                return ts
        return None

    def latency_s(self, version: int) -> float | None:
        """Seconds from the events commit ``version`` to the first output commit holding
        one of its rows (``None``: not landed yet)."""
        out = self.output_ms(version)
        got = self.events.get(version)
        return None if out is None or got is None else (out - got[0]) / 1000
