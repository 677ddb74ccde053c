"""Fault injection for tests: kill the process with SIGKILL at a named point of a batch."""

from __future__ import annotations

import os
import signal

from lakecast.config import get_settings

CRASH_ENV = "LAKECAST_CRASH_AT"
"""Fault injection for tests: ``LAKECAST_CRASH_AT=<point>`` kills the process with
SIGKILL at that point of a batch (``planned``, ``read``, ``main_written``,
``outputs_written``, ``state_written``); ``<point>:<batch_id>`` limits it to one batch."""


def crash_point(point: str, batch_id: int) -> None:
    target = get_settings().crash_at
    if not target:
        return
    name, _, only = target.partition(":")
    if name == point and (not only or int(only) == batch_id):
        os.kill(os.getpid(), signal.SIGKILL)
