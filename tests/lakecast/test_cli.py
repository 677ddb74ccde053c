"""The lakecast CLI: live inputs and lake inspection (in-process, on the test session)."""

from __future__ import annotations

import re

import pytest

from assets import flags
from lakecast.delta import io as delta_io
from lakecast.tools import cli


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
    from assets import datagen

    datagen.generate(spark, lake, datagen.GenSpec(scale=0.02, days=1))
    before = delta_io.latest_version(lake.table_path("events"))
    assert cli.main(["produce", "--batch-size", "100", "--every", "0", "--batches", "2"]) == 0
    assert delta_io.latest_version(lake.table_path("events")) == before + 2
    assert capsys.readouterr().out.count("appended") == 2


LINE = re.compile(
    r"\[(\d+)/\d+\] events v(\d+): produced (\d+) events, dropped (\d+) \(their users had "
    r"churned or not signed up yet\), appended (\d+) rows \(ids (\d+)\.\.(\d+); "
    r"(\d+) deliberate duplicates\)"
)


def _committed(spark, lake, version):
    """The rows commit ``version`` of the events table added (pandas), read back from Delta."""
    path = lake.table_path("events")
    now = delta_io.read(spark, path, version=version).toPandas()
    before = delta_io.read(spark, path, version=version - 1).select("event_id").toPandas()
    return now[now["event_id"] > before["event_id"].max()]


def test_produce_reports_dropped_events_and_ids_never_overlap(spark, lake, capsys):
    from assets import datagen

    datagen.generate(spark, lake, datagen.GenSpec(scale=0.02, days=1))
    for _ in range(2):  # two invocations, 2 commits each
        assert cli.main(["produce", "--batch-size", "300", "--every", "0", "--batches", "2"]) == 0
    lines = [m for m in map(LINE.search, capsys.readouterr().out.splitlines()) if m]
    assert len(lines) == 4
    last_id = -1
    for m in lines:
        version, produced, dropped, rows, first, last, dups = map(int, m.groups()[1:])
        new = _committed(spark, lake, version)
        distinct = new["event_id"].nunique()
        assert produced == 300
        assert rows == len(new) and dups == len(new) - distinct  # what the commit holds
        assert dropped == produced - distinct and 0.15 * 300 < dropped < 0.6 * 300  # churned
        assert (first, last) == (new["event_id"].min(), new["event_id"].max())
        assert first > last_id  # ids never overlap, across commits and invocations
        last_id = last


def test_produce_rate_is_events_per_second(spark, lake, capsys):
    from assets import datagen

    datagen.generate(spark, lake, datagen.GenSpec(scale=0.02, days=1))
    assert cli.main(["produce", "--rate", "40", "--every", "0.5", "--batches", "2"]) == 0
    produced = [int(m.group(3)) for m in map(LINE.search, capsys.readouterr().out.splitlines())
                if m]  # fmt: skip
    assert produced == [20, 20]  # 40 events/s x 0.5 s per commit


def test_produce_flags_are_explained_and_checked(spark, lake, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["produce", "--help"])
    assert exit_.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "events produced per second" in help_text and "events produced per commit" in help_text
    assert "churned" in help_text and "dropped" in help_text

    assert cli.main(["produce", "--rate", "1", "--every", "0"]) == 2  # 0 events per commit
    assert "--batch-size" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one of --rate / --batch-size
        cli.main(["produce", "--rate", "5", "--batch-size", "10"])
    assert delta_io.latest_version(lake.table_path("events")) is None
