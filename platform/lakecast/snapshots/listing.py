"""What people see of a snapshot table (``lakecast snapshots list / show / diff``):
one summary per checkpoint with its completeness, and readable entries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lakecast.delta import io as delta_io
from lakecast.snapshots.codec import readable_entries
from lakecast.snapshots.errors import (
    RefusedCheckpointError,
    SnapshotError,
    UnreadableCheckpointError,
    first_line,
    is_damaged_read,
)
from lakecast.snapshots.records import CheckpointHeader, ManifestRow, parse_manifest_row
from lakecast.snapshots.store import SnapshotStore
from lakecast.snapshots.table import ENTRY, MANIFEST


@dataclass
class CheckpointSummary:
    """One line of ``lakecast snapshots list``."""

    header: CheckpointHeader
    delta_version: int | None
    stored_bytes: int | None
    entries: int  # stored entry rows (all distinct contents)
    state_bytes: int  # serialized bytes of one task's state
    problem: str | None = None

    @property
    def complete(self) -> bool:
        return self.problem is None


def _manifests_and_counts(store: SnapshotStore, checkpoint_id: int | None = None
                          ) -> tuple[dict[int, list[ManifestRow]],
                                     dict[int, dict[tuple[str, str], tuple[int, int]]]]:
    from pyspark.sql import functions as F

    df = store.spark.read.format("delta").load(store.path)
    if checkpoint_id is not None:
        df = df.where(F.col("checkpoint_id") == int(checkpoint_id))
    man_rows = df.where(f"kind = '{MANIFEST}'").select(
        "checkpoint_id", "task", "state", "content_hash", "n_entries", "meta").collect()
    manifests: dict[int, list[ManifestRow]] = {}
    for r in man_rows:
        try:
            row = parse_manifest_row(r[0], r[1], r[2], r[3], r[4], r[5])
        except RefusedCheckpointError as e:
            store.refused.setdefault(r[0], str(e))
            continue
        manifests.setdefault(r[0], []).append(row)
    cnt_rows = (df.where(f"kind = '{ENTRY}'").groupBy("checkpoint_id", "state", "content_hash")
                .agg(F.count("*"), F.sum(F.length("key") + F.length("value"))).collect())
    counts: dict[int, dict[tuple[str, str], tuple[int, int]]] = {}
    for r in cnt_rows:
        counts.setdefault(r[0], {})[(r[1], r[2])] = (int(r[3]), int(r[4] or 0))
    return manifests, counts


def summaries(store: SnapshotStore) -> list[CheckpointSummary]:
    """Every checkpoint with sizes and its completeness (cheap structural check); a
    checkpoint whose files cannot be read is listed with that problem."""
    if not store.exists():
        return []
    headers = store.headers()
    broken = dict(store.unreadable)
    try:
        manifests, counts = _manifests_and_counts(store)
    except Exception as e:
        if not is_damaged_read(e):
            raise
        manifests, counts = {}, {}
        for h in headers:  # one checkpoint at a time: set the damaged ones aside
            try:
                m, c = _manifests_and_counts(store, h.checkpoint_id)
            except Exception as e2:
                if not is_damaged_read(e2):
                    raise
                broken[h.checkpoint_id] = first_line(e2)
                continue
            manifests.update(m)
            counts.update(c)
    versions = store.delta_versions()
    out = []
    for h in headers:
        cid = h.checkpoint_id
        man = manifests.get(cid, [])
        cnt = counts.get(cid, {})
        problem = (f"files cannot be read ({broken[cid]})" if cid in broken
                   else store.refused[cid] if cid in store.refused
                   else store.check_structure(h, man, cnt))
        dv = versions.get(cid)
        stored = None
        if dv is not None:
            try:
                stored = int(delta_io.commit_info(store.path, dv, store.spark)
                             .metrics.get("numOutputBytes", 0))
            except delta_io.DeltaIOError:
                stored = None
        task0 = [m for m in man if m.task == 0]
        state_bytes = sum(int(m.meta.get("bytes", 0)) for m in task0)
        out.append(CheckpointSummary(h, dv, stored, sum(c for c, _ in cnt.values()),
                                     state_bytes, problem))
    return out


def readable(store: SnapshotStore, checkpoint_id: int, m: ManifestRow) -> list[tuple[str, Any]]:
    """``(key JSON, value)`` of the content of manifest row ``m``, in key order."""
    header = store.header(checkpoint_id)
    t = store.entries(checkpoint_id, m.state, m.content_hash)
    values = t.column("value").to_pylist() if t.num_rows else []
    state = header.states[m.state]
    try:
        return readable_entries(state["kind"], values, m.meta.get("schema"),
                                state.get("key_columns", ()))
    except ValueError as e:
        raise UnreadableCheckpointError(
            f"checkpoint {checkpoint_id} state {m.state!r} cannot be read: {e}") from None


def diff(store: SnapshotStore, a: int, b: int) -> dict[str, dict[str, list[str]]]:
    """Per state: keys ``added`` / ``removed`` / ``changed`` from checkpoint a to b
    (task 0's content of each)."""
    out: dict[str, dict[str, list[str]]] = {}
    ma = {m.state: m for m in store.manifest(a) if m.task == 0}
    mb = {m.state: m for m in store.manifest(b) if m.task == 0}
    if not ma or not mb:
        raise SnapshotError(f"checkpoint {a if not ma else b} has no manifest for task 0")
    for s in sorted(set(ma) | set(mb)):
        if s in ma and s in mb and ma[s].content_hash == mb[s].content_hash:
            out[s] = {"added": [], "removed": [], "changed": []}
            continue
        ea = dict(readable(store, a, ma[s])) if s in ma else {}
        eb = dict(readable(store, b, mb[s])) if s in mb else {}
        out[s] = {
            "added": sorted(set(eb) - set(ea)),
            "removed": sorted(set(ea) - set(eb)),
            "changed": sorted(k for k in set(ea) & set(eb) if ea[k] != eb[k]),
        }
    return out
