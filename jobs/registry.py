"""The project's pipelines by name, for the ``lakecast`` CLI (``lakecast replay``;
:mod:`lakecast.tools.registry` reads :data:`PIPELINES`). Only declarations and builders:
no Dagster definitions are made here (the enrichment function's ``assets.transforms``
still imports the ``assets`` package, whose ``__init__`` imports Dagster).

Each entry builds the engine pipeline over a lake's :class:`~lakecast.config.Settings`
as its Dagster job does: the storefront ``enrichment`` pipeline
(:func:`jobs.enrichment_pipeline.build_pipeline`), the keyed ``fraud`` pipeline
(:data:`jobs.fraud_pipeline.FRAUD`) and the model ``scoring`` pipeline
(:data:`jobs.scoring.SCORING`, imported when built: its module also declares its Dagster
definitions through the factory).
"""

from collections.abc import Callable, Mapping
from typing import Any

from jobs.enrichment_pipeline import ENRICHMENT, build_pipeline
from jobs.fraud_pipeline import FRAUD
from lakecast.config import Settings
from lakecast.pipeline.micro_batch import MicroBatchPipeline

__all__ = ["PIPELINES"]


def build_scoring(spark: Any, settings: Settings) -> MicroBatchPipeline:
    """The ``scoring`` pipeline (:data:`jobs.scoring.SCORING`)."""
    from jobs.scoring import SCORING

    return SCORING.build(spark, settings)


PIPELINES: Mapping[str, Callable[[Any, Settings], MicroBatchPipeline]] = {
    ENRICHMENT.name: build_pipeline,
    FRAUD.name: FRAUD.build,
    "scoring": build_scoring,
}
