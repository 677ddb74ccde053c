"""Shared fixtures: one Spark session per test run, a temporary lake per test."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from lakecast.config import Settings, get_settings


@pytest.fixture(scope="session")
def spark():
    """The test run's single Spark session, from Lakecast's own factory."""
    from lakecast.spark import get_spark

    session = get_spark(app_name="lakecast-tests")
    yield session
    session.stop()


@pytest.fixture
def lake(tmp_path, monkeypatch) -> Iterator[Settings]:
    """Settings whose lake, checkpoints and Dagster home live in a fresh temp folder."""
    monkeypatch.setenv("LAKECAST_LAKE_ROOT", str(tmp_path / "lake"))
    monkeypatch.setenv("LAKECAST_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    settings = get_settings()
    settings.ensure_local_dirs()
    assert os.environ["LAKECAST_LAKE_ROOT"] == settings.lake_root
    yield settings
