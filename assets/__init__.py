"""Lakecast's Dagster batch assets: raw data, dimensions, user features and segments.

The Dagster definitions are imported on first use (PEP 562): a module that only needs a
table's name (``assets.tables``) or a transform, such as a pipeline's function unpickled
in a Spark Python worker, does not import Dagster with them."""

from __future__ import annotations

from importlib import import_module
from typing import Any

#: public name -> the module that defines it
_LAZY = {"BATCH_CHECKS": "assets.checks", "DAILY_PARTITIONS": "assets.features",
         "user_features": "assets.features", "user_segments": "assets.segments"}

__all__ = ["BATCH_ASSETS", "BATCH_CHECKS", "DAILY_PARTITIONS", "user_features", "user_segments"]


def __getattr__(name: str) -> Any:
    if name == "BATCH_ASSETS":
        from assets.dimensions import dim_products, dim_users
        from assets.features import user_features
        from assets.raw import raw_tables
        from assets.segments import user_segments

        value: Any = [raw_tables, dim_users, dim_products, user_features, user_segments]
    elif name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module 'assets' has no attribute {name!r}")
    globals()[name] = value  # once
    return value
