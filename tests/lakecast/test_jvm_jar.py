"""The JVM lookup's JAR ships built (issue 53): the wheel carries it and its digest, an
environment without a JDK gets the JVM lookups from it, and a JAR the Spark session cannot
load is said once with the fix while the lookups run in the Python workers.

Real builds and real Spark: the wheel is built by pip (an isolated build, as a user's or a
release's), the no-JDK environment is a virtualenv whose ``PATH`` and ``JAVA_HOME`` find
``java`` but no ``javac``, and each Spark runs in a process of its own (a session started
with the JAR it is given)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from lakecast.config import get_settings
from lakecast.jvm import build
from lakecast.jvm.javac import DIGEST_NAME, JAR_NAME, LOOKUP_CLASS_FILE, jar_problem

PROJECT = Path(__file__).resolve().parents[2]
#: what a wheel's build reads of the source tree (MANIFEST.in's and pyproject's)
SOURCES = ("pyproject.toml", "README.md", "MANIFEST.in", "constraints.txt", "build_backend",
           "platform")

#: a pure enrich(Lookup...) through BroadcastRuntime, twice (two runtimes), against pandas;
#: prints what it saw as JSON (argv[1]: a folder for its table)
SCRIPT = r'''
import json, logging, sys

import pandas as pd

import lakecast
from lakecast import BroadcastRuntime, Lookup, enrich
from lakecast.delta import io as delta_io
from lakecast.jvm.build import built_jar
from lakecast.spark import get_spark

said = []


class Keep(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())


logging.getLogger("lakecast.runtime.jvm_state").addHandler(Keep(logging.WARNING))
spark = get_spark(app_name="lakecast-jvm-jar")
users = pd.DataFrame({"user_id": [1, 2, 3, 4], "segment": ["VIP", "NEW", None, "REGULAR"]})
path = sys.argv[1] + "/dim_users"
delta_io.write(spark.createDataFrame(users), path, mode="overwrite")
ids = [1, 2, 3, 4, 5, 1, None, 2, 9]
events = spark.createDataFrame(list(enumerate(ids)), "event_id long, user_id long")
ref = pd.DataFrame({"event_id": range(len(ids)), "user_id": ids}).merge(
    users, on="user_id", how="left", indicator=True)
ref.loc[ref["_merge"] == "left_only", "segment"] = "none"
want = [None if pd.isna(s) else s for s in ref.sort_values("event_id")["segment"]]
fn = enrich(Lookup("dim_users", key="user_id", defaults={"segment": "none"}))
runs = []
for _ in range(2):
    runtime = BroadcastRuntime(spark, fn, {"dim_users": path}, lineage=False)
    out = runtime.process(events).collect()
    got = out.main.sort_by("event_id").column("segment").to_pylist()
    runs.append({"engine": runtime.state_engine, "reason": runtime.state_engine_reason,
                 "equal": got == want, "got": got,
                 "caches": sorted({r["cache"] for r in out.task_rows})})
    runtime.close()
try:
    BroadcastRuntime(spark, fn, {"dim_users": path}, jvm_lookups=True)
    refused = None
except ValueError as e:
    refused = str(e)
print(json.dumps({"runs": runs, "want": want, "said": said, "refused": refused,
                  "lakecast": lakecast.__file__, "built_jar": str(built_jar()),
                  "jars": spark.conf.get("spark.jars").split(",")}))
'''


def _copy_sources(dest: Path) -> Path:
    """The files a wheel is built from, copied (a build writes build/ and *.egg-info)."""
    dest.mkdir(parents=True)
    for name in SOURCES:
        src = PROJECT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns(
                "__pycache__", "*.egg-info", JAR_NAME, DIGEST_NAME))
        else:
            shutil.copy2(src, dest / name)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """lakecast's wheel, built by pip in an isolated build environment (setuptools and the
    pinned pyspark installed there, as for a release) with this machine's JDK."""
    root = tmp_path_factory.mktemp("wheel")
    src = _copy_sources(root / "src")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(root / "dist"),
         str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (whl,) = (root / "dist").glob("lakecast-*.whl")
    return whl


def _jars_without_lookup(folder: Path) -> Path:
    """A JAR folder with the JAR cache's Delta JARs (links) and its marker, and no JVM
    lookup JAR: what `lakecast setup` leaves before the lookup's JAR."""
    cache = get_settings().jars_dir
    folder.mkdir(parents=True)
    for jar in cache.glob("*.jar"):
        (folder / jar.name).symlink_to(jar)
    shutil.copy2(cache / ".complete", folder / ".complete")
    return folder


def _env(home: Path, jars: Path, **extra: str) -> dict[str, str]:
    """This process's environment without Lakecast's settings and Python paths, with its
    own project folder and JAR folder (and a small driver)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LAKECAST_") and k not in (
               "PYTHONPATH", "VIRTUAL_ENV", "JAVA_HOME", "PYSPARK_PYTHON",
               "PYSPARK_DRIVER_PYTHON", "SPARK_HOME")}
    home.mkdir(parents=True, exist_ok=True)
    env.update(LAKECAST_HOME=str(home), LAKECAST_JARS_DIR=str(jars),
               LAKECAST_SPARK_CONF="spark.driver.memory=1g", **extra)
    return env


def _run(cmd: list[str], env: dict[str, str], cwd: Path,
         timeout: float = 240) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


def _lookups(python: str, env: dict[str, str], home: Path) -> dict:
    script = home / "lookups.py"
    script.write_text(SCRIPT)
    proc = _run([python, str(script), str(home / "tables")], env, home)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_wheel_ships_the_jar_and_its_digest(wheel):
    """The built wheel holds lakecast/jvm/lakecast-jvm.jar (the lookup's classes, intact)
    and its digest: the current sources' with the pinned pyspark (this venv's)."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert f"lakecast/jvm/{JAR_NAME}" in names and f"lakecast/jvm/{DIGEST_NAME}" in names
        digest, version = z.read(f"lakecast/jvm/{DIGEST_NAME}").decode().splitlines()
        jar = wheel.parent / JAR_NAME
        jar.write_bytes(z.read(f"lakecast/jvm/{JAR_NAME}"))
        record = z.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode()
    import pyspark

    assert version == f"pyspark {pyspark.__version__}"
    assert digest == build.source_digest()
    assert jar_problem(jar) is None and LOOKUP_CLASS_FILE in zipfile.ZipFile(jar).namelist()
    assert f"lakecast/jvm/{JAR_NAME}," in record  # a file of the install (pip uninstalls it)


def _no_jdk(tmp_path: Path) -> tuple[str, str]:
    """``PATH`` and ``JAVA_HOME`` that find this machine's ``java`` but no ``javac``: a
    folder of links to every command on ``PATH`` but the JDK's tools, and a Java home
    holding only ``bin/java``."""
    java = Path(shutil.which("java") or "").resolve()
    assert java.is_file(), "the test needs a Java runtime"
    home = tmp_path / "jre"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").symlink_to(java)
    tools = {p.name for p in java.parent.iterdir()} - {"java"}  # javac, jar, jshell, ...
    commands = tmp_path / "commands"
    commands.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not Path(folder).is_dir() or Path(folder).resolve() == Path(sys.prefix) / "bin":
            continue
        for cmd in Path(folder).iterdir():
            link = commands / cmd.name
            if cmd.name not in tools and not link.exists() and not link.is_symlink():
                link.symlink_to(cmd)
    return f"{home / 'bin'}{os.pathsep}{commands}", str(home)


def test_a_wheel_built_without_a_jdk_ships_no_jar_and_says_so(tmp_path):
    """No javac at build time: the wheel builds (an install from a checkout keeps
    working), without the JAR and without pyspark in its build environment, and the build
    says so; with LAKECAST_BUILD_JVM_JAR=1 (a release's build) it is an error instead."""
    src = _copy_sources(tmp_path / "src")
    path, java_home = _no_jdk(tmp_path)
    env = {**os.environ, "PATH": path, "JAVA_HOME": java_home}
    cmd = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w",
           str(tmp_path / "dist"), str(src)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "no JDK (javac) found, so this wheel ships no JVM lookup JAR" in out
    assert "pyspark" not in " ".join(ln for ln in out.splitlines() if "Collecting" in ln)
    (whl,) = (tmp_path / "dist").glob("lakecast-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    assert f"lakecast/jvm/{JAR_NAME}" not in names and "lakecast/jvm/build.py" in names
    strict = subprocess.run(cmd, env={**env, "LAKECAST_BUILD_JVM_JAR": "1"},
                            capture_output=True, text=True, timeout=600)
    assert strict.returncode != 0
    assert "LAKECAST_BUILD_JVM_JAR=1" in strict.stdout + strict.stderr


@pytest.mark.slow
def test_without_a_jdk_the_shipped_jar_runs_the_lookups_in_the_jvm(wheel, tmp_path):
    """A virtualenv with the wheel (its dependencies: this project's venv, through a .pth)
    and a Java runtime but no javac: the package's JAR is the JAR of its digest,
    `lakecast setup` puts it beside the Delta JARs without compiling, and a pure
    enrich(Lookup...) runs in the executor JVM, equal to pandas."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q",
                    "--no-deps", str(wheel)], check=True, timeout=300)
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path("
                                "'purelib'))"], capture_output=True, text=True,
                               check=True).stdout.strip())
    # a path line only: the project venv's own .pth files (its editable lakecast) are not
    # read, so lakecast is the wheel's
    (site / "lakecast-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    path, java_home = _no_jdk(tmp_path)
    jars = _jars_without_lookup(tmp_path / "jars")
    home = tmp_path / "project"
    env = _env(home, jars, PATH=f"{venv / 'bin'}{os.pathsep}{path}", JAVA_HOME=java_home)
    assert shutil.which("javac", path=env["PATH"]) is None
    assert shutil.which("java", path=env["PATH"]) is not None

    probe = _run([python, "-c", "import json, lakecast.jvm.build as b; print(json.dumps("
                  "[b.__file__, b.find_javac(), str(b.built_jar()), str(b.shipped_jar()), "
                  "str(b.jar_path())]))"], env, home)
    module, javac, before, shipped, cached = json.loads(probe.stdout)
    assert module.startswith(str(site)) and javac is None
    assert before == shipped == str(site / "lakecast" / "jvm" / JAR_NAME)  # used in place
    assert cached == str(jars / "lakecast-jvm" / build.source_digest() / JAR_NAME)

    setup = _run([str(venv / "bin" / "lakecast"), "setup"], env, home)
    assert "installing the JVM lookup JAR shipped with lakecast" in setup.stdout
    assert "compiling" not in setup.stdout and "warning" not in setup.stderr, setup.stderr
    assert f"JVM lookup JAR: {cached}" in setup.stdout
    assert Path(cached).read_bytes() == Path(shipped).read_bytes()

    seen = _lookups(python, env, home)
    assert seen["lakecast"].startswith(str(site)) and seen["built_jar"] == cached
    assert seen["jars"].count(cached) == 1  # beside the Delta JARs
    assert all(Path(j).parent == jars for j in seen["jars"] if j != cached)
    for run in seen["runs"]:
        assert run["engine"] == "jvm" and run["equal"], (run, seen["want"])
    # measured in the executor JVM: its state built cold, then warm
    assert seen["runs"][0]["caches"] == ["cold"] and seen["refused"] is None
    assert seen["said"] == []


@pytest.mark.slow
def test_a_jar_the_session_cannot_load_is_said_once_and_python_runs_the_lookups(tmp_path):
    """The JAR cache's lookup JAR truncated: the session starts, the lookups run in the
    Python workers with the same rows, the log says once which JAR and how to fix it, and
    jvm_lookups=True refuses with that reason."""
    jars = _jars_without_lookup(tmp_path / "jars")
    jar = jars / "lakecast-jvm" / build.source_digest() / JAR_NAME
    jar.parent.mkdir(parents=True)
    good = build.built_jar()
    assert good is not None
    jar.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    assert jar_problem(jar) is not None
    home = tmp_path / "project"
    seen = _lookups(sys.executable, _env(home, jars), home)
    assert seen["built_jar"] == str(jar) and str(jar) in seen["jars"]
    for run in seen["runs"]:
        assert run["engine"] == "python" and run["equal"], (run, seen["want"])
        assert f"cannot load the JVM lookup JAR {jar}" in run["reason"]
    (said,) = [m for m in seen["said"] if "JVM lookups are off" in m]  # once, two runtimes
    assert f"cannot load the JVM lookup JAR {jar}" in said
    assert "`lakecast setup --force`" in said and "not a readable JAR" in said
    assert seen["refused"] is not None and str(jar) in seen["refused"]


def test_setup_replaces_a_damaged_jar(tmp_path):
    """`lakecast setup` (lakecast.jvm.build.build) puts a good JAR where a damaged one
    is, with or without --force."""
    settings = get_settings({**os.environ, "LAKECAST_JARS_DIR": str(tmp_path / "jars")})
    target = build.jar_path(settings)
    target.parent.mkdir(parents=True)
    target.write_bytes(b"PK\x03\x04 not a jar")
    assert build.built_jar(settings) == target and jar_problem(target) is not None
    assert build.build(settings) == target and jar_problem(target) is None
    before = target.stat().st_mtime_ns
    assert build.build(settings) == target and target.stat().st_mtime_ns == before  # kept
