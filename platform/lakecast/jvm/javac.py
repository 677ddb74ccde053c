"""Compile the JVM lookup's Java sources into its JAR: the standard library only.

Two callers: :mod:`lakecast.jvm.build` (``lakecast setup``, when no JAR of the current
sources shipped with the package) and the wheel's build step (``build_backend/``, which
loads this file by its path, before lakecast is installed). Both compile with a JDK's
``javac`` against the JARs pyspark ships and record the same digest, so the runtime knows
whether a shipped JAR is the one of its sources and Spark.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent / "java"
JAR_NAME = "lakecast-jvm.jar"
#: beside a shipped JAR: its :func:`digest` (first line) and the pyspark it was built for
DIGEST_NAME = "lakecast-jvm.digest"
#: a class every good JAR holds (the lookup UDF)
LOOKUP_CLASS_FILE = "lakecast/jvm/StateLookup.class"
#: pyspark's JARs the source compiles against
COMPILE_AGAINST = ("arrow-vector-", "arrow-memory-core-", "arrow-format-", "spark-sql-api_",
                   "spark-catalyst_", "spark-core_", "spark-unsafe_", "kryo-shaded-",
                   "scala-library-", "hadoop-client-api-", "spark-common-utils_")


class CompileError(RuntimeError):
    """javac failed (the message says how to see why)."""


def sources(source_dir: Path = SOURCE_DIR) -> list[Path]:
    return sorted(source_dir.rglob("*.java"))


def digest(pyspark_version: str, source_dir: Path = SOURCE_DIR) -> str:
    """A digest of the Java sources and the pyspark version they compile against."""
    h = hashlib.sha256(pyspark_version.encode())
    for src in sources(source_dir):
        h.update(src.relative_to(source_dir).as_posix().encode())
        h.update(src.read_bytes())
    return h.hexdigest()[:16]


def find_javac() -> str | None:
    """A JDK's ``javac``: ``JAVA_HOME``'s first, else the one on ``PATH``."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "javac").exists():
        return str(Path(java_home) / "bin" / "javac")
    return shutil.which("javac")


def jar_problem(jar: Path) -> str | None:
    """Why ``jar`` is not a readable JVM lookup JAR (``None``: it is)."""
    try:
        with zipfile.ZipFile(jar) as z:
            if LOOKUP_CLASS_FILE not in z.namelist():
                return f"it holds no {LOOKUP_CLASS_FILE}"
            bad = z.testzip()
    except (OSError, zipfile.BadZipFile) as e:
        return f"it is not a readable JAR ({type(e).__name__}: {e})"
    return f"its entry {bad} is damaged" if bad else None


def compile_jar(javac: str, pyspark_jars: Path, target: Path,
                source_dir: Path = SOURCE_DIR) -> Path:
    """Compile the sources with ``javac`` against ``pyspark_jars`` into ``target`` (written
    whole or not at all); a :class:`CompileError` when javac fails."""
    jars = [str(p) for p in sorted(pyspark_jars.glob("*.jar"))
            if p.name.startswith(COMPILE_AGAINST)]
    with tempfile.TemporaryDirectory() as tmp:
        classes = Path(tmp) / "classes"
        cmd = [javac, "--release", "17", "-nowarn", "-encoding", "UTF-8",
               "-cp", os.pathsep.join(jars), "-d", str(classes),
               *map(str, sources(source_dir))]
        # in the temporary folder: javac leaves a javac.<date>.args file where it fails
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        if proc.returncode != 0:
            errors = [ln for ln in proc.stderr.splitlines() if "error" in ln][:3]
            raise CompileError(f"javac could not compile the JVM lookup ({'; '.join(errors)})"
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


def write_digest(path: Path, pyspark_version: str, source_dir: Path = SOURCE_DIR) -> str:
    """Record the digest of a JAR built for ``pyspark_version`` in ``path``."""
    value = digest(pyspark_version, source_dir)
    path.write_text(f"{value}\npyspark {pyspark_version}\n")
    return value


def read_digest(path: Path) -> tuple[str, str] | None:
    """A digest file's digest and pyspark version (``None``: no file)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    if not lines:
        return None
    version = lines[1].removeprefix("pyspark ").strip() if len(lines) > 1 else "?"
    return lines[0].strip(), version
