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
