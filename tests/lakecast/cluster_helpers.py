"""Helpers of the cluster tests: free ports, the listening sockets of a set of processes,
and a slow enrichment function whose tasks say where and when they run (so a test can
kill a worker while they do)."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import time
from pathlib import Path

import pyarrow as pa

from jobs.storefront.enrichment import StorefrontEnrichment
from lakecast.api.functions import ReadOnlyContext


def free_port(span: int = 1) -> int:
    """A port ``p`` such that ``p .. p + span - 1`` are free on 127.0.0.1."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + span < 65000 and all(_free(base + i) for i in range(span)):
            return base
    raise RuntimeError(f"no {span} consecutive free ports on 127.0.0.1")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def listening(pids: list[int]) -> list[tuple[str, str]]:
    """``(local address, ss line)`` of every TCP socket the processes listen on
    (``ss -ltnp``)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    wanted = {f"pid={p}," for p in pids}
    return [(line.split()[3], line) for line in out.splitlines()
            if any(w in line for w in wanted)]


def proc_listeners(pids: list[int]) -> list[tuple[str, int, int]]:
    """``(address, port, pid)`` of every TCP socket the processes listen on, read from the
    kernel: ``/proc/net/tcp{,6}`` (state 0A, LISTEN) joined with the socket inodes of
    each process's ``/proc/<pid>/fd``."""
    listen: dict[str, tuple[str, int]] = {}  # inode -> (address, port)
    for name, size in (("tcp", 4), ("tcp6", 16)):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":
                continue
            hex_addr, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_addr)
            # the kernel prints the address as 32-bit words in host (little-endian) order
            words = b"".join(raw[i:i + 4][::-1] for i in range(0, size, 4))
            listen[fields[9]] = (str(ipaddress.ip_address(words)), int(hex_port, 16))
    out = []
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            inode = target.removeprefix("socket:[").removesuffix("]")
            if target.startswith("socket:[") and inode in listen:
                out.append((*listen[inode], pid))
    return sorted(set(out))


def on_loopback(address: str) -> bool:
    """Whether an address from :func:`proc_listeners` is loopback (IPv4-mapped too)."""
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0]
    return host in ("127.0.0.1", "[::ffff:127.0.0.1]", "[::1]")


class SlowEnrichment(StorefrontEnrichment):
    """The storefront enrichment, ``delay`` seconds slower per Arrow batch; each batch
    first writes a marker ``<partition>-<attempt>-<pid>`` holding the worker's working
    directory (which names the Spark worker and executor) into ``markers``."""

    def __init__(self, markers: str, delay: float) -> None:
        super().__init__()
        self.markers = markers
        self.delay = delay

    def transform(self, batch: pa.RecordBatch, ctx: ReadOnlyContext) -> pa.RecordBatch:
        from pyspark import TaskContext

        tc = TaskContext.get()
        name = f"{tc.partitionId()}-{tc.attemptNumber()}-{os.getpid()}" if tc else "driver"
        Path(self.markers, name).write_text(os.getcwd())
        time.sleep(self.delay)
        return super().transform(batch, ctx)


def markers(folder: str) -> dict[str, str]:
    """Marker name -> the working directory of the task's Python worker."""
    p = Path(folder)
    return {f.name: f.read_text() for f in p.iterdir()} if p.is_dir() else {}


def executors_of(spark, tasks: int = 6) -> set[str]:
    """The executors that run a job of ``tasks`` short tasks (those the driver has)."""

    def probe(batches):
        from lakecast.runtime.tasks import executor_id

        time.sleep(0.5)
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pylist([{"executor": executor_id()}])

    rows = spark.range(0, tasks, 1, tasks).mapInArrow(probe, "executor string").collect()
    return {r.executor for r in rows}
