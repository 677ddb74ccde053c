"""Delta Lake: the one I/O layer and the broadcast source.

- :mod:`~lakecast.delta.io`      the facade callers import (``from lakecast.delta import io
  as delta_io``): writes (idempotent ``txn``), MERGE, time travel, Change Data Feed
- :mod:`~lakecast.delta.log`     the Delta log read without Spark, through ``deltalake``
  (versions, commit info, ``txn`` versions, the Change Data Feed)
- :mod:`~lakecast.delta.files`   a version's active files (``deltalake``), read with pyarrow
- :mod:`~lakecast.delta.source`  Delta versions -> ordered broadcast elements
- :mod:`~lakecast.delta.maintenance`  OPTIMIZE, VACUUM and log checkpoints with delta-rs
- :mod:`~lakecast.delta.validation`  VersionGate: broadcast versions checked against the
  function's table contracts before they touch task state
"""

from lakecast.delta.source import (
    CdfUnavailable,
    DeltaFilesElement,
    latest_versions,
    read_broadcast_elements,
)
from lakecast.delta.validation import RefusedVersion, VersionGate

__all__ = ["CdfUnavailable", "DeltaFilesElement", "RefusedVersion", "VersionGate",
           "latest_versions", "read_broadcast_elements"]
