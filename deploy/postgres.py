"""A PostgreSQL server of the stack's own: Debian's binaries, a data folder under the
stack's root, TCP on 127.0.0.1 only (password, scram-sha-256), a Unix socket in its folder
for the set-up (peer). Run as the ``postgres`` OS user when we are root."""

from __future__ import annotations

import getpass
import os
import secrets
import shutil
import subprocess
from pathlib import Path

from deploy.procs import HOST, StackError, alive, pid_file, require_free, require_traversable


def find_bin(env: dict[str, str]) -> Path:
    """The server binaries: ``LAKECAST_PG_BIN``, else the newest ``/usr/lib/postgresql/*/bin``."""
    if env.get("LAKECAST_PG_BIN"):
        found = [Path(env["LAKECAST_PG_BIN"]) / "initdb"]
        where = f"LAKECAST_PG_BIN={env['LAKECAST_PG_BIN']} holds no initdb"
    else:
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                       key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
        where = "no /usr/lib/postgresql/*/bin/initdb"
    if not found or not found[-1].is_file():
        raise StackError(f"PostgreSQL server not installed ({where}): run `make postgres` "
                         f"(apt-get install -y postgresql), or set LAKECAST_PG_BIN to the "
                         f"folder holding initdb and pg_ctl")
    return found[-1].parent


class PostgresServer:
    """The server whose files live in ``folder`` (``data/``, ``postgres.log``, the socket)."""

    def __init__(self, folder: Path, port: int, user: str, db: str,
                 env: dict[str, str]) -> None:
        self.folder, self.port, self.user, self.db, self.env = folder, port, user, db, env
        self.data = folder / "data"
        self.log = folder / "postgres.log"
        self.os_user = "postgres" if os.geteuid() == 0 else None

    def _as_owner(self, *cmd: str) -> list[str]:
        """``cmd`` as the OS user owning the data (PostgreSQL refuses to run as root)."""
        return ["runuser", "-u", self.os_user, "--", *cmd] if self.os_user else list(cmd)

    def superuser(self) -> str:
        """The cluster's superuser: the OS user running it (peer authentication)."""
        return self.os_user or getpass.getuser()

    def password(self, secret_file: Path) -> str:
        """``DAGSTER_PG_PASSWORD``, else one generated on first use into ``secret_file``."""
        if self.env.get("DAGSTER_PG_PASSWORD"):
            return self.env["DAGSTER_PG_PASSWORD"]
        if not secret_file.exists():
            secret_file.parent.mkdir(parents=True, exist_ok=True)
            secret_file.touch(mode=0o600)
            secret_file.write_text(secrets.token_urlsafe(24))
        return secret_file.read_text().strip()

    def pid(self) -> int | None:
        """The postmaster's pid while it runs."""
        pid = pid_file(self.data / "postmaster.pid")
        return pid if pid is not None and alive(pid) else None

    def _run(self, cmd: list[str], what: str, stdin: str | None = None) -> str:
        res = subprocess.run(cmd, capture_output=True, text=True, input=stdin, check=False)
        if res.returncode != 0:
            detail = (res.stderr or res.stdout).strip()[-800:]
            raise StackError(f"{what} failed (exit {res.returncode}): {detail}\n"
                             f"(server log: {self.log})")
        return res.stdout

    def start(self) -> None:
        """initdb once, then start the server on 127.0.0.1:port."""
        bin_dir = find_bin(self.env)
        require_free(self.port, "PostgreSQL", "DAGSTER_PG_PORT")
        sock = self.folder / f".s.PGSQL.{self.port}"
        if len(str(sock)) > 100:  # sun_path holds 107 bytes
            raise StackError(f"the server's Unix socket path {sock} is too long "
                             f"({len(str(sock))} > 100 characters): choose a shorter --root")
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.os_user:
            require_traversable(self.folder.parent, self.os_user)
            shutil.chown(self.folder, self.os_user, self.os_user)
            self.folder.chmod(0o700)
        if not (self.data / "PG_VERSION").exists():
            self._run(self._as_owner(str(bin_dir / "initdb"), "-D", str(self.data), "-U",
                                     self.superuser(), "-E", "UTF8", "--auth-local=peer",
                                     "--auth-host=scram-sha-256"), "initdb")
        opts = f"-p {self.port} -c listen_addresses={HOST} -k {self.folder}"
        self._run(self._as_owner(str(bin_dir / "pg_ctl"), "-D", str(self.data), "-l",
                                 str(self.log), "-w", "-t", "60", "-o", opts, "start"),
                  "pg_ctl start")

    def ensure_role_and_db(self, password: str) -> None:
        """The login role with ``password`` (set again each time), and its database."""
        psql = self._as_owner(str(find_bin(self.env) / "psql"), "-h", str(self.folder), "-p",
                              str(self.port), "-U", self.superuser(), "-d", "postgres", "-v",
                              "ON_ERROR_STOP=1", "-tA")
        has_role = self._run([*psql, "-c", f"SELECT 1 FROM pg_roles WHERE rolname = "
                                           f"'{self.user}'"], "psql (role lookup)").strip()
        verb = "ALTER" if has_role else "CREATE"
        quoted = password.replace("'", "''")
        # the password goes in on stdin, never on a command line
        self._run([*psql, "-f", "-"], f"psql ({verb} ROLE {self.user})",
                  stdin=f"{verb} ROLE \"{self.user}\" LOGIN PASSWORD '{quoted}';\n")
        has_db = self._run([*psql, "-c", f"SELECT 1 FROM pg_database WHERE datname = "
                                         f"'{self.db}'"], "psql (database lookup)").strip()
        if not has_db:
            self._run([*psql, "-c", f'CREATE DATABASE "{self.db}" OWNER "{self.user}"'],
                      f"psql (CREATE DATABASE {self.db})")

    def stop(self) -> None:
        """Fast shutdown (open sessions are ended), waiting until it has stopped."""
        if self.pid() is not None:
            self._run(self._as_owner(str(find_bin(self.env) / "pg_ctl"), "-D", str(self.data),
                                     "-m", "fast", "-w", "-t", "60", "stop"), "pg_ctl stop")
