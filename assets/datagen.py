"""Deterministic raw-data generator for the batch layer (no Dagster here).

Everything is computed by Spark from ``spark.range`` and hash functions of
``(seed, salt, row id)``, so the same seed and scale always give the same rows,
and scale grows to tens of millions of events without Python loops.

Tables written (paths from ``settings.table_path``):

* ``raw_users``    user_id, name, email, country, signup_ts (string ``yyyy-MM-dd HH:mm:ss``)
* ``raw_products`` product_id, name, category, price (double)
* ``events``       event_id, user_id, product_id, event_type, amount, event_time (string),
  device, ingest_day (``yyyy-MM-dd``, partition column, assigned by the producer)

A small deterministic share of rows is malformed on purpose: null ids, ids
unknown to the dimensions, negative or NaN amounts and prices, unparsable
timestamps, unknown event types and exact duplicates. The batch assets
quarantine them (see ``assets/``).

CLI: ``python -m assets.datagen --scale 1 --seed 7``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING

from assets.tables import EVENTS, RAW_PRODUCTS, RAW_USERS
from lakecast.config import Settings, get_settings
from lakecast.delta import io as delta_io
from lakecast.spark import local_checkpoint

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

DATA_START = date(2026, 1, 1)
"""First day of generated events (and the start of the daily partitions)."""
DEFAULT_DAYS = 7
DEFAULT_SEED = 7
TS_FORMAT = "yyyy-MM-dd HH:mm:ss"
"""Spark datetime pattern of the raw timestamp strings."""
SIGNUP_LOOKBACK_DAYS = 60
CHURN_SHARE = 0.35

COUNTRIES = ("US", "DE", "FR", "GB", "IN", "BR", "JP", "ES", "IT", "CA")
CATEGORIES = (
    "books", "electronics", "fashion", "garden", "grocery", "health",
    "home", "music", "sports", "toys", "beauty", "automotive",
)  # fmt: skip
EVENT_TYPES = ("view", "add_to_cart", "purchase")
DEVICES = ("web", "ios", "android")
BAD_TIMESTAMPS = ("not-a-timestamp", "2026-13-45 99:99:99", "")

# Shares of malformed rows (per generated row, by a hash of the row id).
USER_BAD = {"null_id": 0.01, "bad_signup_ts": 0.01}
USER_DUP = 0.01
PRODUCT_BAD = {"null_id": 0.01, "negative_price": 0.005, "nan_price": 0.005}
PRODUCT_DUP = 0.01
EVENT_BAD = {
    "null_user": 0.004,
    "unknown_user": 0.004,
    "unknown_product": 0.004,
    "negative_amount": 0.004,
    "nan_amount": 0.004,
    "bad_time": 0.004,
    "bad_type": 0.003,
}
EVENT_DUP = 0.005
UNKNOWN_ID_OFFSET = 1_000_000_000

_PRIME = 1_000_003


@dataclass(frozen=True)
class GenSpec:
    """What to generate. ``scale=1`` is ~2k users, ~200 products, ~50k events over 7 days.

    ``n_events`` ids are drawn; ~30% are dropped (before signup / after churn).
    """

    scale: float = 1.0
    seed: int = DEFAULT_SEED
    days: int = DEFAULT_DAYS
    start: date = DATA_START

    @property
    def n_users(self) -> int:
        return max(20, round(2_000 * self.scale))

    @property
    def n_products(self) -> int:
        return max(10, round(200 * self.scale))

    @property
    def n_events(self) -> int:
        return max(100, round(70_000 * self.scale))

    @property
    def end(self) -> date:
        """Last generated day (inclusive)."""
        return self.start + timedelta(days=self.days - 1)

    @property
    def day_keys(self) -> list[str]:
        """The generated days as ``YYYY-MM-DD`` partition keys."""
        return [(self.start + timedelta(days=i)).isoformat() for i in range(self.days)]


@dataclass(frozen=True)
class RefreshResult:
    """Raw rows changed by :func:`refresh_dimensions` (per table: updated, deleted, inserted)."""

    users: tuple[int, int, int]
    products: tuple[int, int, int]
    versions: dict[str, int]


# --------------------------------------------------------------------------- helpers


def _epoch(d: date) -> int:
    return int(datetime(d.year, d.month, d.day, tzinfo=UTC).timestamp())


def _u(seed: int, salt: str, *cols: Column | str) -> Column:
    """A deterministic uniform number in [0, 1) from the seed, a salt and columns."""
    from pyspark.sql import functions as F

    h = F.xxhash64(F.lit(seed), F.lit(salt), *cols)
    return F.pmod(h, F.lit(_PRIME)).cast("double") / F.lit(float(_PRIME))


def _pick(options: Sequence[str], u: Column) -> Column:
    """One of ``options``, chosen by the uniform column ``u``."""
    from pyspark.sql import functions as F

    idx = F.least((u * len(options)).cast("int"), F.lit(len(options) - 1)) + 1
    return F.element_at(F.array(*[F.lit(o) for o in options]), idx)


def _cumulative(shares: dict[str, float]) -> list[tuple[str, float]]:
    out, acc = [], 0.0
    for kind, share in shares.items():
        acc += share
        out.append((kind, acc))
    return out


def _kind(u: Column, shares: dict[str, float], scale: float) -> Column:
    """The malformation kind of a row (null when the row is clean)."""
    from pyspark.sql import functions as F

    expr = None
    for kind, upper in _cumulative(shares):
        cond = u < F.lit(upper * scale)
        expr = F.when(cond, F.lit(kind)) if expr is None else expr.when(cond, F.lit(kind))
    assert expr is not None
    return expr.otherwise(F.lit(None).cast("string"))


# --------------------------------------------------------------------------- frames


def _signup_epoch(seed: int, user: Column, start: date, days: int) -> Column:
    """When user ``user`` signed up: uniform over the 60 days before ``start`` and the window."""
    from pyspark.sql import functions as F

    span = (SIGNUP_LOOKBACK_DAYS + days) * 86_400
    return F.lit(_epoch(start) - SIGNUP_LOOKBACK_DAYS * 86_400) + F.floor(
        _u(seed, "signup", user) * span
    ).cast("long")


def _churn_epoch(seed: int, user: Column, start: date, days: int) -> Column:
    """When user ``user`` stops producing events: ~35% of users churn from 3 days before
    ``start`` to the end of the window; the others never (null)."""
    from pyspark.sql import functions as F

    at = F.lit(_epoch(start) - 3 * 86_400) + F.floor(
        _u(seed, "churn_at", user) * (days + 3) * 86_400
    ).cast("long")
    return F.when(_u(seed, "churner", user) < CHURN_SHARE, at)


def users_frame(
    spark: SparkSession,
    n: int,
    seed: int,
    *,
    first_id: int = 1,
    start: date = DATA_START,
    days: int = DEFAULT_DAYS,
    bad_rate: float = 1.0,
) -> DataFrame:
    """``n`` raw users with ids from ``first_id``; ``bad_rate`` scales the malformed share."""
    from pyspark.sql import functions as F

    k = F.col("id")
    signup_epoch = _signup_epoch(seed, k, start, days)
    kind = _kind(_u(seed, "user_bad", k), USER_BAD, bad_rate)
    good_ts = F.date_format(F.timestamp_seconds(signup_epoch), TS_FORMAT)
    df = spark.range(first_id, first_id + n).select(
        F.when(kind == "null_id", F.lit(None).cast("long")).otherwise(k).alias("user_id"),
        F.concat(F.lit("user_"), k.cast("string")).alias("name"),
        F.concat(F.lit("user"), k.cast("string"), F.lit("@example.com")).alias("email"),
        _pick(COUNTRIES, _u(seed, "country", k)).alias("country"),
        F.when(kind == "bad_signup_ts", _pick(BAD_TIMESTAMPS, _u(seed, "bad_ts", k)))
        .otherwise(good_ts)
        .alias("signup_ts"),
        (_u(seed, "user_dup", k) < F.lit(USER_DUP * bad_rate)).alias("_dup"),
    )
    return df.unionByName(df.filter("_dup")).drop("_dup")


def products_frame(
    spark: SparkSession, n: int, seed: int, *, first_id: int = 1, bad_rate: float = 1.0
) -> DataFrame:
    """``n`` raw products with ids from ``first_id``."""
    from pyspark.sql import functions as F

    k = F.col("id")
    kind = _kind(_u(seed, "product_bad", k), PRODUCT_BAD, bad_rate)
    price = F.round(F.lit(1.0) + _u(seed, "price", k) * 299.0, 2)
    df = spark.range(first_id, first_id + n).select(
        F.when(kind == "null_id", F.lit(None).cast("long")).otherwise(k).alias("product_id"),
        F.concat(F.lit("product_"), k.cast("string")).alias("name"),
        _pick(CATEGORIES, _u(seed, "category", k)).alias("category"),
        F.when(kind == "negative_price", -price)
        .when(kind == "nan_price", F.lit(float("nan")))
        .otherwise(price)
        .alias("price"),
        (_u(seed, "product_dup", k) < F.lit(PRODUCT_DUP * bad_rate)).alias("_dup"),
    )
    return df.unionByName(df.filter("_dup")).drop("_dup")


def events_frame(
    spark: SparkSession,
    n: int,
    seed: int,
    *,
    n_users: int,
    n_products: int,
    start_event_id: int = 0,
    first_day: date = DATA_START,
    days: int = DEFAULT_DAYS,
    bad_rate: float = 1.0,
    users_start: date = DATA_START,
    users_days: int = DEFAULT_DAYS,
) -> DataFrame:
    """About ``n`` raw events spread evenly over ``days`` days from ``first_day``.

    Users and products are skewed (low ids are more active), ~10% of events are
    purchases. Event times fall inside their ``ingest_day``. Events a user would
    make before signing up or after churning are dropped (~35% of users churn by the end
    of the users' window, so for later days about a third of the ids are dropped), so
    there are fewer than ``n`` rows (``users_start``/``users_days`` must match the users').
    """
    from pyspark.sql import functions as F

    i = F.col("id")
    k = i + F.lit(start_event_id)
    day_idx = F.floor(i * days / F.lit(n)).cast("long")
    day_epoch = F.lit(_epoch(first_day)) + day_idx * 86_400
    event_epoch = day_epoch + F.floor(_u(seed, "second", k) * 86_400).cast("long")
    kind = _kind(_u(seed, "event_bad", k), EVENT_BAD, bad_rate)
    user = F.lit(1) + F.floor(F.pow(_u(seed, "user", k), 2) * n_users).cast("long")
    product = F.lit(1) + F.floor(F.pow(_u(seed, "product", k), 1.5) * n_products).cast("long")
    t = _u(seed, "type", k)
    event_type = F.when(t < 0.72, "view").when(t < 0.90, "add_to_cart").otherwise("purchase")
    amount = F.round(F.lit(5.0) + _u(seed, "amount", k) * 195.0, 2)
    alive = (event_epoch >= _signup_epoch(seed, user, users_start, users_days)) & (
        F.coalesce(event_epoch < _churn_epoch(seed, user, users_start, users_days), F.lit(True))
    )
    df = spark.range(0, n).filter(alive).select(
        k.alias("event_id"),
        F.when(kind == "null_user", F.lit(None).cast("long"))
        .when(kind == "unknown_user", F.lit(UNKNOWN_ID_OFFSET) + k)
        .otherwise(user)
        .alias("user_id"),
        F.when(kind == "unknown_product", F.lit(UNKNOWN_ID_OFFSET) + k)
        .otherwise(product)
        .alias("product_id"),
        F.when(kind == "bad_type", F.lit("click")).otherwise(event_type).alias("event_type"),
        F.when(kind == "negative_amount", -amount)
        .when(kind == "nan_amount", F.lit(float("nan")))
        .otherwise(amount)
        .alias("amount"),
        F.when(kind == "bad_time", _pick(BAD_TIMESTAMPS, _u(seed, "bad_time", k)))
        .otherwise(F.date_format(F.timestamp_seconds(event_epoch), TS_FORMAT))
        .alias("event_time"),
        _pick(DEVICES, _u(seed, "device", k)).alias("device"),
        F.date_format(F.timestamp_seconds(day_epoch), "yyyy-MM-dd").alias("ingest_day"),
        (_u(seed, "event_dup", k) < F.lit(EVENT_DUP * bad_rate)).alias("_dup"),
    )
    return df.unionByName(df.filter("_dup")).drop("_dup")


# --------------------------------------------------------------------------- writers


def generate(
    spark: SparkSession, settings: Settings | None = None, spec: GenSpec | None = None
) -> dict[str, int]:
    """Write (overwrite) raw_users, raw_products and events; return their Delta versions."""
    settings = settings or get_settings()
    spec = spec or GenSpec()
    users = users_frame(spark, spec.n_users, spec.seed, start=spec.start, days=spec.days)
    products = products_frame(spark, spec.n_products, spec.seed)
    events = events_frame(
        spark,
        spec.n_events,
        spec.seed,
        n_users=spec.n_users,
        n_products=spec.n_products,
        first_day=spec.start,
        days=spec.days,
        users_start=spec.start,
        users_days=spec.days,
    )
    return {
        RAW_USERS: delta_io.write(users, settings.table_path(RAW_USERS), mode="overwrite"),
        RAW_PRODUCTS: delta_io.write(
            products, settings.table_path(RAW_PRODUCTS), mode="overwrite"
        ),
        EVENTS: delta_io.write(
            events, settings.table_path(EVENTS), mode="overwrite", partition_by=("ingest_day",)
        ),
    }


def max_id(spark: SparkSession, path: str, column: str) -> int:
    """The largest ``column`` value of the table at ``path`` (0 when empty)."""
    from pyspark.sql import functions as F

    value = delta_io.read(spark, path).agg(F.max(column)).first()[0]
    return int(value) if value is not None else 0


def _refresh_table(
    spark: SparkSession,
    path: str,
    key: str,
    seed: int,
    fraction: float,
    update: dict[str, Column],
    new_rows: DataFrame,
) -> tuple[tuple[int, int, int], int]:
    """Update ~80% and delete ~20% of a ``fraction`` of rows, append ``new_rows``; overwrite."""
    from pyspark.sql import functions as F

    raw = delta_io.read(spark, path)
    # Rows are chosen by content, so an exact duplicate is chosen with its twin.
    u = _u(seed, f"refresh_{key}", F.to_json(F.struct(*raw.columns)))
    marked = local_checkpoint(raw.withColumn(
        "_op",
        F.when(u < fraction * 0.8, "update").when(u < fraction, "delete").otherwise("keep"),
    ))
    counts = {r["_op"]: r["count"] for r in marked.groupBy("_op").count().collect()}
    changed = marked.filter("_op != 'delete'").select(
        *[
            F.when(F.col("_op") == "update", update[c]).otherwise(F.col(c)).alias(c)
            if c in update
            else F.col(c)
            for c in raw.columns
        ]
    )
    out = changed.unionByName(new_rows.select(*raw.columns))
    inserted = new_rows.count()
    version = delta_io.write(out, path, mode="overwrite")
    return (counts.get("update", 0), counts.get("delete", 0), inserted), version


def refresh_dimensions(
    spark: SparkSession,
    settings: Settings | None = None,
    *,
    seed: int = 1,
    fraction: float = 0.01,
) -> RefreshResult:
    """Change ~``fraction`` of raw users and products (update most, delete some) and add a
    few new ones (~``fraction``/5), so re-materializing the dimensions is a small MERGE.

    Use a different ``seed`` per refresh to touch different rows.
    """
    from pyspark.sql import functions as F

    settings = settings or get_settings()
    users_path = settings.table_path(RAW_USERS)
    products_path = settings.table_path(RAW_PRODUCTS)
    n_users = max_id(spark, users_path, "user_id")
    n_products = max_id(spark, products_path, "product_id")
    n_new_users = max(1, round(n_users * fraction / 5))
    n_new_products = max(1, round(n_products * fraction / 5))
    salt = 1_000 + seed
    users, uv = _refresh_table(
        spark,
        users_path,
        "user_id",
        seed,
        fraction,
        {
            "email": F.concat(
                F.lit("user"), F.col("user_id").cast("string"), F.lit(f"+r{seed}@example.com")
            ),
            "country": _pick(COUNTRIES, _u(salt, "country", F.col("email"))),
        },
        users_frame(spark, n_new_users, salt, first_id=n_users + 1, bad_rate=0.0),
    )
    products, pv = _refresh_table(
        spark,
        products_path,
        "product_id",
        seed,
        fraction,
        {"price": F.round(F.col("price") * 1.1 + 1.0, 2)},
        products_frame(spark, n_new_products, salt, first_id=n_products + 1, bad_rate=0.0),
    )
    return RefreshResult(users, products, {RAW_USERS: uv, RAW_PRODUCTS: pv})


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m assets.datagen --scale 1 --seed 7 [--days 7] [--start 2026-01-01]``."""
    from lakecast.spark import get_spark

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--days", type=int, default=DEFAULT_DAYS)
    parser.add_argument("--start", type=date.fromisoformat, default=DATA_START)
    args = parser.parse_args(argv)
    spec = GenSpec(scale=args.scale, seed=args.seed, days=args.days, start=args.start)
    settings = get_settings()
    spark = get_spark(app_name="lakecast-datagen", settings=settings)
    versions = generate(spark, settings, spec)
    print(f"generated {spec} into {settings.lake_root}")
    for name, version in versions.items():
        rows = delta_io.read(spark, settings.table_path(name)).count()
        print(f"  {name:<13} version {version:>3}  rows {rows:>12,}")


if __name__ == "__main__":
    main()
