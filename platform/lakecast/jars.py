"""Fetch Delta Lake's JARs from Maven Central once: ``python -m lakecast.jars``.

The delta-spark wheel ships no JARs. This resolves ``deploy/maven/pom.xml``
(``io.delta:delta-spark_<spark>_2.13`` and its runtime dependencies) with Maven
into the JAR folder, then drops every JAR whose artifact pyspark already ships
(Spark's own copy wins on the classpath anyway). Idempotent: a complete folder
is left alone (the marker records the pom's digest: a changed pom is fetched again).
The Spark session factory only ever reads this folder.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from lakecast.config import get_settings
from lakecast.errors import SetupError

FETCH_COMMAND = "make setup"
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
    """The marker's first line for ``pom``: a folder fetched for another pom is stale."""
    return f"# pom sha256 {hashlib.sha256(pom.read_bytes()).hexdigest()}"


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
        raise SetupError(
            "Maven (`mvn`) is needed once to fetch Delta's JARs: apt-get install -y maven"
        )
    print(f"==> fetching Delta Lake JARs from Maven Central into {jars_dir}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
            f"-DoutputDirectory={tmp}", "-DincludeScope=runtime",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SetupError(f"Maven failed to resolve {pom}:\n{proc.stdout}{proc.stderr}")
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    settings = get_settings()
    try:
        fetch(settings.jars_dir, settings.project_root / "deploy" / "maven" / "pom.xml",
              force="--force" in argv)
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
