"""The local standalone cluster's doors (the test run's ``cluster`` fixture: a master, two
workers and its own Lakecast Spark server): it runs with ``spark.authenticate``, so an
application without its secret (or with a wrong one) is refused by the master, checked
from outside with a plain PySpark driver in a subprocess; the secret file is 0600 and the
secret is in no log, command line, Spark conf or ``lakecast cluster status`` output; and
every socket the cluster's processes listen on is on loopback (read from the kernel)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from lakecast.auth import SECRET_IN_ENV, cluster_secret_file
from lakecast.config import get_settings
from lakecast.spark import get_spark
from tests.lakecast import cluster_helpers as ch

pytestmark = [pytest.mark.cluster, pytest.mark.connect, pytest.mark.slow]

#: a plain PySpark driver that knows the master's URL (and maybe a guessed secret)
INTRUDER = """
import sys
from pyspark.sql import SparkSession
b = (SparkSession.builder.master(sys.argv[1]).appName(sys.argv[2])
     .config("spark.ui.enabled", "false").config("spark.driver.memory", "512m")
     .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1"))
if len(sys.argv) > 3:
    b = b.config("spark.authenticate", "true").config("spark.authenticate.secret", sys.argv[3])
print("RAN", b.getOrCreate().range(4).count(), flush=True)
"""


def _apps(cluster) -> set[str]:
    state = cluster.master_state() or {}
    return {a["name"] for key in ("activeapps", "completedapps") for a in state.get(key, [])}


def _rejections(cluster) -> int:
    """SASL handshakes the master refused so far (its log)."""
    log = cluster.log_file("master").read_text(errors="replace")
    return log.count("Expected SaslMessage") + log.count("Mismatched response")


@pytest.mark.parametrize("secret", [None, "a-guessed-secret"], ids=["no_secret", "wrong"])
def test_an_application_without_the_secret_is_refused(cluster, tmp_path, secret):
    name = f"intruder-{uuid.uuid4().hex[:8]}"
    before = _rejections(cluster)
    # a classic driver of its own: no secret, and none of the Spark Connect variables an
    # earlier test's session left in this process's environment
    connect = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE",
               "SPARK_API_MODE")
    env = {k: v for k, v in os.environ.items()
           if k != "_SPARK_AUTH_SECRET" and k not in connect}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    err = tmp_path / "stderr"
    args = [sys.executable, "-c", INTRUDER, cluster.master_url, name, *([secret] if secret else [])]
    t0 = time.monotonic()
    with open(err, "wb") as f:
        proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=f,
                                start_new_session=True)
    try:
        # refused: the driver says it cannot connect and the master logs the refused
        # handshake (Spark retries for a minute before it gives up; no need to wait)
        while not ("Failed to connect to master" in err.read_text(errors="replace")
                   and _rejections(cluster) > before):
            assert proc.poll() is None or proc.returncode != 0, "the intruder ran a job"
            assert time.monotonic() - t0 < 60, f"no refusal within 60 s:\n{err.read_text()}"
            time.sleep(0.2)
        assert name not in _apps(cluster)  # never registered
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the intruder and its JVM (its own session)
        out = proc.communicate(timeout=30)[0].decode()
    assert "RAN" not in out
    assert time.monotonic() - t0 < 60
    # Lakecast's own application (the cluster's server) is registered and has executors
    assert "lakecast-server" in _apps(cluster) and cluster.app_cores() >= 1


def test_the_secret_is_private_and_never_shown(cluster, lake, monkeypatch):
    path = cluster_secret_file(cluster.settings, cluster.port)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    secret = path.read_text().strip()
    assert len(secret) == 64
    # a job through Lakecast's session works on the authenticated cluster
    monkeypatch.setenv("LAKECAST_SPARK_REMOTE", cluster.server.url)
    spark = get_spark(settings=get_settings())
    assert spark.range(0, 100, 1, 4).count() == 100
    # the driver's conf, which every session reads back, holds no secret
    assert spark.conf.get("spark.authenticate.secret") == SECRET_IN_ENV
    assert spark.conf.get("spark.authenticate") == "true"
    # `lakecast cluster status`
    env = {**os.environ, "LAKECAST_CLUSTER_PORT": str(cluster.port),
           "LAKECAST_SERVER_PORT": str(cluster.server_port)}
    env.pop("LAKECAST_SPARK_REMOTE", None)
    status = subprocess.run([sys.executable, "-m", "lakecast.tools.cli", "cluster", "status"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and "ALIVE" in status.stdout, status.stderr
    assert secret not in status.stdout + status.stderr
    # no command line of the cluster's processes (master, workers, server, executors)
    pids = cluster.processes()
    assert len(pids) >= 5
    for pid in pids:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert secret.encode() not in cmdline, pid
    # no log: the cluster's folder (master, workers, executors' stdout/stderr), the server's
    logs = [p for p in cluster.folder.rglob("*")
            if p.is_file() and p != path and p.stat().st_size < 50 << 20]
    logs += [cluster.server.log_file, cluster.settings.var_dir / "log" / "spark.log"]
    read = [p for p in logs if p.exists()]
    assert any(p.name.startswith("master") for p in read)
    assert any(p.name == "stderr" for p in read)  # an executor's log
    for p in read:
        assert secret.encode() not in p.read_bytes(), p


def test_every_listener_of_the_cluster_is_on_loopback(cluster):
    pids = cluster.processes()
    found = ch.proc_listeners(pids)
    ports = {port for _, port, _ in found}
    # the master, its web UI, the workers' web UIs, the Spark Connect server at least
    assert {cluster.port, cluster.ui_port, cluster.ui_port + 1, cluster.ui_port + 2,
            cluster.server_port} <= ports, found
    assert all(ch.on_loopback(addr) for addr, _, _ in found), found
    assert 6066 not in ports  # no REST submission server (it would skip the secret)
