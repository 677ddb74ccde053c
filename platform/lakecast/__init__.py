"""Lakecast: Flink's broadcast-state pattern on Spark + Delta Lake.

The engine package is free of Dagster. Its parts:

- :mod:`lakecast.config`      one place for lake paths and settings (env overrides)
- :mod:`lakecast.spark`       the one Spark session factory (local Delta JARs)
- :mod:`lakecast.delta_io`    the one Delta I/O layer (write, MERGE, versions, CDF)
"""

__version__ = "0.1.0"
