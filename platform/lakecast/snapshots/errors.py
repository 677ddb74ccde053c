"""Errors of checkpoints and restores."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lakecast.errors import LakecastError


class SnapshotError(LakecastError):
    """A checkpoint cannot be written or restored."""


class CheckpointDivergenceError(SnapshotError):
    """Tasks hold different broadcast state (a non-deterministic process_broadcast_element)."""

    def __init__(self, state: str, by_hash: Mapping[str, Sequence[int]], checkpoint_id: int):
        self.state = state
        self.by_hash = {h: sorted(t) for h, t in by_hash.items()}
        groups = "; ".join(f"tasks {ts} hold {h[:12]}" for h, ts in self.by_hash.items())
        super().__init__(
            f"checkpoint {checkpoint_id} failed: broadcast state {state!r} differs across "
            f"tasks ({groups}). process_broadcast_element must be deterministic: every task "
            "applies the same elements and must end with the same state"
        )


class IncompleteCheckpointError(SnapshotError):
    """A checkpoint is missing rows or its content does not match its manifest."""
