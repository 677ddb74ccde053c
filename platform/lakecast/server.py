"""The Lakecast Spark server: one long-lived Spark Connect server with Delta configured.

Dagster runs, the CLI and tests attach to it as Spark Connect clients, so consecutive
runs of a pipeline share one server-side session and its Python workers: the task-local
broadcast state stays warm between runs (see ``docs/architecture.md``, "Spark modes").

::

    lakecast server start | stop | status

The server is pyspark's own ``SparkConnectServer`` class started with ``spark-submit``
from the installed ``pyspark`` package (no download), with the configuration of
:func:`lakecast.spark_conf.build_conf` (Delta's session extension, the local JARs, the
master: ``local[*]`` or ``LAKECAST_SPARK_MASTER``). It binds to 127.0.0.1 unless
``LAKECAST_SERVER_HOST`` says otherwise; its log and pid live in ``var/server/``.

Only the owner gets in (:mod:`lakecast.auth`): Spark Connect checks a pre-shared token
(``var/server/token``, generated at the first start, or the operator's
``LAKECAST_SERVER_TOKEN`` / ``LAKECAST_SERVER_TOKEN_FILE``), passed in the server's
environment; binding another address than loopback needs an operator's token. Secret
Hadoop settings (S3 keys) reach the server through a ``core-site.xml`` of its own, never
its Spark conf, which every session exposes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from lakecast.auth import (
    CLUSTER_SECRET_ENV,
    ensure_token,
    is_loopback,
    operator_token,
    private_folder,
    server_folder,
    split_secrets,
    write_hadoop_site,
)
from lakecast.config import DEFAULT_SERVER_PORT, Settings, get_settings
from lakecast.errors import SetupError
from lakecast.spark_conf import build_conf, check_java, driver_env, python_env

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = DEFAULT_SERVER_PORT
#: addresses that mean "every interface": local clients reach those on loopback
_ANY = ("0.0.0.0", "::", "[::]", "")

#: server-only settings (sessions are kept until the server stops: a pipeline's session
#: must outlive the gap between two Dagster runs)
SERVER_CONF = {
    "spark.connect.session.manager.defaultSessionTimeout": "-1",
}


class ServerError(SetupError):
    """The Lakecast Spark server could not be started, stopped or reached."""


@dataclass(frozen=True)
class Server:
    """The Lakecast Spark server of a project (``var/server/``)."""

    settings: Settings
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> Server:
        settings = settings or get_settings()
        return cls(settings, settings.server_host, settings.server_port)

    @property
    def url(self) -> str:
        """The ``sc://`` URL clients on this machine connect to (no token: see
        :func:`lakecast.auth.connection_string`)."""
        host = "127.0.0.1" if self.host in _ANY else self.host
        return f"sc://{host}:{self.port}"

    @property
    def folder(self) -> Path:
        return server_folder(self.settings)

    @property
    def hadoop_conf_dir(self) -> Path:
        """The server's own Hadoop configuration folder (its secret Hadoop settings)."""
        return self.folder / f"hadoop-{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.folder / f"server-{self.port}.pid"

    @property
    def log_file(self) -> Path:
        return self.folder / f"server-{self.port}.log"

    # -- state ---------------------------------------------------------------------
    def pid(self) -> int | None:
        """The server's pid when its process is alive (a zombie counts as dead)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        try:  # reap it if it is our own dead child
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return None
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return pid
        return None if state in ("Z", "X") else pid

    def listening(self, timeout: float = 0.5) -> bool:
        """Whether something accepts connections on the server's port."""
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout):
                return True
        except OSError:
            return False

    def status(self) -> str:
        pid = self.pid()
        if pid is None:
            return f"not running ({self.url}); start it with `lakecast server start`"
        state = "serving" if self.listening() else "starting"
        return f"{state} on {self.url} (pid {pid}, log {self.log_file})"

    # -- start / stop --------------------------------------------------------------
    def _conf(self) -> tuple[dict[str, str], dict[str, str]]:
        """The server's Spark conf and, apart, its secret Hadoop settings."""
        return split_secrets(build_conf(self.settings, {
            **SERVER_CONF,
            "spark.connect.grpc.binding.address": self.host,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.app.name": "lakecast-server",
        }))

    def command(self) -> list[str]:
        """The ``spark-submit`` command line that runs the server (no secret on it)."""
        import pyspark

        spark_home = Path(pyspark.__file__).parent
        conf = self._conf()[0]
        driver_mem = conf.pop("spark.driver.memory", None)
        cmd = [str(spark_home / "bin" / "spark-submit"), "--class", SERVER_CLASS]
        if driver_mem:
            cmd += ["--driver-memory", driver_mem]
        for k, v in sorted(conf.items()):
            cmd += ["--conf", f"{k}={v}"]
        return [*cmd, "spark-internal"]

    def env(self) -> dict[str, str]:
        """The server's environment: Java, Python workers on this interpreter with the
        project on their path, loopback addresses, the token (created if there is none),
        the local cluster's secret when the master is that cluster and, when the Spark
        conf has secret Hadoop settings, the Hadoop configuration folder that holds them."""
        import pyspark

        env = dict(os.environ)
        env.update(python_env(self.settings))
        env["SPARK_HOME"] = str(Path(pyspark.__file__).parent)
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        env.pop("SPARK_CONNECT_MODE_ENABLED", None)
        env.pop("SPARK_REMOTE", None)
        env.pop(CLUSTER_SECRET_ENV, None)
        env["SPARK_CONNECT_AUTHENTICATE_TOKEN"] = ensure_token(self.settings)
        conf, hidden = self._conf()
        env.update(driver_env(self.settings, conf))  # the local cluster's secret
        if hidden:
            if env.get("HADOOP_CONF_DIR"):
                raise ServerError(
                    f"HADOOP_CONF_DIR={env['HADOOP_CONF_DIR']} is set and the Spark conf has "
                    f"secret Hadoop settings ({', '.join(sorted(hidden))}): put them in that "
                    f"folder's core-site.xml instead, or unset HADOOP_CONF_DIR")
            env["HADOOP_CONF_DIR"] = str(write_hadoop_site(self.hadoop_conf_dir, hidden))
        return env

    def check_binding(self) -> None:
        """Refuse an address beyond loopback unless the operator gave a token."""
        if not is_loopback(self.host) and not operator_token(self.settings):
            raise ServerError(
                f"refusing to serve Spark on {self.host} without a token of yours: set "
                f"LAKECAST_SERVER_TOKEN (or LAKECAST_SERVER_TOKEN_FILE, mode 600) to a secret "
                f"its clients share and put TLS in front of it (deploy/README.md), or bind "
                f"127.0.0.1")

    def start(self, timeout: float = 120.0) -> str:
        """Start the server unless it runs; wait until it serves. Returns its URL."""
        if self.pid() is not None:
            self.wait_ready(timeout)
            return self.url
        self.check_binding()
        check_java()
        deadline = time.monotonic() + 15  # a killed JVM may hold its port for a moment
        while self.listening() and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.listening():
            raise ServerError(
                f"port {self.port} on {self.host} is taken by another process; stop it or set "
                f"LAKECAST_SERVER_PORT to a free port")
        private_folder(self.folder)
        self.settings.ensure_local_dirs()
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                self.command(), env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
                cwd=str(self.settings.project_root))
        self.pid_file.write_text(str(proc.pid))
        self.wait_ready(timeout)
        return self.url

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait until the server accepts connections (or fail with its log's tail)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.pid() is None:
                raise ServerError(f"the Lakecast Spark server exited during start-up; "
                                  f"its log ({self.log_file}) ends with:\n{self.log_tail()}")
            if self.listening():
                return
            time.sleep(0.3)
        raise ServerError(f"the Lakecast Spark server did not serve {self.url} within "
                          f"{timeout:.0f} s; its log ({self.log_file}) ends with:\n"
                          f"{self.log_tail()}")

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the server (SIGTERM, then SIGKILL); True if one was running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout

        def alive() -> bool:  # a JVM whose main thread exited may still serve its port
            return self.pid() is not None or self.listening(0.2)

        while alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if alive():
            _signal_group(pid, signal.SIGKILL)
            while alive() and time.monotonic() < deadline + 10:
                time.sleep(0.2)
        self.pid_file.unlink(missing_ok=True)
        (self.hadoop_conf_dir / "core-site.xml").unlink(missing_ok=True)
        return True

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the server's process group (the JVM and the Python workers it forked)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def ensure_server(settings: Settings | None = None) -> Server:
    """The project's server, started when it does not run (the embedded default)."""
    server = Server.from_settings(settings)
    server.start()
    return server
