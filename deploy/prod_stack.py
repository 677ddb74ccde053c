"""The production Dagster stack on one machine, over loopback: PostgreSQL (run, event-log
and schedule storage), ``dagster-daemon`` and ``dagster-webserver`` as separate processes.

    python -m deploy.prod_stack up        # init + start PostgreSQL, the instance, daemon, UI
    python -m deploy.prod_stack status    # what runs, where its logs are (--json for tools)
    python -m deploy.prod_stack down      # stop all of it, no process left (--purge: delete)

Everything lives under ``--root`` (``LAKECAST_PROD_ROOT``, default ``var/prodstack``):
``postgres/`` (data, server log, socket; owned by the ``postgres`` OS user under root),
``dagster_home/dagster.yaml`` (copied from ``deploy/dagster/dagster.production.yaml``),
``logs/`` and ``run/`` (pids, the generated database password). From the environment:
``DAGSTER_PG_PORT`` (15432), ``LAKECAST_WEB_PORT`` (3001), ``DAGSTER_PG_USER`` and
``DAGSTER_PG_DB`` (``lakecast``), ``DAGSTER_PG_PASSWORD`` (generated once if unset). Every
listener binds 127.0.0.1. The rest of the environment (``LAKECAST_*``: lake root, Spark,
the Spark server's ``LAKECAST_SERVER_TOKEN``) passes through to the daemon and so to its
runs, never into run config or ``status``; without a token variable the runs read the
server's ``var/server/token``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from deploy.postgres import PostgresServer
from deploy.procs import HOST, StackError, alive, group, pid_file, require_free, signal_group

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DAGSTER_PROCS = ("daemon", "webserver")
DEFAULT_PG_PORT, DEFAULT_WEB_PORT = 15432, 3001


class Stack:
    """The stack whose files live under ``root``; settings from ``env``."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root.resolve()
        self.env = env
        self.home = self.root / "dagster_home"
        self.logs = self.root / "logs"
        self.run = self.root / "run"
        saved = self._saved()  # the ports of the last `up`, for status and down
        self.web_port = int(env.get("LAKECAST_WEB_PORT") or saved.get("web_port")
                            or DEFAULT_WEB_PORT)
        pg_port = int(env.get("DAGSTER_PG_PORT") or saved.get("pg_port") or DEFAULT_PG_PORT)
        self.pg = PostgresServer(self.root / "postgres", pg_port,
                                 env.get("DAGSTER_PG_USER", "lakecast"),
                                 env.get("DAGSTER_PG_DB", "lakecast"), env)

    def _saved(self) -> dict:
        path = self.root / "stack.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def pid(self, name: str) -> int | None:
        """Pid of the running ``name`` (daemon or webserver), else None."""
        pid = pid_file(self.run / f"{name}.pid")
        if pid is None or not alive(pid):
            return None
        try:  # not a recycled pid
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        return pid if f"dagster-{name}".encode() in cmdline else None

    def dagster_env(self) -> dict[str, str]:
        """The environment of the Dagster processes: the instance and its database."""
        return {**self.env, "DAGSTER_HOME": str(self.home), "DAGSTER_PG_HOST": HOST,
                "DAGSTER_PG_PORT": str(self.pg.port), "DAGSTER_PG_USER": self.pg.user,
                "DAGSTER_PG_DB": self.pg.db,
                "DAGSTER_PG_PASSWORD": self.pg.password(self.run / "pg_password")}

    def _start_postgres(self) -> None:
        if self.pg.pid() is not None:
            running = self._saved().get("pg_port")
            if running not in (None, self.pg.port):
                raise StackError(f"PostgreSQL of {self.root} already runs on port {running}, "
                                 f"not {self.pg.port}: `down` first")
        else:
            self.pg.start()
        self.pg.ensure_role_and_db(self.pg.password(self.run / "pg_password"))

    def _write_instance(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.run.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PROJECT_ROOT / "deploy" / "dagster" / "dagster.production.yaml",
                        self.home / "dagster.yaml")
        (self.root / "stack.json").write_text(json.dumps(
            {"pg_port": self.pg.port, "web_port": self.web_port}))

    def _migrate(self) -> None:
        """Create (or upgrade) the instance's tables once, before the daemon and the
        webserver start: on a fresh database both would create them at once, and the loser
        of that race exits (a duplicate ``alembic_version`` table)."""
        out = subprocess.run([str(Path(sys.executable).parent / "dagster"), "instance",
                              "migrate"], cwd=PROJECT_ROOT, env=self.dagster_env(),
                             capture_output=True, text=True, timeout=300, check=False)
        if out.returncode != 0:
            raise StackError(f"dagster instance migrate failed (exit {out.returncode}): "
                             f"{(out.stderr or out.stdout)[-2000:]}")

    def _start_dagster(self, name: str) -> None:
        """Start ``name`` in a process group of its own (its code server and runs join it)."""
        if self.pid(name) is not None:
            return
        bin_dir, workspace = Path(sys.executable).parent, str(PROJECT_ROOT / "workspace.yaml")
        if name == "daemon":
            cmd = [str(bin_dir / "dagster-daemon"), "run", "-w", workspace]
        else:
            require_free(self.web_port, "dagster-webserver", "LAKECAST_WEB_PORT")
            cmd = [str(bin_dir / "dagster-webserver"), "-h", HOST, "-p", str(self.web_port),
                   "-w", workspace]
        self.logs.mkdir(parents=True, exist_ok=True)
        path = self.logs / f"{name}.log"
        if path.exists():  # the previous start's log is kept as <name>.log.1
            path.replace(path.with_suffix(".log.1"))
        with open(path, "wb") as log:
            proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=self.dagster_env(), stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        (self.run / f"{name}.pid").write_text(str(proc.pid))

    def _wait_ready(self, timeout: float = 180.0) -> None:
        """The webserver answers on its port; the daemon's log lists its daemons."""
        deadline, url = time.monotonic() + timeout, f"http://{HOST}:{self.web_port}/server_info"
        web_ok = daemon_ok = False
        while time.monotonic() < deadline and not (web_ok and daemon_ok):
            for name in DAGSTER_PROCS:
                if self.pid(name) is None:
                    log = self.logs / (name + ".log")
                    tail = log.read_text(errors="replace").strip().splitlines()[-15:]
                    raise StackError(f"dagster-{name} exited while starting: see {log}; its "
                                     f"last lines:\n" + "\n".join(tail))
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    web_ok = resp.status == 200
            except OSError:
                pass
            daemon_ok = "configured with the following daemons" in (
                self.logs / "daemon.log").read_text(errors="replace")
            time.sleep(0.5)
        if not (web_ok and daemon_ok):
            late = "webserver" if not web_ok else "daemon"
            raise StackError(f"dagster-{late} not ready after {timeout:.0f} s: see "
                             f"{self.logs / (late + '.log')}")

    def up(self) -> None:
        """Start what is not running yet; on a failure, stop what this call started."""
        was_up = self.pg.pid() is not None or any(self.pid(n) for n in DAGSTER_PROCS)
        try:
            self._start_postgres()
            self._write_instance()
            if not all(self.pid(n) for n in DAGSTER_PROCS):
                self._migrate()
            for name in DAGSTER_PROCS:
                self._start_dagster(name)
            self._wait_ready()
        except StackError as e:
            if was_up:
                raise
            self.down()
            raise StackError(f"{e}\n(stopped what had started)") from e

    def down(self, timeout: float = 60.0) -> None:
        """SIGTERM each Dagster process group (code servers and runs with it), SIGKILL what
        is left after ``timeout`` s, stop PostgreSQL; fail if any process survives."""
        groups = [p for p in (pid_file(self.run / f"{n}.pid") for n in DAGSTER_PROCS) if p]
        for pgid in groups:
            signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(group(g) for g in groups) and time.monotonic() < deadline:
            time.sleep(0.3)
        for pgid in groups:
            signal_group(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while any(group(g) for g in groups) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.pg.stop()
        left = [p for g in groups for p in group(g)]
        if left or self.pg.pid() is not None:
            raise StackError(f"processes left after down: {left or ['postgres']}")
        for name in DAGSTER_PROCS:
            (self.run / f"{name}.pid").unlink(missing_ok=True)

    def status(self) -> dict:
        """Pids (None: stopped), address, logs, UI URL and DAGSTER_HOME."""
        return {
            "root": str(self.root), "dagster_home": str(self.home),
            "url": f"http://{HOST}:{self.web_port}",
            "postgres": {"pid": self.pg.pid(), "host": HOST, "port": self.pg.port,
                         "user": self.pg.user, "db": self.pg.db, "log": str(self.pg.log)},
            **{name: {"pid": self.pid(name), "log": str(self.logs / f"{name}.log")}
               for name in DAGSTER_PROCS},
        }


def _print_status(info: dict) -> None:
    def state(pid: int | None) -> str:
        return f"pid {pid}" if pid else "stopped"

    pg = info["postgres"]
    print(f"postgres   {state(pg['pid'])}  postgresql://{pg['user']}@{pg['host']}:{pg['port']}/"
          f"{pg['db']}  (log {pg['log']})")
    for name in DAGSTER_PROCS:
        print(f"{name:<10} {state(info[name]['pid'])}  (log {info[name]['log']})")
    print(f"UI         {info['url']}  (DAGSTER_HOME={info['dagster_home']})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--root", default=os.environ.get(
        "LAKECAST_PROD_ROOT", str(PROJECT_ROOT / "var" / "prodstack")))
    parser.add_argument("--json", action="store_true", help="print the status as JSON")
    parser.add_argument("--purge", action="store_true", help="down: then delete --root")
    args = parser.parse_args(argv)
    stack = Stack(Path(args.root), dict(os.environ))
    try:
        if args.command == "up":
            stack.up()
        elif args.command == "down":
            stack.down()
            if args.purge:
                shutil.rmtree(stack.root)
                print(f"deleted {stack.root}")
                return 0
    except StackError as e:
        print(f"prod_stack {args.command}: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(stack.status()))
    else:
        _print_status(stack.status())
    return 0


if __name__ == "__main__":
    sys.exit(main())
