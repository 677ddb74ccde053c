"""A pure enrich(Lookup...) keeps its task-local state in the executor JVM by default (the
``StateLookup`` Java UDF, :mod:`lakecast.runtime.jvm_state`), on real Spark and Delta: the
same rows as pandas and as the Python workers, version after version applied as changes,
values of every type it holds, and a clear fallback where it cannot hold them."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import logging
import re
from pathlib import Path
from urllib.parse import urlparse

import pandas as pd
import pytest

from lakecast import BroadcastRuntime, Lookup, enrich
from lakecast.delta import io as delta_io
from lakecast.jvm.build import LOOKUP_CLASS, built_jar
from tests.lakecast.test_joins import _events, _function, _reference, _rows


def state_folder(runtime: BroadcastRuntime) -> Path:
    """The local folder of a runtime's JVM state (its root is a ``file:`` URI)."""
    assert runtime.jvm is not None and runtime.jvm.root.startswith("file:")
    return Path(urlparse(runtime.jvm.root).path)


def _users(spark, path: str, version: int) -> pd.DataFrame:
    return delta_io.read(spark, path, version=version).toPandas()


@pytest.fixture
def tables(spark, tmp_path):
    return write_tables(spark, tmp_path)


def write_tables(spark, tmp_path: Path) -> dict[str, str]:
    """users v0; v1 (UPDATE: user 1 VIP), v2 (DELETE user 6), v3 (INSERT user 7 and 9);
    products keyed by (shop, sku) under other names than the events use."""
    users, products = str(tmp_path / "dim_users"), str(tmp_path / "dim_products")
    delta_io.write(spark.createDataFrame(pd.DataFrame({
        "user_id": [1, 2, 3, 4, 5, 6],
        "segment": ["REGULAR", "VIP", "CHURNING", "REGULAR", "VIP", "NEW"],
        "ltv": [10.0, 250.0, None, 40.0, 900.0, 1.0],
    })), users, mode="overwrite")
    spark.sql(f"UPDATE delta.`{users}` SET segment = 'VIP' WHERE user_id = 1")
    spark.sql(f"DELETE FROM delta.`{users}` WHERE user_id = 6")
    spark.sql(f"INSERT INTO delta.`{users}` VALUES (7, 'REGULAR', 7.0), (9, NULL, 9.5)")
    delta_io.write(spark.createDataFrame(pd.DataFrame({
        "shop": ["a", "a", "b", "b"], "sku": [1, 2, 1, 3],
        "title": ["tv", "radio", "book", "pen"], "price": [100.0, 20.0, 8.0, 1.5],
    })), products, mode="overwrite")
    return {"dim_users": users, "dim_products": products}


def _version_json(versions: dict[str, int]) -> str:
    return json.dumps(versions, separators=(",", ":"), sort_keys=True)


@pytest.mark.parametrize("jvm", [True, False], ids=["jvm", "python"])
def test_each_version_equals_pandas_applied_as_changes(any_spark, tables, jvm):
    """One runtime walks v0 -> v3 of the users (update, delete, insert): each batch equals
    pandas over that version, in the JVM and in the Python workers alike."""
    spark = any_spark
    pdf, events = _events(spark)
    runtime = BroadcastRuntime(spark, _function(), tables, jvm_lookups=jvm)
    assert runtime.state_engine == ("jvm" if jvm else "python")
    products = delta_io.read(spark, tables["dim_products"]).toPandas()
    try:
        for version in range(4):
            pinned = {"dim_users": version, "dim_products": 0}
            result = runtime.process(events, until=pinned)
            out = result.collect()
            want_main, want_unmatched = _reference(
                pdf, _users(spark, tables["dim_users"], version), products)
            main = _rows(out.main)
            assert set(main["_state_version"]) == {_version_json(pinned)}
            got = main.drop(columns=["_state_version"])
            pd.testing.assert_frame_equal(got, want_main, check_dtype=False)
            assert sorted(out.sides["unmatched"].column("event_id").to_pylist()) == \
                want_unmatched
            metrics = result.metrics()
            assert metrics.rows_in == len(pdf) == (metrics.rows_main
                                                   + metrics.rows_side("unmatched"))
            if jvm:  # one accounting row per executor JVM (one: local mode), measured
                # there: the base built cold at v0, then each version's changes applied
                (row,) = out.task_rows
                assert row["cache"] == ("warm" if version else "cold")
                assert row["events_in"] == len(pdf) and row["state_bytes"] > 0
                assert metrics.summary()["cold_tasks"] == (0 if version else 1)
            if version:  # the versions after the base travel as changes, not the table
                assert {e.kind for e in result.new_elements} == {"changes"}
        # user 3's null ltv is a matched row: it stays null, no default
        assert pd.isna(main.set_index("event_id").loc[2, "ltv"])
    finally:
        runtime.close()


def test_the_state_files_are_the_chain_and_go_with_the_runtime(spark, tables):
    """The JVM state is the chain's files: a base, then one changes file per version; an
    ephemeral runtime's folder goes when it closes (its executors then drop the state)."""
    _, events = _events(spark)
    runtime = BroadcastRuntime(spark, _function(), tables)
    runtime.process(events, until={"dim_users": 0, "dim_products": 0}).collect()
    runtime.process(events, until={"dim_users": 3, "dim_products": 0}).collect()
    folder = state_folder(runtime)
    names = sorted(p.name for p in folder.glob("*/*.arrow"))
    # <table>-v<version>-t<commit ms>.<kind>.arrow: a recreated table's v1 is another file
    assert [re.sub(r"-t\d+\.", ".", n) for n in names] == [
        "dim_products-v0.full.arrow", "dim_users-v0.full.arrow", "dim_users-v1.changes.arrow",
        "dim_users-v2.changes.arrow", "dim_users-v3.changes.arrow"]
    (manifest,) = [p for p in folder.glob("*/dim_users@*.manifest")
                   if len(p.read_text().splitlines()) == 5]
    lineage, *files = manifest.read_text().splitlines()
    assert lineage.endswith("|dim_users") and [Path(f).name for f in files] == names[1:]
    assert all(f.startswith("file:/") for f in files)  # URIs, read with Hadoop's FileSystem
    runtime.close()
    assert not folder.exists()


@pytest.mark.parametrize("gone", ["dim_users-v0-t*.full.arrow", "dim_users@*.manifest"],
                         ids=["state-file", "manifest"])
def test_a_state_file_gone_before_the_job_is_a_clear_error(spark, tables, gone):
    """A state file or manifest removed between planning and the job (another process
    cleaned ``var/``): the job fails naming the file and the fix, not a bare IOException."""
    _, events = _events(spark)
    runtime = BroadcastRuntime(spark, _function(), tables)
    try:
        result = runtime.process(events, until={"dim_users": 0, "dim_products": 0})
        (path,) = state_folder(runtime).glob(f"*/{gone}")
        path.unlink()
        with pytest.raises(Exception) as err:
            result.collect()
        message = str(err.value)
        assert f"Lakecast JVM lookup state {'manifest' if 'manifest' in gone else 'file'} " \
               f"file://{path} is missing" in message
        assert "Rerun the batch" in message and "jvm_lookups=False" in message
    finally:
        runtime.close()


def test_values_of_every_held_type_and_string_keys(spark, tmp_path):
    """Dates, timestamps, decimals, booleans, binary, floats, ints and strings come back
    as Spark typed them, for a string key, equal to the Python workers' rows."""
    path = str(tmp_path / "dim_codes")
    codes = spark.createDataFrame(
        [("x", dt.date(2026, 1, 2), dt.datetime(2026, 1, 2, 3, 4, 5, 678901,
                                                 tzinfo=dt.UTC),
          decimal.Decimal("12.34"), True, bytearray(b"\x00\x01"), 1.5, 7, "ünï"),
         ("y", None, None, None, None, None, None, None, None)],
        "code string, day date, at timestamp, amount decimal(10,2), flag boolean, "
        "blob binary, score float, n int, label string")
    delta_io.write(codes, path, mode="overwrite")
    events = spark.createDataFrame([(1, "x"), (2, "y"), (3, "z"), (4, None)],
                                   "event_id long, code string")
    fn = enrich(Lookup("dim_codes", key="code", defaults={"label": "?"}))
    rows = {}
    for jvm in (True, False):
        runtime = BroadcastRuntime(spark, fn, {"dim_codes": path}, jvm_lookups=jvm,
                                   lineage=False)
        assert runtime.state_engine == ("jvm" if jvm else "python")
        out = runtime.process(events).collect()
        rows[jvm] = out.main.sort_by("event_id")
        runtime.close()
    assert rows[True].equals(rows[False]), (rows[True], rows[False])
    got = rows[True].to_pylist()
    assert got[0]["day"] == dt.date(2026, 1, 2) and got[0]["amount"] == decimal.Decimal("12.34")
    assert got[0]["at"].replace(tzinfo=None) == dt.datetime(2026, 1, 2, 3, 4, 5, 678901)
    assert (got[0]["flag"], got[0]["blob"], got[0]["n"], got[0]["label"]) == \
        (True, b"\x00\x01", 7, "ünï")
    assert got[1]["label"] is None and got[1]["day"] is None  # a matched row's nulls
    assert [r["label"] for r in got[2:]] == ["?", "?"]  # no row, a null key: the default


@pytest.mark.parametrize("ids", [list(range(-3, 500)),  # dense: an array by key
                                 [-(2**62), -7, 0, 3, 2**40, 2**62 + 11]],  # sparse
                         ids=["dense", "sparse"])
def test_integer_keys_dense_or_sparse_equal_pandas(spark, tmp_path, ids):
    """Integer keys go through the JVM state's flat index (an array for a dense range,
    open addressing for sparse keys); hits, misses below, between and above the keys
    and null keys equal pandas, version after version: an update, a delete and an insert
    in one step, then an overwrite (its changes list the inserts before the deletes)."""
    path = str(tmp_path / "dim_accounts")
    dim = pd.DataFrame({"account": ids, "tier": [f"t{i % 7}" for i in range(len(ids))]})
    delta_io.write(spark.createDataFrame(dim), path, mode="overwrite")
    probes = [*ids, min(ids) - 1, max(ids) + 1, ids[0] + 1 if ids[1] - ids[0] > 1 else 10**15,
              -(2**63), 2**63 - 1]
    events = spark.createDataFrame(list(enumerate([*probes, None])),
                                   "event_id long, account long")
    fn = enrich(Lookup("dim_accounts", key="account", defaults={"tier": "none"}))
    runtime = BroadcastRuntime(spark, fn, {"dim_accounts": path}, lineage=False)
    assert runtime.state_engine == "jvm"
    try:
        for step, version in enumerate((0, 3, 4)):
            if step == 1:  # update one key, delete another, insert a new one
                spark.sql(f"UPDATE delta.`{path}` SET tier = 'up' WHERE account = {ids[-1]}")
                spark.sql(f"DELETE FROM delta.`{path}` WHERE account = {ids[0]}")
                spark.sql(f"INSERT INTO delta.`{path}` VALUES ({max(ids) + 1}, 'new')")
            if step == 2:  # the same keys but the first, other tiers
                delta_io.write(spark.createDataFrame(pd.DataFrame(
                    {"account": ids[1:], "tier": [f"o{i % 3}" for i in range(len(ids) - 1)]})),
                    path, mode="overwrite")
            want = delta_io.read(spark, path, version=version).toPandas()
            tiers = dict(zip(want["account"], want["tier"], strict=True))
            got = runtime.process(events).collect().main.sort_by("event_id").to_pylist()
            expected = [tiers.get(a, "none") if a is not None else "none"
                        for a in [*probes, None]]
            assert [r["tier"] for r in got] == expected
    finally:
        runtime.close()


def test_a_key_type_the_jvm_state_does_not_hold_runs_in_python_said_once(spark, tmp_path,
                                                                           caplog):
    """A double key: the lookups run in the Python workers, and the log says why once."""
    path = str(tmp_path / "dim_rates")
    delta_io.write(spark.createDataFrame([(1.5, "a"), (2.5, "b")], "rate double, name string"),
                   path, mode="overwrite")
    events = spark.createDataFrame([(1, 1.5), (2, 9.0)], "event_id long, rate double")
    fn = enrich(Lookup("dim_rates", key="rate"))
    with caplog.at_level(logging.WARNING, logger="lakecast.runtime.jvm_state"):
        for _ in range(2):
            runtime = BroadcastRuntime(spark, fn, {"dim_rates": path})
            out = runtime.process(events).collect()
            assert runtime.state_engine == "python"
            assert out.main.sort_by("event_id").column("name").to_pylist() == ["a", None]
            runtime.close()
    said = [r.getMessage() for r in caplog.records if "JVM lookups are off" in r.getMessage()]
    assert len(said) == 1 and "key column 'rate' is double" in said[0], said


def test_jvm_lookups_true_refuses_python_logic_clearly(spark, tables):
    class OwnBatches(type(_function())):
        def process_batch(self, batch, ctx):  # type: ignore[override]
            return super().process_batch(batch, ctx)

    fn = OwnBatches(_function().lookups)
    with pytest.raises(ValueError, match="jvm_lookups=True: OwnBatches overrides process_batch"):
        BroadcastRuntime(spark, fn, tables, jvm_lookups=True)
    assert BroadcastRuntime(spark, fn, tables).state_engine == "python"


def test_the_jar_is_built_and_loaded_by_the_session(spark):
    jar = built_jar()
    assert jar is not None and jar.exists()
    assert str(jar) in spark.conf.get("spark.jars")
    assert LOOKUP_CLASS == "lakecast.jvm.StateLookup"


def test_the_state_budget_counts_one_copy_per_executor_jvm(spark, tmp_path):
    from lakecast.runtime.metrics import StateBudgetWarning, reset_budget_warnings

    reset_budget_warnings()
    path = str(tmp_path / "dim_users")
    delta_io.write(spark.createDataFrame(pd.DataFrame({"user_id": range(100),
                                                       "segment": ["VIP"] * 100})),
                   path, mode="overwrite")
    runtime = BroadcastRuntime(spark, enrich(Lookup("dim_users", key="user_id")),
                               {"dim_users": path}, state_budget_bytes=100)
    assert runtime.state_engine == "jvm"
    result = runtime.process(spark.range(10).withColumnRenamed("id", "user_id"))
    result.main.count()
    with pytest.warns(StateBudgetWarning, match="exceeds the budget"):
        m = result.metrics()
    (row,) = result.task_rows()  # local mode: one executor JVM holds one copy
    assert m.parallelism == m.resident_copies == 1
    assert m.state_bytes_total == row["state_bytes"] > 100
    print("measured", row["state_bytes"], "estimated", runtime.estimated_state_bytes)
    assert m.over_budget
    runtime.close()


def test_setup_compiles_the_jar_with_javac_and_names_the_fix_without_a_jdk(tmp_path,
                                                                             monkeypatch):
    import os
    import zipfile

    from lakecast.config import get_settings
    from lakecast.errors import SetupError
    from lakecast.jvm import build

    monkeypatch.setattr(build, "shipped_jar", lambda: None)  # (an installed wheel ships one)
    settings = get_settings({**os.environ, "LAKECAST_JARS_DIR": str(tmp_path / "jars")})
    jar = build.build(settings)  # the JDK's javac, against pyspark's JARs
    assert jar == build.jar_path(settings) and jar.parent.name == build.source_digest()
    assert "lakecast/jvm/StateLookup.class" in zipfile.ZipFile(jar).namelist()
    assert build.build(settings) == jar  # built once
    monkeypatch.setattr(build, "find_javac", lambda: None)
    other = get_settings({**os.environ, "LAKECAST_JARS_DIR": str(tmp_path / "other")})
    with pytest.raises(SetupError, match=r"javac \(a JDK\) was not found.*openjdk-17-jdk"):
        build.build(other)
    assert build.built_jar(other) is None
