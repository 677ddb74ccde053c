"""Exactly-once micro-batches over Delta, independent of the runtime that processes them.

- :mod:`~lakecast.pipeline.contract`     the one runtime contract (BatchRuntime, BatchOutput)
- :mod:`~lakecast.pipeline.progress`     the plan/commit log (offsets and state versions)
- :mod:`~lakecast.pipeline.spec`         PipelineSpec: a pipeline's tables
- :mod:`~lakecast.pipeline.micro_batch`  MicroBatchPipeline: plan, read, validate, process,
  reconcile, write, commit
- :mod:`~lakecast.pipeline.batch_result` what a batch did (BatchResult) and its phases' times
- :mod:`~lakecast.pipeline.rewind`       roll a pipeline back to a committed batch
- :mod:`~lakecast.pipeline.dedup`        exactly once per key across batches (DedupSpec)
- :mod:`~lakecast.pipeline.held`         held events, re-offered until their state arrives
- :mod:`~lakecast.pipeline.events`       a batch's new events (append-only range)
"""

from lakecast.pipeline.batch_result import BatchResult
from lakecast.pipeline.contract import TASK_SIDE, BatchOutput, BatchRuntime
from lakecast.pipeline.dedup import DedupSpec
from lakecast.pipeline.micro_batch import MicroBatchPipeline, ReconciliationError
from lakecast.pipeline.progress import BatchCommit, BatchPlan, ProgressLog
from lakecast.pipeline.rewind import rewind
from lakecast.pipeline.spec import PipelineSpec

__all__ = [
    "TASK_SIDE", "BatchCommit", "BatchOutput", "BatchPlan", "BatchResult", "BatchRuntime",
    "DedupSpec",
    "MicroBatchPipeline", "PipelineSpec", "ProgressLog", "ReconciliationError", "rewind",
]
