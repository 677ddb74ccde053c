"""How a runtime routes a batch's events to the tasks of a sharded state's shards, and how
it sizes them (:mod:`lakecast.runtime.sharded_state`).

A function with a sharded state says how its events are routed (``routing()``: the event
columns equal to the state's key, and the shard count); :func:`route` repartitions a
batch's events by them, cast as the table's key columns, so that task ``s`` gets the
events of shard ``s`` (:mod:`lakecast.runtime.shards`). :func:`choose_shards` settles
``Lookup(shards="auto")`` once, from the base's size and one task's share of the state
budget, and logs what it chose; :func:`per_task_bytes` is the budget's estimate of one
task's state, a sharded table counting its share.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakecast.api.element import BroadcastElement
from lakecast.runtime.shards import routing_columns

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lakecast.runtime.tasks import ChainLink

log = logging.getLogger(__name__)


def route(events: DataFrame, function: Any, schemas: Mapping[str, pa.Schema]) -> DataFrame:
    """``events`` repartitioned to the tasks of their keys' shards (as they are when the
    function has no sharded state)."""
    routing = function.routing()
    if routing is None:
        return events
    cols, shards = routing
    return events.repartition(shards, *routing_columns(
        cols, events.schema, _key_types(function, schemas, len(cols))))


def _key_types(function: Any, schemas: Mapping[str, pa.Schema], n: int
               ) -> list[pa.DataType | None] | None:
    """The key columns' types of the sharded state the events are routed to (as its
    table's schema says; ``None`` where not known yet)."""
    sharded = [d for d in function.state_descriptors() if d.shards]
    schema = schemas.get(sharded[0].name) if sharded else None
    if schema is None or len(sharded[0].key_columns) != n:
        return None
    return [schema.field(k).type if k in schema.names else None
            for k in sharded[0].key_columns]


def choose_shards(function: Any, elements: Iterable[BroadcastElement],
                  task_budget: int) -> None:
    """Settle the function's ``Lookup(shards="auto")`` from the sizes of the base's
    ``elements`` and ``task_budget`` (one task's share of the state budget); logged."""
    choose = getattr(function, "choose_shards", None)
    if choose is None:
        return
    sizes: dict[str, int] = {}
    for e in elements:
        sizes[e.table] = sizes.get(e.table, 0) + e.nbytes
    for line in choose(sizes, task_budget):
        log.info("%s", line)


def per_task_bytes(function: Any, chain: Iterable[ChainLink], whole: int) -> int:
    """One task's state as the chain's sizes estimate it: ``whole`` (every table whole)
    unless a table is sharded, whose share is its size over its shards."""
    shards = {d.name: d.shards for d in function.state_descriptors() if d.shards}
    links = list(chain)
    if not shards or not links:
        return whole
    return sum(n // (shards.get(t) or 1) for link in links for t, n in link.table_bytes.items())
