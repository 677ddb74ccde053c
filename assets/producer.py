"""The live producer: append generated events to the events table, one commit at a time.

Used by ``lakecast produce`` and the demo. Rows come from
:func:`assets.datagen.events_frame` (deterministic per seed).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING

from assets.datagen import DEFAULT_SEED, events_frame, max_id
from assets.tables import EVENTS, RAW_PRODUCTS, RAW_USERS
from lakecast.config import Settings, get_settings
from lakecast.delta import io as delta_io
from lakecast.spark import local_checkpoint

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class AppendResult:
    """Outcome of :func:`append_events`.

    ``first_event_id..last_event_id`` is the range of ids drawn (``produced`` events);
    the events of churned users are dropped (``dropped``), so some ids in it are unused.
    ``rows`` = produced - dropped + ``duplicates`` (exact copies, malformed on purpose);
    ``first_written..last_written`` are the ids the commit holds (``None``: no row).
    """

    first_event_id: int
    last_event_id: int
    rows: int
    day: date
    version: int
    produced: int = 0
    dropped: int = 0
    duplicates: int = 0
    first_written: int | None = None
    last_written: int | None = None



def append_events(
    spark: SparkSession,
    settings: Settings | None = None,
    n: int = 1_000,
    *,
    seed: int = DEFAULT_SEED,
    start_event_id: int | None = None,
    day: date | None = None,
    txn: tuple[str, int] | None = None,
    bad_rate: float = 1.0,
) -> AppendResult:
    """Produce ``n`` new events for ``day`` (default: today, UTC) and append them in one
    commit — the live producer.

    Events whose user had churned (or not signed up) by the event time are dropped:
    about a third of them after the generated window, since ~35% of users churn in it.
    Ids continue after the table's largest ``event_id`` unless ``start_event_id`` is
    given, so the ids of successive appends never overlap; users and products are drawn
    from the raw tables' id ranges. ``txn=(app_id, version)`` makes a retried append a
    no-op (see ``delta_io.write``).
    """
    from pyspark.sql import functions as F

    settings = settings or get_settings()
    path = settings.table_path(EVENTS)
    if start_event_id is None:
        start_event_id = max_id(spark, path, "event_id") + 1 if delta_io.table_exists(path) else 0
    day = day or datetime.now(UTC).date()
    df = local_checkpoint(events_frame(
        spark,
        n,
        seed,
        n_users=max(1, max_id(spark, settings.table_path(RAW_USERS), "user_id")),
        n_products=max(1, max_id(spark, settings.table_path(RAW_PRODUCTS), "product_id")),
        start_event_id=start_event_id,
        first_day=day,
        days=1,
        bad_rate=bad_rate,
    ))  # the rows counted are the rows written
    stats = df.agg(F.count(F.lit(1)), F.count_distinct("event_id"), F.min("event_id"),
                   F.max("event_id")).first()  # fmt: skip
    rows, distinct = int(stats[0]), int(stats[1])
    version = delta_io.write(df, path, partition_by=("ingest_day",), txn=txn)
    return AppendResult(start_event_id, start_event_id + n - 1, rows, day, version,
                        produced=n, dropped=n - distinct, duplicates=rows - distinct,
                        first_written=stats[2], last_written=stats[3])  # fmt: skip
