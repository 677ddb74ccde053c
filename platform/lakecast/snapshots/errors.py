"""Errors of checkpoints and restores."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from lakecast.errors import LakecastError


class SnapshotError(LakecastError):
    """A checkpoint cannot be written or restored."""


class CheckpointDivergenceError(SnapshotError):
    """Tasks hold different broadcast state (a non-deterministic process_broadcast_element).

    Raised before the batch commits (``pipeline`` and ``batch_id`` given: nothing of the
    batch is written) or by a checkpoint taken outside a pipeline."""

    def __init__(self, state: str, by_hash: Mapping[str, Sequence[int]], checkpoint_id: int,
                 pipeline: str | None = None, batch_id: int | None = None):
        self.state = state
        self.by_hash = {h: sorted(t) for h, t in by_hash.items()}
        self.pipeline = pipeline
        self.batch_id = batch_id
        groups = "; ".join(f"tasks {ts} hold {h[:12]}" for h, ts in self.by_hash.items())
        where = (f"pipeline {pipeline!r} batch {batch_id} failed before commit (nothing of it "
                 "was written)" if pipeline is not None
                 else f"checkpoint {checkpoint_id} failed")
        super().__init__(
            f"{where}: broadcast state {state!r} differs across tasks ({groups}). "
            "process_broadcast_element must be deterministic: every task applies the same "
            "elements and must end with the same state (no random numbers, clocks, process "
            "ids or unordered iteration in it)"
        )


class IncompleteCheckpointError(SnapshotError):
    """A checkpoint is missing rows or its content does not match its manifest."""


class UnreadableCheckpointError(IncompleteCheckpointError):
    """A checkpoint's files cannot be read, or its content is not in the checkpoint format
    (e.g. a pickle written by an older Lakecast or forged): it is never loaded."""


class RefusedCheckpointError(UnreadableCheckpointError):
    """A checkpoint's header, manifest or a schema in them does not parse, or carries
    fields Lakecast never writes (rewritten by someone): it is refused, never loaded."""

    def __init__(self, checkpoint_id: int, part: str, reason: str) -> None:
        self.checkpoint_id = checkpoint_id
        self.part = part  # "header" | "manifest" | "schema"
        self.reason = reason
        super().__init__(f"checkpoint {checkpoint_id} refused: its {part} {reason}")


#: the messages of Spark/Delta errors that mean "a file of this table is damaged or gone"
DAMAGED_READ_MARKERS = (
    "FAILED_READ_FILE", "ChecksumException", "FileNotFoundException", "CANNOT_READ_FILE_FOOTER",
    "is not a Parquet file", "DELTA_FILE_NOT_FOUND", "PATH_NOT_FOUND",
)


def is_damaged_read(exc: BaseException) -> bool:
    """Whether ``exc`` is a Spark (classic or Connect) / py4j error reading a damaged or
    missing data file — and nothing else (other Spark errors are not)."""
    module = type(exc).__module__ or ""
    if not (module.startswith("pyspark") or module.startswith("py4j")):
        return False
    text = str(exc)
    return any(m in text for m in DAMAGED_READ_MARKERS)


_CONDITION = re.compile(r"\[([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)\]")
_DATA_FILE = re.compile(r"([^/\s'\"]+\.(?:parquet|json|crc|checkpoint))\b")
_CAUSE = re.compile(r"^Caused by: (?:[\w$]+\.)*([\w$]+)(?::|$)")


def first_line(exc: BaseException, limit: int = 200) -> str:
    """One clean line for a (long, multi-line, Java-traced) Spark read error: the error
    condition, the file and the root cause's class, e.g. ``FAILED_READ_FILE.NO_HINT
    reading part-0001.snappy.parquet (ChecksumException)``; never a stack line."""
    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("at ", "..."))]
    cond = _CONDITION.search(text)
    marker = cond.group(1) if cond else next((m for m in DAMAGED_READ_MARKERS if m in text),
                                             None)
    if marker is None:
        head = lines[0] if lines else type(exc).__name__
        return head.removeprefix("Caused by: ")[:limit]
    found = _DATA_FILE.search(text)
    causes = [m.group(1) for ln in lines if (m := _CAUSE.match(ln))]
    cause = next((c for c in reversed(causes) if not c.endswith("SparkException")), None)
    out = marker + (f" reading {found.group(1)}" if found else "")
    return (out + (f" ({cause})" if cause and cause not in out else ""))[:limit]
