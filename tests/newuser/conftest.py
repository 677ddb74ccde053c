"""The new-user tests resolve with uv's own cache, as a user's uv does. PyPI publishes
PySpark as a source distribution; each resolution that revalidates it builds it again into
a new revision of uv's cache (about 800 MB each) and leaves the older revision dangling, so
repeated runs fill the disk. ``uv cache prune`` (before and after these tests) removes only
dangling entries: the newest build stays cached."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


def prune_uv_cache() -> None:
    """Remove the dangling entries of uv's cache; fail with uv's words if it cannot."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert uv, "uv is part of the dev dependencies"
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}  # the user's cache
    proc = subprocess.run([uv, "cache", "prune", "-q"], capture_output=True, text=True,
                          env=env, timeout=900)
    assert proc.returncode == 0, f"uv cache prune failed: {proc.stderr[-2000:]}"


@pytest.fixture(autouse=True, scope="package")
def bounded_uv_cache() -> Iterator[None]:
    """Prune uv's cache before the first new-user test and after the last."""
    prune_uv_cache()
    yield
    prune_uv_cache()
