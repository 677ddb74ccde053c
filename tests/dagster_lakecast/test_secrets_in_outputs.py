"""Secret settings never reach an output of a run: a batch of the fx pipeline runs through
Dagster (a persistent instance in the test's folder) with secret Hadoop/S3/ABFS settings
in ``LAKECAST_SPARK_CONF``, then a run whose conf has a malformed secret entry fails; no
secret value is in the captured stdout/stderr, any event record of either run (text and
metadata, serialized whole), the run records, or any file the runs wrote (lake, progress
logs, checkpoints, Dagster home and compute logs, the project's ``var/log/``)."""

import secrets
from pathlib import Path

import dagster as dg
import pytest

from lakecast.config import get_settings
from tests.dagster_lakecast.test_run_seam import write_inputs
from tests.dagster_lakecast.test_two_writers import _assert_once, _job

KEYS = ("spark.hadoop.fs.s3a.secret.key", "spark.hadoop.fs.s3a.access.key",
        "spark.hadoop.fs.s3a.session.token", "spark.hadoop.fs.s3a.encryption.key",
        "spark.hadoop.fs.azure.account.key.lakeacct.dfs.core.windows.net")


@pytest.fixture
def hadoop_reset(spark):
    """The in-process session's Hadoop configuration as it was, after the test (the run
    copies the conf's ``fs.s3a.*`` settings into it)."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    before = {k.removeprefix("spark.hadoop."): hadoop.get(k.removeprefix("spark.hadoop."))
              for k in KEYS}
    yield
    for k, v in before.items():
        if v is None:
            hadoop.unset(k)
        else:
            hadoop.set(k, v)


def _files(*roots: Path) -> list[Path]:
    return [p for root in roots if root.exists() for p in root.rglob("*")
            if p.is_file() and p.stat().st_size < 200 << 20]


def test_secret_settings_appear_in_no_output_of_a_run(spark, lake, tmp_path, monkeypatch,
                                                      capfd, hadoop_reset):
    values = {k: f"S3CR3T{secrets.token_hex(12)}" for k in KEYS}
    conf = ";".join(f"{k}={v}" for k, v in values.items())
    monkeypatch.setenv("LAKECAST_SPARK_CONF", conf)
    new = write_inputs(lake, 0)
    job = _job(None)
    with dg.DagsterInstance.get() as instance:
        ok = job.execute_in_process(instance=instance)
        assert ok.success
        # a malformed secret entry (":" for "="): the run fails on a clear error
        bad = "spark.hadoop.fs.s3a.secret.key:" + values[KEYS[0]]
        monkeypatch.setenv("LAKECAST_SPARK_CONF", f"{conf};{bad}")
        failed = job.execute_in_process(instance=instance, raise_on_error=False)
        assert not failed.success
        failure = [e for e in failed.all_events if e.is_failure]
        assert failure and any("not of the form key=value" in str(e.event_specific_data)
                               for e in failure)
        records = []
        for run in (ok, failed):
            records += [dg.serialize_value(e) for e in instance.all_logs(run.run_id)]
            records.append(dg.serialize_value(instance.get_run_by_id(run.run_id)))
    _assert_once(lake, new)
    out, err = capfd.readouterr()
    texts = {"stdout": out, "stderr": err, "events": "\n".join(records)}
    assert len(records) > 20 and "ASSET_MATERIALIZATION" in texts["events"]
    files = _files(tmp_path, lake.var_dir / "log")
    assert any(p.suffix == ".json" or "_progress" in str(p) for p in files)
    for name, value in values.items():
        for where, text in texts.items():
            assert value not in text, f"{name}'s value is in the run's {where}"
        for path in files:
            assert value.encode() not in path.read_bytes(), f"{name}'s value is in {path}"


@pytest.mark.parametrize("entry", ["spark.hadoop.fs.s3a.secret.key:{v}",
                                   "fs.azure.account.key.acct.dfs.core.windows.net {v}"])
def test_a_malformed_secret_entry_is_named_without_its_value(entry, monkeypatch):
    from lakecast.errors import ConfigError

    value = f"S3CR3T{secrets.token_hex(8)}"
    monkeypatch.setenv("LAKECAST_SPARK_CONF", entry.format(v=value))
    with pytest.raises(ConfigError) as err:
        get_settings()
    assert value not in str(err.value) and "value is not shown" in str(err.value)
    assert entry.split(":")[0].split(" ")[0] in str(err.value)
