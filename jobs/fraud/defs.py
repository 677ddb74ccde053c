"""The fraud-rules pipeline (seeds 002 and 004), declared through the factory.

The function, its tables and the :class:`~dagster_lakecast.declaration.PipelineDeclaration`
:data:`FRAUD` live in :mod:`jobs.fraud.pipeline` (no Dagster, so the ``lakecast`` CLI
builds it through :mod:`jobs.registry`); this module turns the declaration into its
Dagster job, assets, sensor and checks (:func:`dagster_lakecast.factory.declare_pipeline`).
"""

from dagster_lakecast import declare_pipeline
from jobs.fraud.pipeline import (
    FRAUD,
    FRAUD_ALERTS,
    FRAUD_REJECTED,
    FRAUD_REVIEW,
    FRAUD_RULES,
    RULE_COLUMNS,
    RULES_CONTRACT,
    TRANSACTIONS,
    FraudRules,
    validate_transactions,
)

__all__ = [
    "FRAUD", "FRAUD_ALERTS", "FRAUD_PIPELINE", "FRAUD_REJECTED", "FRAUD_REVIEW", "FRAUD_RULES",
    "RULES_CONTRACT", "RULE_COLUMNS", "TRANSACTIONS", "FraudRules", "validate_transactions",
]  # fmt: skip

FRAUD_PIPELINE = declare_pipeline(FRAUD)
