"""A project's pipelines and commands for the ``lakecast`` CLI, without importing Dagster.

The CLI imports the project's *pipelines module*: ``--pipelines MODULE``, else
``Settings.pipelines_module`` (``LAKECAST_PIPELINES``, else ``[tool.lakecast] pipelines``
in the project's ``pyproject.toml``, :mod:`lakecast.config`). The module defines:

- ``PIPELINES``: pipeline name -> ``factory(spark, settings)`` returning the engine's
  :class:`~lakecast.pipeline.micro_batch.MicroBatchPipeline` (``lakecast replay``);
- optionally ``COMMANDS``: ``add(subparsers)`` adding the project's own subcommands, each
  with ``set_defaults(fn=handler)`` (``handler(args) -> exit code``).

The module is imported with the project folder and the working directory on
``sys.path`` (as ``python -m`` does), so a project's own module is found.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from lakecast.config import get_settings
from lakecast.errors import LakecastError

if TYPE_CHECKING:
    from lakecast.config import Settings
    from lakecast.pipeline.micro_batch import MicroBatchPipeline

ENV = "LAKECAST_PIPELINES"
PipelineFactory = Callable[[Any, "Settings"], "MicroBatchPipeline"]


class UnknownPipeline(LakecastError):
    """No pipelines module, or no pipeline of that name in it."""


def module_name(module: str | None = None) -> str:
    """The pipelines module's name (see the module doc), or :class:`UnknownPipeline`."""
    name = module or get_settings().pipelines_module
    if not name:
        raise UnknownPipeline(
            "no pipelines module: set [tool.lakecast] pipelines = \"your_project.registry\" "
            f"in your project's pyproject.toml (or {ENV}=MODULE, or --pipelines MODULE); it "
            "defines PIPELINES (pipeline name -> factory(spark, settings))")
    return name


def load(module: str | None = None) -> ModuleType:
    """Import the project's pipelines module."""
    name = module_name(module)
    for folder in (os.getcwd(), str(get_settings().project_root)):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise UnknownPipeline(
            f"cannot import the pipelines module {name!r} ({e}); run lakecast from the "
            f"project root, or name a module that defines PIPELINES with --pipelines MODULE "
            f"(or {ENV})") from e


def pipelines(module: str | None = None) -> tuple[str, Mapping[str, PipelineFactory]]:
    """The pipelines module's name and its ``PIPELINES`` mapping."""
    loaded = load(module)
    found = getattr(loaded, "PIPELINES", None)
    if not isinstance(found, Mapping):
        raise UnknownPipeline(f"the pipelines module {loaded.__name__!r} has no PIPELINES "
                              "mapping (pipeline name -> factory(spark, settings))")
    return loaded.__name__, found


def find_pipeline(name: str, module: str | None = None) -> PipelineFactory:
    """The factory of pipeline ``name``; :class:`UnknownPipeline` lists the known ones."""
    where, found = pipelines(module)
    if name not in found:
        known = ", ".join(sorted(found)) or "none"
        raise UnknownPipeline(f"no pipeline {name!r} in {where} (known: {known}); give one "
                              f"of those, or --pipelines MODULE for another project's")
    return found[name]


def add_project_commands(sub: Any) -> None:
    """Add the project's ``COMMANDS`` to the ``lakecast`` subcommands (none without a
    configured pipelines module, or when it does not import: ``lakecast replay`` then
    reports why)."""
    try:
        loaded = load()
    except LakecastError:
        return
    add = getattr(loaded, "COMMANDS", None)
    if callable(add):
        add(sub)
