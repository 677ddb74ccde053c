"""Processes started in sessions of their own (:mod:`lakecast.cluster`): whether one is
alive, which processes belong to a session, and stopping a session whole."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as dead; our own dead child is reaped)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def session_members(sids: set[int]) -> list[int]:
    """Live processes whose session id is in ``sids``."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) in sids and fields[0] not in ("Z", "X"):
            out.append(int(d.name))
    return sorted(out)


def stop_sessions(sids: set[int], timeout: float) -> None:
    """SIGTERM every process of the sessions, then SIGKILL what is left."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        for pid in session_members(sids):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                continue
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            for pid in sids:
                alive(pid)  # reaps our own children
            if not session_members(sids):
                return
            time.sleep(0.2)


def listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
