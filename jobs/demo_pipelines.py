"""``make demo``'s tour of the pipelines declared through the factory (after the storefront
pipeline): each runs its job twice, its broadcast table changed in between, and the demo
prints what each broadcast version produced, from the runs' Dagster metadata.

* fraud rules (:mod:`jobs.fraud`): the demo rules and 200 transactions, a run of
  ``fraud_microbatch``; then the BLOCK rule ``card_test`` disabled (a new ``fraud_rules``
  version), 200 more transactions, a second run: no BLOCK alert from that version on.
"""

from __future__ import annotations

from dagster import DagsterInstance, ExecuteInProcessResult, materialize

from assets.resources import LakecastSparkResource, LakeResource
from jobs.declaration import PipelineDeclaration
from jobs.demo_live import remove_tables
from jobs.fraud import FRAUD, FRAUD_RULES
from jobs.fraud_tables import fraud_rules, transactions
from jobs.runs import QUIET_RUN_LOGS
from lakecast.config import Settings

__all__ = ["DISABLED_RULE", "fraud_tour", "reset_pipeline"]

#: the demo rule the second fraud_rules version disables (the demo's one BLOCK rule)
DISABLED_RULE = "card_test"


def reset_pipeline(settings: Settings, decl: PipelineDeclaration) -> list[str]:
    """Remove the pipeline's tables (inputs, outputs, keyed state) and its checkpoint
    folder (progress log, snapshots), so the tour starts from scratch."""
    tables = [decl.events_table, *decl.broadcast_tables, *(t for t, _ in decl.outputs)]
    if decl.state_table:
        tables.append(decl.state_table)
    return remove_tables(settings, tables, decl.name)


def _batches(result: ExecuteInProcessResult, table: str) -> list[dict]:
    """The per-batch metadata of ``table``'s materializations in ``result``."""
    return [
        {k: getattr(v, "value", v) for k, v in m.materialization.metadata.items()}
        for m in result.get_asset_materialization_events()
        if m.asset_key.to_user_string() == table
    ]


def fraud_tour(instance: DagsterInstance) -> list[str]:
    """Two rules versions, two runs of ``fraud_microbatch``; a line per batch."""
    from jobs.definitions import defs

    resources = {"pyspark": LakecastSparkResource(), "lake": LakeResource()}
    job = defs.resolve_job_def(FRAUD.job_name)
    lines = []
    for disabled in ([], [DISABLED_RULE]):
        inputs = materialize(
            [fraud_rules, transactions],
            instance=instance,
            resources=resources,
            run_config={**QUIET_RUN_LOGS,
                        "ops": {FRAUD_RULES: {"config": {"disabled": disabled}}}},
        )
        rules = next(
            m.materialization.metadata
            for m in inputs.get_asset_materialization_events()
            if m.asset_key.to_user_string() == FRAUD_RULES
        )
        run = job.execute_in_process(instance=instance)
        what = f"{DISABLED_RULE} disabled" if disabled else "all enabled"
        for b in _batches(run, FRAUD.output_table):
            lines.append(
                f"{FRAUD_RULES} v{rules['delta_version'].value} ({what}): "
                f"{b['events']} transactions -> {b['outputs']} BLOCK alerts, "
                f"{b['side_outputs']} REVIEW alerts, {b['rejected']} rejected "
                f"(batch {b['batch_id']}, {b['batch_seconds']:.1f}s)"
            )
    return lines
