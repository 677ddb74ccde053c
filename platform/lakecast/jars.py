"""Fetch Delta Lake's JARs from Maven Central once: ``lakecast setup``.

The delta-spark wheel ships no JARs. This resolves the package's ``defaults/pom.xml``
(``io.delta:delta-spark_<spark>_2.13`` at the installed delta-spark version, and its
runtime dependencies) with Maven into the JAR folder (``Settings.jars_dir``: a cache
shared by every project, see :mod:`lakecast.config`), then drops every JAR whose artifact
pyspark already ships (Spark's own copy wins on the classpath anyway). Idempotent: a
complete folder is left alone (the marker records the pom's digest and the Delta version:
another pom or version is fetched again). The Spark session factory only ever reads
this folder.

Without Maven or a reachable repository, put the JARs in the folder by hand (see
:func:`by_hand`) and create its ``.complete`` file.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from lakecast.config import default_file, delta_version, get_settings
from lakecast.errors import SetupError

FETCH_COMMAND = "lakecast setup"
_MARKER = ".complete"
_ARTIFACT = re.compile(r"^(?P<artifact>.+?)-(?P<version>\d[^-]*(?:-[^-]+)?)\.jar$")


def pyspark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def artifact_name(jar: str) -> str:
    """``jackson-core-2.13.5.jar`` -> ``jackson-core``."""
    m = _ARTIFACT.match(jar)
    return m.group("artifact") if m else jar.removesuffix(".jar")


def local_jars(jars_dir: Path) -> list[Path]:
    """The JARs Spark should load, or a :class:`SetupError` naming the fix."""
    if not (jars_dir / _MARKER).exists():
        raise SetupError(
            f"Delta Lake JARs are missing in {jars_dir}. Fetch them once with `{FETCH_COMMAND}` "
            "(or `python -m lakecast.jars`); Spark never downloads them at start-up."
        )
    jars = sorted(jars_dir.glob("*.jar"))
    if not any(j.name.startswith("delta-spark_") for j in jars):
        raise SetupError(f"no delta-spark JAR in {jars_dir}; re-run `{FETCH_COMMAND}`")
    return jars


def pom_digest(pom: Path) -> str:
    """The marker's first line for ``pom`` at the installed Delta version: a folder fetched
    for another pom or version is stale."""
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()
    return f"# pom sha256 {digest} delta {delta_version()}"


def jar_delta_version(jars: list[Path]) -> str | None:
    """The version of the ``delta-spark_*`` JAR among ``jars`` (``None``: none)."""
    for jar in jars:
        if jar.name.startswith("delta-spark_"):
            m = _ARTIFACT.match(jar.name)
            return m.group("version") if m else None
    return None


def by_hand(jars_dir: Path) -> str:
    """How to provide the JARs without Maven (one sentence)."""
    v = delta_version()
    return (f"put io.delta:delta-spark_4.2_2.13:{v} and io.delta:delta-storage:{v} (plus "
            f"hadoop-aws and the AWS SDK bundle for s3a:// lakes) in {jars_dir} and create "
            f"{jars_dir / _MARKER}, or point LAKECAST_JARS_DIR at a folder that has them")


def is_current(jars_dir: Path, pom: Path) -> bool:
    """Whether ``jars_dir`` holds a complete fetch of this very ``pom``."""
    marker = jars_dir / _MARKER
    if not marker.exists():
        return False
    lines = marker.read_text().splitlines()
    return bool(lines) and lines[0] == pom_digest(pom)


def fetch(jars_dir: Path, pom: Path, force: bool = False) -> list[Path]:
    """Resolve the pom's dependencies into ``jars_dir`` (no-op when already complete for
    this pom; a folder fetched for an older pom is fetched again)."""
    if is_current(jars_dir, pom) and not force:
        return sorted(jars_dir.glob("*.jar"))
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SetupError(f"Maven (mvn) is not on PATH: install it (e.g. apt-get install -y "
                         f"maven) and run `{FETCH_COMMAND}` again, or {by_hand(jars_dir)}")
    with tempfile.TemporaryDirectory() as tmp:
        resolve(mvn, pom, Path(tmp), jars_dir)
        shipped = {artifact_name(p.name) for p in pyspark_jars_dir().glob("*.jar")}
        jars_dir.mkdir(parents=True, exist_ok=True)
        for old in jars_dir.glob("*.jar"):
            old.unlink()
        kept = []
        for jar in sorted(Path(tmp).glob("*.jar")):
            if artifact_name(jar.name) in shipped:
                continue
            shutil.copy2(jar, jars_dir / jar.name)
            kept.append(jars_dir / jar.name)
    (jars_dir / _MARKER).write_text(
        "\n".join([pom_digest(pom), *(p.name for p in kept)]) + "\n")
    for p in kept:
        print(f"    {p.name}")
    return kept


def jar_versions(version: str) -> list[str]:
    """The Delta JAR versions to try for the installed delta-spark ``version``: itself,
    then its minor's ``x.y.0`` (a patch release of the Python package may have no JARs
    of its own; the Python API of one minor talks to any of its JARs)."""
    major, minor, *_ = [*version.split("."), "0", "0"]
    base = f"{major}.{minor}.0"
    return [version] if version == base else [version, base]


def resolve(mvn: str, pom: Path, out: Path, jars_dir: Path) -> str:
    """Resolve the pom's runtime dependencies into ``out`` at the first Delta version of
    :func:`jar_versions` that Maven finds; return it (else a :class:`SetupError`)."""
    errors = []
    for v in jar_versions(delta_version()):
        print(f"==> fetching Delta Lake {v} JARs from Maven Central into {jars_dir}",
              flush=True)
        cmd = [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
               f"-DoutputDirectory={out}", "-DincludeScope=runtime", f"-Ddelta.version={v}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode == 0:
            return v
        errors.append(f"{v}: {_first_error(proc)}")
    raise SetupError(
        f"Maven could not resolve Delta {delta_version()}'s JARs (no reachable repository, "
        f"or the artifact is missing): {'; '.join(errors)}; {by_hand(jars_dir)}")


def _first_error(proc: subprocess.CompletedProcess[str]) -> str:
    """Maven's first ``[ERROR]`` line (its full output is long)."""
    for line in (proc.stdout + proc.stderr).splitlines():
        if "[ERROR]" in line:
            return line.replace("[ERROR]", "").strip()[:300]
    return f"mvn exited with {proc.returncode}"


def setup(force: bool = False) -> list[Path]:
    """Fetch the JARs into ``Settings.jars_dir`` once (``lakecast setup`` then builds the
    JVM lookup's JAR: :mod:`lakecast.jvm.build`)."""
    return fetch(get_settings().jars_dir, default_file("pom.xml"), force=force)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        setup(force="--force" in argv)
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
