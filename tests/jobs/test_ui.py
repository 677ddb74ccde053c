"""``make ui`` (``python -m jobs.ui``) lists the pipelines before ``dagster dev`` starts: a line
per sensor-triggered job with its sensor and the tables it writes and reads."""

from __future__ import annotations

import os

import pytest

from jobs import ui

#: job, its sensor, its output tables, its input tables
PIPELINES = {
    "enrichment_microbatch": ("broadcast_versions_sensor",
                              {"enriched_events", "enrichment_unmatched", "enrichment_rejected"},
                              {"events", "dim_products", "user_segments"}),
    "fraud_microbatch": ("fraud_sensor", {"fraud_alerts", "fraud_review", "fraud_rejected"},
                         {"transactions", "fraud_rules"}),
    "scoring_microbatch": ("scoring_sensor",
                           {"predictions", "scoring_unmatched", "predictions_rejected"},
                           {"scoring_events", "models"}),
}  # fmt: skip


def parse(line: str) -> tuple[str, str, set[str], set[str]]:
    """(job, sensor, written tables, read tables) of a :func:`jobs.ui.pipeline_lines` line."""
    head, tables = line.strip().split(": writes ")
    job, sensor = head.split(" (sensor ")
    writes, reads = tables.split("; reads ")
    return (job, sensor.split(",")[0], set(writes.split(", ")),
            set(reads.split(", ")))  # fmt: skip


def test_pipeline_lines_name_each_pipelines_job_sensor_and_tables():
    lines = ui.pipeline_lines()
    got = {job: (sensor, writes, reads) for job, sensor, writes, reads in map(parse, lines)}
    assert set(got) == set(PIPELINES), lines
    for job, (sensor, writes, reads) in PIPELINES.items():
        assert got[job][:2] == (sensor, writes), (job, got[job])
        assert reads <= got[job][2], (job, got[job])
    assert all("on by default" in line for line in lines), lines


def test_main_prints_the_pipelines_before_dagster_dev_starts(monkeypatch, tmp_path, capsys):
    """``main`` up to the ``exec`` of ``dagster dev`` (the fork's parent side)."""
    started: list[list[str]] = []

    class Exec(Exception):
        pass

    def execve(path: str, args: list[str], env: dict[str, str]) -> None:
        started.append(args)
        raise Exec

    monkeypatch.chdir(tmp_path)  # main changes to the project root: restored after
    monkeypatch.setattr(os, "fork", lambda: 1)
    monkeypatch.setattr(os, "execve", execve)
    with pytest.raises(Exec):
        ui.main(["-p", "3999"])
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == ui.pipeline_lines() and len(out) == 1 + len(PIPELINES), out
    assert started and started[0][1:2] == ["dev"] and "3999" in started[0]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "example.org"])
def test_the_ui_beyond_loopback_needs_an_explicit_flag(host: str, capsys) -> None:
    """``python -m jobs.ui --host <not loopback>`` refuses to start (nothing is started),
    naming the flag and what to put in front; ``--allow-remote`` lets it through."""
    from jobs.ui import host_refusal, main

    assert main(["--host", host]) == 2
    said = capsys.readouterr().err
    assert "--allow-remote" in said and "reverse proxy" in said, said
    assert host_refusal(host, allow_remote=True) is None


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1"])
def test_loopback_hosts_need_no_flag(host: str) -> None:
    from jobs.ui import host_refusal

    assert host_refusal(host, allow_remote=False) is None
