"""A small hand-made lake for the micro-batch tests, and an independent pandas model."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from assets import flags
from assets.tables import DIM_PRODUCTS, EVENTS, USER_SEGMENTS
from lakecast.delta import io as delta_io

EVENT_COLUMNS = [
    "event_id", "user_id", "product_id", "event_type", "amount", "event_time", "device",
    "ingest_day",
]  # fmt: skip
#: the enrichment pipeline's default dedup retention (``LAKECAST_DEDUP_RETENTION``)
RETENTION = pd.Timedelta(days=7)
EVENTS_SCHEMA = (
    "event_id LONG, user_id LONG, product_id LONG, event_type STRING, amount DOUBLE, "
    "event_time STRING, device STRING, ingest_day STRING"
)


def products() -> pd.DataFrame:
    return pd.DataFrame(
        {"product_id": [1, 2, 3, 4], "name": ["p1", "p2", "p3", "p4"],
         "category": ["books", "toys", "home", "music"], "price": [10.0, 20.0, 30.0, 40.0]}
    )  # fmt: skip


def segments_v1() -> pd.DataFrame:
    return pd.DataFrame({"user_id": [1, 2, 3, 4], "segment": ["VIP", "REGULAR", "CHURNING", "VIP"]})


def events(first_id: int, n: int, seed: int) -> pd.DataFrame:
    """``n`` events; users 1..6 (5 and 6 unsegmented), products 1..5 (5 unknown),
    plus malformed rows: null user, NaN and negative amounts, bad timestamp,
    unknown type, and a duplicate event id."""
    rng = np.random.default_rng(seed)
    ids = np.arange(first_id, first_id + n)
    df = pd.DataFrame({
        "event_id": ids,
        "user_id": rng.integers(1, 7, n).astype("float"),
        "product_id": rng.integers(1, 6, n),
        "event_type": rng.choice(["view", "add_to_cart", "purchase"], n),
        "amount": np.round(rng.uniform(1, 100, n), 2),
        "event_time": [f"2026-01-0{1 + i % 7} 10:00:{i % 60:02d}" for i in ids],
        "device": "web",
        "ingest_day": "2026-01-01",
    })  # fmt: skip
    df.loc[0, "user_id"] = np.nan
    df.loc[1, "amount"] = np.nan
    df.loc[2, "amount"] = -5.0
    df.loc[3, "event_time"] = "not-a-timestamp"
    df.loc[4, "event_type"] = "click"
    dup = df.iloc[[5]].copy()
    return pd.concat([df, dup], ignore_index=True)


def write_events(spark, lake, frame: pd.DataFrame) -> int:
    def clean(col: str, v: object) -> object:
        if isinstance(v, float) and np.isnan(v) and col != "amount":
            return None
        return int(v) if col in ("event_id", "user_id", "product_id") else v

    rows = [tuple(clean(c, v) for c, v in zip(EVENT_COLUMNS, r, strict=True))
            for r in frame[EVENT_COLUMNS].itertuples(index=False)]  # fmt: skip
    return delta_io.write(spark.createDataFrame(rows, EVENTS_SCHEMA), lake.table_path(EVENTS))


def build(spark, lake) -> None:
    """Broadcast tables at their first version (flag vip_discount = 10%)."""
    delta_io.write(spark.createDataFrame(products()), lake.table_path(DIM_PRODUCTS))
    delta_io.write(spark.createDataFrame(segments_v1()), lake.table_path(USER_SEGMENTS))
    flags.set_flag(spark, lake.table_path("feature_flags"), "vip_discount", "10")


def expected(ev: pd.DataFrame, segs: pd.DataFrame, vip_pct: float,
             prods: pd.DataFrame | None = None, *, prior: pd.DataFrame | None = None,
             retention: pd.Timedelta = RETENTION, accept_late: bool = False
             ) -> dict[str, pd.DataFrame]:
    """The outputs of one batch, computed with pandas: rejected / unmatched / enriched,
    and ``accepted`` (event_id, ts of the enriched and unmatched events) (``prods``:
    dim_products, default :func:`products`; ``prior``: the ``accepted`` of earlier
    batches, for cross-batch duplicates and late events, see :func:`expected_batches`;
    ``accept_late``: events older than the horizon are accepted unchecked)."""
    ev = ev.copy()
    ts = pd.to_datetime(ev["event_time"], format="%Y-%m-%d %H:%M:%S", errors="coerce")
    reason = pd.Series([None] * len(ev), dtype=object)
    checks = [
        (ev["user_id"].isna(), "null_user_id"),
        (~ev["event_type"].isin(["view", "add_to_cart", "purchase"]), "unknown_event_type"),
        (ev["amount"].isna(), "nan_amount"),
        (ev["amount"] < 0, "negative_amount"),
        (ts.isna(), "unparsable_event_time"),
    ]
    for cond, why in checks:
        reason = reason.where(reason.notna() | ~cond, why)
    dup = ev.duplicated("event_id") & reason.isna()
    reason = reason.where(~dup, "duplicate_event_id")
    if prior is not None and len(prior):
        # retained: accepted events within the retention of the newest accepted time;
        # a duplicate: a retained event of the same id within the retention of this one
        kept = prior[prior["ts"] >= prior["ts"].max() - retention]
        earlier = [pd.isna(reason.iloc[i]) and any(
            abs(t - ts.iloc[i]) <= retention for t in kept.loc[kept.event_id == e, "ts"])
            for i, e in enumerate(ev["event_id"])]
        reason = reason.where(~pd.Series(earlier, index=reason.index), "duplicate_event_id")
        ev["earlier"] = earlier
        # too late: valid, not a duplicate, older than the newest accepted time - retention
        late = reason.isna() & (ts < prior["ts"].max() - retention) & (not accept_late)
        reason = reason.where(~late, "too_late_to_deduplicate")
        ev["late"] = late
    else:
        ev["earlier"] = ev["late"] = False
    ev["reason"] = reason
    ev["ts"] = ts
    valid = ev[ev["reason"].isna()]
    prods = (products() if prods is None else prods).rename(
        columns={"category": "product_category", "price": "product_price"})
    joined = valid.merge(prods[["product_id", "product_category", "product_price"]],
                         on="product_id", how="left")  # fmt: skip
    unmatched = joined[joined["product_category"].isna()]
    enriched = joined[joined["product_category"].notna()].merge(segs, on="user_id", how="left")
    enriched["segment"] = enriched["segment"].fillna("NEW")
    enriched["vip_discount_pct"] = np.where(enriched["segment"] == "VIP", vip_pct, 0.0)
    return {
        "rejected": ev[ev["reason"].notna()][["event_id", "reason", "earlier", "late"]],
        "unmatched": unmatched[["event_id"]],
        "enriched": enriched[["event_id", "user_id", "product_category", "product_price",
                              "segment", "vip_discount_pct"]],
        "accepted": valid[["event_id", "ts"]],
    }  # fmt: skip


def expected_batches(batches: list[pd.DataFrame], segs: pd.DataFrame, vip_pct: float,
                     retention: pd.Timedelta = RETENTION, accept_late: bool = False
                     ) -> dict[str, pd.DataFrame]:
    """:func:`expected` of one batch per frame, in order, each checked against the events
    the earlier ones accepted; the outputs concatenated (``earlier`` / ``late`` in
    ``rejected``: a duplicate of an earlier batch's event / older than the horizon;
    ``cross_batch`` / ``late``: how many per batch)."""
    prior = pd.DataFrame({"event_id": pd.Series([], dtype="int64"),
                          "ts": pd.Series([], dtype="datetime64[ns]")})
    outs = []
    for ev in batches:
        out = expected(ev, segs, vip_pct, prior=prior, retention=retention,
                       accept_late=accept_late)
        prior = pd.concat([prior, out["accepted"]], ignore_index=True)
        outs.append(out)
    merged = {k: pd.concat([o[k] for o in outs], ignore_index=True)
              for k in ("rejected", "unmatched", "enriched", "accepted")}
    merged["cross_batch"] = pd.DataFrame(
        {"batch": range(len(outs)), "n": [int(o["rejected"]["earlier"].sum()) for o in outs]})
    merged["late"] = pd.DataFrame(
        {"batch": range(len(outs)), "n": [int(o["rejected"]["late"].sum()) for o in outs]})
    return merged


def assert_exact(spark, lake, frames: list[pd.DataFrame]) -> None:
    """The pipeline's outputs in ``lake`` hold every event of ``frames`` once, as
    :func:`expected` says (segments v1, vip_discount 10%)."""
    from jobs.storefront.microbatch import (
        ENRICHED_EVENTS,
        ENRICHMENT_REJECTED,
        ENRICHMENT_UNMATCHED,
    )

    want = expected(pd.concat(frames, ignore_index=True), segments_v1(), 10.0)
    got = {t: delta_io.read(spark, lake.table_path(t)).toPandas()
           for t in (ENRICHED_EVENTS, ENRICHMENT_UNMATCHED, ENRICHMENT_REJECTED)}
    cols = ["event_id", "user_id", "product_category", "segment", "vip_discount_pct"]
    g = got[ENRICHED_EVENTS][cols].sort_values("event_id").reset_index(drop=True)
    w = want["enriched"][cols].sort_values("event_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(g, w, check_dtype=False)
    assert sorted(got[ENRICHMENT_UNMATCHED].event_id) == sorted(want["unmatched"].event_id)
    assert sorted(got[ENRICHMENT_REJECTED].reason) == sorted(want["rejected"].reason)


def versions(value: str) -> dict[str, int]:
    return json.loads(value)


def run_microbatch(crash_at: str | None = None, *args: str, remote: str | None = None) -> int:
    """``python -m jobs.storefront.microbatch --max-versions-per-batch 1 ARGS`` in a process of its
    own (``LAKECAST_CRASH_AT=crash_at``: SIGKILL at that point, between Spark actions), a
    client of the Spark server at ``remote`` (``None``: its own Spark); its return code
    (-9: killed). Raises when it fails otherwise."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys

    from tests import ROOT as PROJECT_ROOT
    from tests.runs import remote_env

    env = remote_env(remote, **({"LAKECAST_CRASH_AT": crash_at} if crash_at else {}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobs.storefront.microbatch", "--max-versions-per-batch", "1",
        *args],
        cwd=PROJECT_ROOT, env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    out, _ = proc.communicate(timeout=600)
    with contextlib.suppress(ProcessLookupError):  # no lingering JVM of a killed job
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(out)
    return proc.returncode


def skip_message(result) -> str:
    """The skip message of a sensor tick (a SkipReason, or a SensorResult without runs)."""
    from dagster import SkipReason

    reason = result if isinstance(result, SkipReason) else result.skip_reason
    return reason.skip_message if reason is not None else ""
