"""What a restore puts in the chain: :class:`SnapshotElement` s and the wrapper that loads them.

Restored state enters a runtime's chain as one :class:`SnapshotElement` per broadcast
table (carrying the table's checkpointed version; the first carries every state's
content). :class:`SnapshotAware` wraps the user's function so that applying them loads
the states directly — never through the user's ``process_broadcast_element``; every other
call goes to the user's function unchanged. :func:`declared_states` is what every
checkpoint records of the function's states.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from lakecast.api.descriptors import MapStateDescriptor
from lakecast.api.element import BroadcastElement
from lakecast.api.functions import BroadcastProcessFunction, Context, ReadOnlyContext
from lakecast.snapshots.codec import load_into


@dataclass(frozen=True, eq=False)
class SnapshotElement(BroadcastElement):
    """A broadcast element standing for "table ``table`` at ``version``, restored from a
    checkpoint". ``rows`` is empty (with the table's schema); the first element of a
    restore carries every state's content in ``contents``."""

    contents: Mapping[str, tuple[str, Any]] | None = None
    checkpoint_id: int = -1
    entries: int = 0
    content_bytes: int = 0

    @property
    def num_rows(self) -> int:
        return self.entries

    @property
    def nbytes(self) -> int:
        return self.content_bytes


class SnapshotAware(BroadcastProcessFunction):
    """Wraps a function so that :class:`SnapshotElement` s load checkpointed state; every
    other call is delegated to the wrapped function unchanged."""

    def __init__(self, inner: BroadcastProcessFunction) -> None:
        self.inner = inner

    # delegation -------------------------------------------------------------------------
    @property
    def missing_state(self) -> Any:  # type: ignore[override]
        return self.inner.missing_state

    @property
    def batch_format(self) -> Any:  # type: ignore[override]
        return self.inner.batch_format

    def is_vectorized(self) -> bool:  # type: ignore[override]
        return self.inner.is_vectorized()

    def state_descriptors(self) -> Sequence[MapStateDescriptor]:
        return self.inner.state_descriptors()

    def routing(self) -> tuple[list[str], int] | None:
        return self.inner.routing()

    def choose_shards(self, table_bytes: Mapping[str, int], task_budget: int) -> list[str]:
        choose = getattr(self.inner, "choose_shards", None)
        return [] if choose is None else choose(table_bytes, task_budget)

    def output_tags(self) -> Sequence[Any]:
        return self.inner.output_tags()

    def table_contracts(self) -> Sequence[Any]:
        return self.inner.table_contracts()

    def side_output_tags(self) -> list[Any]:
        return self.inner.side_output_tags()

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        return self.inner.output_schema(input_schema)

    def bind_tables(self, schemas: Mapping[str, pa.Schema]) -> None:
        self.inner.bind_tables(schemas)

    def open(self) -> None:
        self.inner.open()

    def process_element(self, value: Any, ctx: ReadOnlyContext) -> Iterable[Any] | None:
        return self.inner.process_element(value, ctx)

    def process_batch(self, batch: Any, ctx: ReadOnlyContext) -> Any:
        return self.inner.process_batch(batch, ctx)

    def process_broadcast_element(self, value: Any, ctx: Context) -> Iterable[Any] | None:
        if isinstance(value, SnapshotElement):
            if value.contents is not None:
                declared = {d.name: d for d in self.inner.state_descriptors()}
                for name, (kind, content) in value.contents.items():
                    load_into(ctx.get_broadcast_state(declared[name]), kind, content)
            return None
        return self.inner.process_broadcast_element(value, ctx)


def declared_states(function: BroadcastProcessFunction) -> dict[str, dict[str, Any]]:
    """``{state: {"kind", "key_columns"}}`` of a function (stored in every checkpoint)."""
    return {d.name: {"kind": "table" if d.table_shaped else "dict",
                     "key_columns": list(d.key_columns)}
            for d in function.state_descriptors()}
