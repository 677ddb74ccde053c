"""What a Spark JVM starts with: its configuration, environment and Java.

Used by the session factory (:mod:`lakecast.spark`, Spark in this process) and by the
Lakecast Spark server (:mod:`lakecast.server`, Spark Connect). Precedence: built-in
defaults < the package's ``defaults/spark-defaults.conf`` (or ``LAKECAST_SPARK_CONF_FILE``) <
``LAKECAST_SPARK_CONF`` < ``LAKECAST_SPARK_MASTER`` < code overrides. Spark starts from
the local JAR folder only (``spark.jars``; ``spark.jars.packages`` is refused), plus the
JVM lookup's JAR when ``lakecast setup`` built it (:mod:`lakecast.jvm.build`). A driver
of the local standalone cluster (:mod:`lakecast.cluster`) authenticates with its secret
(``spark.authenticate``; the secret in the JVM's environment, :func:`driver_env`).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from lakecast.auth import cluster_auth
from lakecast.config import Settings, get_settings, parse_spark_defaults
from lakecast.errors import ConfigError, SetupError
from lakecast.jars import local_jars
from lakecast.jvm.build import built_jar

DEFAULT_APP_NAME = "lakecast"

BUILTIN_DEFAULTS: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    "spark.ui.enabled": "false",
    "spark.driver.memory": "6g",
    "spark.sql.shuffle.partitions": "8",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # plans of wide tables (the outputs' columns) print whole: no "Truncated the string
    # representation of a plan" WARN once per session
    "spark.sql.debug.maxToStringFields": "500",
    # Every Delta table Lakecast creates records its Change Data Feed.
    "spark.databricks.delta.properties.defaults.enableChangeDataFeed": "true",
    # loopback only: the driver, its block manager and RPC never bind another address
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}

# Settings that must not be overridden: Spark starts from local JARs only.
_FORBIDDEN = ("spark.jars.packages", "spark.jars.repositories", "spark.jars.ivy")


def check_java() -> str:
    """Path of the ``java`` binary Spark will use, or a :class:`SetupError`."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise SetupError(
            "Java 17 is required to run Spark and was not found (no JAVA_HOME, no `java` on PATH). "
            "Install it with `apt-get install -y openjdk-17-jre-headless`, then run `make setup`."
        )
    return found


def build_conf(settings: Settings, overrides: dict[str, str] | None = None) -> dict[str, str]:
    """The full Spark conf for a session, in precedence order (see module doc)."""
    conf = dict(BUILTIN_DEFAULTS)
    conf["spark.master"] = "local[*]"
    if settings.spark_conf_file is not None:
        conf.update(parse_spark_defaults(settings.spark_conf_file))
    conf.update(settings.spark_conf)
    if settings.spark_master:
        conf["spark.master"] = settings.spark_master
    conf.update({k: str(v) for k, v in (overrides or {}).items()})
    conf.update(cluster_auth(settings, conf["spark.master"])[0])
    bad = [k for k in _FORBIDDEN if k in conf]
    if bad:
        raise ConfigError(
            f"{', '.join(bad)} is not allowed: Lakecast's Spark starts from the local JARs in "
            f"{settings.jars_dir} and never downloads packages. Add JARs to spark.jars (local "
            f"files)."
        )
    jars = [str(p) for p in local_jars(settings.jars_dir)]
    lookup_jar = built_jar(settings)  # the JVM lookup (lakecast.jvm), when built
    if lookup_jar is not None:
        jars.append(str(lookup_jar))
    extra = [j for j in conf.get("spark.jars", "").split(",") if j]
    conf["spark.jars"] = ",".join(jars + [j for j in extra if j not in jars])
    log4j = settings.log4j_file
    if log4j.exists() and "-Dlog4j.configurationFile" not in conf.get(
        "spark.driver.extraJavaOptions", ""
    ):
        opts = conf.get("spark.driver.extraJavaOptions", "")
        spark_log = settings.var_dir / "log" / "spark.log"  # full traces
        conf["spark.driver.extraJavaOptions"] = (
            f"{opts} -Dlog4j.configurationFile=file:{log4j} -Dlakecast.spark.log={spark_log}"
        ).strip()
    conf.setdefault("spark.sql.warehouse.dir", str(settings.var_dir / "warehouse"))
    return conf


def s3a_hadoop_conf(settings: Settings | None = None) -> dict[str, str]:
    """The ``spark.hadoop.fs.s3a.*`` settings of the Spark conf (``LAKECAST_SPARK_CONF``
    and the defaults file) as Hadoop keys (``fs.s3a.*``), for an in-process session that
    started without them and for object-store readers (:mod:`lakecast.delta.objstore`)."""
    settings = settings or get_settings()
    conf = parse_spark_defaults(settings.spark_conf_file) if settings.spark_conf_file else {}
    conf = {**conf, **settings.spark_conf}
    prefix = "spark.hadoop.fs.s3a."
    return {k.removeprefix("spark.hadoop."): v for k, v in conf.items() if k.startswith(prefix)}


def driver_env(settings: Settings, conf: dict[str, str]) -> dict[str, str]:
    """What a driver JVM with ``conf`` needs in its environment besides
    :func:`python_env`: the local cluster's secret when its master is the cluster."""
    return cluster_auth(settings, conf.get("spark.master", ""))[1]


def python_env(settings: Settings) -> dict[str, str]:
    """Environment of a Spark JVM: Python workers use this interpreter, can import the
    project's modules and find the same project folder (``LAKECAST_HOME``: a worker's
    working directory is Spark's, so a module that reads the settings when a task imports it,
    e.g. a declaration's ``CheckpointPolicy()``, would find no project); Spark binds to
    loopback unless ``SPARK_LOCAL_IP`` says otherwise."""
    roots = [str(settings.project_root)]
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {
        "LAKECAST_HOME": str(settings.project_root),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(roots + [p for p in current if p not in roots]),
        "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
    }
