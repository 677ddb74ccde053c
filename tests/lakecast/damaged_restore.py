"""Run as a script (its own Spark JVM, so the test sees everything it prints): three
checkpoints, the two newest damaged on disk (bytes garbled in the middle, a file cut in
half), then a restore. Prints ``RESTORED <id>`` and one ``SKIPPED <line>`` per skip."""

from __future__ import annotations

import sys
import uuid

from lakecast.config import get_settings
from lakecast.snapshots.checkpointer import snapshot_path
from lakecast.snapshots.runtime import SnapshottingRuntime
from lakecast.snapshots.store import SnapshotStore
from lakecast.spark import get_spark
from tests.jobs.test_snapshot_pipeline import _damage
from tests.lakecast.test_snapshots import RulesWithHistory, _events, _rules


def main() -> int:
    lake = get_settings()
    lake.ensure_local_dirs()
    spark = get_spark(app_name="lakecast-damaged-restore")
    path = lake.table_path("rules")
    _rules(spark, path, [(1, 0.1), (2, 0.2)])
    store = SnapshotStore(spark, snapshot_path(lake, "dmg"), "dmg")
    rt = SnapshottingRuntime(spark, RulesWithHistory(), {"rules": path}, store,
                             parallelism=2, function_id=f"dmg-{uuid.uuid4().hex[:6]}")
    rt.process(_events(spark, 2)).main.count()
    for cid in (0, 1, 2):
        rt.checkpoint(cid, batch_id=cid, events_start=cid - 1, events_end=cid)
    _damage(store.path, 2, "middle")
    _damage(store.path, 1, "truncate")
    print("=== restore", flush=True)
    print("=== restore", file=sys.stderr, flush=True)
    cold = SnapshottingRuntime(spark, RulesWithHistory(), {"rules": path}, store,
                               parallelism=2, function_id=f"dmg-{uuid.uuid4().hex[:6]}")
    cold.process(_events(spark, 2)).main.count()
    print(f"RESTORED {cold.restored.header.checkpoint_id if cold.restored else None}")
    for line in cold.restore_skipped:
        print(f"SKIPPED {line}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
