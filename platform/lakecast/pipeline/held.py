"""Held events: retried in every following batch until their state arrives, or a timeout.

A function holds an event it cannot process yet (``ctx.hold(value)``, a lookup's
``on_missing="hold"``): the event goes to the :data:`~lakecast.api.descriptors.HELD` side
output. A pipeline whose :class:`~lakecast.pipeline.micro_batch.PipelineSpec` names a
``held_table`` keeps those events and offers them again to each following batch:

* the **held set** after a batch is the held table **as of the version the batch's
  commit recorded** (the table is overwritten whole by each batch that changes it, with
  ``txnAppId``/``txnVersion`` = ``<pipeline>:held``/batch id, like every output). A batch
  reads the held set of the last committed batch — never the newest version: a batch
  redone after a crash re-offers exactly what its first attempt offered, and after a
  rewind the held set is the rolled-back one;
* the held events are **re-offered** after validation (they were validated when they
  arrived) with the batch's new events, to the same function at the batch's state
  version: an event whose state arrived is processed (e.g. enriched, with that
  ``_state_version``) and leaves the held set; one the function holds again stays;
* the **timeout** is measured by plan time: an event first held by the batch planned at
  ``T0`` is sent to the ``unmatched`` output (with ``_unmatched_reason`` =
  :data:`HOLD_TIMEOUT`) by the first batch planned at ``T >= T0 + timeout`` that still
  holds it. Plan times are in the progress log, so a redo decides the same. A timeout of 0
  holds nothing past its batch: a held event goes to unmatched at once, with
  :data:`MISSING_STATE`, as an event the function sent there itself.

Counts: events in + held re-offered = enriched + unmatched + rejected + held now (for a
function with one output row per event); each batch records ``held``, ``held_retried``
and ``held_expired``. The held set lives on the driver (Arrow) between the batch's job
and its write: it is meant to be small (events waiting for state), not a second stream.
A held event is matched to its earlier hold by its column values.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from lakecast.api.descriptors import HELD, UNMATCHED
from lakecast.delta import io as delta_io
from lakecast.errors import LakecastError
from lakecast.pipeline.dedup import settled_version

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakecast.pipeline.progress import BatchPlan

#: a batch's held set before it ran (``None``: none), and its event columns (asked lazily)
Held = tuple["pa.Table | None", Callable[[], list[str]]] | None

#: held-table columns: plan time (epoch ms) and batch id of the event's first hold
HELD_SINCE = "_held_since_ms"
HELD_BATCH = "_held_batch_id"
#: the unmatched output's column saying why an event is there
UNMATCHED_REASON = "_unmatched_reason"
#: the function found no state for the event (or held it with a timeout of 0)
MISSING_STATE = "missing_state"
#: the event was held until the hold timeout passed and its state never arrived
HOLD_TIMEOUT = "hold_timeout"
HELD_SIDE = HELD.name
UNMATCHED_SIDE = UNMATCHED.name
#: count keys of a batch with a held table
HELD_COUNTS = ("held", "held_retried", "held_expired")


@dataclass(frozen=True)
class HeldOutcome:
    """What one batch does with its held events: the held set it leaves (``held``, with
    :data:`HELD_SINCE`/:data:`HELD_BATCH`), the events it sends to unmatched (``expired``:
    the held output's columns and :data:`UNMATCHED_REASON`; ``timed_out`` of them held by
    an earlier batch), how many it re-offered, and whether the held table changes (it did
    or does hold something)."""

    held: pa.Table
    expired: pa.Table
    timed_out: int
    retried: int
    write: bool

    def apply(self, counts: dict[str, int]) -> None:
        """Move the expired events from ``held`` to ``unmatched`` in the batch's counts
        (``held_expired``: those held past the timeout, not those a timeout of 0 never
        held past their batch)."""
        counts[UNMATCHED_SIDE] = counts.get(UNMATCHED_SIDE, 0) + self.expired.num_rows
        counts.update(held=self.held.num_rows, held_retried=self.retried,
                      held_expired=self.timed_out)


class HeldEvents:
    """The held table of one pipeline (see the module docstring)."""

    def __init__(self, spark: SparkSession, pipeline: str, table: str, path: str,
                 timeout: timedelta) -> None:
        if timeout < timedelta(0):
            raise LakecastError(f"{pipeline}: the hold timeout must be >= 0, got {timeout}")
        self.spark = spark
        self.pipeline = pipeline
        self.table = table
        self.path = path
        self.timeout = timeout

    def prior(self, versions: Mapping[str, int]) -> pa.Table | None:
        """The held set the last committed batch left (``versions``: its recorded output
        versions); ``None`` when it left none."""
        version = versions.get(self.table, -1)
        if version < 0:
            return None
        version = settled_version(self.spark, self.path, version)
        try:
            rows = delta_io.table_files(self.path, version).read()
        except delta_io.DirectReadUnsupported:
            rows = delta_io.read(self.spark, self.path, version=version).toArrow()
        return rows if rows.num_rows else None

    def offer(self, valid: DataFrame, prior: pa.Table) -> DataFrame:
        """``valid`` (the batch's validated new events) with the held events of ``prior``
        added, in ``valid``'s columns and types."""
        from pyspark.sql import functions as F

        missing = [c for c in valid.columns if c not in prior.column_names]
        if missing:
            raise LakecastError(
                f"{self.pipeline}: the held events in {self.path} lack the event columns "
                f"{missing}; the events' schema changed while events were held. Move the held "
                f"events out of {self.table} (e.g. append them to the events table) and empty it")
        again = self.spark.createDataFrame(prior.select(valid.columns))
        again = again.select(*[F.col(f.name).cast(f.dataType).alias(f.name)
                               for f in valid.schema.fields])
        return valid.unionByName(again)

    def settle(self, held_rows: pa.Table | None, prior: pa.Table | None,
               event_columns: Callable[[], Sequence[str]], plan: BatchPlan) -> HeldOutcome:
        """Split the function's held output of this batch into the held set it leaves and
        the events past the timeout; an event held before keeps its first hold's time.
        ``event_columns`` is asked only when a held event is to be identified or the held
        set has no columns yet (over Spark Connect it is a schema request)."""
        now, limit = plan.planned_at_ms, int(self.timeout.total_seconds() * 1000)
        first: dict[str, tuple[int, int]] = {}
        if prior is not None:
            since = prior.column(HELD_SINCE).to_pylist()
            batch = prior.column(HELD_BATCH).to_pylist()
            for i, key in enumerate(_fingerprints(prior, event_columns())):
                first[key] = min(first.get(key, (since[i], batch[i])), (since[i], batch[i]))
        if held_rows is not None:
            rows = held_rows
        elif prior is not None:  # the function held nothing: an empty set, same columns
            rows = prior.drop_columns([HELD_SINCE, HELD_BATCH]).slice(0, 0)
        else:
            rows = pa.table({c: pa.array([], pa.null()) for c in event_columns()})
        found = [first.get(k, (now, plan.batch_id))
                 for k in _fingerprints(rows, event_columns())] if rows.num_rows else []
        since_col = pa.array([s for s, _ in found], pa.int64())
        batch_col = pa.array([b for _, b in found], pa.int64())
        expired = pc.less_equal(pc.add(since_col, limit), now)
        kept = (rows.append_column(HELD_SINCE, since_col).append_column(HELD_BATCH, batch_col)
                .filter(pc.invert(expired)))
        gone = rows.filter(expired)
        earlier = pc.less(since_col.filter(expired), now)
        reasons = pc.if_else(earlier, HOLD_TIMEOUT, MISSING_STATE)
        gone = gone.append_column(UNMATCHED_REASON, pc.cast(reasons, pa.string()))
        retried = 0 if prior is None else prior.num_rows
        return HeldOutcome(kept, gone, int(pc.sum(earlier).as_py() or 0), retried,
                           write=bool(retried or kept.num_rows))

    def route(self, sides: Mapping[str, Any], outcome: HeldOutcome, *, arrow: bool
              ) -> dict[str, Any]:
        """The side outputs to write: the function's unmatched rows with
        :data:`UNMATCHED_REASON` = :data:`MISSING_STATE`, then the expired held events
        (Arrow tables when ``arrow``, else DataFrames); the held output dropped."""
        out = {k: v for k, v in sides.items() if k != HELD_SIDE}
        own = out.get(UNMATCHED_SIDE)
        expired = outcome.expired
        if own is None and not expired.num_rows:
            return out
        if arrow:
            parts = [] if own is None else [own.append_column(
                UNMATCHED_REASON, pa.array([MISSING_STATE] * own.num_rows, pa.string()))]
            out[UNMATCHED_SIDE] = pa.concat_tables([*parts, expired],
                                                   promote_options="permissive")
            return out
        from pyspark.sql import functions as F

        frame = self.spark.createDataFrame(expired) if expired.num_rows else None
        if own is not None:
            own = own.withColumn(UNMATCHED_REASON, F.lit(MISSING_STATE))
            frame = own if frame is None else own.unionByName(frame, allowMissingColumns=True)
        out[UNMATCHED_SIDE] = frame
        return out

    def write(self, outcome: HeldOutcome, plan: BatchPlan) -> None:
        """Replace the held set with the batch's (exactly once per batch id)."""
        if outcome.write:
            delta_io.overwrite_arrow(outcome.held, self.path, create=True, replace_schema=True,
                                     txn=(f"{self.pipeline}:{HELD_SIDE}", plan.batch_id))


def _fingerprints(rows: pa.Table, columns: Sequence[str]) -> list[str]:
    """One string per row of ``rows`` naming its values in ``columns`` (timestamps as
    UTC microseconds, so Spark's and Delta's Arrow types compare)."""
    cols = []
    for c in sorted(columns):
        col = rows.column(c) if c in rows.column_names else pa.nulls(rows.num_rows)
        if pa.types.is_timestamp(col.type):
            col = pc.cast(pc.cast(col, pa.timestamp("us", tz="UTC")), pa.int64())
        cols.append(col.to_pylist())
    return [json.dumps(values, default=str) for values in zip(*cols, strict=True)] \
        if cols else [""] * rows.num_rows
