"""Lakecast's Dagster integration: declare a broadcast-state (or keyed) pipeline over your
Delta tables and get its jobs, sensor, assets, checks and schedule.

Shaped like ``dagster_sling``: :func:`run_pipeline` runs a pipeline's batches from any
asset (the factory's, the Component's overridable ``execute``, or your own
``@multi_asset`` with :func:`output_specs`), :func:`declare_pipeline` turns a
:class:`PipelineDeclaration` (what the engine builds, with its :class:`DagsterNames` and
:class:`PipelineHooks`) into definitions through one resolved :class:`PipelineHandle`,
:class:`DagsterLakecastTranslator` maps each table to an ``AssetSpec``, and
:class:`LakecastPipelineComponent` declares the same from a ``defs.yaml`` (``dg scaffold
defs dagster_lakecast.LakecastPipelineComponent defs/NAME``).
Nothing else is public; the engine is :mod:`lakecast`.
"""

from dagster_lakecast.component import LakecastPipelineComponent
from dagster_lakecast.continuous import ContinuousConfig
from dagster_lakecast.declaration import CheckpointPolicy, PipelineDeclaration
from dagster_lakecast.execute import PipelineRunConfig, run_pipeline
from dagster_lakecast.factory import PipelineDefinitions, declare_pipeline, output_specs
from dagster_lakecast.handle import PipelineHandle
from dagster_lakecast.hooks import PipelineHooks
from dagster_lakecast.naming import DagsterNames
from dagster_lakecast.resources import LakecastSparkResource, LakeResource
from dagster_lakecast.tags import EXCLUSIVE_TAG, QUIET_RUN_LOGS, VERSIONS_TAG
from dagster_lakecast.translator import DagsterLakecastTranslator

__all__ = [
    "EXCLUSIVE_TAG",
    "QUIET_RUN_LOGS",
    "VERSIONS_TAG",
    "CheckpointPolicy",
    "ContinuousConfig",
    "DagsterLakecastTranslator",
    "DagsterNames",
    "LakeResource",
    "LakecastPipelineComponent",
    "LakecastSparkResource",
    "PipelineDeclaration",
    "PipelineDefinitions",
    "PipelineHandle",
    "PipelineHooks",
    "PipelineRunConfig",
    "declare_pipeline",
    "output_specs",
    "run_pipeline",
]
