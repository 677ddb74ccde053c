"""Replaying the batches of a keyed pipeline: :class:`KeyedReplay`.

A keyed batch's output depends on the keyed state the batches before it built (flags,
timers, entries with a TTL, the watermark, the broadcast versions the state has seen).
The keyed state table holds one Delta version per batch
(:mod:`lakecast.runtime.keyed_store`) and each batch's commit records the version it left
(``BatchCommit.output_versions``), so the state as of the batch before the first replayed
one is time travel to that version. :class:`KeyedReplay` copies it (compacted, with its
meta) into a scratch table and runs each replayed batch on a replica of the pipeline's
runtime pointed at the copy — the batch's own id, plan time (TTL and processing-time
timers) and broadcast versions, the watermark carried in the state — then commits the
batch's state changes to the copy, as the pipeline did to its own table. The pipeline's
keyed state table is only read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakecast.runtime.keyed import KeyedBroadcastRuntime
from lakecast.runtime.keyed_tasks import STATE_SIDE, StateMeta

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lakecast.pipeline.progress import BatchPlan
    from lakecast.runtime.collected import CollectedOutput

#: the scratch keyed state of a replay into table ``T`` is the table ``T`` + this
STATE_SUFFIX = "_keyed_state"


def start_meta(live: KeyedBroadcastRuntime, version: int | None) -> StateMeta | None:
    """The meta of the pipeline's keyed state at ``version`` (``None``: no state)."""
    return None if version is None else live.store.meta_at(version)


class KeyedReplay:
    """Batches of a keyed pipeline run again from its keyed state at ``version`` of its
    state table (``None``: empty, the first batch), in the scratch table ``state_path``
    (replaced)."""

    def __init__(self, live: KeyedBroadcastRuntime, state_path: str,
                 version: int | None) -> None:
        live.store.copy_to(state_path, version)
        self.runtime = live.replica(state_path)

    def run(self, events: DataFrame, plan: BatchPlan) -> CollectedOutput:
        """One batch (one Spark job, collected as Arrow); its keyed state is committed to
        the scratch table, ready for the next batch."""
        result = self.runtime.process_batch(events, plan)
        out = result.collect()
        self.runtime.commit(result, out.sides[STATE_SIDE])
        return out

    def close(self) -> None:
        self.runtime.close()


__all__ = ["STATE_SUFFIX", "KeyedReplay", "start_meta"]
