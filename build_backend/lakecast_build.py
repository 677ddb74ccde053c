"""Lakecast's build backend: setuptools', plus the JVM lookup's JAR built into the wheel.

``pyproject.toml`` names this module (``backend-path = ["build_backend"]``) and its
:class:`BuildPy` as setuptools' ``build_py`` command. Building a wheel compiles
``lakecast/jvm/java`` with a JDK's ``javac`` against the JARs of the build environment's
pyspark and adds ``lakecast/jvm/lakecast-jvm.jar`` and ``lakecast/jvm/lakecast-jvm.digest``
(the digest of the sources and that pyspark version) to the package: an installed
lakecast needs a Java runtime, not a JDK (:mod:`lakecast.jvm.build`).

pyspark is a build requirement of the wheel only, at the version ``constraints.txt`` pins
(the project's lock; the runtime uses a shipped JAR only when its pyspark is that version):
an isolated build installs it, ``--no-build-isolation`` uses the environment's. An
editable install (``pip install -e``) builds no JAR and needs no pyspark to build:
``lakecast setup`` compiles the JAR there.

``LAKECAST_BUILD_JVM_JAR``: unset, the JAR is built when a JDK is found, else the build
warns and the wheel ships none (installing from a checkout without a JDK keeps working;
``lakecast setup`` then compiles the JAR where a JDK is, else pure lookups run in the
Python workers, said once); ``1`` requires it (a release's build: no JDK is an error);
``0`` builds a wheel without it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys
from pathlib import Path

from setuptools.build_meta import (
    build_editable,
    build_sdist,
    build_wheel,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)
from setuptools.build_meta import get_requires_for_build_wheel as setuptools_wheel_requires
from setuptools.command.build_py import build_py

__all__ = ["BuildPy", "build_editable", "build_sdist", "build_wheel",
           "get_requires_for_build_editable", "get_requires_for_build_sdist",
           "get_requires_for_build_wheel", "prepare_metadata_for_build_editable",
           "prepare_metadata_for_build_wheel"]

ROOT = Path(__file__).resolve().parent.parent
#: the package folder of lakecast.jvm in the source tree
JVM_DIR = Path("platform") / "lakecast" / "jvm"


def pyspark_requirement(root: Path = ROOT) -> str:
    """pyspark at ``constraints.txt``'s pin, else at the range ``pyproject.toml`` allows."""
    constraints = root / "constraints.txt"
    if constraints.exists():
        for line in constraints.read_text().splitlines():
            if re.match(r"pyspark\s*==", line.strip(), re.IGNORECASE):
                return line.split("#")[0].strip()
    m = re.search(r'"(pyspark\s*[<>=!~][^"]*)"', (root / "pyproject.toml").read_text())
    return m.group(1) if m else "pyspark"


def jar_mode() -> str:
    """``LAKECAST_BUILD_JVM_JAR``: ``"1"`` (required), ``"0"`` (skipped) or ``"auto"``."""
    value = os.environ.get("LAKECAST_BUILD_JVM_JAR", "").strip()
    return value if value in ("0", "1") else "auto"


def builds_jar() -> bool:
    """Whether a wheel's build compiles the JAR (``"auto"``: when a JDK is found)."""
    mode = jar_mode()
    return mode == "1" or (mode == "auto" and _javac_module().find_javac() is not None)


def get_requires_for_build_wheel(config_settings=None) -> list[str]:
    """setuptools' requirements, plus pyspark (its JARs, compiled against) when the
    build compiles the JAR."""
    requires = list(setuptools_wheel_requires(config_settings))
    if builds_jar():
        requires.append(pyspark_requirement())
    return requires


@functools.cache
def _javac_module():
    """``lakecast/jvm/javac.py`` loaded by its path (the standard library only)."""
    path = ROOT / JVM_DIR / "javac.py"
    spec = importlib.util.spec_from_file_location("lakecast_build_javac", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses and the like look their module up)
    spec.loader.exec_module(module)
    return module


class BuildPy(build_py):
    """setuptools' ``build_py``, then the JVM lookup's JAR and its digest into the built
    ``lakecast/jvm`` (a wheel's build only: an editable install has none)."""

    def jar_outputs(self) -> list[str]:
        javac = _javac_module()
        folder = Path(self.build_lib) / "lakecast" / "jvm"
        return [str(folder / javac.JAR_NAME), str(folder / javac.DIGEST_NAME)]

    def wants_jar(self) -> bool:
        return not self.editable_mode and builds_jar()

    def run(self) -> None:
        super().run()
        if self.wants_jar():
            self.build_jar()
        elif not self.editable_mode and jar_mode() == "auto":
            print("lakecast: WARNING: no JDK (javac) found, so this wheel ships no JVM "
                  "lookup JAR: its users need a JDK for `lakecast setup` to compile it, "
                  "else pure lookups run in the Python workers; install one (e.g. apt-get "
                  "install -y openjdk-17-jdk-headless) and build again, or set "
                  "LAKECAST_BUILD_JVM_JAR=1 to make this an error", file=sys.stderr)

    def build_jar(self) -> None:
        import pyspark

        javac = _javac_module()
        compiler = javac.find_javac()
        if compiler is None:
            raise SystemExit(
                "error: building lakecast's wheel compiles its JVM lookup JAR with javac, and "
                "no JDK was found (JAVA_HOME, PATH) while LAKECAST_BUILD_JVM_JAR=1: install "
                "one (e.g. apt-get install -y openjdk-17-jdk-headless), or unset it to build "
                "a wheel without the JAR")
        jar, digest_file = map(Path, self.jar_outputs())
        source_dir = ROOT / JVM_DIR / "java"
        try:
            javac.compile_jar(compiler, Path(pyspark.__file__).parent / "jars", jar,
                              source_dir)
        except javac.CompileError as e:
            raise SystemExit(f"error: {e}") from None
        value = javac.write_digest(digest_file, pyspark.__version__, source_dir)
        print(f"lakecast: built {jar} (digest {value}, pyspark {pyspark.__version__})")

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        return [*outputs, *self.jar_outputs()] if self.wants_jar() else outputs
