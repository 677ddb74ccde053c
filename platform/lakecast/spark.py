"""The one Spark session factory, used by assets, jobs, tests and benchmarks.

``get_spark()`` returns a Delta-enabled session that starts from the local JAR
folder only (``spark.jars``; ``spark.jars.packages`` is refused), on
``local[*]`` unless configured otherwise. See :mod:`lakecast.config` for the
override order. It also points Python workers at the running interpreter
(``PYSPARK_PYTHON``) and puts the project on their ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from lakecast.config import Settings, get_settings, parse_spark_defaults
from lakecast.errors import ConfigError, SetupError
from lakecast.jars import local_jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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
    # Every Delta table Lakecast creates records its Change Data Feed.
    "spark.databricks.delta.properties.defaults.enableChangeDataFeed": "true",
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
    bad = [k for k in _FORBIDDEN if k in conf]
    if bad:
        raise ConfigError(
            f"{', '.join(bad)} is not allowed: Lakecast's Spark starts from the local JARs in "
            f"{settings.jars_dir} and never downloads packages. Add JARs with deploy/maven/pom.xml."
        )
    jars = [str(p) for p in local_jars(settings.jars_dir)]
    extra = [j for j in conf.get("spark.jars", "").split(",") if j]
    conf["spark.jars"] = ",".join(jars + [j for j in extra if j not in jars])
    log4j = settings.project_root / "deploy" / "spark" / "log4j2.properties"
    if log4j.exists() and "-Dlog4j.configurationFile" not in conf.get(
        "spark.driver.extraJavaOptions", ""
    ):
        opts = conf.get("spark.driver.extraJavaOptions", "")
        conf["spark.driver.extraJavaOptions"] = (
            f"{opts} -Dlog4j.configurationFile=file:{log4j}".strip()
        )
    conf.setdefault("spark.sql.warehouse.dir", str(settings.project_root / "var" / "warehouse"))
    return conf


def _prepare_python_env(settings: Settings) -> None:
    """Python workers use this interpreter and can import the project's modules."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    roots = [str(settings.project_root), str(settings.project_root / "platform")]
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(roots + [p for p in current if p not in roots])


def get_spark(
    overrides: dict[str, str] | None = None,
    app_name: str = DEFAULT_APP_NAME,
    settings: Settings | None = None,
) -> SparkSession:
    """Return the process's Delta-enabled Spark session, creating it on first call.

    JVM-level settings (master, memory, JARs) apply only when the session is
    created; session-level SQL settings in ``overrides`` apply to an existing one.
    """
    from pyspark.sql import SparkSession

    settings = settings or get_settings()
    active = SparkSession.getActiveSession()
    if active is not None:
        for k, v in (overrides or {}).items():
            if k.startswith("spark.sql.") and not k.startswith("spark.sql.extensions"):
                active.conf.set(k, str(v))
        return active
    check_java()
    conf = build_conf(settings, overrides)
    settings.ensure_local_dirs()
    _prepare_python_env(settings)
    builder = SparkSession.builder.appName(app_name)
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def delta_jar_location(spark: SparkSession) -> str:
    """Where the JVM loaded Delta's session extension class from (a file URL)."""
    jvm = spark.sparkContext._jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    cls = loader.loadClass("io.delta.sql.DeltaSparkSessionExtension")
    return str(cls.getProtectionDomain().getCodeSource().getLocation().toString())
