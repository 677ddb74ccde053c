"""The Lakecast Spark server: status, loopback-only sockets, Delta over Spark Connect; only
the owner gets in (a token, unguessable session ids)."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pandas as pd
import pytest

from lakecast import auth
from lakecast.config import get_settings
from lakecast.delta import io as delta_io
from lakecast.server import Server
from lakecast.spark import (
    default_parallelism,
    get_spark,
    is_connect,
    local_checkpoint,
    session_id_for,
)
from lakecast.tools import cli

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
    # the token: the owner's only, in the server's environment, not on its command line
    token_file = auth.token_file(spark_server.settings)
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(spark_server.folder.stat().st_mode) == 0o700
    token = token_file.read_text().strip()
    assert len(token) >= 32 and token.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
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


def _raw_client(connection: str):
    """A plain PySpark Spark Connect client (not Lakecast's factory), unregistered."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    return ConnectSession(connection=connection)


def test_a_client_without_the_token_or_with_a_wrong_one_is_refused_and_runs_nothing(
        connect_lake, spark_server, tmp_path):
    own = get_spark(settings=connect_lake)  # a Lakecast client: the token of var/server/token
    port = spark_server.port
    attempts = {"no token": f"sc://127.0.0.1:{port}",
                "wrong token": f"sc://localhost:{port}/;token={'x' * 43}"}
    for what, connection in attempts.items():
        target = tmp_path / what.replace(" ", "_")
        client = _raw_client(connection)
        try:
            with pytest.raises(Exception, match="UNAUTHENTICATED") as e:
                client.range(3).write.parquet(str(target))
            assert ("No authentication token" if what == "no token"
                    else "Invalid authentication token") in str(e.value)
        finally:
            client.client.close()
        assert not target.exists(), what
    # the same write from the Lakecast client runs
    own.range(3).write.parquet(str(tmp_path / "owner"))
    assert own.read.parquet(str(tmp_path / "owner")).count() == 3


def test_a_pipeline_session_cannot_be_attached_by_its_name(connect_lake, spark_server):
    lake = connect_lake
    pipeline = get_spark(settings=lake, session="pipeline:guarded")
    pipeline.conf.set("lakecast.test.marker", "warm-state")
    pipeline.range(5).createOrReplaceTempView("guarded_view")
    sid = pipeline.session_id
    assert uuid.UUID(sid).version == 4  # random, not derived from the lake and the name
    store = auth.server_folder(lake) / "sessions.json"
    assert stat.S_IMODE(store.stat().st_mode) == 0o600
    assert json.loads(store.read_text())[f"{lake.lake_root}\npipeline:guarded"] == sid
    # stable across processes (runs find their session, state warm)
    out = subprocess.run(
        [sys.executable, "-c", "from lakecast.auth import session_id_for; from lakecast.config "
         "import get_settings; print(session_id_for(get_settings(), 'pipeline:guarded'))"],
        env=dict(os.environ), capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == sid
    # a client that knows the address, the lake and the name (even one holding the token)
    # guesses the session id: it gets a session of its own, empty
    token = auth.client_token(lake, spark_server.url)
    guesses = [str(uuid.uuid5(uuid.NAMESPACE_URL, f"lakecast:{lake.lake_root}:pipeline:guarded")),
               str(uuid.uuid5(uuid.NAMESPACE_URL, "pipeline:guarded")), str(uuid.uuid4())]
    for guess in guesses:
        assert guess != sid
        intruder = _raw_client(auth.connection_string(spark_server.url, token, guess))
        try:
            assert intruder.conf.get("lakecast.test.marker", None) is None
            assert not intruder.catalog.tableExists("guarded_view")
        finally:
            intruder.stop()
    assert pipeline.conf.get("lakecast.test.marker") == "warm-state"
    assert pipeline.catalog.tableExists("guarded_view")


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.1"])
def test_binding_beyond_loopback_without_a_token_is_refused(tmp_path, monkeypatch, capsys,
                                                            host):
    monkeypatch.setenv("LAKECAST_HOME", str(tmp_path))
    for var in ("LAKECAST_SERVER_TOKEN", "LAKECAST_SERVER_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert cli.main(["server", "start", "--host", host, "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"refusing to serve Spark on {host} without a token" in err
    assert "LAKECAST_SERVER_TOKEN" in err and "TLS" in err
    server = Server(get_settings(), host, port)
    assert server.pid() is None and not server.listening()
    assert not auth.token_file(get_settings()).exists()  # nothing generated either
    # with the operator's token the same address passes the check
    monkeypatch.setenv("LAKECAST_SERVER_TOKEN", "an-operator-token-0123456789")
    Server(get_settings(), host, port).check_binding()
