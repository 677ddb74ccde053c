"""Errors of checkpoints and restores."""

from __future__ import annotations

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


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The informative line of a (long, multi-line) Spark error message."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for marker in DAMAGED_READ_MARKERS:  # Spark's error condition first
        for ln in lines:
            if marker in ln and not ln.startswith("at "):
                return ln[:limit]
    return (lines[0] if lines else type(exc).__name__)[:limit]
