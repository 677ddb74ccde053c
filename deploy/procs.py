"""Processes and ports of the production stack, read from ``/proc`` (Linux)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from pathlib import Path

HOST = "127.0.0.1"


class StackError(RuntimeError):
    """A step of the stack failed; the message names it and the fix."""


def pid_file(path: Path) -> int | None:
    """The pid on the first line of ``path`` (None: no file, or not a pid)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _stat(pid: int | str) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (state, ppid, pgrp, ...)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie does not)."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def group(pgid: int) -> list[int]:
    """Live processes of process group ``pgid``."""
    out = []
    for entry in Path("/proc").iterdir():
        fields = _stat(entry.name) if entry.name.isdigit() else None
        if fields and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(entry.name))
    return out


def descendants(roots: set[int]) -> set[int]:
    """``roots`` and every live process below them."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        fields = _stat(entry.name) if entry.name.isdigit() else None
        if fields and fields[0] not in ("Z", "X"):
            parent[int(entry.name)] = int(fields[1])
    found = {p for p in roots if p in parent}
    grew = True
    while grew:
        more = {p for p, pp in parent.items() if pp in found} - found
        found |= more
        grew = bool(more)
    return found


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to process group ``pgid``, if it still exists."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def require_free(port: int, what: str, variable: str) -> None:
    """Raise :class:`StackError` naming ``what`` and ``variable`` if ``port`` is taken."""
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError as e:
            raise StackError(f"{what}: port {port} on {HOST} is in use ({e.strerror}): stop "
                             f"what holds it (ss -ltnp) or choose another with {variable}") from e


def require_traversable(folder: Path, user: str) -> None:
    """``user`` (not the owner) must be able to pass through ``folder`` and its parents."""
    for f in (folder, *folder.parents):
        if not f.stat().st_mode & 0o001:
            raise StackError(f"{f} is not searchable by the {user!r} OS user that runs "
                             f"PostgreSQL: chmod o+x {f}, or choose another --root")
