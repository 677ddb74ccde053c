"""The producer of ``scoring_events`` (the scoring pipeline's events table,
:mod:`jobs.scoring.pipeline`)
for the demo: each call appends ``n`` events in one commit, drawn from the lake's users.

An event is a user's features on the newest day of ``user_features`` (a user without
events yet has ``recency_days = tenure_days + 1``, as the training of ``models`` says)
with the user's segment in ``user_segments``; the users are drawn with replacement by
``random.Random(seed + the table's next version)`` (deterministic per seed and append).
Event ids follow the table's largest, ``ts`` (epoch ms) one second apart after its newest
(the first append: midnight after the features' day).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import TYPE_CHECKING, Any

from assets.tables import USER_FEATURES, USER_SEGMENTS
from jobs.scoring.pipeline import FEATURES, SCORING_EVENTS
from jobs.scoring.training import SCORING_EVENTS_SCHEMA
from lakecast.config import Settings
from lakecast.delta import io as delta_io
from lakecast.errors import LakecastError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DEFAULT_SEED", "ScoringAppend", "append_scoring_events", "current_users",
           "scoring_rows"]  # fmt: skip

DEFAULT_SEED = 23
Row = dict[str, Any]


@dataclass(frozen=True)
class ScoringAppend:
    """One append: the new Delta version of ``scoring_events``, its event ids
    ``first_event_id .. first_event_id + rows - 1`` and the features' day."""

    version: int
    first_event_id: int
    rows: int
    day: date


def current_users(spark: SparkSession, settings: Settings) -> tuple[date, list[Row]]:
    """(the newest day of ``user_features``, each user's ``user_id``, ``segment`` and
    :data:`jobs.scoring.pipeline.FEATURES` on that day), users in id order."""
    from pyspark.sql import functions as F

    feats_path, segs_path = settings.table_path(USER_FEATURES), settings.table_path(USER_SEGMENTS)
    for table, path in ((USER_FEATURES, feats_path), (USER_SEGMENTS, segs_path)):
        if delta_io.latest_version(path) is None:
            raise LakecastError(
                f"{SCORING_EVENTS} producer: no table {table} at {path}; materialize "
                f"{USER_FEATURES} and {USER_SEGMENTS} first (daily_segment_refresh_job)")
    feats = delta_io.read(spark, feats_path)
    day = feats.agg(F.max("day")).first()[0]
    values = {
        "recency_days": F.coalesce(F.col("recency_days"), F.col("tenure_days") + 1),
        "frequency": F.col("frequency"),
        "monetary": F.col("monetary"),
    }
    segments = delta_io.read(spark, segs_path).select("user_id", "segment")
    rows = (feats.filter(F.col("day") == F.lit(day)).join(segments, "user_id")
            .select("user_id", "segment", *(values[f].cast("double").alias(f) for f in FEATURES))
            .orderBy("user_id").collect())  # fmt: skip
    users = [r.asDict() for r in rows]
    if not users:
        raise LakecastError(
            f"{SCORING_EVENTS} producer: no user of {USER_FEATURES} on {day} has a segment in "
            f"{USER_SEGMENTS}; materialize {USER_SEGMENTS} for {day} (daily_segment_refresh_job)")
    return day, users


def scoring_rows(users: list[Row], n: int, seed: int, first_event_id: int,
                 start_ts: int) -> list[Row]:
    """``n`` events of users drawn from ``users`` (see the module docstring)."""
    rnd = random.Random(seed)
    rows = []
    for j in range(n):
        user = rnd.choice(users)
        rows.append({"event_id": first_event_id + j, "user_id": user["user_id"],
                     "segment": user["segment"], **{f: user[f] for f in FEATURES},
                     "ts": start_ts + 1_000 * j})  # fmt: skip
    return rows


def append_scoring_events(spark: SparkSession, settings: Settings, n: int = 300, *,
                          seed: int = DEFAULT_SEED) -> ScoringAppend:
    """Append ``n`` events to ``scoring_events`` in one commit (the table is created by
    the first append)."""
    from pyspark.sql import functions as F

    day, users = current_users(spark, settings)
    path = settings.table_path(SCORING_EVENTS)
    version = delta_io.latest_version(path)
    top = (None, None) if version is None else (
        delta_io.read(spark, path).agg(F.max("event_id"), F.max("ts")).first())
    if top[0] is None:  # no event yet
        first_id = 0
        midnight = datetime.combine(day + timedelta(days=1), time(), tzinfo=UTC)
        start_ts = int(midnight.timestamp() * 1000)
    else:
        first_id, start_ts = int(top[0]) + 1, int(top[1]) + 1_000
    rows = scoring_rows(users, n, seed + (0 if version is None else version + 1), first_id,
                        start_ts)
    columns = [c.split()[0] for c in SCORING_EVENTS_SCHEMA.split(", ")]
    frame = spark.createDataFrame([tuple(r[c] for c in columns) for r in rows],
                                  SCORING_EVENTS_SCHEMA)
    new_version = delta_io.write(frame, path, mode="append")
    return ScoringAppend(new_version, first_id, len(rows), day)
