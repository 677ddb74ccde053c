"""A pipeline's hooks (no Dagster import): code a project runs at fixed points of the
factory's definitions, kept apart from what the engine builds and from Dagster names
(:class:`~dagster_lakecast.declaration.PipelineDeclaration` holds one
:class:`PipelineHooks`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakecast.config import Settings
    from lakecast.pipeline.batch_result import BatchResult
    from lakecast.pipeline.micro_batch import MicroBatchPipeline
    from lakecast.pipeline.progress import BatchCommit, BatchPlan

__all__ = [
    "Builder", "MetadataHook", "PipelineHooks", "RecoveredHook", "RunMetadataHook",
    "SensorEventsHook",
]  # fmt: skip

#: ``hook(settings, result)`` -> extra metadata of one committed batch per output table
#: (``{table: {key: value}}``), added to that table's materialization
MetadataHook = Callable[["Settings", "BatchResult"], Mapping[str, Mapping[str, Any]]]
#: ``hook(settings, plan, commit)`` -> metadata per output table of a batch committed by a
#: run that died before recording it (recorded by the next run)
RecoveredHook = Callable[["Settings", "BatchPlan", "BatchCommit"],
                         Mapping[str, Mapping[str, Any]]]
#: ``hook(results)`` -> extra metadata of a run's last materializations (run totals)
RunMetadataHook = Callable[[list["BatchResult"]], Mapping[str, Any]]
#: ``builder(spark, settings, parallelism=, max_versions_per_batch=, **run_options)`` ->
#: the engine pipeline (``run_options``: the run config's fields beyond the factory's own)
Builder = Callable[..., "MicroBatchPipeline"]
#: ``hook(context, previous, versions, settings)`` -> asset events (e.g. observations) a
#: sensor tick records, run or not (``previous``: the cursor's versions, ``None`` if unusable)
SensorEventsHook = Callable[
    [Any, Mapping[str, int | None] | None, Mapping[str, int | None], "Settings"], list[Any]
]


@dataclass(frozen=True)
class PipelineHooks:
    """Optional code of a project's own, for pipelines with a history of their own (the
    example project's storefront enrichment).

    ``metadata`` adds entries to each batch's materializations; ``run_metadata`` to a
    run's last ones; ``recovered_metadata`` to those of batches committed but not recorded
    by a killed run (the next run records them); ``sensor_events``: asset events each
    sensor tick records (default: an observation of each input table whose Delta version
    moved); ``builder`` builds the engine pipeline instead of the declaration's default;
    ``run_config``: a subclass of :class:`~dagster_lakecast.execute.PipelineRunConfig`
    whose extra fields go to ``builder``."""

    metadata: MetadataHook | None = None
    run_metadata: RunMetadataHook | None = None
    recovered_metadata: RecoveredHook | None = None
    sensor_events: SensorEventsHook | None = None
    builder: Builder | None = None
    #: a subclass of ``dagster_lakecast.execute.PipelineRunConfig`` (a Dagster ``Config``)
    run_config: Any = None
