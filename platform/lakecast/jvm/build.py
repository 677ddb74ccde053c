"""The JVM lookup's JAR: shipped in the wheel, else compiled once per source and Spark.

The wheel carries the JAR: its build step (``build_backend/lakecast_build.py``) compiles
``java/`` with a JDK's ``javac`` against the JARs of the pyspark it builds with, into
``lakecast/jvm/lakecast-jvm.jar``, beside ``lakecast-jvm.digest`` (the digest of the
sources and that pyspark version, :func:`source_digest`). An installed lakecast therefore
needs a Java 17 runtime (a JRE), not a JDK.

``lakecast setup`` runs :func:`build`: it puts the JAR of the current digest into
``<JAR cache>/lakecast-jvm/<digest>/lakecast-jvm.jar``, beside the Delta JARs: a copy of
the shipped JAR when its recorded digest is the current one (no JDK needed), else
compiled with ``javac`` (``JAVA_HOME``'s first) against pyspark's JARs. The digest covers
the sources and the pyspark version, so another source or Spark gets its own JAR and
nothing stale is loaded; nothing is downloaded. Without a matching shipped JAR and without
a JDK there is no JAR, and pure lookups run in the Python workers
(:func:`lakecast.runtime.jvm_state.unavailable` says so once, as it does for a JAR the
Spark session cannot load).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from lakecast.config import Settings, get_settings
from lakecast.errors import SetupError
from lakecast.jvm.javac import (
    DIGEST_NAME,
    JAR_NAME,
    CompileError,
    compile_jar,
    digest,
    find_javac,
    jar_problem,
    read_digest,
)

__all__ = ["JAR_NAME", "LOOKUP_CLASS", "SHIPPED_JAR", "STATS_CLASS", "build", "built_jar",
           "find_javac", "jar_path", "shipped_jar", "source_digest"]

SOURCE_DIR = Path(__file__).resolve().parent / "java"
#: the JAR the wheel ships (absent in a source checkout, e.g. an editable install)
SHIPPED_JAR = Path(__file__).resolve().parent / JAR_NAME
#: its recorded digest (see :func:`source_digest`)
SHIPPED_DIGEST = Path(__file__).resolve().parent / DIGEST_NAME
#: the UDF class registered with ``spark.udf.registerJavaFunction``
LOOKUP_CLASS = "lakecast.jvm.StateLookup"
#: the UDF reporting, per task, what its JVM holds of a lookup's state
STATS_CLASS = "lakecast.jvm.StateStats"


def source_digest() -> str:
    """A digest of the Java sources and the pyspark version they compile against."""
    import pyspark

    return digest(pyspark.__version__, SOURCE_DIR)


def jar_path(settings: Settings | None = None) -> Path:
    """Where the JAR of the current sources lives in the JAR cache (there or not)."""
    settings = settings or get_settings()
    return settings.jars_dir / "lakecast-jvm" / source_digest() / JAR_NAME


def shipped_jar() -> Path | None:
    """The JAR the package ships, when its recorded digest is the current
    :func:`source_digest` (the same sources, built against this pyspark version)."""
    recorded = read_digest(SHIPPED_DIGEST)
    if not SHIPPED_JAR.exists() or recorded is None or recorded[0] != source_digest():
        return None
    return SHIPPED_JAR


def built_jar(settings: Settings | None = None) -> Path | None:
    """The JAR of the current sources: the JAR cache's (``lakecast setup`` put it there),
    else the package's own when it matches (:func:`shipped_jar`); ``None``: neither."""
    path = jar_path(settings)
    return path if path.exists() else shipped_jar()


def _no_jar_reason() -> str:
    """Why the package's own JAR cannot be used (for the no-JDK error)."""
    recorded = read_digest(SHIPPED_DIGEST)
    if not SHIPPED_JAR.exists() or recorded is None:
        return ("this lakecast install ships no JVM lookup JAR (a source checkout, or a "
                "wheel built without a JDK)")
    import pyspark

    return (f"the JAR this lakecast install ships was built for pyspark {recorded[1]} "
            f"(digest {recorded[0]}), this environment has pyspark {pyspark.__version__} "
            f"(digest {source_digest()})")


def build(settings: Settings | None = None, force: bool = False) -> Path:
    """Put the JAR of the current sources at :func:`jar_path` (a no-op when a readable
    one is there and not ``force``): the shipped JAR when it matches, else compiled with
    ``javac``; a :class:`SetupError` naming the fix when neither can be had."""
    from lakecast.jars import pyspark_jars_dir

    target = jar_path(settings)
    if target.exists() and not force and jar_problem(target) is None:
        return target
    shipped = shipped_jar()
    if shipped is not None and jar_problem(shipped) is None:
        print(f"==> installing the JVM lookup JAR shipped with lakecast into {target.parent}",
              flush=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        shutil.copyfile(shipped, partial)
        partial.replace(target)
        return target
    javac = find_javac()
    if javac is None:
        problem = jar_problem(shipped) if shipped is not None else None
        why = (f"the JAR this lakecast install ships ({shipped}) is damaged: {problem}; "
               "reinstall lakecast (pip install --force-reinstall lakecast)"
               if problem else _no_jar_reason())
        raise SetupError(
            f"javac (a JDK) was not found and {why}, so the JVM lookup JAR was not built and "
            "pure enrich(Lookup...) functions run in the Python workers; install a JDK (e.g. "
            "apt-get install -y openjdk-17-jdk-headless) and run `lakecast setup` again")
    print(f"==> compiling the JVM lookup JAR with {javac} into {target.parent}", flush=True)
    try:
        return compile_jar(javac, pyspark_jars_dir(), target, SOURCE_DIR)
    except CompileError as e:
        raise SetupError(str(e)) from None
