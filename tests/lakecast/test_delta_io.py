"""Delta round trip through the factory's session and the Delta I/O layer."""

from __future__ import annotations

import pandas as pd
from pyspark.sql import functions as F

from lakecast import delta_io


def _frame(spark, rows):
    return spark.createDataFrame(pd.DataFrame(rows, columns=["id", "name", "score"]))


def test_round_trip_merge_time_travel_history_and_cdf(spark, lake):
    path = lake.table_path("people")
    assert delta_io.latest_version(path) is None

    v0 = delta_io.write(_frame(spark, [(1, "a", 1.0), (2, "b", 2.0)]), path, mode="overwrite")
    v1 = delta_io.write(_frame(spark, [(3, "c", 3.0)]), path)
    assert (v0, v1) == (0, 1)
    assert delta_io.table_properties(spark, path)[delta_io.CDF_PROPERTY] == "true"

    # MERGE: one changed row, one unchanged row, one new row
    res = delta_io.merge_upsert(
        spark, _frame(spark, [(1, "a", 1.0), (2, "b", 20.0), (4, "d", 4.0)]), path, keys=["id"]
    )
    assert (res.version, res.inserted, res.updated, res.deleted) == (2, 1, 1, 0)

    now = delta_io.read(spark, path).toPandas().sort_values("id").reset_index(drop=True)
    expected = pd.DataFrame(
        {"id": [1, 2, 3, 4], "name": list("abcd"), "score": [1.0, 20.0, 3.0, 4.0]}
    )
    pd.testing.assert_frame_equal(now, expected, check_dtype=False)

    # time travel
    assert delta_io.read(spark, path, version=0).count() == 2
    assert delta_io.read(spark, path, version=1).count() == 3

    # history, newest first, and cheap log reads agree with it
    hist = delta_io.history(spark, path)
    assert [h["version"] for h in hist] == [2, 1, 0]
    assert hist[0]["operation"] == "MERGE"
    assert delta_io.latest_version(path) == 2
    assert delta_io.commit_info(path, 2).operation == "MERGE"

    # Change Data Feed of the MERGE holds only the changed and inserted rows
    cdf = delta_io.read_changes(spark, path, 2, 2).select("id", "_change_type").toPandas()
    got = sorted(map(tuple, cdf.itertuples(index=False)))
    assert got == [(2, "update_postimage"), (2, "update_preimage"), (4, "insert")]

    # CDF between two versions spans both commits
    span = delta_io.read_changes(spark, path, 1, 2)
    assert span.select(F.countDistinct("_commit_version")).first()[0] == 2


def test_idempotent_write_with_txn(spark, lake):
    path = lake.table_path("txn")
    df = _frame(spark, [(1, "a", 1.0)])
    delta_io.write(df, path, txn=("app", 0))
    delta_io.write(df, path, txn=("app", 0))  # a retry: skipped by Delta
    delta_io.write(df, path, txn=("app", 1))
    assert delta_io.read(spark, path).count() == 2


def test_merge_without_changes_commits_nothing_new(spark, lake):
    path = lake.table_path("same")
    rows = [(1, "a", 1.0), (2, "b", 2.0)]
    first = delta_io.merge_upsert(spark, _frame(spark, rows), path, keys=["id"])
    assert first.created and first.inserted == 2
    again = delta_io.merge_upsert(spark, _frame(spark, rows), path, keys=["id"])
    assert again.changed == 0
    assert again.version == first.version == delta_io.latest_version(path)  # no empty commit
    assert delta_io.read_changes(spark, path, again.version, again.version).filter(
        "_change_type != 'insert' OR _commit_version > 0"
    ).count() == 0
