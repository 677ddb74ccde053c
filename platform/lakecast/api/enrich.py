"""Declarative, vectorized enrichment: join events to broadcast states by key columns.

::

    fn = enrich(
        Lookup("dim_users", key="user_id", columns=["segment"], defaults={"segment": "NEW"}),
        Lookup("dim_products", key="product_id", columns={"name": "product_name"},
               on_missing="unmatched"),
    )

Each :class:`Lookup` keeps one table-shaped broadcast state (an Arrow table plus a
hash index on the key, kept warm in the task-local cache). A batch of events is
enriched with one hash probe and one ``take`` per lookup — no per-row Python.
Keys that are missing get the lookup's defaults (``on_missing="default"``), or send
the event to the ``unmatched`` side output, or hold it back (``"hold"``) to be retried.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakecast.api.contracts import InvalidVersionPolicy, RowCheck, TableContract
from lakecast.api.descriptors import (
    HELD,
    MISSING_POLICIES,
    UNMATCHED,
    MapStateDescriptor,
    MissingPolicy,
    OutputTag,
)
from lakecast.api.element import BroadcastElement
from lakecast.api.functions import BroadcastProcessFunction, Context, ReadOnlyContext


@dataclass(frozen=True)
class Lookup:
    """Join events to broadcast table ``table``.

    ``key``: event column name(s) equal to the state's key column(s); a mapping
    ``{event_column: state_column}`` when names differ. ``columns``: state columns to
    add (a list, or ``{state_column: output_column}``); all non-key columns by default.
    ``defaults``: value per output column for events whose key is missing (``None`` if
    not given). ``on_missing``: ``"default"`` / ``"unmatched"`` / ``"hold"`` (``None``:
    the enrichment's policy). ``on_invalid``: what happens to a version of the table with
    duplicate or null keys, a missing used column, or rows failing ``checks``
    (``"refuse_and_continue"`` | ``"fail"``, see :mod:`lakecast.api.contracts`).
    ``shards``: split the table into this many shards by its key, each task keeping only
    its shard, and route each batch's events to the tasks of their keys' shards (for a
    table larger than one task's memory: :mod:`lakecast.runtime.sharded_state`);
    ``"auto"``: the runtime chooses when it first reads the table, from its size and the
    state budget's share of one task (none when the table fits), and says so in its log.
    """

    table: str
    key: str | Sequence[str] | Mapping[str, str]
    columns: Sequence[str] | Mapping[str, str] | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)
    on_missing: MissingPolicy | None = None
    on_invalid: InvalidVersionPolicy = "refuse_and_continue"
    checks: Sequence[RowCheck] = ()
    shards: int | Literal["auto"] | None = None

    def __post_init__(self) -> None:
        if self.on_missing is not None and self.on_missing not in MISSING_POLICIES:
            raise ValueError(f"on_missing must be one of {MISSING_POLICIES}")
        if self.shards not in (None, "auto") and (
                isinstance(self.shards, bool) or not isinstance(self.shards, int)
                or self.shards < 1):
            raise ValueError(f"Lookup({self.table!r}): shards must be a whole number >= 1 "
                             f"or 'auto', got {self.shards!r}")

    @property
    def key_pairs(self) -> list[tuple[str, str]]:
        """(event column, state column) pairs."""
        if isinstance(self.key, str):
            return [(self.key, self.key)]
        if isinstance(self.key, Mapping):
            return list(self.key.items())
        return [(k, k) for k in self.key]

    @property
    def state_keys(self) -> list[str]:
        return [s for _, s in self.key_pairs]

    @property
    def descriptor(self) -> MapStateDescriptor:
        return MapStateDescriptor(self.table, tuple, dict, key_columns=tuple(self.state_keys),
                                  shards=None if self.shards == "auto" else self.shards)

    @property
    def contract(self) -> TableContract:
        """The lookup's :class:`~lakecast.api.contracts.TableContract`: its key, the columns
        it names, its checks and policy."""
        if isinstance(self.columns, Mapping):
            used = tuple(self.columns)
        else:
            used = tuple(self.columns or ())
        return TableContract(self.table, tuple(self.state_keys), used, tuple(self.checks),
                             self.on_invalid)

    def column_pairs(self, state_schema: pa.Schema | None) -> list[tuple[str, str]]:
        """(state column, output column) pairs."""
        if isinstance(self.columns, Mapping):
            return list(self.columns.items())
        if self.columns is not None:
            return [(c, c) for c in self.columns]
        if state_schema is None:
            raise ValueError(
                f"Lookup({self.table!r}) without columns needs the table's schema (bind_tables)"
            )
        return [(c, c) for c in state_schema.names if c not in self.state_keys]


class Enrichment(BroadcastProcessFunction):
    """A ready-made vectorized :class:`~lakecast.api.BroadcastProcessFunction`.

    Subclass it and override :meth:`transform` to add vectorized logic after the joins.
    """

    missing_state = "default"  # key misses are handled per lookup
    #: the columns :meth:`transform` reads (``None``: every column of the enriched batch).
    #: Set, ``transform`` gets a batch of just these columns and returns them with the
    #: columns it adds or replaces; every other column passes by it unchanged — and with
    #: the lookups in the executor JVM, only these columns go to the Python workers.
    transform_reads: ClassVar[Sequence[str] | None] = None

    def __init__(self, lookups: Sequence[Lookup], on_missing: MissingPolicy = "default") -> None:
        if on_missing not in MISSING_POLICIES:
            raise ValueError(f"on_missing must be one of {MISSING_POLICIES}")
        tables = [lk.table for lk in lookups]
        if len(set(tables)) != len(tables):
            raise ValueError(f"one Lookup per broadcast table, got {tables}")
        if not lookups:
            raise ValueError("an Enrichment needs at least one Lookup")
        sharded = [lk for lk in lookups if lk.shards]
        if len({(tuple(e for e, _ in lk.key_pairs), lk.shards) for lk in sharded}) > 1 or (
                "auto" in {lk.shards for lk in sharded} and len(sharded) > 1):
            raise ValueError(
                "sharded lookups of one Enrichment must share their event key columns and "
                "shard count (the events are routed by one key): got "
                + ", ".join(f"Lookup({lk.table!r}, key={[e for e, _ in lk.key_pairs]}, "
                            f"shards={lk.shards})" for lk in sharded))
        self.lookups = list(lookups)
        self.on_missing = on_missing
        self._schemas: dict[str, pa.Schema] = {}

    # -- declarations ----------------------------------------------------------------
    def routing(self) -> tuple[list[str], int] | None:
        """The event columns and shard count the events are routed by (its sharded
        lookups' keys), or ``None`` (no sharded lookup, or ``"auto"`` not chosen yet)."""
        for lk in self.lookups:
            if isinstance(lk.shards, int):
                return [e for e, _ in lk.key_pairs], lk.shards
        return None

    def choose_shards(self, table_bytes: Mapping[str, int], task_budget: int) -> list[str]:
        """Choose the shards of each ``Lookup(shards="auto")`` from its table's size (of
        ``table_bytes``) and one task's share of the state budget: none when the table
        fits it, else enough shards for a shard to fit; returns what was chosen, one line
        per lookup (for the log)."""
        said = []
        for i, lk in enumerate(self.lookups):
            if lk.shards != "auto" or lk.table not in table_bytes:
                continue
            size = table_bytes[lk.table]
            n = None if size <= task_budget else min(1024, -(-size // max(1, task_budget)))
            self.lookups[i] = replace(lk, shards=n)
            said.append(f"Lookup({lk.table!r}, shards='auto'): {size / 1e6:.1f} MB against "
                        f"{task_budget / 1e6:.1f} MB per task: "
                        + ("not sharded" if n is None else f"{n} shards"))
        return said

    def state_descriptors(self) -> Sequence[MapStateDescriptor]:
        return [lk.descriptor for lk in self.lookups]

    def table_contracts(self) -> Sequence[TableContract]:
        return [lk.contract for lk in self.lookups]

    def policy(self, lookup: Lookup) -> MissingPolicy:
        return lookup.on_missing or self.on_missing

    def side_output_tags(self) -> list[OutputTag]:
        policies = {self.policy(lk) for lk in self.lookups}
        tags = [t for t, p in ((UNMATCHED, "unmatched"), (HELD, "hold")) if p in policies]
        return tags + [t for t in self.output_tags() if t not in tags]

    def bind_tables(self, schemas: Mapping[str, pa.Schema]) -> None:
        self._schemas = {lk.table: schemas[lk.table] for lk in self.lookups if lk.table in schemas}

    def _column_type(self, lookup: Lookup, state_col: str, out_col: str, state_schema: Any) -> Any:
        for schema in (self._schemas.get(lookup.table), state_schema):
            if schema is not None and state_col in schema.names:
                return schema.field(state_col).type
        default = lookup.defaults.get(out_col)
        return pa.scalar(default).type if default is not None else pa.null()

    def enriched_columns(self) -> list[tuple[str, Any]]:
        """(output column, Arrow type) of every added column, in order."""
        out = []
        for lk in self.lookups:
            schema = self._schemas.get(lk.table)
            for s, o in lk.column_pairs(schema):
                out.append((o, self._column_type(lk, s, o, None)))
        return out

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        added = self.enriched_columns()
        clash = [n for n, _ in added if n in input_schema.names]
        if clash:
            raise ValueError(f"enriched columns {clash} already exist in the events")
        return pa.schema(list(input_schema) + [pa.field(n, t) for n, t in added])

    # -- broadcast side --------------------------------------------------------------
    def process_broadcast_element(self, value: Any, ctx: Context) -> None:
        if not isinstance(value, BroadcastElement):
            raise TypeError(f"Enrichment applies Delta BroadcastElements, got {type(value)}")
        for lk in self.lookups:
            if lk.table == value.table:
                state = ctx.get_broadcast_state(lk.descriptor)
                schema = self._schemas.get(lk.table) or value.rows.schema
                cols = [s for s, _ in lk.column_pairs(schema)]
                state.apply(value, value_columns=cols)

    # -- event side ------------------------------------------------------------------
    def process_batch(self, batch: Any, ctx: ReadOnlyContext) -> Iterable[Any]:
        n = batch.num_rows
        names = list(batch.schema.names)
        arrays = list(batch.columns)
        unmatched = np.zeros(n, dtype=bool)
        held = np.zeros(n, dtype=bool)
        for lk in self.lookups:
            state = ctx.get_broadcast_state(lk.descriptor)
            state_schema = state.schema
            pairs = lk.column_pairs(self._schemas.get(lk.table) or state_schema)
            keys = [batch.column(e) for e, _ in lk.key_pairs]
            if state_schema is None:
                taken, found = None, np.zeros(n, dtype=bool)
            else:
                taken, found = state.lookup(keys, [s for s, _ in pairs])
            all_found = bool(found.all())
            found_arr = None if all_found else pa.array(found)
            for s, o in pairs:
                typ = self._column_type(lk, s, o, state_schema)
                arr = pa.nulls(n, typ) if taken is None else taken.column(s)
                if isinstance(arr, pa.ChunkedArray):
                    arr = arr.combine_chunks()
                if arr.type != typ:
                    arr = pc.cast(arr, typ)
                default = lk.defaults.get(o)
                if default is not None and not all_found:
                    arr = pc.if_else(found_arr, arr, pa.scalar(default, typ))
                names.append(o)
                arrays.append(arr)
            if not all_found:
                policy = self.policy(lk)
                if policy == "unmatched":
                    unmatched |= ~found
                elif policy == "hold":
                    held |= ~found
        out = self.run_transform(pa.RecordBatch.from_arrays(arrays, names=names), ctx)
        if held.any() or unmatched.any():
            unmatched &= ~held
            if held.any():
                ctx.output(HELD, batch.filter(pa.array(held)))
            if unmatched.any():
                ctx.output(UNMATCHED, batch.filter(pa.array(unmatched)))
            out = out.filter(pa.array(~(held | unmatched)))
        return [out]

    def transform(self, batch: pa.RecordBatch, ctx: ReadOnlyContext) -> pa.RecordBatch:
        """Hook for vectorized logic on the enriched batch (same rows, may add columns —
        then also override :meth:`output_schema`)."""
        return batch

    def transform_columns(self, names: Sequence[str]) -> list[str]:
        """Which of the enriched batch's columns ``names`` :meth:`transform` gets: its
        :attr:`transform_reads` (all of ``names`` when ``None``); a clear error for a
        declared column the batch does not have."""
        if self.transform_reads is None:
            return list(names)
        missing = [c for c in self.transform_reads if c not in names]
        if missing:
            raise ValueError(
                f"{type(self).__name__}.transform_reads names {missing}, which the enriched "
                f"batch does not have (its columns: {list(names)}): name the events' and "
                "the lookups' output columns transform reads")
        return list(self.transform_reads)

    def transform_input(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """What :meth:`transform` gets of the enriched ``batch``
        (:meth:`transform_columns`)."""
        if self.transform_reads is None:
            return batch
        return batch.select(self.transform_columns(batch.schema.names))

    def run_transform(self, batch: pa.RecordBatch, ctx: ReadOnlyContext) -> pa.RecordBatch:
        """:meth:`transform` over the enriched ``batch``: with :attr:`transform_reads`,
        over those columns, the others kept as they are and the columns it returns
        replacing or following them."""
        got = self.transform(self.transform_input(batch), ctx)
        if self.transform_reads is None or got.num_rows != batch.num_rows:
            return got
        returned = set(got.schema.names)
        kept = [c for c in batch.schema.names if c not in returned]
        return pa.RecordBatch.from_arrays(
            [*(batch.column(c) for c in kept), *got.columns],
            names=[*kept, *got.schema.names])


def enrich(*lookups: Lookup, on_missing: MissingPolicy = "default") -> Enrichment:
    """A vectorized enrichment of events with one or more broadcast tables."""
    return Enrichment(list(lookups), on_missing=on_missing)
