"""Build the JVM lookup's JAR from its source, once per source and Spark version.

``lakecast setup`` runs :func:`build`: ``javac`` (a JDK's, ``JAVA_HOME`` first) compiles
``java/`` against the JARs pyspark ships (Spark's Row and UDF interfaces, Arrow Java),
into ``<JAR cache>/lakecast-jvm/<digest>/lakecast-jvm.jar``; the digest covers the sources
and the pyspark version, so another source or Spark gets its own JAR and nothing stale is
loaded. Nothing is downloaded. Without a JDK the JAR is not built and pure lookups run in
the Python workers (:func:`lakecast.runtime.jvm_state.unavailable` says so once).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from lakecast.config import Settings, get_settings
from lakecast.errors import SetupError

SOURCE_DIR = Path(__file__).resolve().parent / "java"
JAR_NAME = "lakecast-jvm.jar"
#: the UDF class registered with ``spark.udf.registerJavaFunction``
LOOKUP_CLASS = "lakecast.jvm.StateLookup"
#: the UDF reporting, per task, what its JVM holds of a lookup's state
STATS_CLASS = "lakecast.jvm.StateStats"
#: pyspark's JARs the source compiles against
_COMPILE_AGAINST = ("arrow-vector-", "arrow-memory-core-", "arrow-format-", "spark-sql-api_",
                    "spark-catalyst_", "spark-core_", "spark-unsafe_", "kryo-shaded-",
                    "scala-library-", "hadoop-client-api-",
                    "spark-common-utils_")


def _sources() -> list[Path]:
    return sorted(SOURCE_DIR.rglob("*.java"))


def source_digest() -> str:
    """A digest of the Java sources and the pyspark version they compile against."""
    import pyspark

    h = hashlib.sha256(pyspark.__version__.encode())
    for src in _sources():
        h.update(src.relative_to(SOURCE_DIR).as_posix().encode())
        h.update(src.read_bytes())
    return h.hexdigest()[:16]


def jar_path(settings: Settings | None = None) -> Path:
    """Where the JAR of the current sources lives (built or not)."""
    settings = settings or get_settings()
    return settings.jars_dir / "lakecast-jvm" / source_digest() / JAR_NAME


def built_jar(settings: Settings | None = None) -> Path | None:
    """The JAR of the current sources when it is built."""
    path = jar_path(settings)
    return path if path.exists() else None


def find_javac() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "javac").exists():
        return str(Path(java_home) / "bin" / "javac")
    return shutil.which("javac")


def build(settings: Settings | None = None, force: bool = False) -> Path:
    """Compile the sources into :func:`jar_path` (a no-op when built); a
    :class:`SetupError` naming the fix when there is no JDK or javac fails."""
    from lakecast.jars import pyspark_jars_dir

    target = jar_path(settings)
    if target.exists() and not force:
        return target
    javac = find_javac()
    if javac is None:
        raise SetupError(
            "javac (a JDK) was not found, so the JVM lookup JAR was not built and pure "
            "enrich(Lookup...) functions run in the Python workers; install a JDK (e.g. "
            "apt-get install -y openjdk-17-jdk-headless) and run `lakecast setup` again")
    jars = [str(p) for p in sorted(pyspark_jars_dir().glob("*.jar"))
            if p.name.startswith(_COMPILE_AGAINST)]
    with tempfile.TemporaryDirectory() as tmp:
        classes = Path(tmp) / "classes"
        cmd = [javac, "--release", "17", "-nowarn", "-encoding", "UTF-8",
               "-cp", os.pathsep.join(jars), "-d", str(classes), *map(str, _sources())]
        # in the temporary folder: javac leaves a javac.<date>.args file where it fails
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        if proc.returncode != 0:
            errors = [ln for ln in proc.stderr.splitlines() if "error" in ln][:3]
            raise SetupError(f"javac could not compile the JVM lookup ({'; '.join(errors)})"
                             f"; run `{' '.join(cmd[:2])} ...` by hand to see why")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n"
                                                 "Created-By: lakecast\n\n")
            for cls in sorted(classes.rglob("*.class")):
                jar.write(cls, cls.relative_to(classes).as_posix())
        partial.replace(target)
    return target
