"""Whether a Spark session can load the JVM lookup's JAR it was started with.

A JAR on ``spark.jars`` that the JVM cannot read (truncated, overwritten, not a JAR)
does not stop Spark from starting: its classes are just not there. :func:`load_problem`
registers the JAR's ``StateStats`` class once per session under :data:`PROBE_NAME` (a
name never called), the way the lookups register theirs, and turns a failure into the
reason :func:`lakecast.runtime.jvm_state.unavailable` gives: the JAR's path and the fix.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakecast.jvm.build import JAR_NAME, SHIPPED_JAR, STATS_CLASS
from lakecast.jvm.javac import jar_problem

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: the registered name of the probe (``StateStats``; never called)
PROBE_NAME = "lakecast_jvm_probe"
#: per session, what its probe found (``None``: the JAR loads)
_PROBED: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()


def session_jar(spark: SparkSession) -> str | None:
    """The JVM lookup JAR on the session's ``spark.jars`` (``None``: none)."""
    jars = spark.conf.get("spark.jars", "") or ""
    return next((j for j in jars.split(",") if j.endswith(JAR_NAME)), None)


def fix(jar: str) -> str:
    """How to replace ``jar`` with a good one (one sentence)."""
    restart = ("then start the Spark session again (the Lakecast Spark server: `lakecast "
               "server stop` and `lakecast server start`)")
    if Path(jar.removeprefix("file:")) == SHIPPED_JAR:
        return (f"reinstall lakecast (`pip install --force-reinstall --no-deps lakecast`) or "
                f"run `lakecast setup --force` with a JDK, {restart}")
    return f"run `lakecast setup --force` to install it again, {restart}"


def load_problem(spark: SparkSession) -> str | None:
    """Why the session cannot load its JVM lookup JAR (``None``: it can), found once per
    session."""
    if spark in _PROBED:
        return _PROBED[spark]
    from pyspark.sql.types import StringType

    jar = session_jar(spark) or JAR_NAME
    problem = None
    try:
        spark.udf.registerJavaFunction(PROBE_NAME, STATS_CLASS, StringType())
    except Exception as e:
        said = (str(e).strip().splitlines() or [type(e).__name__])[0][:200].rstrip(".")
        local = Path(jar.removeprefix("file:"))
        found = jar_problem(local) if local.is_file() else None
        problem = (f"the Spark session cannot load the JVM lookup JAR {jar} ({said}"
                   f"{'; ' + found if found else ''}); {fix(jar)}")
    _PROBED[spark] = problem
    return problem
