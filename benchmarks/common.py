"""What the benchmarks share: a Dagster home with the embedded instance's config, and
where results go (``benchmarks/results/NAME.json``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

#: the repository root (this example project's folder)
PROJECT_ROOT = Path(__file__).resolve().parents[1]


RESULTS = PROJECT_ROOT / "benchmarks" / "results"


def dagster_home(root: Path, *, clean: bool = True) -> Path:
    """``root/dagster_home`` holding ``deploy/dagster/dagster.yaml`` (``root`` emptied
    first unless ``clean`` is False)."""
    if clean:
        shutil.rmtree(root, ignore_errors=True)
    home = root / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROJECT_ROOT / "deploy" / "dagster" / "dagster.yaml", home / "dagster.yaml")
    return home


def save_result(name: str, result: dict[str, Any]) -> Path:
    """Write ``result`` as ``benchmarks/results/<name>.json``; its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    return path


#: Dagster's sensor daemon looks at its sensors once per loop of at least this many seconds
#: (``MIN_INTERVAL_LOOP_TIME`` in ``dagster._daemon.sensor``), whatever the sensor's interval
SENSOR_LOOP_S = 5.0


def phase_offsets(commits: int, period: float = SENSOR_LOOP_S, seed: int = 0) -> list[float]:
    """Seconds to add to each of ``commits`` evenly spaced commits so that their phases
    against a consumer that looks every ``period`` s cover the period evenly (one commit
    per ``period / commits`` slice, the slices in a fixed shuffled order).

    Commits every 20 s against a 5 s loop otherwise all land at one phase of it, the same
    in every commit of a run: each run then measures one point of the wait for the next
    look (0 to 5 s) instead of its distribution, which a user's commits, coming at any
    time, meet."""
    import random

    slices = list(range(commits))
    random.Random(seed).shuffle(slices)
    return [round(period * k / max(1, commits), 3) for k in slices]
