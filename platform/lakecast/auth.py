"""Who may use the Lakecast Spark server: its token, pipelines' session ids, secret confs.

- **The token.** The server runs Spark Connect with a pre-shared token
  (``SPARK_CONNECT_AUTHENTICATE_TOKEN`` in its environment, never on its command line);
  every Lakecast client sends it as a bearer token. It is the operator's
  ``LAKECAST_SERVER_TOKEN``, else the file ``LAKECAST_SERVER_TOKEN_FILE``, else
  ``var/server/token``, generated at the server's first start (mode 0600).
- **Session ids.** A pipeline's server-side session id is random (uuid4), created once per
  pipeline and lake and kept in ``var/server/sessions.json`` (mode 0600): stable across
  runs (warm state), unguessable from the lake and the pipeline's name.
- **Secrets stay off sessions.** Spark copies its whole conf into every session, where
  any client reads it back with ``spark.conf.get``: the server's secret Hadoop settings
  (``spark.hadoop.*`` keys such as ``fs.s3a.secret.key``) go into a ``core-site.xml`` of
  its own (mode 0600) instead, which only its Hadoop configuration reads.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import secrets
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path
from xml.sax.saxutils import escape

from lakecast.config import Settings
from lakecast.errors import ConfigError, SetupError
from lakecast.secret_keys import SECRET_KEY

#: a token is sent as gRPC metadata and a ``;token=`` URL parameter
_TOKEN = re.compile(r"[A-Za-z0-9._~-]{16,512}")
_HADOOP = "spark.hadoop."


class AuthError(SetupError):
    """The server's token or session store cannot be used (the message names the fix)."""


def server_folder(settings: Settings) -> Path:
    """The server's folder (``var/server/``): token, sessions, logs, pids."""
    return settings.var_dir / "server"


def token_file(settings: Settings) -> Path:
    """Where the token is read from when ``LAKECAST_SERVER_TOKEN`` is not set."""
    return settings.server_token_file or server_folder(settings) / "token"


def operator_token(settings: Settings) -> bool:
    """Whether the operator provides the token (variable or token file), not a generated one."""
    return bool(settings.server_token or settings.server_token_file)


def read_token(settings: Settings) -> str | None:
    """The server's token, ``None`` when there is none yet (no variable, no file)."""
    if settings.server_token:
        return _valid(settings.server_token, "LAKECAST_SERVER_TOKEN")
    path = token_file(settings)
    if not path.exists():
        if settings.server_token_file:
            raise AuthError(f"LAKECAST_SERVER_TOKEN_FILE={path} does not exist: create it "
                            f"(mode 600) or unset the variable")
        return None
    _check_private(path)
    return _valid(path.read_text().strip(), str(path))


def ensure_token(settings: Settings) -> str:
    """The server's token; generated into ``var/server/token`` (0600) when there is none."""
    token = read_token(settings)
    if token is not None:
        return token
    path = token_file(settings)
    private_folder(path.parent)
    _write_private(path, secrets.token_urlsafe(32) + "\n", exclusive=True)
    return read_token(settings) or ""


def client_token(settings: Settings, url: str) -> str:
    """The token a client sends to the server at ``url`` (an error naming the fix if none)."""
    token = read_token(settings)
    if token is None:
        raise AuthError(f"no token for the Spark server at {url}: the server writes "
                        f"{token_file(settings)} when it starts (`lakecast server start`); "
                        f"or set LAKECAST_SERVER_TOKEN to the token it was started with")
    return token


def _valid(token: str, where: str) -> str:
    if not _TOKEN.fullmatch(token):
        raise AuthError(f"the server token from {where} is not usable: use 16 to 512 "
                        f"characters of letters, digits and ._~- (e.g. the output of "
                        f"`openssl rand -hex 32`)")
    return token


def _check_private(path: Path) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise AuthError(f"{path} is readable by other users (mode {mode:o}): "
                        f"run `chmod 600 {path}`")


def private_folder(path: Path) -> Path:
    """Create ``path`` (and parents) and make it the owner's only (0700)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def _write_private(path: Path, text: str, exclusive: bool = False) -> None:
    """Write ``text`` to ``path`` with mode 0600, atomically (a temp file renamed, or with
    ``exclusive`` linked: a file that appeared meanwhile is kept)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        if exclusive:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# -- session ids ------------------------------------------------------------------------
@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def session_id_for(settings: Settings, name: str) -> str:
    """The server-side session id of session ``name`` on this lake: a uuid4 created once,
    then read from ``var/server/sessions.json`` (0600). Entries of local lakes that no
    longer exist are dropped when a new one is added."""
    folder = private_folder(server_folder(settings))
    path, key = folder / "sessions.json", f"{settings.lake_root}\n{name}"
    with _locked(folder / ".sessions.lock"):
        known: dict[str, str] = {}
        if path.exists():
            _check_private(path)
            try:
                known = json.loads(path.read_text())
            except ValueError:
                raise AuthError(f"{path} is not valid JSON: delete it (pipelines then start "
                                f"new sessions, their state cold once)") from None
        if key in known:
            return known[key]
        known = {k: v for k, v in known.items() if _lake_exists(k.split("\n", 1)[0])}
        known[key] = str(uuid.uuid4())
        _write_private(path, json.dumps(known, indent=1, sort_keys=True))
        return known[key]


def _lake_exists(root: str) -> bool:
    return "://" in root or Path(root).exists()


# -- client connection strings --------------------------------------------------------
def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def connection_string(url: str, token: str, session_id: str) -> str:
    """The ``sc://`` connection string of a Lakecast client: ``url`` with its token and
    session id. PySpark sends a token only over TLS (``use_ssl=true``) or to
    ``localhost`` (gRPC local credentials): a loopback address is reached as
    ``localhost``; another host without ``use_ssl=true`` is refused, since the token
    would cross the network in the clear."""
    base, _, params = url.removeprefix("sc://").partition("/")
    if base.startswith("["):  # [IPv6]:port
        host, _, rest = base[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = base.partition(":")
    pairs = [p for p in params.split(";") if p]
    keys = {p.split("=", 1)[0].lower(): p.split("=", 1)[-1] for p in pairs}
    if "token" in keys or "session_id" in keys:
        raise ConfigError(f"LAKECAST_SPARK_REMOTE={url.split(';')[0]}...: leave token= and "
                          f"session_id= out of the URL (set LAKECAST_SERVER_TOKEN; Lakecast "
                          f"picks the session)")
    if keys.get("use_ssl", "").lower() != "true":
        if not is_loopback(host):
            raise ConfigError(
                f"LAKECAST_SPARK_REMOTE=sc://{base}: a server on another host is reached "
                f"only over TLS, or the token would cross the network in the clear: put "
                f"TLS in front of it and add ;use_ssl=true (deploy/README.md)")
        host = "localhost"
    host = f"[{host}]" if ":" in host else host
    where = f"{host}:{port}" if port else host
    return ";".join([f"sc://{where}/", *pairs, f"token={token}", f"session_id={session_id}"])


# -- secret confs -----------------------------------------------------------------------
def split_secrets(conf: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``conf`` without its secret Hadoop settings, and those as Hadoop keys
    (``spark.hadoop.fs.s3a.secret.key`` -> ``fs.s3a.secret.key``). Any other key that
    looks secret is refused: every client of the server could read it back."""
    public, hidden = {}, {}
    for k, v in conf.items():
        if not SECRET_KEY.search(k) or (k, v) == (SPARK_AUTH_SECRET, SECRET_IN_ENV):
            public[k] = v
        elif k.startswith(_HADOOP):
            hidden[k.removeprefix(_HADOOP)] = v
        else:
            raise ConfigError(
                f"{k} looks like a secret and every client of the Lakecast Spark server "
                f"could read it with spark.conf.get: remove it from the Spark conf and give "
                f"it to the server through its environment (Hadoop credentials: as "
                f"spark.hadoop.* keys, which the server keeps in its own core-site.xml)")
    return public, hidden


def write_hadoop_site(folder: Path, hadoop: dict[str, str]) -> Path:
    """Write ``hadoop`` as ``folder/core-site.xml`` (folder 0700, file 0600); returns the
    folder, the server's ``HADOOP_CONF_DIR``."""
    private_folder(folder)
    props = "".join(f"  <property><name>{escape(k)}</name><value>{escape(v)}</value>"
                    f"</property>\n" for k, v in sorted(hadoop.items()))
    _write_private(folder / "core-site.xml",
                   f'<?xml version="1.0"?>\n<configuration>\n{props}</configuration>\n')
    return folder


# -- the local cluster's shared secret (spark.authenticate) ---------------------------
#: Spark's variable for the shared secret (``SecurityManager.ENV_AUTH_SECRET``). In Spark
#: 4.2 a standalone master, worker or driver takes the secret from it, else from
#: ``spark.authenticate.secret``; ``spark.authenticate.secret.file`` is Kubernetes-only
#: ("Secret keys provided via files is only allowed in Kubernetes mode").
CLUSTER_SECRET_ENV = "_SPARK_AUTH_SECRET"
SPARK_AUTH_SECRET = "spark.authenticate.secret"
#: a standalone driver's ``spark.authenticate.secret``: Spark requires the key on it
#: (``SecurityManager.initializeAuth``) but reads :data:`CLUSTER_SECRET_ENV` first, so
#: the conf (which every session and the UI expose) holds no secret
SECRET_IN_ENV = f"env:{CLUSTER_SECRET_ENV}"


def cluster_folder(settings: Settings) -> Path:
    """The local cluster's folder (``var/cluster/``): secret, logs, pids, work dirs."""
    return settings.var_dir / "cluster"


def cluster_secret_file(settings: Settings, port: int) -> Path:
    """The shared secret of the local cluster whose master listens on ``port`` (0600)."""
    return cluster_folder(settings) / f"secret-{port}"


def ensure_cluster_secret(settings: Settings, port: int) -> str:
    """The cluster's secret; generated (256 random bits, mode 0600) when there is none."""
    path = cluster_secret_file(settings, port)
    if not path.exists():
        private_folder(path.parent)
        _write_private(path, secrets.token_hex(32) + "\n", exclusive=True)
    _check_private(path)
    return path.read_text().strip()


def cluster_secret(settings: Settings, master: str) -> str | None:
    """The secret of ``master`` when it is this project's local cluster (a loopback
    ``spark://host:port`` with a secret file), else ``None``."""
    m = re.fullmatch(r"spark://\[?([^\]/,]+?)\]?:(\d+)/?", master.strip())
    if m is None or not is_loopback(m.group(1)):
        return None
    path = cluster_secret_file(settings, int(m.group(2)))
    return ensure_cluster_secret(settings, int(m.group(2))) if path.exists() else None


def cluster_auth(settings: Settings, master: str) -> tuple[dict[str, str], dict[str, str]]:
    """The Spark conf and the environment of a driver whose master is ``master``: for the
    local cluster, ``spark.authenticate`` on and the secret in the JVM's environment
    (never in its conf or on its command line); nothing for any other master."""
    secret = cluster_secret(settings, master)
    if secret is None:
        return {}, {}
    return ({"spark.authenticate": "true", SPARK_AUTH_SECRET: SECRET_IN_ENV},
            {CLUSTER_SECRET_ENV: secret})
