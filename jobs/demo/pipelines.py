"""``make demo``'s tour of the pipelines declared through the factory (after the storefront
pipeline): each runs its job twice, its broadcast table changed in between, and the demo
prints what each broadcast version produced, from the runs' Dagster metadata.

* fraud rules (:mod:`jobs.fraud.defs`): the demo rules and 200 transactions, a run of
  ``fraud_microbatch``; then the BLOCK rule ``card_test`` disabled (a new ``fraud_rules``
  version), 200 more transactions, a second run: no BLOCK alert from that version on.
* model scoring (:mod:`jobs.scoring.pipeline`): ``models`` trained with Spark MLlib (v0: each
  segment's challenger on 20% of its users), scoring events of the lake's users
  (:mod:`jobs.scoring.producer`), a run of ``scoring_microbatch``; then ``models``
  retrained with the challengers on half the users (v1), more events, a second run: each
  run's predictions per models version and role.
"""

from __future__ import annotations

from dagster import DagsterInstance, ExecuteInProcessResult, materialize

from dagster_lakecast import (
    QUIET_RUN_LOGS,
    LakecastSparkResource,
    LakeResource,
    PipelineDeclaration,
)
from jobs.demo.live import remove_tables
from jobs.fraud.defs import FRAUD, FRAUD_PIPELINE, FRAUD_RULES
from jobs.fraud.tables import fraud_rules, transactions
from jobs.scoring.pipeline import (
    CHALLENGER,
    CHAMPION,
    MODELS,
    PREDICTIONS,
    SCORING_PIPELINE,
)
from jobs.scoring.producer import append_scoring_events
from jobs.scoring.training import models
from lakecast.config import Settings

__all__ = ["CHALLENGER_SHARES", "DISABLED_RULE", "fraud_tour", "reset_pipeline", "scoring_tour"]

#: the demo rule the second fraud_rules version disables (the demo's one BLOCK rule)
DISABLED_RULE = "card_test"
#: each segment's share of users scored by its challenger, in the two trainings of ``models``
CHALLENGER_SHARES = (0.2, 0.5)


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
    job = defs.resolve_job_def(FRAUD_PIPELINE.handle.job_name)
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


def _by_version_and_role(by_model: dict[str, int]) -> str:
    """``{"v0/VIP:champion": 12, ...}`` (the predictions metadata) as ``v0: 12 champion,
    3 challenger``, one part per models version."""
    counts: dict[str, dict[str, int]] = {}
    for key, n in by_model.items():
        version, model_id = key.split("/", 1)
        role = model_id.rsplit(":", 1)[-1]
        counts.setdefault(version, {}).setdefault(role, 0)
        counts[version][role] += n
    return "; ".join(
        f"{v}: {roles.get(CHAMPION, 0)} {CHAMPION}, {roles.get(CHALLENGER, 0)} {CHALLENGER}"
        for v, roles in sorted(counts.items(), key=lambda kv: int(kv[0][1:]))
    )


def scoring_tour(instance: DagsterInstance, events_per_run: int = 300, max_iter: int = 10
                 ) -> list[str]:
    """Two trainings of ``models`` (:data:`CHALLENGER_SHARES`), ``events_per_run`` scoring
    events and a run of ``scoring_microbatch`` after each; a line per batch. Needs
    ``user_features`` and ``user_segments`` in the lake."""
    from jobs.definitions import defs
    from lakecast.spark import get_spark

    resources = {"pyspark": LakecastSparkResource(), "lake": LakeResource()}
    settings = resources["lake"].settings()
    job = defs.resolve_job_def(SCORING_PIPELINE.handle.job_name)
    lines = []
    for share in CHALLENGER_SHARES:
        config = {"challenger_share": share, "max_iter": max_iter}
        trained = materialize([models], instance=instance, resources=resources,
                              run_config={**QUIET_RUN_LOGS, "ops": {MODELS: {"config": config}}})
        meta = next(m.materialization.metadata for m in trained.get_asset_materialization_events()
                    if m.asset_key.to_user_string() == MODELS)  # fmt: skip
        append_scoring_events(get_spark(settings=settings), settings, events_per_run)
        run = job.execute_in_process(instance=instance)
        for b in _batches(run, PREDICTIONS):
            lines.append(
                f"{MODELS} v{meta['delta_version'].value} ({len(meta['models'].value)} models, "
                f"challengers on {share:.0%} of users): {b['events']} events -> "
                f"{b['outputs']} predictions ({_by_version_and_role(b['predictions_by_model'])}), "
                f"{b['side_outputs']} unmatched (no model), {b['rejected']} rejected "
                f"(batch {b['batch_id']}, {b['batch_seconds']:.1f}s)"
            )
    return lines
