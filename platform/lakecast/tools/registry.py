"""Pipelines by name for the ``lakecast`` CLI, without importing Dagster.

The CLI imports a *pipelines module* — ``--pipelines MODULE``, else the environment's
``LAKECAST_PIPELINES``, else :data:`DEFAULT_MODULE` (the project's ``jobs.registry``) —
and reads its ``PIPELINES``: pipeline name -> ``factory(spark, settings)`` returning the
engine's :class:`~lakecast.pipeline.micro_batch.MicroBatchPipeline`. The module is
imported with the current directory on ``sys.path`` (as ``python -m`` does), so a
project's own module is found when ``lakecast`` runs from its root.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from lakecast.errors import LakecastError

if TYPE_CHECKING:
    from lakecast.config import Settings
    from lakecast.pipeline.micro_batch import MicroBatchPipeline

DEFAULT_MODULE = "jobs.registry"
ENV = "LAKECAST_PIPELINES"
PipelineFactory = Callable[[Any, "Settings"], "MicroBatchPipeline"]


class UnknownPipeline(LakecastError):
    """No pipelines module, or no pipeline of that name in it."""


def pipelines(module: str | None = None) -> tuple[str, Mapping[str, PipelineFactory]]:
    """The pipelines module's name and its ``PIPELINES`` mapping."""
    from lakecast.config import get_settings

    name = module or get_settings().pipelines_module or DEFAULT_MODULE
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found = getattr(importlib.import_module(name), "PIPELINES", None)
    except ImportError as e:
        raise UnknownPipeline(
            f"cannot import the pipelines module {name!r} ({e}); run lakecast from the "
            f"project root, or name a module that defines PIPELINES with --pipelines MODULE "
            f"(or {ENV})") from e
    if not isinstance(found, Mapping):
        raise UnknownPipeline(f"the pipelines module {name!r} has no PIPELINES mapping "
                              "(pipeline name -> factory(spark, settings))")
    return name, found


def find_pipeline(name: str, module: str | None = None) -> PipelineFactory:
    """The factory of pipeline ``name``; :class:`UnknownPipeline` lists the known ones."""
    where, found = pipelines(module)
    if name not in found:
        known = ", ".join(sorted(found)) or "none"
        raise UnknownPipeline(f"no pipeline {name!r} in {where} (known: {known}); give one "
                              f"of those, or --pipelines MODULE for another project's")
    return found[name]
