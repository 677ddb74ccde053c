"""``python -m jobs.ui [--port 3000]``: ``dagster dev`` as ``make ui`` runs it, quiet.

An operator leaves it running for hours, so its terminal shows what needs them — warnings
and errors — and says once which pipelines it runs (:func:`pipeline_lines`: a line per
sensor-triggered micro-batch job) and where the UI is; everything else is in the UI:

- the daemon and the webserver log at ``warning`` (``--log-level``): no lines per sensor
  tick, per queued run or per monitoring pass;
- the runs of Lakecast's jobs print only warnings and errors to the terminal
  (:data:`dagster_lakecast.runs.QUIET_RUN_LOGS`); every event and log line is still on the run's
  page;
- Dagster's nudge to use ``dg dev`` instead (a ``SupersessionWarning`` of ``dagster dev``
  itself) is filtered by its message, nothing else.

The process becomes ``dagster dev`` (exec: Ctrl-C and signals work as they do for it); a
forked child prints the ready line. The sensor benchmarks start it the same way
(``benchmarks.freshness.start_consumer``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

#: this example project's folder (its workspace.yaml)
PROJECT_ROOT = Path(__file__).resolve().parents[1]


if TYPE_CHECKING:
    from dagster import Definitions

LOG_LEVEL = "warning"
#: the one warning filtered (Python's -W syntax: action:message prefix:category)
DEV_SUPERSEDED = "ignore:Function `dev_command` is superseded:FutureWarning"
READY = "Dagster UI ready on"
SERVE_TIMEOUT_S = 300.0


def dev_command(port: int, host: str = "127.0.0.1") -> list[str]:
    """``dagster dev`` for ``workspace.yaml`` on ``host:port``, warnings and errors only."""
    dagster = Path(sys.executable).parent / "dagster"
    return [str(dagster), "dev", "-h", host, "-p", str(port), "--log-level", LOG_LEVEL,
            "-w", str(PROJECT_ROOT / "workspace.yaml")]


def dev_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with :data:`DEV_SUPERSEDED` added to ``PYTHONWARNINGS``."""
    filters = [f for f in env.get("PYTHONWARNINGS", "").split(",") if f]
    return {**env, "PYTHONWARNINGS": ",".join([*filters, DEV_SUPERSEDED])}


def pipeline_lines(defs: Definitions | None = None) -> list[str]:
    """A line per pipeline of ``defs`` (default: ``jobs.definitions``'s, what the workspace
    loads): each sensor's job, the sensor, the tables the job writes and the tables they
    are computed from."""
    from dagster import DefaultSensorStatus

    if defs is None:
        from jobs.definitions import defs
    graph = defs.resolve_asset_graph()
    lines = []
    for sensor in sorted(defs.sensors or (), key=lambda s: s.name):
        for job_name in sorted(t.job_name for t in sensor.targets):
            keys = defs.resolve_job_def(job_name).asset_layer.selected_asset_keys
            parents = {p for k in keys for p in graph.get(k).parent_keys} - set(keys)
            outputs = ", ".join(sorted(k.to_user_string() for k in keys))
            inputs = ", ".join(sorted(k.to_user_string() for k in parents))
            state = "on" if sensor.default_status == DefaultSensorStatus.RUNNING else "off"
            lines.append(f"  {job_name} (sensor {sensor.name}, {state} by default): writes "
                         f"{outputs}; reads {inputs}")
    return sorted(lines)


def serving(url: str) -> bool:
    """The webserver at ``url`` answers."""
    try:
        with urllib.request.urlopen(f"{url}/server_info", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def announce_when_serving(url: str, timeout: float = SERVE_TIMEOUT_S) -> None:
    """Print the one line that says where the UI is, once it answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if serving(url):
            # (no "warn" in it: the log-noise benchmark lists every line that says so)
            print(f"{READY} {url} (dagster dev; this terminal prints only what needs "
                  "attention, each run's full log is on its page)", flush=True)
            return
        time.sleep(0.5)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names a loopback address (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host.lower() in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_refusal(host: str, allow_remote: bool) -> str | None:
    """Why the UI must not listen on ``host`` (``None``: it may): beyond loopback only
    with ``--allow-remote``."""
    if is_loopback(host) or allow_remote:
        return None
    return (f"--host {host} would serve the Dagster UI beyond this machine, and it has no "
            "authentication of its own (anyone who reaches it can launch runs): keep the "
            "default 127.0.0.1, or put an authenticating reverse proxy in front of it and "
            "add --allow-remote (deploy/README.md)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.ui", description=__doc__)
    parser.add_argument("-p", "--port", type=int, default=3000)
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to listen on (default: loopback only)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="listen on a non-loopback --host: the Dagster UI has no "
                        "authentication of its own, so put an authenticating reverse proxy "
                        "in front of it (deploy/README.md)")
    args = parser.parse_args(argv)
    refusal = host_refusal(args.host, args.allow_remote)
    if refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    cmd = dev_command(args.port, args.host)
    print("Lakecast pipelines (job, its sensor, the tables it writes and reads):")
    print("\n".join(pipeline_lines()))
    sys.stdout.flush()
    if os.fork() == 0:  # a small child announces the URL; this process becomes dagster dev
        announce_when_serving(f"http://{args.host}:{args.port}")
        os._exit(0)
    os.chdir(PROJECT_ROOT)
    os.execve(cmd[0], cmd, dev_env(os.environ))
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
