"""Environments for jobs that tests run in subprocesses."""

from __future__ import annotations

import os


def remote_env(url: str | None, **extra: str) -> dict[str, str]:
    """This process's environment for a subprocess, attached to the Spark server at ``url``
    (``None``: Spark in the subprocess), without an inherited ``LAKECAST_CRASH_AT``."""
    env = {k: v for k, v in os.environ.items() if k != "LAKECAST_CRASH_AT"}
    if url:
        env["LAKECAST_SPARK_REMOTE"] = url
    env.update(extra)
    return env
