"""Exactly-once micro-batches over Delta, independent of the runtime that processes them.

- :mod:`~lakecast.pipeline.contract`     the one runtime contract (BatchRuntime, BatchOutput)
- :mod:`~lakecast.pipeline.progress`     the plan/commit log (offsets and state versions)
- :mod:`~lakecast.pipeline.micro_batch`  MicroBatchPipeline: plan, read, validate, process,
  reconcile, write, commit
- :mod:`~lakecast.pipeline.rewind`       roll a pipeline back to a committed batch
"""

from lakecast.pipeline.contract import TASK_SIDE, BatchOutput, BatchRuntime
from lakecast.pipeline.micro_batch import (
    BatchResult,
    MicroBatchPipeline,
    PipelineSpec,
    ReconciliationError,
)
from lakecast.pipeline.progress import BatchCommit, BatchPlan, ProgressLog
from lakecast.pipeline.rewind import rewind

__all__ = [
    "TASK_SIDE", "BatchCommit", "BatchOutput", "BatchPlan", "BatchResult", "BatchRuntime",
    "MicroBatchPipeline", "PipelineSpec", "ProgressLog", "ReconciliationError", "rewind",
]
