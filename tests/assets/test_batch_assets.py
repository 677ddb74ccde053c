"""Batch assets end to end on a small generated lake, checked against pandas."""

from __future__ import annotations

import subprocess
import sys
from datetime import date
from pathlib import Path

import pandas as pd
from dagster import (
    AssetCheckKey,
    AssetKey,
    DagsterInstance,
    DagsterRunStatus,
)
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from assets import datagen, producer
from assets.tables import (
    DIM_PRODUCTS,
    DIM_USERS,
    EVENTS,
    QUARANTINE,
    RAW_PRODUCTS,
    RAW_USERS,
    USER_FEATURES,
    USER_SEGMENTS,
)
from lakecast.delta import io as delta_io
from tests import ROOT as PROJECT_ROOT
from tests.assets import reference
from tests.assets.conftest import DAYS, DIM_ONLY, DIMS, SEGMENTS, SMALL, run_assets
from tests.runs import remote_env

SEGMENT_COLUMNS = ["user_id", "segment", "lifetime_value", "interests", "updated_day"]
FEATURE_COLUMNS = [
    "user_id", "recency_days", "frequency", "monetary", "purchases", "interests",
    "last_event_at", "tenure_days",
]  # fmt: skip
SEGMENT_ASSETS = f"{USER_FEATURES},{USER_SEGMENTS}"


def cli_backfill(selection: str, first: str, last: str, remote: str | None = None) -> str:
    """``dagster asset materialize --partition-range first...last`` in a subprocess with this
    process's environment (temp lake, DAGSTER_HOME), a client of the Spark server at
    ``remote`` (``None``: its own Spark); returns the one run's id."""
    dagster = Path(sys.executable).parent / "dagster"
    cmd = [
        str(dagster), "asset", "materialize", "-m", "jobs.definitions",
        "--select", selection, "--partition-range", f"{first}...{last}",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=PROJECT_ROOT, env=remote_env(remote), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with DagsterInstance.get() as instance:
        runs = instance.get_runs()
    assert len(runs) == 1 and runs[0].status == DagsterRunStatus.SUCCESS
    return runs[0].run_id


def _pdf(spark, settings, name: str, version: int | None = None) -> pd.DataFrame:
    return delta_io.read(spark, settings.table_path(name), version=version).toPandas()


def _materializations(result, key: str) -> list:
    return [
        e.materialization
        for e in result.get_asset_materialization_events()
        if e.materialization.asset_key == AssetKey(key)
    ]


def _by_partition(instance: DagsterInstance, key: str) -> dict[str, dict]:
    """The latest materialization metadata of each partition of ``key`` (plain values)."""
    records = instance.fetch_materializations(AssetKey(key), limit=10_000,
                                              ascending=True).records
    return {
        r.partition_key: {k: v.value for k, v in r.asset_materialization.metadata.items()}
        for r in records
    }


def _segments_table(frame: pd.DataFrame) -> pd.DataFrame:
    df = frame[SEGMENT_COLUMNS].sort_values("user_id").copy()
    df["lifetime_value"] = df["lifetime_value"].astype(float)
    df["interests"] = df["interests"].map(list)
    df["updated_day"] = pd.to_datetime(df["updated_day"]).dt.date
    return df.reset_index(drop=True)


def _features_of(spark, settings, day: date) -> pd.DataFrame:
    df = _pdf(spark, settings, USER_FEATURES)
    df = df[pd.to_datetime(df["day"]).dt.date == day][FEATURE_COLUMNS].sort_values("user_id")
    df["monetary"] = df["monetary"].astype(float)
    df["interests"] = df["interests"].map(list)
    df["recency_days"] = df["recency_days"].astype("Int64")
    return df.reset_index(drop=True)


def _expected_features(accepted, users, day: date) -> pd.DataFrame:
    df = reference.features(accepted, users, day)[FEATURE_COLUMNS].copy()
    df["recency_days"] = df["recency_days"].astype("Int64")
    df["last_event_at"] = pd.to_datetime(df["last_event_at"])
    return df.reset_index(drop=True)


def _add_a_vip(spark, lake) -> int:
    """Append 5 purchases of 200.00 on the last day by the accepted user who signed up
    first (a valid product): that user is VIP at the end of the last day whatever the
    generator drew, so every segment is in the small lake (asserted below). Returns the
    user's id."""
    pu = reference.users(_pdf(spark, lake, RAW_USERS))
    pp = reference.products(_pdf(spark, lake, RAW_PRODUCTS))
    user = int(pu[pu["reason"].isna()].sort_values(["signup", "user_id"])["user_id"].iloc[0])
    product = int(pp[pp["reason"].isna()]["product_id"].min())
    raw = delta_io.read(spark, lake.table_path(EVENTS))
    first_id = int(_pdf(spark, lake, EVENTS)["event_id"].max()) + 1
    day = DAYS[-1].isoformat()
    rows = [{"event_id": first_id + i, "user_id": user, "product_id": product,
             "event_type": "purchase", "amount": 200.0, "event_time": f"{day} 12:00:0{i}",
             "device": "web", "ingest_day": day} for i in range(5)]  # fmt: skip
    frame = spark.createDataFrame([tuple(r[c] for c in raw.columns) for r in rows], raw.schema)
    delta_io.write(frame, lake.table_path(EVENTS))
    return user


def test_cli_backfill_matches_pandas_quarantine_reconciles_and_reruns_change_nothing(
    spark, small_lake, spark_server, server_url
):
    lake = small_lake
    vip = _add_a_vip(spark, lake)
    dims = run_assets(DIMS)
    dim_meta = _materializations(dims, DIM_USERS)[0].metadata
    for key in ("dagster/row_count", "dagster/column_schema", "delta_version", "rows_inserted",
                "rows_updated", "rows_deleted", "quarantined_rows"):  # fmt: skip
        assert key in dim_meta, key

    # ---- dimensions == independent pandas cleaning of the same raw rows
    pu = reference.users(_pdf(spark, lake, RAW_USERS))
    pp = reference.products(_pdf(spark, lake, RAW_PRODUCTS))
    exp_users = pu[pu["reason"].isna()].sort_values("user_id").reset_index(drop=True)
    got_users = _pdf(spark, lake, DIM_USERS).sort_values("user_id").reset_index(drop=True)
    assert got_users["user_id"].tolist() == exp_users["user_id"].astype(int).tolist()
    assert got_users["country"].tolist() == exp_users["country"].tolist()
    assert (pd.to_datetime(got_users["signup_ts"]) == exp_users["signup"]).all()
    exp_products = pp[pp["reason"].isna()].sort_values("product_id").reset_index(drop=True)
    got_products = _pdf(spark, lake, DIM_PRODUCTS).sort_values("product_id").reset_index(drop=True)
    assert got_products["product_id"].tolist() == exp_products["product_id"].astype(int).tolist()
    assert got_products["price"].astype(float).tolist() == exp_products["price"].tolist()
    assert dim_meta["accepted_rows"].value == len(exp_users)
    assert dim_meta["quarantined_rows"].value == int(pu["reason"].notna().sum()) > 0

    # ---- three days in ONE run, through the Dagster CLI in a subprocess (on the test run's
    # Spark server, as under `make ui`)
    server_log = spark_server.log_file.stat().st_size
    run_id = cli_backfill(SEGMENT_ASSETS, SMALL.day_keys[0], SMALL.day_keys[-1], server_url)
    # the server (where the run's Spark work happened) logged no large task binary (issue
    # 20: locally checkpointed frames made each user_features task carry 1-2 MiB)
    with open(spark_server.log_file, "rb") as f:
        f.seek(server_log)
        logged = f.read().decode(errors="replace")
    assert "Broadcasting large task binary" not in logged, logged[-2000:]
    with DagsterInstance.get() as instance:  # the temp lake's DAGSTER_HOME
        seg_meta = _by_partition(instance, USER_SEGMENTS)
        feat_meta = _by_partition(instance, USER_FEATURES)
        assert sorted(seg_meta) == sorted(feat_meta) == SMALL.day_keys
        runs = {
            r.run_id
            for k in (USER_SEGMENTS, USER_FEATURES)
            for r in instance.fetch_materializations(AssetKey(k), limit=10_000).records
        }
        assert runs == {run_id}
        checks = instance.event_log_storage.get_latest_asset_check_execution_by_key(
            [AssetCheckKey(AssetKey(USER_SEGMENTS), n)
             for n in ("unique_non_null_keys", "segment_domain")]
            + [AssetCheckKey(AssetKey(USER_FEATURES), "counts_reconcile")]
        )  # fmt: skip
        assert len(checks) == 3
        for c in checks.values():
            assert c.run_id == run_id
            assert c.status == AssetCheckExecutionRecordStatus.SUCCEEDED
            assert c.event.dagster_event.event_specific_data.passed
    history = delta_io.history(spark, lake.table_path(USER_SEGMENTS))
    assert [h["operation"] for h in reversed(history)][1:] == ["MERGE", "MERGE"], "day by day"

    # ---- features per day and the segments table == pandas; per-partition counts
    pe = reference.events(_pdf(spark, lake, EVENTS), exp_users, exp_products)
    accepted = pe[pe["reason"].isna()]
    for day in DAYS:
        pd.testing.assert_frame_equal(
            _features_of(spark, lake, day), _expected_features(accepted, exp_users, day),
            check_dtype=False,
        )  # fmt: skip
    steps = reference.record_history(accepted, exp_users, DAYS)
    expected = steps[-1][1]
    got = _segments_table(_pdf(spark, lake, USER_SEGMENTS))
    pd.testing.assert_frame_equal(got, expected[SEGMENT_COLUMNS], check_dtype=False)
    # every segment is there (the VIP rule, too, is checked against the reference)
    assert set(expected["segment"]) == {"VIP", "NEW", "CHURNING", "REGULAR"}
    assert expected.set_index("user_id").loc[vip, "segment"] == "VIP"
    raw_events = _pdf(spark, lake, EVENTS)
    for day, snapshot, changed in steps:
        key = day.isoformat()
        m = seg_meta[key]
        sizes = snapshot["segment"].value_counts()
        for s in ("VIP", "NEW", "CHURNING", "REGULAR"):
            assert m[f"segment_{s.lower()}"] == sizes.get(s, 0), (key, s)
        assert m["changed_users"] == changed and m["input_rows"] == len(snapshot), key
        f = feat_meta[key]
        n_in = int((raw_events["ingest_day"] == key).sum())
        n_ok = int(((pe["ingest_day"] == key) & pe["reason"].isna()).sum())
        assert (f["input_rows"], f["accepted_rows"], f["quarantined_rows"]) == (
            n_in, n_ok, n_in - n_ok)  # fmt: skip
        assert f["dagster/row_count"] == len(snapshot)
    assert len({m["changed_users"] for m in seg_meta.values()}) > 1, "per day, not totals"
    assert seg_meta[SMALL.day_keys[-1]]["segment_vip"] >= 1

    # ---- quarantine: every bad row with its reason; input = accepted + quarantined per day
    q = _pdf(spark, lake, QUARANTINE)
    q_events = q[q["asset"] == USER_FEATURES]
    got_reasons = q_events.groupby(["partition_key", "reason"]).size().to_dict()
    bad = pe[pe["reason"].notna()]
    assert got_reasons == bad.groupby(["ingest_day", "reason"]).size().to_dict()
    assert {"null_user_id", "unknown_user_id", "unknown_product_id", "negative_amount",
            "nan_amount", "unparsable_event_time", "duplicate_event_id",
            "unknown_event_type"} <= set(bad["reason"])  # fmt: skip
    q_users = q[q["asset"] == DIM_USERS]
    assert q_users["reason"].value_counts().to_dict() == pu["reason"].value_counts().to_dict()
    assert q_users["partition_key"].isna().all()
    assert q_events["raw_record"].str.startswith("{").all()
    assert q["quarantined_at"].notna().all() and (q["source_table"] != "").all()
    for day in SMALL.day_keys:
        n_in = int((raw_events["ingest_day"] == day).sum())
        n_ok = int(((pe["ingest_day"] == day) & pe["reason"].isna()).sum())
        assert n_in == n_ok + int((q_events["partition_key"] == day).sum())

    # ---- the same partitions again (in-process, one run), then an older one after the
    # newest: no table changes, nothing is duplicated
    paths = [lake.table_path(t) for t in (USER_SEGMENTS, USER_FEATURES)]
    before = [delta_io.latest_version(p) for p in paths]
    features_before = _pdf(spark, lake, USER_FEATURES)
    for kwargs in (
        {"partition_range": (SMALL.day_keys[0], SMALL.day_keys[-1])},
        {"partition_key": SMALL.day_keys[0]},
    ):
        again = run_assets(SEGMENTS, **kwargs)
        for m in _materializations(again, USER_SEGMENTS):
            assert m.metadata["changed_users"].value == 0
        for m in _materializations(again, USER_FEATURES):
            assert m.metadata["rewritten"].value is False
            assert m.metadata["quarantined_rows"].value > 0
    assert [delta_io.latest_version(p) for p in paths] == before, "no commit at all"
    pd.testing.assert_frame_equal(_segments_table(_pdf(spark, lake, USER_SEGMENTS)), got)
    assert len(_pdf(spark, lake, USER_FEATURES)) == len(features_before)
    q2 = _pdf(spark, lake, QUARANTINE)
    assert len(q2) == len(q)
    assert sorted(q2["raw_record"]) == sorted(q["raw_record"])


def test_one_percent_refresh_commits_only_the_changed_rows(spark, lake):
    # ~1000 users, ~100 products; events are not needed for the dimensions
    users = datagen.users_frame(spark, 1_000, 5)
    delta_io.write(users, lake.table_path(RAW_USERS), mode="overwrite")
    delta_io.write(datagen.products_frame(spark, 100, 5), lake.table_path(RAW_PRODUCTS))
    run_assets(DIM_ONLY)
    before_u = reference.users(_pdf(spark, lake, RAW_USERS))
    before_p = reference.products(_pdf(spark, lake, RAW_PRODUCTS))
    refresh = datagen.refresh_dimensions(spark, lake, seed=3, fraction=0.01)
    assert sum(refresh.users) > 0 and sum(refresh.products) > 0
    v_users = delta_io.latest_version(lake.table_path(DIM_USERS))
    v_products = delta_io.latest_version(lake.table_path(DIM_PRODUCTS))
    result = run_assets(DIM_ONLY)
    after_u = reference.users(_pdf(spark, lake, RAW_USERS))
    after_p = reference.products(_pdf(spark, lake, RAW_PRODUCTS))

    cases = [
        (DIM_USERS, "user_id", before_u, after_u, ["name", "email", "country", "signup"], v_users),
        (DIM_PRODUCTS, "product_id", before_p, after_p, ["name", "category", "price"], v_products),
    ]
    for table, key, before, after, cols, v_before in cases:
        b = before[before["reason"].isna()].set_index(key)[cols]
        a = after[after["reason"].isna()].set_index(key)[cols]
        inserted = len(a.index.difference(b.index))
        deleted = len(b.index.difference(a.index))
        common = a.index.intersection(b.index)
        updated = int((a.loc[common] != b.loc[common]).any(axis=1).sum())
        assert 0 < inserted + updated + deleted <= 0.03 * len(b), (inserted, updated, deleted)

        path = lake.table_path(table)
        v_after = delta_io.latest_version(path)
        assert v_after == v_before + 1, "one MERGE commit"
        cdf = delta_io.read_changes(spark, path, v_after, v_after).toPandas()
        kinds = cdf["_change_type"].value_counts().to_dict()
        assert kinds.get("insert", 0) == inserted
        assert kinds.get("delete", 0) == deleted
        assert kinds.get("update_postimage", 0) == kinds.get("update_preimage", 0) == updated
        assert len(cdf) == inserted + deleted + 2 * updated
        meta = _materializations(result, table)[0].metadata
        assert (meta["rows_inserted"].value, meta["rows_updated"].value,
                meta["rows_deleted"].value) == (inserted, updated, deleted)  # fmt: skip
        assert meta["delta_version"].value == v_after
        assert delta_io.read(spark, path).count() == len(a)


def test_generator_is_deterministic_and_appends_events(spark, lake):
    spec = datagen.GenSpec(scale=0.02, seed=3, days=2)
    first = datagen.events_frame(spark, 2_000, 3, n_users=40, n_products=10).toPandas()
    second = datagen.events_frame(spark, 2_000, 3, n_users=40, n_products=10).toPandas()
    pd.testing.assert_frame_equal(first, second)
    assert first["event_time"].map(type).eq(str).all()

    datagen.generate(spark, lake, spec)
    n_before = delta_io.read(spark, lake.table_path(EVENTS)).count()
    max_id = int(_pdf(spark, lake, EVENTS)["event_id"].max())
    res = producer.append_events(spark, lake, 500, day=date(2026, 1, 3))
    assert res.first_event_id == max_id + 1 and 0 < res.rows <= 500
    events = _pdf(spark, lake, EVENTS)
    assert len(events) == n_before + res.rows
    new = events[events["event_id"] > max_id]
    assert set(new["ingest_day"]) == {"2026-01-03"}
    assert new["event_time"].str.startswith("2026-01-03").sum() >= 0.95 * len(new)
