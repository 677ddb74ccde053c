"""user_segments commits only the users whose record changed: over the demo week, per
daily commit, rows in the commit (Change Data Feed) = users whose record changed (pandas
diff of consecutive versions read with time travel) — ratio 1.0."""

from __future__ import annotations

from datetime import date

import pandas as pd
import pyarrow as pa
from dagster import AssetKey, DagsterInstance
from deltalake import DeltaTable

from assets import datagen
from assets.tables import (
    EVENTS,
    RAW_PRODUCTS,
    RAW_USERS,
    USER_FEATURES,
    USER_SEGMENTS,
)
from lakecast.delta import io as delta_io
from tests.assets import reference
from tests.assets.conftest import DIMS, SEGMENTS, run_assets

WEEK = datagen.GenSpec(scale=0.1, seed=11)
"""The datagen's default days (the demo week), at a small scale."""
RECORD = ["segment", "lifetime_value", "interests"]
CHANGES = ("insert", "update_postimage", "delete")


def _records(path: str, version: int) -> tuple[pd.DataFrame, str]:
    """The table's records at ``version`` and its newest ``updated_day`` (read with
    ``deltalake``, independently of Spark)."""
    df = DeltaTable(path, version=version).to_pandas().set_index("user_id")
    df["lifetime_value"] = df["lifetime_value"].astype(float)
    df["interests"] = df["interests"].map(tuple)
    return df[RECORD], str(df["updated_day"].max())


def changed_users(before: pd.DataFrame, after: pd.DataFrame) -> int:
    """Users inserted, deleted, or whose record differs between two versions."""
    inserted = after.index.difference(before.index)
    deleted = before.index.difference(after.index)
    common = after.index.intersection(before.index)
    differs = (after.loc[common, RECORD] != before.loc[common, RECORD]).any(axis=1)
    return len(inserted) + len(deleted) + int(differs.sum())


def commit_report(path: str) -> list[dict]:
    """Per version of the table: rows in its commit vs users whose record changed."""
    latest = DeltaTable(path).version()
    rows = []
    previous = pd.DataFrame(columns=["user_id", *RECORD]).set_index("user_id")
    for v in range(latest + 1):
        current, day = _records(path, v)
        if v == 0:
            in_commit = len(current)  # the creating write: every row is in it
        else:
            feed = DeltaTable(path).load_cdf(starting_version=v, ending_version=v)
            cdf = pa.table(feed.read_all()).select(["_change_type"]).to_pandas()
            in_commit = int(cdf["_change_type"].isin(CHANGES).sum())
        changed = changed_users(previous, current)
        rows.append({"version": v, "day": day, "rows_in_commit": in_commit,
                     "changed_users": changed})  # fmt: skip
        previous = current
    return rows


def test_daily_commits_hold_exactly_the_users_whose_record_changed(spark, lake):
    datagen.generate(spark, lake, WEEK)
    run_assets(DIMS)
    with DagsterInstance.get() as instance:  # the temp lake's DAGSTER_HOME
        run_assets(SEGMENTS, partition_range=(WEEK.day_keys[0], WEEK.day_keys[-1]),
                   instance=instance)  # fmt: skip
    path = lake.table_path(USER_SEGMENTS)
    report = commit_report(path)
    print(f"\n{'version':>7} {'day':>11} {'rows in commit':>15} {'users changed':>14} {'ratio':>6}")
    for r in report:
        ratio = r["rows_in_commit"] / r["changed_users"]
        print(f"{r['version']:>7} {r['day']:>11} {r['rows_in_commit']:>15} "
              f"{r['changed_users']:>14} {ratio:>6.2f}")  # fmt: skip
    assert all(r["changed_users"] > 0 for r in report), "no empty commit"
    assert all(r["rows_in_commit"] / r["changed_users"] == 1.0 for r in report), report

    # every day with a change has its one commit, and the counts match pandas from raw
    users = reference.users(delta_io.read(spark, lake.table_path(RAW_USERS)).toPandas())
    users = users[users["reason"].isna()]
    products = reference.products(delta_io.read(spark, lake.table_path(RAW_PRODUCTS)).toPandas())
    events = reference.events(delta_io.read(spark, lake.table_path(EVENTS)).toPandas(), users,
                              products[products["reason"].isna()])  # fmt: skip
    days = [date.fromisoformat(k) for k in WEEK.day_keys]
    steps = reference.record_history(events[events["reason"].isna()], users, days)
    expected = [(d.isoformat(), n) for d, _, n in steps if n > 0]
    assert [(r["day"], r["changed_users"]) for r in report] == expected
    assert len(report) >= 5, "the week has daily changes"
    total = len(steps[-1][1])
    assert sum(r["changed_users"] for r in report[1:]) < (len(report) - 1) * total, (
        "a daily commit is not the whole table"
    )

    # each partition's materialization carries its own day's changed users and input rows
    with DagsterInstance.get() as instance:
        records = instance.fetch_materializations(AssetKey(USER_SEGMENTS), limit=10_000).records
        feats = instance.fetch_materializations(AssetKey(USER_FEATURES), limit=10_000).records
    meta = {r.partition_key: r.asset_materialization.metadata for r in records}
    assert sorted(meta) == WEEK.day_keys and len({r.partition_key for r in feats}) == len(days)
    for day, snapshot, n in steps:
        m = meta[day.isoformat()]
        assert m["changed_users"].value == n and m["input_rows"].value == len(snapshot)
        sizes = snapshot["segment"].value_counts()
        assert m["segment_vip"].value == sizes.get("VIP", 0)
        assert m["segment_regular"].value == sizes.get("REGULAR", 0)
