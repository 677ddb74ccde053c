"""The broadcast state budget in the UI: per-batch metadata and the ``state_budget`` check.

Every task of a broadcast job holds its own copy of the state, so memory is state size x
parallelism (the seeds' rule: keep it under ~100 MB). For a pipeline declared with
``state_budget=True`` (the enrichment), each batch's materialization of the main output
(``enriched_events``) carries the figures (:func:`state_budget_metadata`); the
``state_budget`` asset check (:func:`state_budget_check`, added by the factory) reads the
newest batch that has them and WARNs (it never blocks) when it is over budget, with the
numbers and the fix. The engine itself warns once per process at most
(:func:`lakecast.runtime.metrics.check_budget`); a run of such a pipeline's job (one every
few seconds under the sensor) leaves it to the check (:func:`reported_by_check`).
"""

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetKey,
    MetadataValue,
    asset_check,
)

from lakecast.pipeline.micro_batch import BatchResult
from lakecast.runtime.metrics import (
    BUDGET_FIX,
    StateBudgetWarning,
    budget_message,
    format_bytes,
)

FIGURES = ("state_bytes_per_task", "parallelism", "state_budget_bytes")
#: materializations of the main output searched for a batch with the figures (a batch
#: recorded by a later run, ``recovered``, has none)
LOOK_BACK = 20


def state_budget_metadata(result: BatchResult) -> dict[str, Any]:
    """A batch's state total against its budget (nothing when the runtime has no budget)."""
    if not result.state_budget_bytes:
        return {}
    total = result.state_bytes_per_task * result.parallelism
    return {"state_bytes_total": total, "state_budget_bytes": result.state_budget_bytes,
            "state_over_budget": total > result.state_budget_bytes}


@contextlib.contextmanager
def reported_by_check() -> Iterator[None]:
    """No :class:`StateBudgetWarning` in the terminal: the batch metadata and the
    ``state_budget`` check report the budget in the UI."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=StateBudgetWarning)
        yield


def newest_figures(context: AssetCheckExecutionContext, asset: Any) -> dict[str, Any] | None:
    """The budget figures of the newest recorded batch of ``asset`` that has them."""
    key = asset if isinstance(asset, AssetKey) else AssetKey(asset)
    records = context.instance.fetch_materializations(key, limit=LOOK_BACK).records
    for record in records:
        mat = record.asset_materialization
        meta = mat.metadata if mat is not None else {}
        if all(k in meta for k in FIGURES):
            return {k: v.value for k, v in meta.items()
                    if k in (*FIGURES, "batch_id", "delta_version")}
    return None


def budget_result(figures: dict[str, Any] | None) -> AssetCheckResult:
    """The ``state_budget`` check's result for the newest batch's ``figures``."""
    if figures is None:
        return AssetCheckResult(passed=True, severity=AssetCheckSeverity.WARN,
                                description="no batch with state figures recorded yet")
    per_task, parallelism, budget = (int(figures[k]) for k in FIGURES)
    total = per_task * parallelism
    over = total > budget
    return AssetCheckResult(
        passed=not over,
        severity=AssetCheckSeverity.WARN,
        metadata={
            **figures,
            "state_bytes_total": total,
            "budget_used_pct": MetadataValue.float(round(100.0 * total / budget, 1)),
            "fix": BUDGET_FIX,
        },
        description=budget_message(per_task, parallelism, budget) if over else
        f"{format_bytes(total)} of {format_bytes(budget)} (state x parallelism)",
    )


def state_budget_check(asset: Any) -> AssetChecksDefinition:
    """The ``state_budget`` check on ``asset`` (a pipeline's main output)."""

    @asset_check(
        asset=asset,
        name="state_budget",
        description="The newest batch's broadcast state x parallelism is within the state "
        "budget (run config state_budget_bytes, default 100 MB); WARN when over, with the fix.",
    )
    def state_budget(context: AssetCheckExecutionContext) -> AssetCheckResult:
        """Compare the newest recorded batch's state x parallelism with its budget."""
        return budget_result(newest_figures(context, asset))

    return state_budget
