"""The one Spark session factory, used by assets, jobs, tests and benchmarks.

``get_spark()`` returns a Delta-enabled session in one of two modes
(``LAKECAST_SPARK_REMOTE``, see :mod:`lakecast.config`):

- **in-process** (the default): a classic session in this process, started from the
  local JAR folder (:mod:`lakecast.spark_conf`), ``local[*]`` unless configured;
- **Spark Connect**: a client session of a Lakecast Spark server (:mod:`lakecast.server`;
  ``server`` starts the project's own on demand). ``get_spark(session="name")`` attaches
  to the server-side session ``name`` of this lake: every process asking for the same
  name shares that session and its Python workers, so task-local state stays warm
  between Dagster runs. Without a name a process gets a session of its own. Every
  client sends the server's token; a named session's id is random, kept by the owner
  (:mod:`lakecast.auth`), so other clients cannot attach to it. No client sets
  credentials on a session: the server has its own (:mod:`lakecast.server`).

Engine code must run in both modes: no ``sparkContext``, RDDs, accumulators or
broadcast variables; :func:`default_parallelism` and :func:`local_checkpoint` cover the
two places where the modes differ.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from lakecast.auth import client_token, connection_string, session_id_for
from lakecast.config import Settings, get_settings
from lakecast.errors import SetupError
from lakecast.spark_conf import (
    BUILTIN_DEFAULTS,
    DEFAULT_APP_NAME,
    build_conf,
    check_java,
    driver_env,
    python_env,
    s3a_hadoop_conf,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation, SparkSession

__all__ = [
    "BUILTIN_DEFAULTS", "DEFAULT_APP_NAME", "ServerUnavailableError", "activate", "build_conf",
    "check_java", "default_parallelism", "delta_jar_location", "get_spark", "is_connect",
    "local_checkpoint", "observed_metrics", "persisted_frames", "python_env", "session_id_for",
]


class ServerUnavailableError(SetupError):
    """The configured Spark Connect server cannot be reached."""


#: Spark Connect sessions of this process, by (url, session id)
_SESSIONS: dict[tuple[str, str], SparkSession] = {}
_PARALLELISM: dict[str, int] = {}


def get_spark(
    overrides: dict[str, str] | None = None,
    app_name: str = DEFAULT_APP_NAME,
    settings: Settings | None = None,
    *,
    session: str | None = None,
) -> SparkSession:
    """Return a Delta-enabled Spark session (see the module doc for the two modes).

    JVM-level settings (master, memory, JARs) apply only when a JVM starts; session-level
    SQL settings in ``overrides`` apply to an existing session too. ``session`` names a
    shared server-side session (Spark Connect only; ignored in-process, where the
    process has one session).
    """
    settings = settings or get_settings()
    if settings.spark_remote:
        return _connect(settings, session, overrides or {})
    return _classic(settings, overrides or {}, app_name)


def _classic(settings: Settings, overrides: dict[str, str], app_name: str) -> SparkSession:
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        _set_sql_conf(active, overrides)
        _set_s3a_conf(active, settings)
        return active
    check_java()
    conf = build_conf(settings, overrides)
    settings.ensure_local_dirs()
    os.environ.update(python_env(settings))
    builder = SparkSession.builder.appName(app_name)
    for k, v in conf.items():
        builder = builder.config(k, v)
    with _jvm_env(driver_env(settings, conf)):  # the JVM inherits it; Python keeps none
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


@contextmanager
def _jvm_env(env: dict[str, str]) -> Iterator[None]:
    """``env`` in ``os.environ`` while the block starts the driver JVM, then removed."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _set_s3a_conf(spark: SparkSession, settings: Settings) -> None:
    """The Spark conf's ``spark.hadoop.fs.s3a.*`` settings in the Hadoop configuration of
    a running in-process session (not as session settings, which a client can read back),
    so a session started without them reaches the same object store
    (:func:`lakecast.spark_conf.s3a_hadoop_conf`, as :mod:`lakecast.delta.objstore` reads
    them)."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for k, v in s3a_hadoop_conf(settings).items():
        if hadoop.get(k) != v:
            hadoop.set(k, v)


def _set_sql_conf(spark: SparkSession, overrides: dict[str, str]) -> None:
    for k, v in overrides.items():
        if k.startswith("spark.sql.") and not k.startswith("spark.sql.extensions"):
            spark.conf.set(k, str(v))


def _server_url(settings: Settings) -> str:
    if settings.spark_remote == "server":
        from lakecast.server import ensure_server

        return ensure_server(settings).url
    return settings.spark_remote.rstrip("/")


def _connect(settings: Settings, name: str | None, overrides: dict[str, str]) -> SparkSession:
    url = _server_url(settings)
    sid = session_id_for(settings, name) if name else str(uuid.uuid4())
    cached = _SESSIONS.get((url, sid))
    if cached is not None:
        _activate(cached)
        _set_sql_conf(cached, overrides)
        return cached
    fix = ("start it with `lakecast server start` (or set LAKECAST_SPARK_REMOTE=server to "
           "start it on demand, or unset LAKECAST_SPARK_REMOTE to run Spark in-process)")
    if not _answers(url, timeout=3.0):
        raise ServerUnavailableError(
            f"no Spark Connect server answers at {url} (connection refused): {fix}")
    # PySpark picks its Spark Connect implementations by this variable: from now on
    # this process is a Spark Connect client
    connection = connection_string(url, client_token(settings, url), sid)
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    spark = ConnectSession.builder.remote(connection).create()
    try:
        spark.conf.get("spark.sql.session.timeZone")
    except Exception as e:
        with contextlib.suppress(Exception):
            spark.client.close()
        if "UNAUTHENTICATED" in str(e):
            raise ServerUnavailableError(
                f"the Spark Connect server at {url} refused this client's token "
                f"(UNAUTHENTICATED): it was started with another one; restart it "
                f"(`lakecast server stop`, then `lakecast server start`) or set "
                f"LAKECAST_SERVER_TOKEN to its token") from None
        raise ServerUnavailableError(f"the Spark Connect server at {url} did not answer: "
                                     f"{str(e).splitlines()[0]}; {fix}") from None
    _set_sql_conf(spark, overrides)
    _SESSIONS[(url, sid)] = spark
    # a session of this process only is released on exit; a named one outlives it
    atexit.register(_on_exit, spark, url, not name)
    return spark


def _on_exit(spark: SparkSession, url: str, release: bool) -> None:
    """At exit: release a process's own session; close the client in any case, so that
    PySpark's own exit hook sends nothing (it retries for minutes when the server is
    gone)."""
    with contextlib.suppress(Exception):
        if release and _answers(url, timeout=1.0):
            spark.stop()
        spark.client.close()


def _answers(url: str, timeout: float) -> bool:
    host, _, port = url.removeprefix("sc://").partition(":")
    try:
        with socket.create_connection((host, int(port or 15002)), timeout=timeout):
            return True
    except OSError:
        return False


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client session."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _activate(spark: SparkSession) -> None:
    """Make ``spark`` this thread's active Spark Connect session.

    PySpark 4 builds the result of ``localCheckpoint()`` on the thread's *active* session
    (``conversion.proto_to_remote_cached_dataframe``), and its own setter keeps the first
    session ever made active: a process holding several Connect sessions must set the
    frame's own first. The one place Lakecast touches PySpark's session registry.
    """
    registry = getattr(type(spark), "_active_session", None)
    if registry is not None:
        registry.session = spark


def activate(spark: SparkSession) -> None:
    """Make ``spark`` this thread's active session when it is a Spark Connect one (no-op
    in-process). pyspark.ml over Connect fits on the data's session but fetches the fitted
    model's attributes (``coefficients``, ...) through the thread's active session: with
    several Connect sessions in the process, activate the data's session before fitting."""
    if is_connect(spark):
        _activate(spark)


def local_checkpoint(frame: DataFrame) -> DataFrame:
    """``frame.localCheckpoint()`` in either mode (materialized once, lineage cut)."""
    if is_connect(frame.sparkSession):
        _activate(frame.sparkSession)
    return frame.localCheckpoint()


@contextmanager
def persisted_frames() -> Iterator[Callable[[DataFrame], DataFrame]]:
    """A ``persist(frame)`` for the block: the frame is persisted and materialized at once
    (a count), and every frame persisted so is unpersisted when the block ends.

    For intermediate frames that later stages read several times. Unlike
    :func:`local_checkpoint`, the tasks that read a persisted frame do not carry the
    closures of the plan that made it: a locally checkpointed RDD keeps them, so each
    downstream task binary of ``user_features`` was 1-2 MiB (Spark's "Broadcasting large
    task binary" WARN, five per partition day).
    """
    frames: list[DataFrame] = []

    def persist(frame: DataFrame) -> DataFrame:
        frame = frame.persist()
        frame.count()
        frames.append(frame)
        return frame

    try:
        yield persist
    finally:
        for frame in frames:
            frame.unpersist()


def observed_metrics(observation: Observation) -> dict[str, Any] | None:
    """The metrics of ``observation`` once the first action on its frame finished, else
    ``None`` (``Observation.get`` would wait forever). In-process: the JVM observation's
    future is complete; Spark Connect: the server reported the metrics with the action's
    result (a write's are reported only by servers with SPARK-61013)."""
    jo = getattr(observation, "_jo", None)
    if jo is not None:  # in-process: a py4j org.apache.spark.sql.Observation
        return dict(observation.get) if jo.future().isCompleted() else None
    metrics = observation.get  # Connect: {} until the server sent them
    return dict(metrics) if metrics else None


def default_parallelism(spark: SparkSession) -> int:
    """Spark's default parallelism (tasks of a parallelized scan) in either mode."""
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    key = str(getattr(spark, "session_id", id(spark)))
    if key not in _PARALLELISM:
        from pyspark.sql import functions as F

        row = (spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p"))
               .agg(F.max("p")).first())
        _PARALLELISM[key] = int(row[0]) + 1 if row and row[0] is not None else 1
    return _PARALLELISM[key]


def delta_jar_location(spark: SparkSession) -> str:
    """Where the JVM loaded Delta's session extension class from (a file URL; in-process
    sessions only)."""
    jvm = spark.sparkContext._jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    cls = loader.loadClass("io.delta.sql.DeltaSparkSessionExtension")
    return str(cls.getProtectionDomain().getCodeSource().getLocation().toString())
