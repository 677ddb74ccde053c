"""One place for Lakecast's configuration: lake paths, Dagster home, Spark settings.

Every setting has a default inside the user's *project folder* (its git-ignored ``var/``)
and an environment override. The project folder is ``LAKECAST_HOME`` when set, else the
nearest folder at or above the working directory that holds a ``pyproject.toml``,
``workspace.yaml``, ``dg.toml`` or ``setup.py`` (a Dagster project's root); never the
folder Lakecast is installed in. With neither, :func:`get_settings` raises a
:class:`~lakecast.errors.ConfigError` naming ``LAKECAST_HOME``.

- project folder: ``LAKECAST_HOME`` (default: found from the working directory)
- lake root, every Delta table: ``LAKECAST_LAKE_ROOT`` (``var/lake``)
- checkpoint root: ``LAKECAST_CHECKPOINT_ROOT`` (``var/checkpoints``)
- the JVM lookups' state chain, read by every executor: ``LAKECAST_JVM_STATE_ROOT``
  (``<checkpoint root>/_jvm-state``; a local folder or an ``s3a://`` URI)
- Dagster home: ``DAGSTER_HOME`` (``var/dagster_home``)
- Delta JAR folder: ``LAKECAST_JARS_DIR`` (a cache shared by every project:
  ``$XDG_CACHE_HOME/lakecast/jars/delta-<delta-spark version>``, ``~/.cache`` without
  ``XDG_CACHE_HOME``; filled once by ``lakecast setup``)
- Spark master: ``LAKECAST_SPARK_MASTER`` (``local[*]``)
- Spark defaults file: ``LAKECAST_SPARK_CONF_FILE`` (the package's
  ``lakecast/defaults/spark-defaults.conf``)
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
- the project's pipelines module for the ``lakecast`` command (``PIPELINES``, and
  optionally ``COMMANDS``): ``LAKECAST_PIPELINES``, else ``[tool.lakecast] pipelines`` in
  the project's ``pyproject.toml`` (none)
- how often a pipeline's sensor looks at the Delta logs:
  ``LAKECAST_SENSOR_INTERVAL_SECONDS`` (``3``)
- checkpoint a broadcast pipeline's state every N committed batches, and keep N
  checkpoints, when its declaration does not say: ``LAKECAST_CHECKPOINT_EVERY`` (``10``),
  ``LAKECAST_KEEP_CHECKPOINTS`` (``10``)
- table maintenance: its schedule ``LAKECAST_MAINTENANCE_CRON`` (``0 3 * * *``, UTC) and
  the VACUUM retention of scheduled runs ``LAKECAST_MAINTENANCE_RETENTION_HOURS`` (none:
  each table's default)
- the Lakecast Spark server's address: ``LAKECAST_SERVER_HOST`` (``127.0.0.1``; another
  address needs an operator's token, see :mod:`lakecast.server`) and
  ``LAKECAST_SERVER_PORT`` (``15002``)
- the server's pre-shared token, which every client sends: ``LAKECAST_SERVER_TOKEN``
  (none: read from the token file), else the file ``LAKECAST_SERVER_TOKEN_FILE``
  (``var/server/token``, generated at the server's first start, mode 0600)
- the local cluster's master port: ``LAKECAST_CLUSTER_PORT`` (``7077``; see
  :mod:`lakecast.cluster`)
- fault injection for tests: ``LAKECAST_CRASH_AT`` (none: never; see
  :mod:`lakecast.pipeline.faults`)

Lake roots may be URIs (``s3a://bucket/lake``); local paths are made absolute.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from importlib import resources
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from lakecast.errors import ConfigError
from lakecast.secret_keys import shown

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

#: files whose folder is a project's root (the nearest one at or above the working directory)
PROJECT_MARKERS = ("pyproject.toml", "workspace.yaml", "dg.toml", "setup.py")
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


@dataclass(frozen=True)
class Setting:
    """One environment variable Lakecast reads: its name, default and meaning."""

    name: str
    default: str
    description: str


#: every environment variable Lakecast reads (the docs' configuration reference is
#: generated from this table; a test finds every ``LAKECAST_*`` name read in the code here)
SETTINGS: tuple[Setting, ...] = (
    Setting("LAKECAST_HOME", "the nearest folder at or above the working directory with a "
            "pyproject.toml, workspace.yaml, dg.toml or setup.py",
            "The project folder; its var/ holds the lake, checkpoints, Dagster home, the "
            "Spark server's and the cluster's folders."),
    Setting("LAKECAST_LAKE_ROOT", "var/lake", "Root of every Delta table (a path, relative "
            "to the project folder, or an s3a:// URI)."),
    Setting("LAKECAST_CHECKPOINT_ROOT", "var/checkpoints", "Root of progress logs and "
            "broadcast-state snapshots."),
    Setting("LAKECAST_JVM_STATE_ROOT", "<checkpoint root>/_jvm-state", "Where the JVM "
            "lookups' state chain is written (the driver) and read (every executor, through "
            "Hadoop's FileSystem): a path or a URI all executors can read, e.g. s3a://."),
    Setting("DAGSTER_HOME", "var/dagster_home", "Dagster's instance folder."),
    Setting("LAKECAST_JARS_DIR", "$XDG_CACHE_HOME/lakecast/jars/delta-<delta-spark version> "
            "(~/.cache without XDG_CACHE_HOME)", "Where `lakecast setup` puts Delta's JARs "
            "and Spark finds them."),
    Setting("LAKECAST_SPARK_MASTER", "local[*]", "Spark master of in-process sessions and of "
            "the Spark server."),
    Setting("LAKECAST_SPARK_CONF_FILE", "lakecast/defaults/spark-defaults.conf (package data)",
            "A spark-defaults.conf whose pairs every session gets."),
    Setting("LAKECAST_SPARK_CONF", "(none)", "Extra Spark conf as key=value;key=value."),
    Setting("LAKECAST_SPARK_REMOTE", "(empty: Spark in this process)", "`server`: the "
            "project's Lakecast Spark server, started on demand; `sc://host:port`: a running "
            "Spark Connect server."),
    Setting("LAKECAST_DEDUP_RETENTION", "7d", "How long (by event time) a pipeline remembers "
            "the keys it accepted, to reject a later copy as a duplicate."),
    Setting("LAKECAST_HOLD_TIMEOUT", "0", "How long (by plan time) a pipeline retries an "
            "event its function held before sending it to unmatched."),
    Setting("LAKECAST_PARALLELISM", "(none: as the events are read)", "Tasks per "
            "micro-batch when a run does not set it."),
    Setting("LAKECAST_PIPELINES", "[tool.lakecast] pipelines in the project's pyproject.toml",
            "The project's pipelines module for the lakecast command (PIPELINES, COMMANDS)."),
    Setting("LAKECAST_SENSOR_INTERVAL_SECONDS", "3", "Least seconds between two ticks of a "
            "pipeline's sensor. Dagster's sensor daemon evaluates sensors once per 5-second "
            "loop, so any value up to 5 ticks once a loop (3 leaves room for the loop's "
            "jitter: at 5, a tick 4.9 s after the last one waits for the next loop, 10 s); "
            "a tick reads Delta logs only (no Spark)."),
    Setting("LAKECAST_CHECKPOINT_EVERY", "10", "Checkpoint a broadcast pipeline's state every "
            "N committed batches, when its declaration does not say."),
    Setting("LAKECAST_KEEP_CHECKPOINTS", "10", "Checkpoints kept, when a declaration does "
            "not say."),
    Setting("LAKECAST_MAINTENANCE_CRON", "0 3 * * *", "When the maintenance schedules run "
            "(cron, UTC)."),
    Setting("LAKECAST_MAINTENANCE_RETENTION_HOURS", "(none: each table's default, 7 days)",
            "VACUUM retention of scheduled maintenance runs (never below what rewinds "
            "need)."),
    Setting("LAKECAST_SERVER_HOST", "127.0.0.1", "Address the Lakecast Spark server binds."),
    Setting("LAKECAST_SERVER_PORT", "15002", "Port of the Lakecast Spark server."),
    Setting("LAKECAST_SERVER_TOKEN", "(none: read from the token file)", "The Spark "
            "server's pre-shared token, which every Lakecast client sends (an operator's "
            "secret; required to bind beyond loopback)."),
    Setting("LAKECAST_SERVER_TOKEN_FILE", "var/server/token (generated at the server's "
            "first start, mode 0600)", "The file the token is read from when "
            "LAKECAST_SERVER_TOKEN is not set."),
    Setting("LAKECAST_CLUSTER_PORT", "7077", "Port of the local standalone cluster's master "
            "(its web UI on the next port)."),
    Setting("LAKECAST_CRASH_AT", "(none)", "Tests only: kill the process at a named point "
            "of a batch (lakecast.pipeline.faults)."),
)


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
            raise ConfigError(f"LAKECAST_SPARK_CONF entry {shown(item)} is not of the form "
                              f"key=value")
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
            raise ConfigError(f"{path}:{lineno}: expected 'key value', got {shown(raw)}")
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
class PipelinePaths:
    """Where one pipeline keeps its own tables: ``<checkpoint root>/<pipeline>/progress``
    (the progress log) and ``.../snapshots`` (broadcast-state checkpoints). The one
    spelling of both: everything else asks this object."""

    #: ``<checkpoint root>/<pipeline>``
    root: str

    @classmethod
    def under(cls, checkpoint_root: str, pipeline: str) -> PipelinePaths:
        from lakecast.names import check_pipeline_folder

        return cls(f"{checkpoint_root}/{check_pipeline_folder(pipeline)}")

    @property
    def progress(self) -> str:
        return f"{self.root}/progress"

    @property
    def snapshots(self) -> str:
        return f"{self.root}/snapshots"


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
    #: the project's pipelines module for the ``lakecast`` command (None: none)
    pipelines_module: str | None = None
    #: seconds between two ticks of a pipeline's sensor
    sensor_interval_seconds: int = 3
    #: checkpoint every N batches / keep N checkpoints (declarations that do not say)
    checkpoint_every: int = 10
    keep_checkpoints: int = 10
    #: the maintenance schedule (cron, UTC) and the VACUUM retention of its runs
    maintenance_cron: str = "0 3 * * *"
    maintenance_retention_hours: int | None = None

    @property
    def var_dir(self) -> Path:
        """The project's git-ignored working folder (server, cluster, warehouse)."""
        return self.project_root / "var"

    @property
    def log4j_file(self) -> Path:
        """The log4j2 properties Spark JVMs start with (package data)."""
        return default_file("log4j2.properties")
    #: the Lakecast Spark server's bind address and port
    server_host: str = DEFAULT_SERVER_HOST
    server_port: int = DEFAULT_SERVER_PORT
    #: the operator's server token (``LAKECAST_SERVER_TOKEN``); kept out of ``repr``
    server_token: str | None = field(default=None, repr=False)
    #: the operator's token file (None: ``var/server/token`` of the project)
    server_token_file: Path | None = None
    #: the local cluster's master port
    cluster_port: int = DEFAULT_CLUSTER_PORT
    #: ``LAKECAST_JVM_STATE_ROOT`` (None: under the checkpoint root, :attr:`jvm_state_dir`)
    jvm_state_root: str | None = None
    #: ``<point>`` or ``<point>:<batch_id>`` where a test kills the process (empty: never)
    crash_at: str = ""

    def table_path(self, name: str) -> str:
        """Path of the Delta table ``name`` in the lake."""
        from lakecast.names import check_table_name

        return f"{self.lake_root}/{check_table_name(name)}"

    @property
    def jvm_state_dir(self) -> str:
        """Where the JVM lookups' state chain lives (a path or a URI every executor reads):
        ``LAKECAST_JVM_STATE_ROOT``, else ``<checkpoint root>/_jvm-state``."""
        return self.jvm_state_root or f"{self.checkpoint_root}/_jvm-state"

    def pipeline_paths(self, pipeline: str) -> PipelinePaths:
        """The folders of pipeline ``pipeline`` under the checkpoint root."""
        return PipelinePaths.under(self.checkpoint_root, pipeline)

    def checkpoint_path(self, name: str) -> str:
        """Path of the checkpoint folder ``name`` (streaming offsets, snapshots); no part
        of it may leave the checkpoint root."""
        parts = name.split("/")
        if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ConfigError(f"invalid checkpoint folder {name!r}: it must stay under "
                              f"{self.checkpoint_root}")
        return f"{self.checkpoint_root}/{name}"

    def ensure_local_dirs(self) -> None:
        """Create the local lake, checkpoint and Dagster folders (URIs are left alone)."""
        for p in (self.lake_root, self.checkpoint_root, self.dagster_home):
            if not _is_uri(p):
                Path(p).mkdir(parents=True, exist_ok=True)


def default_file(name: str) -> Path:
    """A default file shipped with the package (``lakecast/defaults/<name>``)."""
    return Path(str(resources.files("lakecast") / "defaults" / name))


def delta_version() -> str:
    """The installed ``delta-spark`` version: the Delta JARs fetched match it."""
    try:
        return version("delta-spark")
    except PackageNotFoundError as e:
        raise ConfigError("the delta-spark package is not installed: pip install lakecast") from e


def default_jars_dir(env: dict[str, str]) -> Path:
    """The shared JAR cache: ``$XDG_CACHE_HOME/lakecast/jars/delta-<version>``."""
    cache = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return cache / "lakecast" / "jars" / f"delta-{delta_version()}"


def find_project_root(env: dict[str, str], cwd: Path | None = None) -> Path:
    """``LAKECAST_HOME``, else the nearest folder at or above ``cwd`` with a project file
    (:data:`PROJECT_MARKERS`); a :class:`ConfigError` names the fix when there is none."""
    if env.get("LAKECAST_HOME"):
        return Path(env["LAKECAST_HOME"]).expanduser().resolve()
    here = (cwd or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if any((folder / m).is_file() for m in PROJECT_MARKERS):
            return folder
    raise ConfigError(
        f"no Lakecast project folder: {here} and the folders above it hold none of "
        f"{', '.join(PROJECT_MARKERS)}. Run from your project's folder, or set "
        "LAKECAST_HOME=/path/to/project (its var/ then holds the lake, checkpoints and the "
        "server's folder; LAKECAST_LAKE_ROOT and LAKECAST_CHECKPOINT_ROOT move those)")


def project_table(root: Path) -> dict[str, object]:
    """``[tool.lakecast]`` of the project's ``pyproject.toml`` (empty without one)."""
    path = root / "pyproject.toml"
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from e
    table = data.get("tool", {}).get("lakecast", {})
    return table if isinstance(table, dict) else {}


def _int(env: dict[str, str], name: str, default: int | None, low: int = 0) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < low:
        raise ConfigError(f"{name}={raw!r}: use a whole number >= {low}, or unset it for "
                          f"the default ({default})")
    return int(raw)


def get_settings(env: dict[str, str] | None = None) -> Settings:
    """Resolve settings from the environment (``os.environ`` by default)."""
    env = dict(os.environ if env is None else env)
    root = find_project_root(env)
    var = root / "var"
    conf_file_env = env.get("LAKECAST_SPARK_CONF_FILE")
    conf_file: Path | None
    if conf_file_env:
        conf_file = Path(conf_file_env).expanduser().resolve()
        if not conf_file.is_file():
            raise ConfigError(f"LAKECAST_SPARK_CONF_FILE={conf_file_env} does not exist")
    else:
        conf_file = default_file("spark-defaults.conf")
    jars_env = env.get("LAKECAST_JARS_DIR")
    pipelines = env.get("LAKECAST_PIPELINES") or project_table(root).get("pipelines")
    return Settings(
        project_root=root,
        lake_root=_path_or_uri(env.get("LAKECAST_LAKE_ROOT", str(var / "lake")), root),
        checkpoint_root=_path_or_uri(
            env.get("LAKECAST_CHECKPOINT_ROOT", str(var / "checkpoints")), root
        ),
        dagster_home=_path_or_uri(env.get("DAGSTER_HOME", str(var / "dagster_home")), root),
        jars_dir=Path(_path_or_uri(jars_env, root)) if jars_env else default_jars_dir(env),
        spark_master=env.get("LAKECAST_SPARK_MASTER") or None,
        spark_conf_file=conf_file,
        spark_conf=parse_conf_pairs(env.get("LAKECAST_SPARK_CONF", "")),
        spark_remote=_remote(env.get("LAKECAST_SPARK_REMOTE", "")),
        dedup_retention=parse_duration(env["LAKECAST_DEDUP_RETENTION"])
        if env.get("LAKECAST_DEDUP_RETENTION") else DEFAULT_DEDUP_RETENTION,
        hold_timeout=parse_duration(env["LAKECAST_HOLD_TIMEOUT"], "LAKECAST_HOLD_TIMEOUT")
        if env.get("LAKECAST_HOLD_TIMEOUT") else DEFAULT_HOLD_TIMEOUT,
        parallelism=_parallelism(env.get("LAKECAST_PARALLELISM", "")),
        pipelines_module=str(pipelines) if pipelines else None,
        sensor_interval_seconds=_int(env, "LAKECAST_SENSOR_INTERVAL_SECONDS", 3, 1) or 3,
        checkpoint_every=_int(env, "LAKECAST_CHECKPOINT_EVERY", 10, 1) or 10,
        keep_checkpoints=_int(env, "LAKECAST_KEEP_CHECKPOINTS", 10, 1) or 10,
        maintenance_cron=env.get("LAKECAST_MAINTENANCE_CRON") or "0 3 * * *",
        maintenance_retention_hours=_int(env, "LAKECAST_MAINTENANCE_RETENTION_HOURS", None),
        server_host=env.get("LAKECAST_SERVER_HOST", "").strip() or DEFAULT_SERVER_HOST,
        server_port=_port(env, "LAKECAST_SERVER_PORT", DEFAULT_SERVER_PORT),
        server_token=env.get("LAKECAST_SERVER_TOKEN", "").strip() or None,
        server_token_file=Path(_path_or_uri(env["LAKECAST_SERVER_TOKEN_FILE"], root))
        if env.get("LAKECAST_SERVER_TOKEN_FILE") else None,
        cluster_port=_port(env, "LAKECAST_CLUSTER_PORT", DEFAULT_CLUSTER_PORT),
        jvm_state_root=_path_or_uri(env["LAKECAST_JVM_STATE_ROOT"], root)
        if env.get("LAKECAST_JVM_STATE_ROOT", "").strip() else None,
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
