"""kill -9 of the micro-batch job at points of a batch, then a rerun: every event exactly once."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time

import pandas as pd

from jobs.microbatch import ENRICHED_EVENTS, ENRICHMENT_REJECTED, ENRICHMENT_UNMATCHED
from lakecast.config import PROJECT_ROOT
from lakecast.delta import io as delta_io
from tests.jobs import microbatch_lake as ml


def _run(crash_at: str | None = None, kill_after: float | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "LAKECAST_CRASH_AT"}
    if crash_at:
        env["LAKECAST_CRASH_AT"] = crash_at
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobs.microbatch", "--max-versions-per-batch", "1"],
        cwd=PROJECT_ROOT, env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    if kill_after is not None:
        time.sleep(kill_after)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the job and its Spark JVM
    out, _ = proc.communicate(timeout=600)
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(out)
    with contextlib.suppress(ProcessLookupError):  # no lingering JVM of a killed job
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode


def test_kill_minus_9_at_several_points_then_rerun_is_exactly_once(spark, lake):
    ml.build(spark, lake)
    frames = [ml.events(i * 1000, 40, seed=10 + i) for i in range(3)]
    for f in frames:
        ml.write_events(spark, lake, f)  # events versions 0, 1, 2: one batch each

    kills = [
        _run("planned:0"),            # after the plan, before any output
        _run("main_written:0"),       # the redo of batch 0 dies between outputs
        _run("outputs_written:1"),    # batch 0 commits; batch 1 dies before its commit
        _run(kill_after=random.Random(7).uniform(4, 12)),  # a random point
    ]  # fmt: skip
    assert kills[:3] == [-signal.SIGKILL] * 3
    assert _run() == 0  # the rerun finishes the work

    everything = pd.concat(frames, ignore_index=True)
    want = ml.expected(everything, ml.segments_v1(), 10.0)
    got = {t: delta_io.read(spark, lake.table_path(t)).toPandas()
           for t in (ENRICHED_EVENTS, ENRICHMENT_UNMATCHED, ENRICHMENT_REJECTED)}  # fmt: skip
    assert got[ENRICHED_EVENTS].event_id.is_unique
    assert sorted(got[ENRICHED_EVENTS].event_id) == sorted(want["enriched"].event_id)
    assert sorted(got[ENRICHMENT_UNMATCHED].event_id) == sorted(want["unmatched"].event_id)
    assert len(got[ENRICHMENT_REJECTED]) == len(want["rejected"])
    assert sum(len(g) for g in got.values()) == len(everything)
