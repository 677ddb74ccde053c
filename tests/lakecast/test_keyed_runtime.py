"""Keyed broadcast processing on Spark: results vs an independent reference, rescaling,
restore after a kill, rewind to a checkpoint, TTL and schema evolution of Delta state."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from lakecast.api.keyed import KeyedBroadcastProcessFunction
from lakecast.api.keyed_state import StateSchemaError, StateTtlConfig, ValueStateDescriptor
from lakecast.delta import io as delta_io
from lakecast.pipeline.rewind import rewind
from lakecast.runtime.keyed import KeyedBroadcastRuntime
from lakecast.runtime.keyed_store import TAG
from lakecast.runtime.keyed_tasks import KeyedStateError
from tests import ROOT as PROJECT_ROOT
from tests.lakecast import keyed_job as kj
from tests.lakecast.test_keyed_state import (
    ProfileBadType,
    ProfileV1,
    ProfileV2,
    _profile_function,
)
from tests.runs import remote_env

THRESHOLDS = [50.0, 50.0, 80.0]  # the broadcast threshold changes before batch 2


def _run_batches(spark, root, parallelisms):
    """One runtime per batch (a new application each time: cold task-local state)."""
    paths = kj.table_paths(root)
    out = []
    for b, p in enumerate(parallelisms):
        if b == 0 or THRESHOLDS[b] != THRESHOLDS[b - 1]:
            kj.write_thresholds(spark, paths["thresholds"], THRESHOLDS[b],
                                mode="overwrite" if b == 0 else "append")
        rt = KeyedBroadcastRuntime(spark, kj.Sessions(), {"thresholds": paths["thresholds"]},
                                   paths["keyed_state"], timestamp_column="ts",
                                   order_columns=("event_id",), key_groups=32, parallelism=p)
        events = spark.createDataFrame(kj.events_for(b), kj.EVENTS_SCHEMA)
        result = rt.process(events, batch_id=b, processing_time=b).persist()
        out.extend(result.main.collect())
        tasks = result.task_rows()
        assert len(tasks) == p and sum(t["events_in"] for t in tasks) == len(kj.events_for(b))
        assert result.unmatched.count() == 0
        rt.commit(result)
        result.unpersist()
        rt.close()
    return kj.rows(out)


def test_keyed_results_equal_the_reference_at_any_parallelism_and_across_rescaling(
        spark, tmp_path):
    want = kj.reference((kj.events_for(b), THRESHOLDS[b]) for b in range(3))
    assert any(r[0] == "session_end" for r in want) and any(r[6] for r in want)
    constant = _run_batches(spark, str(tmp_path / "p2"), [2, 2, 2])
    assert constant == sorted(want, key=repr)
    rescaled = _run_batches(spark, str(tmp_path / "rescale"), [2, 4, 1])
    assert rescaled == constant


def _seed_events(spark, root, batches):
    paths = kj.table_paths(root)
    kj.write_thresholds(spark, paths["thresholds"], THRESHOLDS[0], mode="overwrite")
    for b in range(batches):  # one events version per batch
        delta_io.write(spark.createDataFrame(kj.events_for(b), kj.EVENTS_SCHEMA),
                       paths["events"])


def _job(root, remote, crash_at=None, compact_every=None):
    """The keyed job in a subprocess, a client of the Spark server at ``remote`` (the
    crash points fall between Spark actions: nothing of the job runs on after its kill)."""
    env = remote_env(remote, **({"LAKECAST_CRASH_AT": crash_at} if crash_at else {}))
    extra = [str(compact_every)] if compact_every else []
    proc = subprocess.run([sys.executable, "-m", "tests.lakecast.keyed_job", root, *extra],
                          cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                          timeout=600, start_new_session=True)
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(proc.stdout + proc.stderr)
    return proc.returncode


def test_keyed_pipeline_killed_between_outputs_and_state_reruns_exactly_once(
    spark, tmp_path, server_url
):
    root = str(tmp_path / "lake")
    _seed_events(spark, root, 3)
    # batch 1 dies after its outputs are written but before its keyed state is; then a
    # redo of batch 1 dies after its state is written but before the batch commits
    assert _job(root, server_url, "outputs_written:1") == -signal.SIGKILL
    assert _job(root, server_url, "state_written:1") == -signal.SIGKILL
    assert _job(root, server_url) == 0
    paths = kj.table_paths(root)
    got = kj.rows(delta_io.read(spark, paths["sessions"]).collect())
    want = kj.reference((kj.events_for(b), THRESHOLDS[0]) for b in range(3))
    assert got == sorted(want, key=repr)  # every output exactly once, state carried over


def test_keyed_pipeline_killed_right_after_a_compaction_reruns_exactly_once(
    spark, tmp_path, server_url
):
    root = str(tmp_path / "lake")
    _seed_events(spark, root, 3)
    # compact_every=2: batch 1's commit appends, then compacts; it dies right after
    assert _job(root, server_url, "state_written:1", compact_every=2) == -signal.SIGKILL
    history = delta_io.history(spark, kj.table_paths(root)["keyed_state"])
    ops = [json.loads(h["userMetadata"])[TAG]["op"] for h in reversed(history)]
    assert ops == ["append", "append", "compact"]
    assert _job(root, server_url, compact_every=2) == 0
    paths = kj.table_paths(root)
    got = kj.rows(delta_io.read(spark, paths["sessions"]).collect())
    want = kj.reference((kj.events_for(b), THRESHOLDS[0]) for b in range(3))
    assert got == sorted(want, key=repr)


def test_rewind_restores_keyed_state_to_a_checkpoint_and_replays_identically(spark, tmp_path):
    root = str(tmp_path / "lake")
    _seed_events(spark, root, 3)
    first = kj.pipeline(spark, root, parallelism=2)
    assert len(first.run()) == 3
    paths = kj.table_paths(root)
    before = kj.rows(delta_io.read(spark, paths["sessions"]).collect())
    state_at_0 = first.log.state()[1][0].output_versions["keyed_state"]
    rewind(spark, first.log, lambda t: paths[t], 0)
    # the keyed state table is back at batch 0's version (Delta RESTORE)
    restored = delta_io.read(spark, paths["keyed_state"]).orderBy("_key").collect()
    at_0 = delta_io.read(spark, paths["keyed_state"], version=state_at_0).orderBy("_key").collect()
    assert restored == at_0
    again = kj.pipeline(spark, root, parallelism=3).run()  # another application, rescaled
    assert [r.plan.events_end for r in again] == [1, 2]
    assert kj.rows(delta_io.read(spark, paths["sessions"]).collect()) == before


# --------------------------------------------------------------------------- TTL, evolution
LAST_SEEN = ValueStateDescriptor("last_seen", int).enable_time_to_live(
    StateTtlConfig.new_builder(1_000).build())


class LastSeen(KeyedBroadcastProcessFunction):
    key_by = "user_id"

    def keyed_state_descriptors(self):
        return [LAST_SEEN]

    def process_element(self, value, ctx):
        ctx.get_state(LAST_SEEN).update(value["ts"])
        return ()


def test_ttl_drops_expired_keys_and_null_keys_go_to_unmatched(spark, tmp_path):
    state = str(tmp_path / "state")
    rt = KeyedBroadcastRuntime(spark, LastSeen(), {}, state, key_groups=8)

    def batch(b, users, at, null_keys=0):
        rows = [(u, b) for u in users] + [(None, b)] * null_keys
        df = spark.createDataFrame(rows, "user_id long, ts long")
        r = rt.process(df, batch_id=b, processing_time=at).persist()
        # every event is accounted for: a null key has no state, so it goes to unmatched
        assert sum(t["events_in"] for t in r.task_rows()) == len(rows)
        assert r.unmatched.count() == null_keys
        rt.commit(r)
        r.unpersist()
        return rt.state_size()

    with pytest.raises(KeyedStateError, match=r"no key column\(s\) \['user_id'\]"):
        rt.process(spark.createDataFrame([(1,)], "ts long"), batch_id=0, processing_time=0)
    assert batch(0, range(200), at=0, null_keys=3)["keys"] == 200
    assert batch(1, range(150, 250), at=500)["keys"] == 250  # 150..199 rewritten at 500
    after = batch(2, [999], at=1_200)  # 0..149 (written at 0) expired: dropped
    assert after["keys"] == 101
    assert batch(3, [], at=5_000)["keys"] == 0  # everything expired, nothing grows forever


def test_state_schema_evolution_on_restore_and_a_breaking_change_fails_first(spark, tmp_path):
    state, tables = str(tmp_path / "state"), {}
    df = spark.createDataFrame([("a",), ("b",), ("a",)], "user string")

    def run(cls, batch_id):
        rt = KeyedBroadcastRuntime(spark, _profile_function(cls), tables, state, key_groups=4)
        r = rt.process(df, batch_id=batch_id, processing_time=0).persist()
        got = sorted((x.user, x.profile["visits"]) for x in r.main.collect())
        rt.commit(r)
        r.unpersist()
        return got

    assert run(ProfileV1, 0) == [("a", 1), ("a", 2), ("b", 1)]
    assert run(ProfileV2, 1) == [("a", 3), ("a", 4), ("b", 2)]  # field added and removed
    version = delta_io.latest_version(state, spark)
    with pytest.raises(StateSchemaError, match="visits: int -> str"):
        run(ProfileBadType, 2)
    assert delta_io.latest_version(state, spark) == version  # nothing written
