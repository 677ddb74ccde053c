"""Failures of a batch's Spark jobs translated by cause (:mod:`lakecast.pipeline.task_errors`),
each caused for real: a JVM lookup state file deleted, or damaged, between planning and
the task (one line naming the table, the state version and the fix, no stage trace), and
a conflicting concurrent commit to a Delta table on Spark's write path (a ``deltalake``
commit of the same transaction id landing while Spark's write runs)."""

from __future__ import annotations

import threading
import time

import pandas as pd
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake

from lakecast import BroadcastRuntime
from lakecast.config import get_settings
from lakecast.pipeline.task_errors import (
    ConcurrentCommitError,
    StateFileError,
    translated,
)
from tests.lakecast.test_joins import _events, _function
from tests.lakecast.test_jvm_lookups import (
    state_folder,
    tables,  # noqa: F401  (the fixture)
)

VERSIONS = {"dim_users": 0, "dim_products": 0}


def _fails_at_task(spark, tables, damage) -> BaseException:  # noqa: F811
    """The error of a batch whose users state file ``damage`` changed after planning."""
    _, events = _events(spark)
    runtime = BroadcastRuntime(spark, _function(), tables)
    try:
        assert runtime.state_engine == "jvm"
        result = runtime.process(events, until=VERSIONS)  # planned: the files are written
        (path,) = state_folder(runtime).glob("*/dim_users-v0-t*.full.arrow")
        damage(path)
        with pytest.raises(Exception) as err:
            result.collect()
        return err.value
    finally:
        runtime.close()


def _assert_one_line(err: Exception) -> str:
    message = str(err)
    assert "\n" not in message and "\tat " not in message and len(message) < 1200, message
    assert err.__cause__ is None
    assert str(get_settings().var_dir / "log" / "spark.log") in message
    return message


def test_a_state_file_deleted_before_the_task_is_one_line_naming_table_version_fix(
        spark, tables):  # noqa: F811
    raw = _fails_at_task(spark, tables, lambda p: p.unlink())
    err = translated(raw, "users_enrichment", 3, VERSIONS)
    assert isinstance(err, StateFileError)
    message = _assert_one_line(err)
    assert message.startswith("users_enrichment: the JVM lookup state of dim_users "
                              "(state version 0, file "), message
    assert "was missing when a task needed it" in message
    assert "Fix: run the pipeline again" in message and "redone exactly once" in message


def test_a_state_file_damaged_before_the_task_says_unreadable_and_the_fix(
        spark, tables):  # noqa: F811
    raw = _fails_at_task(spark, tables, lambda p: p.write_bytes(b"not arrow at all" * 64))
    err = translated(raw, "users_enrichment", 0, VERSIONS)
    assert isinstance(err, StateFileError)
    message = _assert_one_line(err)
    assert "dim_users (state version 0, file " in message
    assert "could not be read (" in message and "Fix: remove " in message


def test_a_conflicting_concurrent_commit_on_the_spark_path_names_what_to_do(spark, tmp_path):
    from pyspark.sql import functions as F

    path = str(tmp_path / "out")
    write_deltalake(path, pd.DataFrame({"id": [0]}), mode="append")

    marker = tmp_path / "writing"

    def slow(batches):  # says its task runs (Spark's transaction has begun), then waits
        for b in batches:
            marker.touch()
            time.sleep(4)
            yield b

    frame = spark.range(1, 5, 1, 2).mapInPandas(slow, "id long").withColumn("id", F.col("id"))
    failure: dict[str, BaseException] = {}

    def spark_write() -> None:  # reads the table's txn version, writes files, commits
        try:
            (frame.write.format("delta").mode("append").option("txnAppId", "batch-app")
             .option("txnVersion", 1).save(path))
        except Exception as e:  # asserted below
            failure["e"] = e

    thread = threading.Thread(target=spark_write)
    thread.start()
    deadline = time.monotonic() + 60
    while not marker.exists():  # the write's tasks run: its transaction read the table
        assert time.monotonic() < deadline and thread.is_alive(), failure
        time.sleep(0.05)
    # another writer commits the same transaction meanwhile
    write_deltalake(path, pd.DataFrame({"id": [100]}), mode="append",
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction("batch-app", 1)]))
    thread.join(timeout=120)
    assert "e" in failure, "Spark's write committed despite the concurrent commit"
    err = translated(failure["e"], "payments", 7, {})
    assert isinstance(err, ConcurrentCommitError), str(failure["e"])[:500]
    message = _assert_one_line(err)
    assert message.startswith("payments: batch 7's write to an output table conflicted")
    assert "Delta retried" in message and "one job writes" in message
    assert "redone exactly once" in message
    # nothing of Spark's write was committed: the table holds the two deltalake rows
    got = spark.read.format("delta").load(path).toPandas()
    assert sorted(got.id) == [0, 100]
