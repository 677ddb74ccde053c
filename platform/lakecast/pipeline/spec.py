"""The tables of a micro-batch pipeline: :class:`PipelineSpec`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from lakecast.pipeline.dedup import DedupSpec


@dataclass(frozen=True)
class PipelineSpec:
    """Tables of a pipeline. ``side_outputs`` maps side output name → Delta table name."""

    name: str
    events_table: str
    broadcast_tables: tuple[str, ...]
    output_table: str
    side_outputs: Mapping[str, str] = field(default_factory=dict)
    rejected_table: str | None = None
    max_versions_per_batch: int | None = None
    #: a table the runtime writes in ``commit_state`` (e.g. a keyed function's state,
    #: :mod:`lakecast.runtime.keyed`): versioned with the outputs, rolled back with them
    state_table: str | None = None
    #: reject valid events whose key an earlier batch accepted (:mod:`.dedup`)
    dedup: DedupSpec | None = None
    #: keep the events the function holds here and offer them again to each following
    #: batch, until their state arrives or ``hold_timeout`` (by plan time) sends them to
    #: the ``unmatched`` side output (:mod:`.held`)
    held_table: str | None = None
    hold_timeout: timedelta = timedelta(0)
    #: an events commit that deletes or updates rows: ``"fail"`` the batch (a clear
    #: error), or ``"skip"`` it whole, as Delta's ``skipChangeCommits`` (:mod:`.events`)
    events_rewrites: str = "fail"

    def __post_init__(self) -> None:
        if self.events_rewrites not in ("fail", "skip"):
            from lakecast.errors import ConfigError

            raise ConfigError(f"{self.name}: events_rewrites must be 'fail' or 'skip', not "
                              f"{self.events_rewrites!r}")

    @property
    def output_tables(self) -> list[str]:
        """Every table a batch writes (main, side outputs, rejected, keyed state): the
        tables a rewind rolls back."""
        extra = (self.rejected_table, self.state_table, self.held_table)
        return [self.output_table, *self.side_outputs.values(), *(t for t in extra if t)]
