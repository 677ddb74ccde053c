"""The broadcast source: Delta versions -> ordered broadcast elements (real Spark + Delta)."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import functions as F

from lakecast import BroadcastTestHarness, Lookup, enrich, read_broadcast_elements
from lakecast.api.element import BroadcastElement, order_elements
from lakecast.delta import io as delta_io
from lakecast.delta.source import CdfUnavailable


def _users(spark, n, segment="REGULAR"):
    return spark.range(n).select(
        F.col("id").alias("user_id"), F.lit(segment).alias("segment"),
        (F.col("id") * 1.5).alias("ltv"),
    )


def test_one_element_per_version_and_a_1pct_version_travels_as_1pct(spark, lake):
    path = lake.table_path("dim_users")
    delta_io.write(_users(spark, 2000), path, mode="overwrite")  # v0
    (base,) = read_broadcast_elements(spark, {"dim_users": path}, {})
    assert (base.kind, base.version, base.num_rows) == ("full", 0, 2000)
    assert "no previous version" in base.reason

    # v1: 1% of the rows change; v2: 5 deletes
    changed = _users(spark, 2000).withColumn(
        "segment", F.when(F.col("user_id") % 100 == 0, "VIP").otherwise(F.col("segment")))
    delta_io.merge_upsert(spark, changed, path, keys=["user_id"])
    delta_io.merge_upsert(spark, changed.where("user_id >= 5"), path, keys=["user_id"],
                          delete_missing=True)
    els = read_broadcast_elements(spark, {"dim_users": path}, {"dim_users": 0})
    assert [(e.version, e.kind) for e in els] == [(1, "changes"), (2, "changes")]
    assert els[0].num_rows == 20  # 1% of 2000: post-images only, no pre-images
    assert set(els[0].rows.column("_change_type").to_pylist()) == {"update_postimage"}
    assert els[0].num_rows / base.num_rows == 0.01
    assert sorted(els[1].deletes().column("user_id").to_pylist()) == [0, 1, 2, 3, 4]
    assert els[0].operation == "MERGE" and els[0].commit_timestamp <= els[1].commit_timestamp

    # the log fast path (no Spark job) and Spark's CDF reader give the same elements
    slow = read_broadcast_elements(spark, {"dim_users": path}, {"dim_users": 0},
                                   fast_path=False)
    fast_cdf = delta_io.read_changes_from_log(path, 1, 2)
    assert fast_cdf is not None and set(fast_cdf) == {1, 2}
    for f, s in zip(els, slow, strict=True):
        key = ["user_id", "_change_type"]
        assert (f.version, f.kind) == (s.version, s.kind)
        assert f.rows.sort_by([(k, "ascending") for k in key]).to_pylist() == \
            s.rows.select(f.rows.column_names).sort_by([(k, "ascending") for k in key]).to_pylist()

    # applied through the harness: same state as reading the table now
    h = BroadcastTestHarness(enrich(Lookup("dim_users", key="user_id", columns=["segment"])))
    h.process_broadcast_elements([base, *els])
    now = delta_io.read(spark, path).toPandas()
    state = h.state(h.function.lookups[0].descriptor)
    assert {k: v["segment"] for k, v in state.items()} == dict(zip(now.user_id, now.segment,
                                                                    strict=True))
    assert h.state_version == {"dim_users": 2}
    # nothing new: no elements
    assert read_broadcast_elements(spark, {"dim_users": path}, {"dim_users": 2}) == []


def test_cdf_not_covering_the_range_gives_a_full_element(spark, lake):
    path = lake.table_path("late_cdf")
    delta_io.write(_users(spark, 10), path, mode="overwrite")  # v0
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
              "(delta.enableChangeDataFeed = false)")  # v1
    delta_io.write(_users(spark, 3, "NEW").withColumn("user_id", F.col("user_id") + 100),
                   path)  # v2, no CDF recorded
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
              "(delta.enableChangeDataFeed = true)")  # v3
    delta_io.write(_users(spark, 1, "VIP").withColumn("user_id", F.col("user_id") + 200),
                   path)  # v4
    (el,) = read_broadcast_elements(spark, {"t": path}, {"t": 0})
    assert (el.kind, el.version, el.num_rows) == ("full", 4, 14)
    assert "CDF does not cover versions 1..4" in el.reason
    assert "DELTA_MISSING_CHANGE_DATA" in el.meta["full_reload"]  # a known gap, counted
    # from v3 on the CDF covers it: v4 travels as its one inserted row, v3 as an empty element
    els = read_broadcast_elements(spark, {"t": path}, {"t": 2})
    assert [(e.version, e.kind, e.num_rows) for e in els] == [(3, "changes", 0), (4, "changes", 1)]


def test_order_across_tables_is_commit_timestamp_then_name(spark, lake):
    a, b = lake.table_path("b_table"), lake.table_path("a_table")
    delta_io.write(_users(spark, 2), a, mode="overwrite")
    delta_io.write(_users(spark, 2), b, mode="overwrite")
    for _ in range(3):
        delta_io.write(_users(spark, 1), a)  # b: versions 1, 2, 3
    els = read_broadcast_elements(spark, {"b": a, "a": b}, {"a": None, "b": 0})
    assert sorted((e.table, e.version) for e in els) == [("a", 0), ("b", 1), ("b", 2), ("b", 3)]
    ts = [e.order_key() for e in els]
    assert ts == sorted(ts)

    def at(clock: dict[tuple[str, int], int]) -> list[tuple[str, int]]:
        """The order of ``els`` with the commit timestamps ``clock`` (shuffled input)."""
        skewed = [BroadcastElement(e.table, e.version, clock[e.table, e.version], e.kind, e.rows)
                  for e in els]
        return [(e.table, e.version) for e in order_elements(reversed(skewed))]

    # clocks in order: the timestamp orders across tables, the name breaks a tie
    assert at({("b", 1): 10, ("b", 2): 20, ("b", 3): 30, ("a", 0): 25}) == [
        ("b", 1), ("b", 2), ("a", 0), ("b", 3)]
    assert at({("b", 1): 10, ("b", 2): 20, ("b", 3): 30, ("a", 0): 20}) == [
        ("b", 1), ("a", 0), ("b", 2), ("b", 3)]
    # a table's own commit order wins over skewed clocks: b's clock runs backwards, so its
    # later versions keep the latest timestamp seen before them (30) and stay in order
    assert at({("b", 1): 30, ("b", 2): 20, ("b", 3): 10, ("a", 0): 25}) == [
        ("a", 0), ("b", 1), ("b", 2), ("b", 3)]
    assert at({("b", 1): 10, ("b", 2): 40, ("b", 3): 5, ("a", 0): 25}) == [
        ("b", 1), ("a", 0), ("b", 2), ("b", 3)]


def test_missing_table_is_skipped_until_it_exists(spark, lake):
    path = lake.table_path("later")
    assert read_broadcast_elements(spark, {"later": path}, {}) == []
    delta_io.write(spark.createDataFrame(pd.DataFrame({"k": [1]})), path, mode="overwrite")
    (el,) = read_broadcast_elements(spark, {"later": path}, {})
    assert el.kind == "full"


def test_only_known_cdf_gaps_fall_back_to_a_full_reload(spark, lake, caplog):
    """21.3: a damaged change file is a fault (the read fails with its cause); vacuumed
    change files are a known gap (a full reload, at WARNING, with its reason)."""
    path = lake.table_path("gaps")
    delta_io.write(_users(spark, 10), path, mode="overwrite")  # v0
    changed = _users(spark, 10).withColumn(
        "segment", F.when(F.col("user_id") < 3, "VIP").otherwise(F.col("segment")))
    delta_io.merge_upsert(spark, changed, path, keys=["user_id"])  # v1: CDC files
    cdc = sorted(Path(path, "_change_data").glob("*.parquet"))
    assert cdc
    for f in cdc:
        f.write_bytes(b"not parquet " * 64)
    with pytest.raises(Exception) as err:  # Spark's own error type
        read_broadcast_elements(spark, {"t": path}, {"t": 0}, fast_path=False)
    assert not isinstance(err.value, CdfUnavailable)
    assert "FILE_NOT_EXIST" not in str(err.value)

    for f in cdc:  # vacuumed
        f.unlink()
    with caplog.at_level(logging.WARNING, logger="lakecast.delta.source"):
        (el,) = read_broadcast_elements(spark, {"t": path}, {"t": 0}, fast_path=False)
    assert (el.kind, el.version, el.num_rows) == ("full", 1, 10)
    assert "vacuumed" in el.meta["full_reload"]
    assert any(r.levelno == logging.WARNING and "full reload" in r.getMessage()
               for r in caplog.records)
