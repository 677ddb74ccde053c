"""The Lakecast Spark server: status, loopback-only sockets, Delta over Spark Connect."""

from __future__ import annotations

import re
import subprocess

import pandas as pd
import pytest

from lakecast.delta import io as delta_io
from lakecast.server import Server
from lakecast.spark import (
    default_parallelism,
    get_spark,
    is_connect,
    local_checkpoint,
    session_id_for,
)

pytestmark = [pytest.mark.connect]


def _listening(pid: int) -> list[str]:
    """Local addresses of the TCP sockets that process ``pid`` listens on (``ss -ltnp``)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3].replace("[::ffff:127.0.0.1]", "127.0.0.1")
            for line in out.splitlines() if f"pid={pid}," in line]


def test_server_status_and_it_listens_on_loopback_only(spark_server):
    pid = spark_server.pid()
    assert pid is not None
    assert spark_server.status().startswith(f"serving on {spark_server.url} (pid {pid}")
    addresses = _listening(pid)
    assert f"127.0.0.1:{spark_server.port}" in addresses
    assert all(re.match(r"^127\.0\.0\.1:\d+$", a) for a in addresses), addresses
    stopped = Server(spark_server.settings, "127.0.0.1", spark_server.port + 1)
    assert stopped.pid() is None and "not running" in stopped.status()


def test_delta_operations_run_over_spark_connect(connect_spark, connect_lake):
    spark, lake = connect_spark, connect_lake
    assert is_connect(spark) and default_parallelism(spark) >= 1
    path = lake.table_path("t")
    base = pd.DataFrame({"k": [1, 2, 3], "v": ["a", "b", "c"]})
    assert delta_io.write(spark.createDataFrame(base), path) == 0
    res = delta_io.merge_upsert(spark, spark.createDataFrame(
        pd.DataFrame({"k": [2, 4], "v": ["B", "d"]})), path, keys=["k"], delete_missing=True)
    assert (res.version, res.inserted, res.updated, res.deleted) == (1, 1, 1, 2)
    got = delta_io.read(spark, path).toPandas().sort_values("k")
    assert got.values.tolist() == [[2, "B"], [4, "d"]]
    assert delta_io.delete(spark, path, "k = 4") == 2
    assert delta_io.restore_version(spark, path, 0) == 3
    assert sorted(delta_io.read(spark, path).toPandas().k) == [1, 2, 3]
    ops = [h["operation"] for h in delta_io.history(spark, path)]
    assert ops == ["RESTORE", "DELETE", "MERGE", "WRITE"]


def test_sessions_are_stable_per_name_and_lake(connect_lake):
    a = get_spark(settings=connect_lake, session="pipeline:x")
    assert a.session_id == session_id_for(connect_lake, "pipeline:x")
    assert get_spark(settings=connect_lake, session="pipeline:x") is a
    assert get_spark(settings=connect_lake, session="pipeline:y").session_id != a.session_id


def test_local_checkpoint_works_on_any_of_a_process_s_connect_sessions(connect_lake):
    first, second = get_spark(settings=connect_lake), get_spark(settings=connect_lake)
    assert first.session_id != second.session_id
    for spark in (second, first, second):
        frame = local_checkpoint(spark.range(7).where("id % 2 = 0"))
        assert sorted(r.id for r in frame.collect()) == [0, 2, 4, 6]
