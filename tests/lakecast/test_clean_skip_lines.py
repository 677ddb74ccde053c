"""Skips report themselves in one clean line (issue 43 item 3): restoring past garbled and
truncated checkpoint files prints no Java stack line and no Spark ERROR line on the
terminal; the full trace stays in the Spark log (``var/log/spark.log``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from lakecast.config import get_settings

ROOT = Path(__file__).resolve().parents[2]
JAVA_FRAME = re.compile(r"^\s+at [\w$.]+\(|^Caused by: |^\s*\.\.\. \d+ more")
SPARK_ERROR = re.compile(r"^\d\d:\d\d:\d\d ERROR ")


def test_a_damaged_checkpoint_is_skipped_in_one_clean_line(lake):
    spark_log = get_settings().project_root / "var" / "log" / "spark.log"
    before = spark_log.stat().st_size if spark_log.exists() else 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "platform"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "tests.lakecast.damaged_restore"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout.split("=== restore", 1)[1]
    err = proc.stderr.split("=== restore", 1)[1]
    assert "RESTORED 0" in out
    skipped = [ln.removeprefix("SKIPPED ") for ln in out.splitlines()
               if ln.startswith("SKIPPED ")]
    assert [s.split(" ")[1] for s in skipped] == ["2", "1"]
    for s in skipped:  # condition, file and cause; no Java class path, no trace
        assert re.fullmatch(r"checkpoint \d skipped: its files cannot be read \("
                            r"[A-Z_.]+ reading part-[\w.-]+\.parquet( \(\w+\))?\)", s), s
    terminal = (out + err).splitlines()
    assert [ln for ln in terminal if JAVA_FRAME.search(ln)] == []
    assert [ln for ln in terminal if SPARK_ERROR.search(ln)] == []
    assert [ln for ln in terminal if "org.apache" in ln] == []
    # each skip logged once, as one line (the Python warning on stderr)
    for s in skipped:
        assert sum(ln.endswith(s) for ln in err.splitlines()) == 1, (s, err[-3000:])
    # the full trace is in the Spark log
    log = spark_log.read_text(errors="replace")[before:]
    assert "ERROR Executor" in log and re.search(r"\n\s+at org\.apache\.", log)
