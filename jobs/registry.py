"""The project's pipelines by name and its own commands, for the ``lakecast`` CLI
(``lakecast replay``; :mod:`lakecast.tools.registry` reads :data:`PIPELINES` and
:data:`COMMANDS`; ``[tool.lakecast] pipelines`` in ``pyproject.toml`` names this module). Only
declarations and builders:
no Dagster definitions are made here (the enrichment function's ``assets.transforms``
still imports the ``assets`` package, whose ``__init__`` imports Dagster).

Each entry builds the engine pipeline over a lake's :class:`~lakecast.config.Settings`
as its Dagster job does: the storefront ``enrichment`` pipeline
(:func:`jobs.storefront.pipeline.build_pipeline`), the keyed ``fraud`` pipeline
(:data:`jobs.fraud.pipeline.FRAUD`) and the model ``scoring`` pipeline
(:data:`jobs.scoring.pipeline.SCORING`, imported when built: its module also declares its Dagster
definitions through the factory).
"""

from collections.abc import Callable, Mapping
from typing import Any

from jobs.fraud.pipeline import FRAUD
from jobs.storefront.pipeline import ENRICHMENT, build_pipeline
from lakecast.config import Settings
from lakecast.pipeline.micro_batch import MicroBatchPipeline

__all__ = ["COMMANDS", "PIPELINES"]


def build_scoring(spark: Any, settings: Settings) -> MicroBatchPipeline:
    """The ``scoring`` pipeline (:data:`jobs.scoring.pipeline.SCORING`)."""
    from jobs.scoring.pipeline import SCORING

    return SCORING.build(spark, settings)


def COMMANDS(sub: Any) -> None:  # the name the lakecast CLI looks up
    """The storefront's ``lakecast produce`` and ``lakecast flag``."""
    from jobs.storefront.commands import add_commands

    add_commands(sub)


PIPELINES: Mapping[str, Callable[[Any, Settings], MicroBatchPipeline]] = {
    ENRICHMENT.name: build_pipeline,
    FRAUD.name: FRAUD.build,
    "scoring": build_scoring,
}
