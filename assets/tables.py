"""The one list of Lakecast's batch-layer Delta table names.

Paths always come from ``settings.table_path(<name>)`` (see :mod:`lakecast.config`).
"""

from __future__ import annotations

from typing import Final

RAW_USERS: Final = "raw_users"
RAW_PRODUCTS: Final = "raw_products"
EVENTS: Final = "events"
DIM_USERS: Final = "dim_users"
DIM_PRODUCTS: Final = "dim_products"
USER_FEATURES: Final = "user_features"
USER_SEGMENTS: Final = "user_segments"
QUARANTINE: Final = "quarantine"

RAW_TABLES: Final = (RAW_USERS, RAW_PRODUCTS, EVENTS)
ALL_TABLES: Final = (*RAW_TABLES, DIM_USERS, DIM_PRODUCTS, USER_FEATURES, USER_SEGMENTS,
                         QUARANTINE)
