"""The Spark session factory: local JARs only, configuration overrides, clear errors."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from lakecast import jars
from lakecast.config import get_settings, parse_conf_pairs
from lakecast.errors import ConfigError, SetupError
from lakecast.spark import build_conf, delta_jar_location
from tests import ROOT as PROJECT_ROOT


def test_stdlib_platform_is_not_shadowed():
    out = subprocess.run(
        [sys.executable, "-c", "import platform; print(platform.__file__)"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert Path(out).parent == Path(sysconfig.get_paths()["stdlib"])
    assert not (PROJECT_ROOT / "platform" / "__init__.py").exists()


def test_delta_classes_load_from_project_jar_folder(spark):
    settings = get_settings()
    location = delta_jar_location(spark)
    assert location.startswith("file:")
    assert Path(location.removeprefix("file:")).parent == settings.jars_dir
    conf = dict(spark.sparkContext.getConf().getAll())
    assert "spark.jars.packages" not in conf
    # the Delta JARs from the JAR folder, plus the JVM lookup's JAR that `lakecast setup`
    # built into it (lakecast.jvm.build); nothing else
    from lakecast.jvm.build import built_jar

    jars = conf["spark.jars"].split(",")
    lookup = built_jar(settings)
    assert lookup is not None and jars.count(str(lookup)) == 1
    assert all(Path(j).parent == settings.jars_dir for j in jars if j != str(lookup))


def test_session_defaults(spark):
    import os

    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.sparkContext.master.startswith("local")
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    # Python workers run this interpreter, with pyarrow importable
    worker = spark.sparkContext.parallelize([0], 1).map(
        lambda _: __import__("sys").executable + "|" + __import__("pyarrow").__version__
    ).first()
    assert worker.split("|")[0] == sys.executable


def test_conf_precedence(tmp_path, monkeypatch):
    conf_file = tmp_path / "spark.conf"
    conf_file.write_text("spark.sql.shuffle.partitions 3\nspark.executor.cores=1\n")
    monkeypatch.setenv("LAKECAST_SPARK_CONF_FILE", str(conf_file))
    monkeypatch.setenv("LAKECAST_SPARK_CONF", "spark.executor.cores=2;spark.foo=bar")
    monkeypatch.setenv("LAKECAST_SPARK_MASTER", "spark://example:7077")
    conf = build_conf(get_settings(), {"spark.foo": "baz"})
    assert conf["spark.sql.shuffle.partitions"] == "3"  # file
    assert conf["spark.executor.cores"] == "2"  # env beats file
    assert conf["spark.foo"] == "baz"  # code beats env
    assert conf["spark.master"] == "spark://example:7077"
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"


def test_packages_are_refused(monkeypatch):
    monkeypatch.setenv("LAKECAST_SPARK_CONF", "spark.jars.packages=io.delta:delta-spark_2.13:4.0.0")
    with pytest.raises(ConfigError, match="local JARs"):
        build_conf(get_settings())


def test_bad_conf_entry():
    with pytest.raises(ConfigError, match="key=value"):
        parse_conf_pairs("spark.a=1;nonsense")


@pytest.mark.parametrize(("value", "want"), [("", None), ("4", 4), (" 12 ", 12)])
def test_parallelism_default_of_runs(value, want):
    assert get_settings({"LAKECAST_PARALLELISM": value}).parallelism == want


@pytest.mark.parametrize("value", ["0", "-2", "four", "2.5"])
def test_bad_parallelism_names_the_variable_and_the_fix(value):
    with pytest.raises(ConfigError, match=r"LAKECAST_PARALLELISM=.*whole number of tasks"):
        get_settings({"LAKECAST_PARALLELISM": value})


def test_missing_jars_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKECAST_JARS_DIR", str(tmp_path / "nojars"))
    with pytest.raises(SetupError, match="lakecast setup"):
        build_conf(get_settings())


def test_missing_java_names_the_fix(monkeypatch):
    from lakecast.spark import check_java

    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SetupError, match="openjdk-17"):
        check_java()


def test_artifact_names():
    assert jars.artifact_name("jackson-core-2.13.5.jar") == "jackson-core"
    assert jars.artifact_name("delta-spark_4.2_2.13-4.4.0.jar") == "delta-spark_4.2_2.13"
    assert jars.artifact_name("zstd-jni-1.5.7-3.jar") == "zstd-jni"


def test_jar_folder_of_another_pom_is_stale(tmp_path):
    pom = tmp_path / "pom.xml"
    pom.write_text("<project>one</project>")
    folder = tmp_path / "jars"
    folder.mkdir()
    assert not jars.is_current(folder, pom)
    (folder / ".complete").write_text("delta-spark_4.2_2.13-4.4.0.jar\n")  # before digests
    assert not jars.is_current(folder, pom)
    (folder / ".complete").write_text(jars.pom_digest(pom) + "\ndelta-spark.jar\n")
    assert jars.is_current(folder, pom)
    pom.write_text("<project>two</project>")  # e.g. hadoop-aws added
    assert not jars.is_current(folder, pom)
