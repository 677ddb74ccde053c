"""One place for Lakecast's configuration: lake paths, Dagster home, Spark settings.

Every setting has an embedded default inside the project (git-ignored ``var/``)
and an environment override:

- project root: ``LAKECAST_HOME`` (default: the checkout)
- lake root, every Delta table: ``LAKECAST_LAKE_ROOT`` (``var/lake``)
- checkpoint root: ``LAKECAST_CHECKPOINT_ROOT`` (``var/checkpoints``)
- Dagster home: ``DAGSTER_HOME`` (``var/dagster_home``)
- Delta JAR folder: ``LAKECAST_JARS_DIR`` (``var/jars``)
- Spark master: ``LAKECAST_SPARK_MASTER`` (``local[*]``)
- Spark defaults file: ``LAKECAST_SPARK_CONF_FILE`` (``deploy/spark/spark-defaults.conf``)
- extra Spark conf: ``LAKECAST_SPARK_CONF`` as ``k=v;k=v`` (none)
- Spark mode: ``LAKECAST_SPARK_REMOTE`` (empty: Spark in this process; ``server``: the
  project's Lakecast Spark server, started on demand; ``sc://host:port``: a running
  Spark Connect server, see :mod:`lakecast.server`)
- how long (by event time) a micro-batch pipeline remembers the keys it accepted, to
  reject a later copy as a duplicate: ``LAKECAST_DEDUP_RETENTION`` (``7d``; see
  :mod:`lakecast.pipeline.dedup`)
- how long (by plan time) a micro-batch pipeline keeps retrying an event its function
  held until the event's state arrives, before sending it to unmatched:
  ``LAKECAST_HOLD_TIMEOUT`` (``0``: never held past its batch; see
  :mod:`lakecast.pipeline.held`)
- tasks per micro-batch when a run does not set it: ``LAKECAST_PARALLELISM`` (none: as
  the events are read; on a cluster, e.g. its executors' cores)
- the Lakecast Spark server's address: ``LAKECAST_SERVER_HOST`` (``127.0.0.1``; another
  address needs an operator's token, see :mod:`lakecast.server`) and
  ``LAKECAST_SERVER_PORT`` (``15002``)
- the server's pre-shared token, which every client sends: ``LAKECAST_SERVER_TOKEN``
  (none: read from the token file), else the file ``LAKECAST_SERVER_TOKEN_FILE``
  (``var/server/token``, generated at the server's first start, mode 0600)
- the local cluster's master port: ``LAKECAST_CLUSTER_PORT`` (``7077``; see
  :mod:`lakecast.cluster`)
- the CLI's pipelines module: ``LAKECAST_PIPELINES`` (none: ``jobs.registry``; see
  :mod:`lakecast.tools.registry`)
- fault injection for tests: ``LAKECAST_CRASH_AT`` (none: never; see
  :mod:`lakecast.pipeline.faults`)

Lake roots may be URIs (``s3a://bucket/lake``); local paths are made absolute.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from lakecast.errors import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parents[2]
#: default of ``LAKECAST_DEDUP_RETENTION``
DEFAULT_DEDUP_RETENTION = timedelta(days=7)
#: default of ``LAKECAST_HOLD_TIMEOUT``: held events go to unmatched in their own batch
DEFAULT_HOLD_TIMEOUT = timedelta(0)
#: default of ``LAKECAST_SERVER_HOST``: loopback only
DEFAULT_SERVER_HOST = "127.0.0.1"
#: default of ``LAKECAST_SERVER_PORT`` (Spark Connect's own default)
DEFAULT_SERVER_PORT = 15002
#: default of ``LAKECAST_CLUSTER_PORT`` (Spark standalone's own default)
DEFAULT_CLUSTER_PORT = 7077
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _is_uri(value: str) -> bool:
    return "://" in value


def _path_or_uri(value: str, base: Path) -> str:
    if _is_uri(value):
        return value.rstrip("/")
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


def parse_conf_pairs(text: str) -> dict[str, str]:
    """Parse ``k=v`` pairs separated by ``;`` or newlines (``LAKECAST_SPARK_CONF``)."""
    out: dict[str, str] = {}
    for raw in text.replace("\n", ";").split(";"):
        item = raw.strip()
        if not item or item.startswith("#"):
            continue
        if "=" not in item:
            raise ConfigError(f"LAKECAST_SPARK_CONF entry {item!r} is not of the form key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def parse_spark_defaults(path: Path) -> dict[str, str]:
    """Parse a ``spark-defaults.conf`` file (``key value`` or ``key=value`` per line)."""
    out: dict[str, str] = {}
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1) if "=" not in line.split(None, 1)[0] else line.split("=", 1)
        if len(parts) != 2:
            raise ConfigError(f"{path}:{lineno}: expected 'key value', got {raw!r}")
        out[parts[0].strip()] = parts[1].strip()
    return out


def parse_duration(text: str, name: str = "LAKECAST_DEDUP_RETENTION") -> timedelta:
    """``7d``, ``36h``, ``90m``, ``3600s`` or ``3600`` (seconds) as a ``timedelta``."""
    m = _DURATION.match(text)
    if m is None:
        raise ConfigError(f"{name}={text!r} is not a duration: write e.g. 7d, 36h, 90m or "
                          f"3600s (a bare number is seconds)")
    return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])


@dataclass(frozen=True)
class Settings:
    """Resolved Lakecast settings. Build with :func:`get_settings`."""

    project_root: Path
    lake_root: str
    checkpoint_root: str
    dagster_home: str
    jars_dir: Path
    spark_master: str | None
    spark_conf_file: Path | None
    spark_conf: dict[str, str] = field(default_factory=dict, repr=False)  # may hold secrets
    #: "" (in-process Spark), "server" (the project's server) or an ``sc://`` URL
    spark_remote: str = ""
    #: how long by event time a pipeline remembers accepted keys (cross-batch dedup)
    dedup_retention: timedelta = DEFAULT_DEDUP_RETENTION
    #: how long by plan time a pipeline retries the events its function held
    hold_timeout: timedelta = DEFAULT_HOLD_TIMEOUT
    #: tasks per micro-batch when a run does not set it (None: as the events are read)
    parallelism: int | None = None
    #: the Lakecast Spark server's bind address and port
    server_host: str = DEFAULT_SERVER_HOST
    server_port: int = DEFAULT_SERVER_PORT
    #: the operator's server token (``LAKECAST_SERVER_TOKEN``); kept out of ``repr``
    server_token: str | None = field(default=None, repr=False)
    #: the operator's token file (None: ``var/server/token`` of the project)
    server_token_file: Path | None = None
    #: the local cluster's master port
    cluster_port: int = DEFAULT_CLUSTER_PORT
    #: the CLI's pipelines module (None: the project's ``jobs.registry``)
    pipelines_module: str | None = None
    #: ``<point>`` or ``<point>:<batch_id>`` where a test kills the process (empty: never)
    crash_at: str = ""

    def table_path(self, name: str) -> str:
        """Path of the Delta table ``name`` in the lake."""
        if not name or "/" in name or name.startswith("."):
            raise ConfigError(f"invalid table name {name!r}")
        return f"{self.lake_root}/{name}"

    def checkpoint_path(self, name: str) -> str:
        """Path of the checkpoint folder ``name`` (streaming offsets, snapshots)."""
        return f"{self.checkpoint_root}/{name}"

    def ensure_local_dirs(self) -> None:
        """Create the local lake, checkpoint and Dagster folders (URIs are left alone)."""
        for p in (self.lake_root, self.checkpoint_root, self.dagster_home):
            if not _is_uri(p):
                Path(p).mkdir(parents=True, exist_ok=True)
        instance_yaml = Path(self.dagster_home) / "dagster.yaml"
        template = self.project_root / "deploy" / "dagster" / "dagster.yaml"
        if not instance_yaml.exists() and template.exists():
            shutil.copyfile(template, instance_yaml)


def get_settings(env: dict[str, str] | None = None) -> Settings:
    """Resolve settings from the environment (``os.environ`` by default)."""
    env = dict(os.environ if env is None else env)
    root = Path(env.get("LAKECAST_HOME", str(PROJECT_ROOT))).resolve()
    var = root / "var"
    conf_file_env = env.get("LAKECAST_SPARK_CONF_FILE")
    conf_file: Path | None
    if conf_file_env:
        conf_file = Path(conf_file_env).expanduser().resolve()
        if not conf_file.is_file():
            raise ConfigError(f"LAKECAST_SPARK_CONF_FILE={conf_file_env} does not exist")
    else:
        default = root / "deploy" / "spark" / "spark-defaults.conf"
        conf_file = default if default.is_file() else None
    return Settings(
        project_root=root,
        lake_root=_path_or_uri(env.get("LAKECAST_LAKE_ROOT", str(var / "lake")), root),
        checkpoint_root=_path_or_uri(
            env.get("LAKECAST_CHECKPOINT_ROOT", str(var / "checkpoints")), root
        ),
        dagster_home=_path_or_uri(env.get("DAGSTER_HOME", str(var / "dagster_home")), root),
        jars_dir=Path(_path_or_uri(env.get("LAKECAST_JARS_DIR", str(var / "jars")), root)),
        spark_master=env.get("LAKECAST_SPARK_MASTER") or None,
        spark_conf_file=conf_file,
        spark_conf=parse_conf_pairs(env.get("LAKECAST_SPARK_CONF", "")),
        spark_remote=_remote(env.get("LAKECAST_SPARK_REMOTE", "")),
        dedup_retention=parse_duration(env["LAKECAST_DEDUP_RETENTION"])
        if env.get("LAKECAST_DEDUP_RETENTION") else DEFAULT_DEDUP_RETENTION,
        hold_timeout=parse_duration(env["LAKECAST_HOLD_TIMEOUT"], "LAKECAST_HOLD_TIMEOUT")
        if env.get("LAKECAST_HOLD_TIMEOUT") else DEFAULT_HOLD_TIMEOUT,
        parallelism=_parallelism(env.get("LAKECAST_PARALLELISM", "")),
        server_host=env.get("LAKECAST_SERVER_HOST", "").strip() or DEFAULT_SERVER_HOST,
        server_port=_port(env, "LAKECAST_SERVER_PORT", DEFAULT_SERVER_PORT),
        server_token=env.get("LAKECAST_SERVER_TOKEN", "").strip() or None,
        server_token_file=Path(_path_or_uri(env["LAKECAST_SERVER_TOKEN_FILE"], root))
        if env.get("LAKECAST_SERVER_TOKEN_FILE") else None,
        cluster_port=_port(env, "LAKECAST_CLUSTER_PORT", DEFAULT_CLUSTER_PORT),
        pipelines_module=env.get("LAKECAST_PIPELINES", "").strip() or None,
        crash_at=env.get("LAKECAST_CRASH_AT", "").strip(),
    )


def _port(env: dict[str, str], name: str, default: int) -> int:
    value = env.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ConfigError(f"{name}={value!r}: use a TCP port number (1-65535), or leave it "
                          f"empty for {default}")
    return int(value)


def _parallelism(value: str) -> int | None:
    value = value.strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"LAKECAST_PARALLELISM={value!r}: use a whole number of tasks "
                          f"(1 or more), or leave it empty for as many as the events are read")
    return int(value)


def _remote(value: str) -> str:
    value = value.strip()
    if value and value != "server" and not value.startswith("sc://"):
        raise ConfigError(f"LAKECAST_SPARK_REMOTE={value!r}: use empty (Spark in-process), "
                          f"'server' (the project's Lakecast Spark server) or an sc:// URL")
    return value
