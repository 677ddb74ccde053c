"""Pre-registered benchmark targets (issue 40 item 1).

Each benchmark declares, before it runs, one :class:`Measure` per figure it is judged
on: the target, the side it is compared with, and the :class:`Rule` (repeats, statistic,
order, whether the first run counts). A run calls :meth:`Benchmark.start` first (load
average before start) and :meth:`Benchmark.report` with its result dict last: each
measure's value and side values are taken from that dict, a PASS/FAIL line is printed
per measure, and the dict is written to ``benchmarks/results/<name>.json`` with a
``verdicts`` block (measure, value, target, verdict, side values, rule) and a ``run``
block (machine cores, load average before start, git commit, date, command).

Every run, passing or not, is also appended to ``<name>.history.jsonl`` beside the result
(:func:`history_line`); :mod:`benchmarks.official` forms the official figures from it:
the median of at least three separate runs at one commit on a quiet machine, with their
spread.

A target changes only with a sentence saying why: the change and its reason go into the
measure's (or the benchmark's) ``history``, which the docs' benchmarks page shows beside
the target.
"""

from __future__ import annotations

import json
import operator
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
_OPS: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, ">=": operator.ge,
                                                   "<": operator.lt, ">": operator.gt}
Result = Mapping[str, Any]
_STARTS: dict[str, Start] = {}  # benchmark name -> its run's start (see Benchmark.start)


@dataclass(frozen=True)
class Rule:
    """How a measure's value is formed from its samples."""

    repeats: int = 1  # timed samples of each side
    statistic: str = "median"  # median | p50 | p99 | max | total | single
    order: str = "fixed"  # fixed | rotated | alternating: the sides' order across repeats
    first_run_counts: bool = True  # False: a warm-up run before the samples is dropped
    note: str = ""  # anything else the rule says (e.g. "query started before timing")


@dataclass(frozen=True)
class Measure:
    """One pre-registered figure: ``value`` (from the result dict) ``op`` ``target``."""

    name: str
    target: float
    op: str  # "<=", ">=", "<", ">"
    unit: str  # "x" (a ratio), "s", "ms", "events/s", "bool"
    compared_with: str  # the side the value is compared with (or what it is)
    rule: Rule = field(default_factory=Rule)
    #: the value in a result dict (``None``: not measured in this run); default: the key
    value: Callable[[Result], float | None] | None = None
    #: the side values behind the value (e.g. both medians of a ratio)
    sides: Callable[[Result], Mapping[str, Any]] | None = None
    #: why the target is what it is, one sentence per change, oldest first (e.g.
    #: ``"2030-01-02: 0.5 -> 0.33, because ..."``); shown with the target in the docs
    history: tuple[str, ...] = ()
    #: what the measurements behind a failing official figure show and what would meet
    #: the target, one sentence each (the figures stay in the results files); shown with
    #: the official figures in the docs while the figure fails
    findings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"{self.name}: op {self.op!r} is not one of {sorted(_OPS)}")
        for what in ("history", "findings"):
            if isinstance(getattr(self, what), str):
                raise TypeError(f"{self.name}: {what} is a tuple of sentences, not a string")

    def extract(self, result: Result) -> tuple[float | None, dict[str, Any]]:
        """``(value, side values)`` of this measure in ``result`` (``None``: absent)."""
        try:
            value = self.value(result) if self.value else result.get(self.name)
            sides = dict(self.sides(result)) if self.sides else {}
        except (KeyError, TypeError, IndexError, ZeroDivisionError):
            return None, {}
        if isinstance(value, bool):
            value = float(value)
        return (None if value is None else float(value)), sides

    def verdict(self, value: float | None) -> str:
        """``PASS``, ``FAIL``, or ``NOT RUN`` when this run did not measure it."""
        if value is None:
            return "NOT RUN"
        return "PASS" if _OPS[self.op](value, self.target) else "FAIL"


def git_commit(root: Path | None = None) -> str | None:
    """``HEAD`` of the checkout holding the benchmarks (``+dirty`` with local changes)."""
    cwd = root or Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                              text=True, check=True, timeout=10).stdout.strip()
        # the results a run writes do not make the next run's checkout dirty
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                ":(top)", ":(top,exclude)benchmarks/results"],
                               cwd=cwd, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty.strip() else "")


@dataclass(frozen=True)
class Start:
    """What :meth:`Benchmark.start` records before the run."""

    load_average: tuple[float, float, float]
    monotonic: float
    date: str
    #: (stolen, total) CPU time of the machine so far (``/proc/stat``; ``None`` elsewhere)
    cpu: tuple[int, int] | None = None
    #: the share of the machine's CPU busy (not idle, not stolen) in the second before the
    #: start: what other processes were doing (``None``: unknown)
    busy: float | None = None


#: a run counts as official only on a machine at most this busy in the second before it
#: started (2 cores: one core a fifth busy)
QUIET_BUSY = 0.1


def cpu_times() -> tuple[int, int] | None:
    """(stolen, total) CPU jiffies of this machine since boot, from ``/proc/stat``: time a
    virtual machine's host gave to others is time every side of a benchmark lost."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal (guest time is counted in user)
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def busy_fraction(seconds: float = 1.0) -> float | None:
    """The share of the machine's CPU time that was busy (not idle or iowait, not stolen)
    over the next ``seconds`` (``/proc/stat``; ``None`` elsewhere)."""
    def read() -> list[int] | None:
        try:
            with open("/proc/stat") as f:
                return [int(v) for v in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
    a = read()
    time.sleep(seconds)
    b = read()
    if a is None or b is None:
        return None
    d = [y - x for x, y in zip(a, b, strict=False)]
    total = sum(d)
    idle = d[3] + d[4] + (d[7] if len(d) > 7 else 0)
    return None if total <= 0 else round(1 - idle / total, 4)


def steal_fraction(start: tuple[int, int] | None, end: tuple[int, int] | None
                   ) -> float | None:
    """The share of the machine's CPU time its host took between ``start`` and ``end``."""
    if start is None or end is None or end[1] <= start[1]:
        return None
    return round((end[0] - start[0]) / (end[1] - start[1]), 4)


@dataclass(frozen=True)
class Benchmark:
    """A benchmark's pre-registered measures."""

    name: str
    command: str  # how to run it (``make bench`` runs this)
    measures: tuple[Measure, ...]
    #: why a run is not at the conditions the targets are set for (``None``: it is);
    #: such a run is reported, and never ``passed``
    conditions: Callable[[Result], str | None] | None = None
    #: changes of the benchmark's setup that move its targets, one sentence each, oldest
    #: first (a single measure's change goes into its :attr:`Measure.history`)
    history: tuple[str, ...] = ()

    def start(self) -> Start:
        """Call before anything runs: the load average then, and the start time (kept
        for :meth:`report` too)."""
        busy = busy_fraction()
        started = Start(os.getloadavg(), time.monotonic(), datetime.now(UTC).isoformat(),
                        cpu_times(), busy)
        _STARTS[self.name] = started
        return started

    def evaluate(self, result: Result) -> list[dict[str, Any]]:
        """One row per measure: measure, value, target, verdict, side values, rule."""
        rows = []
        for m in self.measures:
            value, sides = m.extract(result)
            rows.append({"measure": m.name, "value": value, "op": m.op, "target": m.target,
                         "unit": m.unit, "verdict": m.verdict(value),
                         "compared_with": m.compared_with, "sides": sides,
                         "rule": asdict(m.rule)})
        return rows

    def report(self, result: dict[str, Any], start: Start | None = None, *,
               name: str | None = None, results_dir: Path | None = None) -> dict[str, Any]:
        """Judge ``result`` against the measures, print PASS/FAIL lines, and write it with
        its ``verdicts`` and ``run`` blocks to ``<results_dir>/<name>.json``; returns it
        (``passed``: every measured measure passed and at least one was measured).
        ``start``: default, the one :meth:`start` recorded (else the load now)."""
        start = start or _STARTS.get(self.name) or self.start()
        rows = self.evaluate(result)
        measured = [r for r in rows if r["verdict"] != "NOT RUN"]
        off = self.conditions(result) if self.conditions else None
        result["verdicts"] = rows
        result["off_target_conditions"] = off
        result["passed"] = (off is None and bool(measured)
                            and all(r["verdict"] == "PASS" for r in measured))
        result["run"] = {
            "benchmark": self.name, "command": " ".join([self.command, *sys.argv[1:]]),
            "cores": os.cpu_count(), "load_average_before_start": list(start.load_average),
            "git_commit": git_commit(), "date": start.date,
            "wall_seconds": round(time.monotonic() - start.monotonic, 1),
            # CPU time the VM's host took during the run (every side lost it alike)
            "cpu_steal_fraction": steal_fraction(start.cpu, cpu_times()),
            "busy_before_start": start.busy}
        out_dir = results_dir or RESULTS
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"{name or self.name}.json"
        path.write_text(json.dumps(result, indent=2, default=str))
        with (out_dir / f"{name or self.name}.history.jsonl").open("a") as f:
            f.write(json.dumps(history_line(result), default=str) + "\n")
        steal = result["run"]["cpu_steal_fraction"]
        print(f"{self.name}: pre-registered targets "
              f"(load average before start {start.load_average[0]:.2f}, "
              f"{os.cpu_count()} cores"
              + ("" if steal is None else f", {steal:.1%} of the CPU time stolen by the host")
              + ")")
        for r in rows:
            value = "-" if r["value"] is None else f"{r['value']:.3f}"
            print(f"  {r['verdict']:7s} {r['measure']}: {value} {r['unit']} "
                  f"(target {r['op']} {r['target']}; vs {r['compared_with']})")
        if off:
            print(f"  (not at the targets' conditions: {off}; the verdicts do not count)")
        print(f"-> {path}")
        return result


def history_line(result: Result) -> dict[str, Any]:
    """What a run leaves in the history: when, where, how, and each measure's value and
    verdict (``counts``: whether it may form an official figure; ``why_not`` otherwise)."""
    run = result.get("run") or {}
    commit = run.get("git_commit")
    busy = run.get("busy_before_start")
    why_not = [w for w in (
        result.get("off_target_conditions"),
        None if commit and not commit.endswith("+dirty") else
        f"the checkout was not a clean commit ({commit})",
        None if busy is not None and busy <= QUIET_BUSY else
        f"the machine was {busy if busy is None else f'{busy:.0%}'} busy before the start "
        f"(a quiet machine: <= {QUIET_BUSY:.0%})") if w]
    return {"date": run.get("date"), "git_commit": commit, "command": run.get("command"),
            "wall_seconds": run.get("wall_seconds"), "busy_before_start": busy,
            "cpu_steal_fraction": run.get("cpu_steal_fraction"),
            "counts": not why_not, "why_not": why_not, "passed": result.get("passed"),
            "values": {v["measure"]: v["value"] for v in result.get("verdicts", [])},
            "verdicts": {v["measure"]: v["verdict"] for v in result.get("verdicts", [])}}


def ratio(num: str, den: str) -> Callable[[Result], float | None]:
    """A value: ``result[num] / result[den]`` (dotted paths into nested dicts)."""
    def value(result: Result) -> float | None:
        a, b = dig(result, num), dig(result, den)
        return None if a is None or b is None or not b else float(a) / float(b)
    return value


def key(path: str) -> Callable[[Result], Any]:
    """A value: ``result`` at the dotted ``path`` (``None`` if absent)."""
    return lambda result: dig(result, path)


def sides(**paths: str) -> Callable[[Result], dict[str, Any]]:
    """Side values: ``{label: result at dotted path}``."""
    return lambda result: {label: dig(result, p) for label, p in paths.items()}


def dig(result: Result, path: str) -> Any:
    """``result`` at the dotted ``path`` (``None`` where a step is missing)."""
    cur: Any = result
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur
