"""Lakecast's test suite."""

from pathlib import Path

#: the repository (the example project) root
ROOT = Path(__file__).resolve().parents[1]
