"""The example project's Dagster instance: ``DAGSTER_HOME`` with the project's
``deploy/dagster/dagster.yaml`` (run queue, tag concurrency limits of the
``lakecast/exclusive`` tag)."""

import shutil
from pathlib import Path

from lakecast.config import Settings

#: the instance template of this project
TEMPLATE = Path(__file__).resolve().parents[1] / "deploy" / "dagster" / "dagster.yaml"


def ensure_instance(settings: Settings) -> Path:
    """Create the lake, checkpoint and Dagster folders, and ``dagster.yaml`` in the Dagster
    home from :data:`TEMPLATE` when it has none; returns the Dagster home."""
    settings.ensure_local_dirs()
    home = Path(settings.dagster_home)
    if not (home / "dagster.yaml").exists():
        shutil.copyfile(TEMPLATE, home / "dagster.yaml")
    return home
