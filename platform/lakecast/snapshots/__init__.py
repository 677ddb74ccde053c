"""Broadcast state checkpoints versioned in Delta: restore, rescale, rewind.

- :mod:`~lakecast.snapshots.codec`         canonical serialization and content hashes
- :mod:`~lakecast.snapshots.table`         the snapshot table: its layout, a write, reads
- :mod:`~lakecast.snapshots.store`         which checkpoints are complete, restore, retain
- :mod:`~lakecast.snapshots.tasks`         what a task runs during a checkpoint
- :mod:`~lakecast.snapshots.runtime`       SnapshottingRuntime: checkpoint and restore hooks
- :mod:`~lakecast.snapshots.capture`       a checkpoint taken: manifest job, divergence, commit
- :mod:`~lakecast.snapshots.restored`      what a restore puts in the chain (SnapshotAware)
- :mod:`~lakecast.snapshots.checkpointer`  when to checkpoint, what to keep, restore_checkpoint
- :mod:`~lakecast.snapshots.listing`       summaries, readable entries, diffs (the CLI)
- :mod:`~lakecast.snapshots.horizon`       the output versions rewinds can restore (VACUUM)
- :mod:`~lakecast.snapshots.errors`        SnapshotError and its kinds
"""

from lakecast.snapshots.checkpointer import Checkpointer, CheckpointResult, restore_checkpoint
from lakecast.snapshots.errors import (
    CheckpointDivergenceError,
    IncompleteCheckpointError,
    SnapshotError,
    UnreadableCheckpointError,
)
from lakecast.snapshots.runtime import SnapshottingRuntime
from lakecast.snapshots.store import SnapshotStore

__all__ = [
    "CheckpointDivergenceError", "CheckpointResult", "Checkpointer",
    "IncompleteCheckpointError", "SnapshotError", "SnapshotStore", "SnapshottingRuntime",
    "UnreadableCheckpointError", "restore_checkpoint",
]
