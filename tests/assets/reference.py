"""An independent pandas re-implementation of the batch rules, to check the Spark assets.

It shares no code with ``assets/``: thresholds and validation rules are written
out again here from the documented contract (README / module docstrings).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date, timedelta

import pandas as pd

TS = "%Y-%m-%d %H:%M:%S"
EVENT_TYPES = {"view", "add_to_cart", "purchase"}


def _ts(s: pd.Series) -> pd.Series:
    return pd.to_datetime(s, format=TS, errors="coerce")


def _missing(v: object) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _dedupe(df: pd.DataFrame, key: str, reason: str) -> pd.DataFrame:
    ok = df["reason"].isna()
    dup = ok & df[key].where(ok).duplicated(keep="first") & df[key].notna()
    df.loc[dup, "reason"] = reason
    return df


def users(raw: pd.DataFrame) -> pd.DataFrame:
    """Raw users with ``reason`` (None = accepted) and parsed ``signup``."""
    df = raw.copy()
    df["signup"] = _ts(df["signup_ts"])
    df["reason"] = None
    df.loc[df["signup"].isna(), "reason"] = "unparsable_signup_ts"
    df.loc[df["user_id"].isna(), "reason"] = "null_user_id"
    return _dedupe(df, "user_id", "duplicate_user_id")


def products(raw: pd.DataFrame) -> pd.DataFrame:
    """Raw products with ``reason``."""
    df = raw.copy()
    df["reason"] = None
    df.loc[df["price"] < 0, "reason"] = "negative_price"
    df.loc[df["price"].isna(), "reason"] = "nan_price"  # the generator never writes null
    df.loc[df["category"].isna(), "reason"] = "null_category"
    df.loc[df["product_id"].isna(), "reason"] = "null_product_id"
    return _dedupe(df, "product_id", "duplicate_product_id")


def events(raw: pd.DataFrame, dim_users: pd.DataFrame, dim_products: pd.DataFrame) -> pd.DataFrame:
    """Raw events with ``reason``, parsed ``ts`` and the product ``category``."""
    df = raw.copy()
    df["ts"] = _ts(df["event_time"])
    cats = dict(zip(dim_products["product_id"], dim_products["category"], strict=True))
    known_users = set(dim_users["user_id"])
    df["category"] = df["product_id"].map(cats)
    reasons = []  # the first failing rule, in the documented order
    for r in df.itertuples(index=False):
        if _missing(r.event_id):
            reasons.append("null_event_id")
        elif _missing(r.user_id):
            reasons.append("null_user_id")
        elif _missing(r.product_id):
            reasons.append("null_product_id")
        elif r.event_type not in EVENT_TYPES:
            reasons.append("unknown_event_type")
        elif _missing(r.amount):
            reasons.append("nan_amount")
        elif r.amount < 0:
            reasons.append("negative_amount")
        elif pd.isna(r.ts):
            reasons.append("unparsable_event_time")
        elif r.user_id not in known_users:
            reasons.append("unknown_user_id")
        elif _missing(r.category):
            reasons.append("unknown_product_id")
        else:
            reasons.append(None)
    df["reason"] = reasons
    df = df.sort_values("ingest_day", kind="stable").reset_index(drop=True)
    return _dedupe(df, "event_id", "duplicate_event_id")


@dataclass(frozen=True)
class Rules:
    vip_min_monetary: float = 750.0
    vip_max_recency: int = 2
    new_max_tenure: int = 6
    churn_min_recency: int = 3


def features(accepted: pd.DataFrame, dim_users: pd.DataFrame, day: date) -> pd.DataFrame:
    """Per-user features and segment as of the end of ``day`` (one row per user)."""
    rules = Rules()
    end = pd.Timestamp(day + timedelta(days=1))
    ev = accepted[accepted["ts"] < end]
    rows = []
    pop = dim_users[dim_users["signup"].dt.date <= day]
    by_user = {u: g for u, g in ev.groupby("user_id")}
    for u, signup in zip(pop["user_id"], pop["signup"], strict=True):
        g = by_user.get(u)
        tenure = (day - signup.date()).days
        if g is None:
            freq, monetary, purchases, last, recency, interests = 0, 0.0, 0, None, None, []
        else:
            freq = len(g)
            buys = g[g["event_type"] == "purchase"]
            monetary = round(float(buys["amount"].round(2).sum()), 2)
            purchases = len(buys)
            last = g["ts"].max()
            recency = (day - last.date()).days
            counts = g.groupby("category").size().reset_index(name="n")
            counts = counts.sort_values(["n", "category"], ascending=[False, True])
            interests = list(counts["category"][:3])
        if monetary >= rules.vip_min_monetary and recency is not None and (
            recency <= rules.vip_max_recency
        ):
            segment = "VIP"
        elif tenure <= rules.new_max_tenure:
            segment = "NEW"
        elif recency is None or recency >= rules.churn_min_recency:
            segment = "CHURNING"
        else:
            segment = "REGULAR"
        rows.append(
            {
                "user_id": int(u),
                "segment": segment,
                "recency_days": recency,
                "frequency": freq,
                "monetary": monetary,
                "purchases": purchases,
                "interests": interests,
                "last_event_at": last,
                "tenure_days": tenure,
            }
        )
    return pd.DataFrame(rows)


RECORD = ("segment", "lifetime_value", "interests")


def record_history(
    accepted: pd.DataFrame, dim_users: pd.DataFrame, days: list[date]
) -> list[tuple[date, pd.DataFrame, int]]:
    """Per day in order: (day, the user_segments table after it, users whose record
    changed that day). A record = segment, lifetime_value (= monetary), interests;
    ``updated_day`` = the last day that changed it; users gone from the day's
    population are deleted (and count as changed)."""
    table: dict[int, dict] = {}
    out = []
    for day in days:
        feats = features(accepted, dim_users, day)
        today = {
            int(r["user_id"]): {"user_id": int(r["user_id"]), "segment": r["segment"],
                                "lifetime_value": r["monetary"], "interests": r["interests"]}
            for r in feats.to_dict("records")
        }  # fmt: skip
        changed = 0
        for u, rec in today.items():
            old = table.get(u)
            if old is None or any(old[c] != rec[c] for c in RECORD):
                table[u] = {**rec, "updated_day": day}
                changed += 1
        for u in [u for u in table if u not in today]:
            del table[u]
            changed += 1
        snap = pd.DataFrame(list(table.values())).sort_values("user_id").reset_index(drop=True)
        out.append((day, snap, changed))
    return out
