"""The batch demo runs the named jobs of ``defs`` (not ``__ephemeral_asset_job__``)."""

from __future__ import annotations

from dagster import DagsterInstance

from assets.tables import USER_SEGMENTS
from jobs.demo import tour as demo
from tests.assets.conftest import SMALL


def test_demo_materializes_through_named_jobs(spark, lake):
    from assets import datagen
    from lakecast.delta import io as delta_io

    datagen.generate(spark, lake, SMALL)
    with DagsterInstance.ephemeral() as instance:
        dims = demo.materialize_dimensions(instance)
        segs = demo.materialize_segments(instance, SMALL.day_keys[0], SMALL.day_keys[-1])
        assert dims.success and segs.success
        runs = {r.run_id: r for r in instance.get_runs()}
        assert runs[dims.run_id].job_name == "dimension_refresh_job"
        assert runs[segs.run_id].job_name == "daily_segment_refresh_job"
        assert {r.job_name for r in runs.values()} == {"dimension_refresh_job",
                                                       "daily_segment_refresh_job"}  # fmt: skip
        mats = dims.get_asset_materialization_events()
        assert {m.asset_key.to_user_string() for m in mats} == {
            "raw_users", "raw_products", "dim_users", "dim_products"}  # fmt: skip
        seg = segs.get_asset_materialization_events()  # one per asset and day of the range
        for asset in ("user_features", USER_SEGMENTS):
            days = [m.partition for m in seg if m.asset_key.to_user_string() == asset]
            assert sorted(days) == SMALL.day_keys, asset
        # every check of the selected assets ran in the named jobs, and passed
        assert dims.get_asset_check_evaluations() and segs.get_asset_check_evaluations()
    assert delta_io.latest_version(lake.table_path(USER_SEGMENTS)) is not None


def test_fraud_tour_runs_the_factory_job_over_two_rules_versions(spark, lake):
    """The demo's fraud section: a run per rules version, BLOCK alerts only while the demo's
    BLOCK rule is enabled; every line's figures are the outputs' rows of that batch."""
    import json

    from jobs.demo.pipelines import DISABLED_RULE, fraud_tour, reset_pipeline
    from jobs.fraud.defs import FRAUD, FRAUD_ALERTS, FRAUD_REVIEW, FRAUD_RULES
    from lakecast.delta import io as delta_io

    assert reset_pipeline(lake, FRAUD) == []  # a fresh lake: nothing to remove
    with DagsterInstance.ephemeral() as instance:
        lines = fraud_tour(instance)
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"{FRAUD_RULES} v0 (all enabled): 200 transactions")
    assert lines[1].startswith(f"{FRAUD_RULES} v1 ({DISABLED_RULE} disabled): 200 transactions")
    counts = {}
    for table in (FRAUD_ALERTS, FRAUD_REVIEW):
        frame = delta_io.read(spark, lake.table_path(table)).toPandas()
        versions = frame["_state_version"].map(lambda s: json.loads(s)[FRAUD_RULES])
        counts[table] = versions.value_counts().to_dict()
    blocks = counts[FRAUD_ALERTS]
    assert blocks.get(0, 0) > 0 and blocks.get(1, 0) == 0, blocks
    for v, line in enumerate(lines):
        reviews = counts[FRAUD_REVIEW].get(v, 0)
        assert f"-> {blocks.get(v, 0)} BLOCK alerts, {reviews} REVIEW alerts" in line, line
    assert sorted(reset_pipeline(lake, FRAUD)) == sorted(
        [FRAUD.events_table, *FRAUD.broadcast_tables, *(t for t, _ in FRAUD.outputs),
         FRAUD.state_table])  # fmt: skip


def test_scoring_tour_scores_each_batch_with_the_models_version_current_at_it(spark, lake):
    """The demo's scoring section on a demo lake (SMALL): ``models`` trained twice, scoring
    events and a run after each. Against the tables, read with pandas: every prediction
    carries the models version last committed before its events were (Delta commit times)
    and the role its user's CRC-32 bucket gets under that version's challenger share; the
    unmatched events are those of segments without a model in that version; each line's
    predictions per models version and role, and its unmatched, are its batch's rows."""
    import zlib

    from assets import datagen
    from jobs.demo.pipelines import CHALLENGER_SHARES, scoring_tour
    from jobs.scoring.pipeline import (
        MODELS,
        PREDICTIONS,
        PREDICTIONS_REJECTED,
        SCORING_EVENTS,
        SCORING_UNMATCHED,
    )
    from lakecast.delta import io as delta_io

    per_run = 120
    datagen.generate(spark, lake, SMALL)
    with DagsterInstance.ephemeral() as instance:
        demo.materialize_dimensions(instance)
        demo.materialize_segments(instance, SMALL.day_keys[0], SMALL.day_keys[-1])
        lines = scoring_tour(instance, events_per_run=per_run, max_iter=5)
    assert len(lines) == 2, lines
    events_path, models_path = lake.table_path(SCORING_EVENTS), lake.table_path(MODELS)
    assert delta_io.latest_version(events_path) == delta_io.latest_version(models_path) == 1

    def committed(path: str, version: int) -> int:
        return delta_io.commit_info(path, version).timestamp_ms

    # the models version in force when each events version was committed
    current = {e: max(m for m in (0, 1) if committed(models_path, m) <= committed(events_path, e))
               for e in (0, 1)}  # fmt: skip
    batch_of: dict[int, int] = {}  # event_id -> the events version that appended it
    for e in (0, 1):
        ids = delta_io.read(spark, events_path, e).toPandas()["event_id"]
        batch_of.update({int(i): e for i in ids if int(i) not in batch_of})
    assert len(batch_of) == 2 * per_run
    segments_of = {v: set(delta_io.read(spark, models_path, v).toPandas()["segment"])
                   for v in (0, 1)}  # fmt: skip
    shares = {v: {r["segment"]: r["traffic_share"]
                  for r in delta_io.read(spark, models_path, v).collect()
                  if r["role"] == "challenger"} for v in (0, 1)}  # fmt: skip
    preds = delta_io.read(spark, lake.table_path(PREDICTIONS)).toPandas()
    unmatched = delta_io.read(spark, lake.table_path(SCORING_UNMATCHED)).toPandas()
    rejected_path = lake.table_path(PREDICTIONS_REJECTED)  # written with its first row
    assert delta_io.latest_version(rejected_path) is None or (
        delta_io.read(spark, rejected_path).count() == 0)
    assert len(preds) + len(unmatched) == 2 * per_run and len(preds) > 0

    preds["batch"] = preds["event_id"].map(batch_of)
    want_version = preds["batch"].map(current)
    assert (preds["model_version"] == want_version).all(), preds[["event_id", "model_version"]]
    bucket = preds["user_id"].map(lambda u: zlib.crc32(str(u).encode()) % 10_000)
    share = [shares[v].get(s, 0.0) for v, s in zip(want_version, preds["segment"], strict=True)]
    want_role = ["challenger" if b < s * 10_000 else "champion"
                 for b, s in zip(bucket, share, strict=True)]  # fmt: skip
    assert list(preds["role"]) == want_role
    assert set(preds["role"]) == {"champion", "challenger"}
    unmatched["batch"] = unmatched["event_id"].map(batch_of)
    for r in unmatched.itertuples():
        assert r.segment not in segments_of[current[r.batch]], r

    for e, line in enumerate(lines):
        v, mine = current[e], preds[preds["batch"] == e]
        roles = mine["role"].value_counts().to_dict()
        assert line.startswith(f"{MODELS} v{v} ("), line
        assert f"challengers on {CHALLENGER_SHARES[v]:.0%} of users" in line, line
        assert (f"{per_run} events -> {len(mine)} predictions (v{v}: "
                f"{roles.get('champion', 0)} champion, {roles.get('challenger', 0)} "
                "challenger)") in line, line  # fmt: skip
        assert f", {(unmatched['batch'] == e).sum()} unmatched (no model), 0 rejected" in line
