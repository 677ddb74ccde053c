"""Lakecast's Dagster batch assets: raw data, dimensions, user features and segments."""

from __future__ import annotations

from assets.checks import BATCH_CHECKS
from assets.dimensions import dim_products, dim_users
from assets.features import DAILY_PARTITIONS, user_features
from assets.raw import raw_tables
from assets.segments import user_segments

BATCH_ASSETS = [raw_tables, dim_users, dim_products, user_features, user_segments]

__all__ = ["BATCH_ASSETS", "BATCH_CHECKS", "DAILY_PARTITIONS", "user_features", "user_segments"]
