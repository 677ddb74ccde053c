"""A sharded enrichment pipeline killed -9 mid-batch and rescaled 2 -> 3 -> 1 shards:
every event exactly once, each enriched with the dimension's version its batch planned
(a pandas reference from the pinned Delta versions, :mod:`tests.lakecast.sharded_job`),
and a version with a duplicate key refused whole."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pandas as pd
from pyspark.sql import functions as F

from lakecast.delta import io as delta_io
from lakecast.pipeline.progress import progress_path, read_log
from tests import ROOT as PROJECT_ROOT
from tests.lakecast import sharded_job as sj
from tests.runs import remote_env


def _job(root: str, shards: int, remote: str, crash_at: str | None = None
         ) -> tuple[int, str]:
    env = remote_env(remote, **({"LAKECAST_CRASH_AT": crash_at} if crash_at else {}))
    proc = subprocess.run([sys.executable, "-m", "tests.lakecast.sharded_job", root,
                           str(shards)], cwd=PROJECT_ROOT, env=env, capture_output=True,
                          text=True, timeout=600, start_new_session=True)
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(proc.stdout + proc.stderr)
    return proc.returncode, proc.stdout


def _events(spark, path: str, batch: int, n: int = 300) -> None:
    ids = spark.range(batch * 1000, batch * 1000 + n)
    delta_io.write(ids.select(F.col("id").alias("event_id"),
                              (F.col("id") * 7 % 2100).alias("user_id")), path, mode="append")


def _dim(spark, path: str, ids, segment: str, mode: str = "merge") -> None:
    frame = spark.createDataFrame(pd.DataFrame({"user_id": ids, "segment": segment,
                                                "ltv": [float(i) for i in ids]}))
    if mode == "overwrite":
        delta_io.write(frame, path, mode="overwrite")
    else:
        delta_io.merge_upsert(spark, frame, path, keys=["user_id"])


def test_a_sharded_pipeline_killed_and_rescaled_2_3_1_is_exactly_once(spark, tmp_path,
                                                                       server_url):
    root = str(tmp_path / "lake")
    paths = sj.table_paths(root)
    _dim(spark, paths["dim"], list(range(2000)), "REGULAR", mode="overwrite")
    for b in range(4):  # one events version per batch
        _events(spark, paths["events"], b)
    # 2 shards: batch 0 commits (and its checkpoint), batch 1 dies after its outputs
    assert _job(root, 2, server_url, "outputs_written:1")[0] == -signal.SIGKILL
    _dim(spark, paths["dim"], [7, 14, 2050], "VIP")  # updates and an added key
    # 3 shards (restored from the checkpoint of batch 0): the redo of batch 1 at its
    # planned version commits, batch 2 at the new version dies after its main output
    rc, out = _job(root, 3, server_url, "main_written:2")
    assert rc == -signal.SIGKILL
    # each of the 3 tasks read one shard; the batch's 300 events were routed to them
    assert "batch 1: shards_per_task 1 rows_routed 300 parallelism 3" in out, out
    delta_io.delete(spark, paths["dim"], "user_id IN (21, 28)")
    # a version that breaks the key's contract (a second row of user 7): refused whole,
    # so no task of any shard sees it
    delta_io.write(spark.createDataFrame(pd.DataFrame(
        {"user_id": [7], "segment": ["DUP"], "ltv": [0.0]})), paths["dim"], mode="append")
    # 1 shard: the redo of batch 2, then batch 3 at the newest good version
    assert _job(root, 1, server_url)[0] == 0

    plans, commits = read_log(progress_path(paths["_progress"], "sharded"))
    assert sorted(commits) == [0, 1, 2, 3]
    committed = {p.batch_id: p for p in plans if not p.is_restore}
    assert [committed[b].broadcast_versions["dim"] for b in range(4)] == [0, 0, 1, 2]
    assert [r["version"] for r in committed[3].refused] == [3]
    want = sj.reference(root, [committed[b] for b in range(4)])
    got = delta_io.read(spark, paths["enriched"]).toPandas()
    assert got.event_id.is_unique and len(got) == 4 * 300
    got["v"] = got["_state_version"].map(lambda x: json.dumps(json.loads(x), sort_keys=True))
    cols = ["event_id", "user_id", "segment", "ltv", "v"]
    pd.testing.assert_frame_equal(
        got[cols].sort_values("event_id").reset_index(drop=True),
        want[cols].sort_values("event_id").reset_index(drop=True), check_dtype=False)
