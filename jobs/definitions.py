"""The Dagster Definitions object ``defs`` that ``workspace.yaml`` loads."""

from __future__ import annotations

from dagster import Definitions

from assets.resources import LakecastSparkResource, LakeResource

defs = Definitions(
    assets=[],
    resources={
        "pyspark": LakecastSparkResource(),
        "lake": LakeResource(),
    },
)
