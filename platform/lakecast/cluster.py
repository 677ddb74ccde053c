"""A local Spark standalone cluster whose driver is the Lakecast Spark server.

::

    lakecast cluster up [--workers N] | add-worker | down | status

One master and N workers (1 core, 2 GiB each), started with ``spark-class`` from the
installed ``pyspark`` package, then the Lakecast Spark server (:mod:`lakecast.server`)
with the cluster as its master. Everything binds to 127.0.0.1; logs, pids and the
workers' work dirs live in ``var/cluster/``. Ports: the master on
``LAKECAST_CLUSTER_PORT`` (7077), its web UI on the next port, worker ``i``'s web UI
on ``port + 1 + i``; the server on ``LAKECAST_SERVER_PORT`` (15002). Every process is
started in a session of its own, so ``down`` stops it with everything it forked
(executors, Python workers) and checks that nothing is left.

Only Lakecast's own applications get in: the master, the workers and every driver
Lakecast starts on the cluster (the server, an in-process session whose
``LAKECAST_SPARK_MASTER`` is the cluster) run with ``spark.authenticate`` and one shared
secret, generated at the first ``up`` into ``var/cluster/secret-<port>`` (mode 0600,
like the server's token; :mod:`lakecast.auth`). The secret reaches each JVM in its
environment (Spark's ``_SPARK_AUTH_SECRET``; executors get it from their worker), never on
a command line or in a Spark conf; an application without it is refused by the master.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path

from lakecast.auth import (
    CLUSTER_SECRET_ENV,
    cluster_folder,
    ensure_cluster_secret,
    private_folder,
)
from lakecast.config import DEFAULT_CLUSTER_PORT, DEFAULT_SERVER_PORT, Settings, get_settings
from lakecast.errors import SetupError
from lakecast.processes import alive, listening, session_members, stop_sessions, tail
from lakecast.server import Server
from lakecast.spark_conf import check_java, python_env

DEFAULT_PORT = DEFAULT_CLUSTER_PORT
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class ClusterError(SetupError):
    """The local cluster could not be started, stopped or reached."""


@dataclass(frozen=True)
class Cluster:
    """The project's local standalone cluster (``var/cluster/``) and its server."""

    settings: Settings
    port: int = DEFAULT_PORT
    server_port: int = DEFAULT_SERVER_PORT
    host: str = "127.0.0.1"
    worker_cores: int = 1
    worker_memory: str = "2g"
    executor_memory: str = "1g"

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> Cluster:
        settings = settings or get_settings()
        return cls(settings, port=settings.cluster_port, server_port=settings.server_port)

    # -- names -----------------------------------------------------------------------
    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    @property
    def ui_port(self) -> int:
        return self.port + 1

    @property
    def folder(self) -> Path:
        return cluster_folder(self.settings)

    def pid_file(self, name: str) -> Path:
        return self.folder / f"{name}-{self.port}.pid"

    def log_file(self, name: str) -> Path:
        return self.folder / f"{name}-{self.port}.log"

    @property
    def server(self) -> Server:
        """The Lakecast Spark server whose master is this cluster."""
        conf = {
            "spark.executor.cores": str(self.worker_cores),
            "spark.executor.memory": self.executor_memory,
            # executors fetch the Delta JARs (spark.jars) from the driver; Python workers
            # run this interpreter with the project on their path
            **{f"spark.executorEnv.{k}": v for k, v in python_env(self.settings).items()},
            **self.settings.spark_conf,
        }
        log4j = self.settings.log4j_file
        if log4j.exists():
            conf.setdefault("spark.executor.extraJavaOptions",
                            f"-Dlog4j.configurationFile=file:{log4j}")
        settings = replace(self.settings, spark_master=self.master_url, spark_conf=conf)
        return Server(settings, self.host, self.server_port)

    # -- state -------------------------------------------------------------------------
    def pid(self, name: str) -> int | None:
        """The pid of ``name`` (``master``, ``worker-1``...) when it is alive."""
        try:
            pid = int(self.pid_file(name).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if alive(pid) else None

    def workers(self) -> list[int]:
        """Numbers of the workers whose process is alive."""
        found = [int(p.name.split("-")[1]) for p in self.folder.glob(f"worker-*-{self.port}.pid")]
        return sorted(i for i in found if self.pid(f"worker-{i}") is not None)

    def master_state(self) -> dict | None:
        """The master web UI's JSON (``None`` when it does not answer)."""
        try:
            url = f"http://{self.host}:{self.ui_port}/json/"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return json.loads(resp.read())
        except (OSError, ValueError):
            return None

    def alive_workers(self) -> int:
        state = self.master_state() or {}
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def sessions(self) -> set[int]:
        """Session ids (= pids of the started processes) of the master, the workers and
        the server, from their pid files."""
        leaders = [self.pid_file("master"), *self.folder.glob(f"worker-*-{self.port}.pid"),
                   self.server.pid_file]
        sids = set()
        for f in leaders:
            try:
                sids.add(int(f.read_text().strip()))
            except (OSError, ValueError):
                continue
        return sids

    def app_cores(self) -> int:
        """Cores the running applications (the server's executors) hold on the workers."""
        state = self.master_state() or {}
        return sum(int(a.get("cores", 0)) for a in state.get("activeapps", []))

    def processes(self) -> list[int]:
        """Every live process of the cluster and its server (executors and Python
        workers included: they stay in the session of the process that started them)."""
        return session_members(self.sessions())

    def status(self) -> str:
        master = self.pid("master")
        if master is None:
            return f"not running ({self.master_url}); start it with `lakecast cluster up`"
        lines = [f"master {self.master_url} (pid {master}, web UI http://{self.host}:"
                 f"{self.ui_port}, log {self.log_file('master')})"]
        lines += [f"worker-{i} (pid {self.pid(f'worker-{i}')}, log "
                  f"{self.log_file(f'worker-{i}')})" for i in self.workers()]
        lines.append(f"{self.alive_workers()} worker(s) ALIVE at the master")
        lines.append(f"server: {self.server.status()}")
        return "\n".join(lines)

    # -- start / stop --------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        import pyspark

        env = dict(os.environ)
        env.update(python_env(self.settings))
        env.update({"SPARK_HOME": str(Path(pyspark.__file__).parent),
                    "SPARK_LOCAL_IP": self.host, "SPARK_MASTER_HOST": self.host,
                    "SPARK_LOCAL_HOSTNAME": self.host})
        for k in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE"):
            env.pop(k, None)
        # spark.authenticate with the cluster's secret (a daemon takes it from the variable)
        env[CLUSTER_SECRET_ENV] = ensure_cluster_secret(self.settings, self.port)
        for opts in ("SPARK_MASTER_OPTS", "SPARK_WORKER_OPTS"):
            env[opts] = f"{env.get(opts, '')} -Dspark.authenticate=true".strip()
        # no REST submission server (port 6066): it takes applications without the secret
        env["SPARK_MASTER_OPTS"] += " -Dspark.master.rest.enabled=false"
        return env

    def _spawn(self, name: str, args: list[str]) -> int:
        import pyspark

        cmd = [str(Path(pyspark.__file__).parent / "bin" / "spark-class"), *args]
        private_folder(self.folder)
        with open(self.log_file(name), "ab") as log:
            proc = subprocess.Popen(cmd, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    cwd=str(self.settings.project_root))
        self.pid_file(name).write_text(str(proc.pid))
        return proc.pid

    def _check_free(self, port: int, what: str) -> None:
        if listening(self.host, port):
            raise ClusterError(f"port {port} on {self.host} ({what}) is taken by another "
                               f"process; stop it or set LAKECAST_CLUSTER_PORT to another "
                               f"base port (the cluster uses it and the next few)")

    def start_master(self, timeout: float = 60.0) -> None:
        if self.pid("master") is not None:
            return
        check_java()
        self._check_free(self.port, "master")
        self._check_free(self.ui_port, "master web UI")
        self._spawn("master", [MASTER_CLASS, "--host", self.host, "--port", str(self.port),
                               "--webui-port", str(self.ui_port)])
        deadline = time.monotonic() + timeout
        while self.master_state() is None:
            if self.pid("master") is None or time.monotonic() > deadline:
                raise ClusterError(f"the master did not start on {self.master_url} within "
                                   f"{timeout:.0f} s; see {self.log_file('master')}:\n"
                                   f"{tail(self.log_file('master'))}")
            time.sleep(0.3)

    def start_worker(self, i: int) -> None:
        """Start worker ``i`` (its own work dir and web UI port) unless it runs."""
        name = f"worker-{i}"
        if self.pid(name) is not None:
            return
        self._check_free(self.ui_port + i, f"{name} web UI")
        work = self.folder / f"worker-{i}"
        work.mkdir(parents=True, exist_ok=True)
        self._spawn(name, [WORKER_CLASS, self.master_url, "--host", self.host,
                           "--cores", str(self.worker_cores), "--memory", self.worker_memory,
                           "--work-dir", str(work), "--webui-port", str(self.ui_port + i)])

    def wait_workers(self, n: int, timeout: float = 90.0) -> None:
        """Wait until the master reports ``n`` ALIVE workers."""
        deadline = time.monotonic() + timeout
        while self.alive_workers() < n:
            if time.monotonic() > deadline:
                logs = ", ".join(str(self.log_file(f"worker-{i}")) for i in range(1, n + 1))
                raise ClusterError(f"{self.alive_workers()} of {n} workers registered with "
                                   f"{self.master_url} within {timeout:.0f} s; see {logs}")
            time.sleep(0.3)

    def up(self, workers: int = 2, server: bool = True) -> None:
        """Start the master, ``workers`` workers and (``server``) the Lakecast server."""
        if workers < 1:
            raise ClusterError(f"a cluster needs at least one worker (got --workers {workers})")
        srv = self.server
        if server and srv.pid() is not None and self.pid("master") is None:
            raise ClusterError(
                f"a Lakecast Spark server already runs on {srv.url} without this cluster "
                f"(pid {srv.pid()}); stop it (`lakecast server stop`) or set "
                f"LAKECAST_SERVER_PORT to another port")
        self.start_master()
        for i in range(1, workers + 1):
            self.start_worker(i)
        self.wait_workers(workers)
        if server:
            srv.start()

    def add_worker(self) -> int:
        """Start one more worker; returns its number once the master has it."""
        i = max(self.workers(), default=0) + 1
        before = self.alive_workers()
        self.start_worker(i)
        self.wait_workers(before + 1)
        return i

    def stop_process(self, name: str, timeout: float = 20.0) -> bool:
        """Stop ``name`` and every process of its session; True if it was running."""
        f = self.pid_file(name)
        try:
            sid = int(f.read_text().strip())
        except (OSError, ValueError):
            return False
        running = alive(sid)
        stop_sessions({sid}, timeout)
        f.unlink(missing_ok=True)
        return running

    def down(self, timeout: float = 30.0) -> list[str]:
        """Stop the server, the workers and the master; returns what was running.
        Raises :class:`ClusterError` when a process of the cluster survives."""
        sids, stopped = self.sessions(), []
        if self.server.stop(timeout):
            stopped.append("server")
        names = [p.name.rsplit("-", 1)[0] for p in self.folder.glob(f"worker-*-{self.port}.pid")]
        for name in [*sorted(names), "master"]:
            if self.stop_process(name, timeout):
                stopped.append(name)
        stop_sessions(sids, timeout)  # anything that left its parent's process group
        left = session_members(sids)
        if left:
            raise ClusterError(f"processes of the cluster are still running after `down`: "
                               f"{left}; stop them with kill -9")
        return stopped
