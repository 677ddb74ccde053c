"""The lakecast CLI: live inputs and lake inspection (in-process, on the test session)."""

from __future__ import annotations

from lakecast.delta import io as delta_io
from lakecast.tools import cli, flags


def test_flag_set_list_and_versions(spark, lake, capsys):
    assert cli.main(["flag", "set", "vip_discount", "15"]) == 0
    assert "feature_flags v0" in capsys.readouterr().out
    assert cli.main(["flag", "set", "vip_discount", "15"]) == 0  # same value: no new version
    assert "unchanged" in capsys.readouterr().out
    assert cli.main(["flag", "set", "vip_discount", "20", "--disabled"]) == 0
    assert "feature_flags v1" in capsys.readouterr().out
    assert flags.read_flags(spark, lake.table_path("feature_flags")) == {
        "vip_discount": (False, "20")}
    assert cli.main(["flag", "list"]) == 0
    assert "disabled" in capsys.readouterr().out
    assert cli.main(["versions"]) == 0
    out = capsys.readouterr().out
    assert "feature_flags" in out and "MERGE" in out


def test_bad_flag_name_is_a_clear_error(spark, lake, capsys):
    assert cli.main(["flag", "set", "bad name!", "1"]) == 2
    assert "invalid flag name" in capsys.readouterr().err
    assert delta_io.latest_version(lake.table_path("feature_flags")) is None


def test_produce_appends_events(spark, lake, capsys):
    from lakecast.tools import datagen

    datagen.generate(spark, lake, datagen.GenSpec(scale=0.02, days=1))
    before = delta_io.latest_version(lake.table_path("events"))
    assert cli.main(["produce", "--rate", "100", "--every", "0", "--batches", "2"]) == 0
    assert delta_io.latest_version(lake.table_path("events")) == before + 2
    assert capsys.readouterr().out.count("appended") == 2
