"""``execution="joins"``: a pure enrich(Lookup...) as Spark broadcast joins, on real Spark
and Delta — the same rows, sides and lineage as the task plan and as pandas, accounting
that counts every joined row, and functions it refuses."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pytest

from lakecast import BroadcastRuntime, Lookup, enrich
from lakecast.api.enrich import Enrichment
from lakecast.delta import io as delta_io
from lakecast.errors import LakecastError
from lakecast.runtime.joins import JOIN_CACHE, not_joinable


def _write(spark, frame: pd.DataFrame, path: str, mode: str = "overwrite") -> None:
    delta_io.write(spark.createDataFrame(frame), path, mode=mode)


@pytest.fixture
def tables(spark, tmp_path):
    """users v0 (ids 1-6; user 3 has a null ltv), v1 (user 6 gone, user 7 new, user 1 VIP);
    products keyed by (shop, sku) under other names than the events use."""
    users = str(tmp_path / "dim_users")
    products = str(tmp_path / "dim_products")
    _write(spark, pd.DataFrame({
        "user_id": [1, 2, 3, 4, 5, 6],
        "segment": ["REGULAR", "VIP", "CHURNING", "REGULAR", "VIP", "NEW"],
        "ltv": [10.0, 250.0, None, 40.0, 900.0, 1.0],
    }), users)
    _write(spark, pd.DataFrame({
        "user_id": [1, 2, 3, 4, 5, 7],
        "segment": ["VIP", "VIP", "CHURNING", "REGULAR", "VIP", "REGULAR"],
        "ltv": [10.0, 250.0, None, 40.0, 900.0, 7.0],
    }), users)
    _write(spark, pd.DataFrame({
        "shop": ["a", "a", "b", "b"], "sku": [1, 2, 1, 3],
        "title": ["tv", "radio", "book", "pen"], "price": [100.0, 20.0, 8.0, 1.5],
    }), products)
    return {"dim_users": users, "dim_products": products}


def _events(spark):
    pdf = pd.DataFrame({
        "event_id": list(range(12)),
        "user_id": pd.array([1, 2, 3, 6, 7, 9, None, 1, 5, 4, 2, 3], dtype="Int64"),
        "store": ["a", "a", "b", "b", "a", "z", "a", "b", "b", "a", "a", "b"],
        "item": pd.array([1, 2, 1, 3, 1, 1, 2, 9, 3, 1, None, 1], dtype="Int64"),
    })
    return pdf, spark.createDataFrame(pdf).repartition(3)


def _function() -> Enrichment:
    return enrich(
        Lookup("dim_users", key="user_id", columns=["segment", "ltv"],
               defaults={"segment": "NEW", "ltv": -1.0}),
        Lookup("dim_products", key={"store": "shop", "item": "sku"},
               columns={"title": "product", "price": "product_price"},
               on_missing="unmatched"),
    )


def _reference(pdf: pd.DataFrame, users: pd.DataFrame, products: pd.DataFrame):
    """pandas: left joins, defaults only where the key has no row, misses to unmatched."""
    u = users.assign(_mu=True)
    p = products.rename(columns={"shop": "store", "sku": "item", "title": "product",
                                 "price": "product_price"}).assign(_mp=True)
    out = pdf.merge(u, on="user_id", how="left").merge(p, on=["store", "item"], how="left")
    out.loc[out["_mu"].isna(), "segment"] = "NEW"
    out.loc[out["_mu"].isna(), "ltv"] = -1.0
    unmatched = out[out["_mp"].isna()][list(pdf.columns)]
    main = out[out["_mp"].notna()].drop(columns=["_mu", "_mp"])
    return main.sort_values("event_id").reset_index(drop=True), sorted(unmatched["event_id"])


def _rows(table: pa.Table) -> pd.DataFrame:
    df = table.to_pandas()
    return df.sort_values("event_id").reset_index(drop=True)


@pytest.mark.parametrize("version", [0, 1])
def test_joins_equal_tasks_and_pandas_at_a_pinned_version(any_spark, tables, version):
    """In-process and over Spark Connect (the Observation's counts come with the action's
    result there)."""
    spark = any_spark
    pdf, events = _events(spark)
    pinned = {"dim_users": version, "dim_products": 0}
    outs = {}
    for execution in ("tasks", "joins"):
        runtime = BroadcastRuntime(spark, _function(), tables, execution=execution)
        result = runtime.process(events, until=pinned)
        outs[execution] = (result.collect(), result.metrics())
        runtime.close()
    users = delta_io.read(spark, tables["dim_users"], version=version).toPandas()
    products = delta_io.read(spark, tables["dim_products"], version=0).toPandas()
    want_main, want_unmatched = _reference(pdf, users, products)
    (tasks, _), (joins, metrics) = outs["tasks"], outs["joins"]
    for out in (tasks, joins):
        main = _rows(out.main)
        assert set(main["_state_version"]) == {json.dumps(pinned, separators=(",", ":"),
                                                          sort_keys=True)}
        got = main.drop(columns=["_state_version"])
        assert list(got.columns) == list(want_main.columns)
        pd.testing.assert_frame_equal(got, want_main, check_dtype=False)
        assert sorted(out.sides["unmatched"].column("event_id").to_pylist()) == want_unmatched
    # the same Arrow schema as the task plan: a pipeline may switch plans
    assert joins.main.schema == tasks.main.schema
    assert joins.sides["unmatched"].schema == tasks.sides["unmatched"].schema
    # user 3's null ltv is a matched row: it stays null (no default)
    assert pd.isna(_rows(joins.main).set_index("event_id").loc[2, "ltv"])
    # accounting: one row for the job, every event counted once
    (row,) = joins.task_rows
    assert row["cache"] == JOIN_CACHE and row["events_in"] == len(pdf)
    assert metrics.rows_in == len(pdf) == metrics.rows_main + metrics.rows_side("unmatched")
    assert metrics.rows_main == len(want_main)
    assert metrics.state_version == pinned


def test_joins_hold_wins_over_unmatched_and_observe_one_write(spark, tables, tmp_path):
    pdf, events = _events(spark)
    fn = enrich(
        Lookup("dim_users", key="user_id", columns=["segment"], on_missing="hold"),
        Lookup("dim_products", key={"store": "shop", "item": "sku"}, columns=["title"],
               on_missing="unmatched"),
    )
    runtime = BroadcastRuntime(spark, fn, tables, execution="joins", lineage=False)
    result = runtime.process(events).observe()  # newest versions: users v1
    out = str(tmp_path / "out")
    delta_io.write(result.main, out, mode="overwrite")
    metrics = result.metrics()
    users = set(delta_io.read(spark, tables["dim_users"]).toPandas()["user_id"])
    products = {("a", 1), ("a", 2), ("b", 1), ("b", 3)}
    has_user = pdf["user_id"].isin(users) & pdf["user_id"].notna()
    has_product = pd.Series([(s, i) in products
                             for s, i in zip(pdf["store"], pdf["item"], strict=True)])
    want_main = sorted(pdf[has_user & has_product]["event_id"])
    written = delta_io.read(spark, out).toPandas()
    assert sorted(written["event_id"]) == want_main
    assert "_state_version" not in written.columns
    assert metrics.rows_in == len(pdf)
    assert metrics.rows_side("held") == int((~has_user).sum())
    assert metrics.rows_side("unmatched") == int((has_user & ~has_product).sum())
    assert metrics.rows_main == len(want_main)
    assert metrics.state_version == {"dim_users": 1, "dim_products": 0}


def test_joins_refuses_python_logic_and_unread_metrics(spark, tables):
    class Discounted(Enrichment):
        def transform(self, batch, ctx):
            return batch

    fn = Discounted([Lookup("dim_users", key="user_id", columns=["segment"])])
    assert "overrides transform" in not_joinable(fn)
    with pytest.raises(ValueError, match="execution='joins': Discounted overrides transform"):
        BroadcastRuntime(spark, fn, tables, execution="joins")
    with pytest.raises(ValueError, match="execution must be one of"):
        BroadcastRuntime(spark, _function(), tables, execution="sql")
    assert not_joinable(_function()) is None
    _, events = _events(spark)
    result = BroadcastRuntime(spark, _function(), tables, execution="joins").process(events)
    with pytest.raises(LakecastError, match="no action has consumed this lookup result"):
        result.metrics()


def test_joins_persisted_for_several_actions(spark, tables, tmp_path):
    """The pipeline's large-batch path: persist, count the outputs, write each one."""
    pdf, events = _events(spark)
    for fn in (_function(), enrich(Lookup("dim_users", key="user_id", columns=["segment"]))):
        runtime = BroadcastRuntime(spark, fn, tables, execution="joins")
        result = runtime.process(events, until={"dim_users": 0, "dim_products": 0}).persist()
        counts = result.output_counts()
        delta_io.write(result.main, str(tmp_path / "main"), mode="overwrite")
        metrics = result.metrics()
        result.unpersist()
        assert sum(counts.values()) == len(pdf) == metrics.rows_in
        assert counts[None] == metrics.rows_main == delta_io.read(
            spark, str(tmp_path / "main")).count()
        assert counts.get("unmatched", 0) == metrics.rows_side("unmatched")


def test_joins_count_every_joined_row_so_duplicate_keys_cannot_hide(spark, tables, tmp_path):
    """A table version with a duplicate key (unvalidated, outside a pipeline) makes the
    left join emit two rows for an event: the accounting counts both, so the pipeline's
    reconciliation against the events it counted itself fails instead of passing."""
    users = str(tmp_path / "dup_users")
    _write(spark, pd.DataFrame({"user_id": [1, 1, 2], "segment": ["VIP", "NEW", "VIP"],
                                "ltv": [1.0, 2.0, 3.0]}), users)
    pdf, events = _events(spark)
    fn = enrich(Lookup("dim_users", key="user_id", columns=["segment"]))
    result = BroadcastRuntime(spark, fn, {"dim_users": users}, execution="joins").process(
        events)
    out = result.collect()
    n_user_1 = int((pdf["user_id"] == 1).sum())
    assert out.main.num_rows == len(pdf) + n_user_1
    assert result.metrics().rows_in == len(pdf) + n_user_1 != len(pdf)
