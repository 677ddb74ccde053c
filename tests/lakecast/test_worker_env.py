"""The Spark JVMs Lakecast starts give their Python workers the project folder."""

from __future__ import annotations

import os
import subprocess
import sys

from lakecast.config import get_settings
from lakecast.spark_conf import python_env


def test_a_worker_outside_the_project_finds_it(tmp_path):
    """A Python worker runs in Spark's working directory, not the project's; with the
    environment the server gives it, the settings still resolve to the same project (a
    declaration module that builds a ``CheckpointPolicy()`` on import reads them)."""
    settings = get_settings()
    env = {k: v for k, v in os.environ.items() if k != "LAKECAST_HOME"}
    env.update(python_env(settings))
    code = "from lakecast.config import get_settings; print(get_settings().project_root)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(settings.project_root)
    without = {k: v for k, v in env.items() if k != "LAKECAST_HOME"}
    failed = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=without,
                            capture_output=True, text=True, timeout=120)
    assert failed.returncode != 0 and "LAKECAST_HOME" in failed.stderr
