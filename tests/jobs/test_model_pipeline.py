"""The models asset and the scoring pipeline (jobs/model_training.py, jobs/scoring.py),
run through Dagster.

End to end on the test run's Spark session and a real Dagster instance: ``models`` is
trained twice with Spark MLlib (a day of features more and another challenger share the
second time: a new Delta version), ``scoring_microbatch`` runs after each training, and
a bad models version is refused by the contract. EVERY prediction is compared
with a plain-Python score computed from the parameters of its row's ``model_version``
read by time travel, with the champion/challenger split recomputed from the user id; the
per-model-version counts of each batch's metadata, the rejected and unmatched events, the
asset checks and the definitions are checked too. Then the training over Spark Connect.

Time budget (the suite is near its limit): about 40 s + 20 s (Spark Connect).
"""

from __future__ import annotations

import json
import math
import random
import zlib
from collections import Counter
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

import pytest
from dagster import AssetKey, DagsterInstance, SensorResult, build_sensor_context, materialize

from assets.columns import COLUMNS
from assets.tables import USER_FEATURES, USER_SEGMENTS
from dagster_lakecast import VERSIONS_TAG
from dagster_lakecast.checks import counts_reconcile, newest_versions_refused
from dagster_lakecast.handle import PipelineHandle
from dagster_lakecast.resources import LakecastSparkResource, LakeResource
from jobs.scoring.pipeline import (
    MODELS,
    PREDICTIONS,
    PREDICTIONS_REJECTED,
    SCORING,
    SCORING_EVENTS,
    SCORING_PIPELINE,
    SCORING_UNMATCHED,
)
from jobs.scoring.training import (
    MODELS_SCHEMA,
    SCORING_EVENTS_SCHEMA,
    TrainingSpec,
    models,
    train_models,
)
from lakecast.delta import io as delta_io
from lakecast.runtime.executor import VERSION_COLUMN
from lakecast.tools import cli
from tests.assets.conftest import QUIET
from tests.assets.test_columns import MODEL_TABLES, column_mismatches

SCORING_H = PipelineHandle.resolve(SCORING)

Row = dict[str, Any]
USERS = 36
#: CHURNING users never buy: that segment gets no model (its events are unmatched)
SEGMENT_OF = {u: ("VIP", "REGULAR", "CHURNING")[u % 3] for u in range(USERS)}
FIRST_DAY = date(2026, 1, 1)
SHARES = (0.3, 0.5)  # challenger share of the two trainings
#: invalid events of the first batch and why each is rejected
BAD = [
    ({"event_id": 900, "user_id": None, "segment": "VIP", "recency_days": 1.0,
      "frequency": 3.0, "monetary": 10.0, "ts": 1}, "null_user_id"),
    ({"event_id": 901, "user_id": 1, "segment": None, "recency_days": 1.0,
      "frequency": 3.0, "monetary": 10.0, "ts": 2}, "null_segment"),
    ({"event_id": 902, "user_id": 2, "segment": "VIP", "recency_days": 1.0,
      "frequency": 3.0, "monetary": math.nan, "ts": 3}, "bad_monetary"),
    ({"event_id": 903, "user_id": 4, "segment": "REGULAR", "recency_days": 1.0,
      "frequency": -1.0, "monetary": 10.0, "ts": 4}, "bad_frequency"),
]  # fmt: skip


def ddl(table: str) -> str:
    """The Spark DDL of a table's declared columns (assets/columns.py)."""
    return ", ".join(f"{n} {t}" for n, t, _ in COLUMNS[table])


# ------------------------------------------------------------------ the data
def feature_days(days: int, segment_of: dict[int, str]) -> list[Row]:
    """``user_features`` rows of ``days`` days: buyers are frequent, recent users."""
    rnd = random.Random(5)
    rows = []
    for u in range(USERS):
        purchases, frequency = 0, rnd.randint(1, 5)
        for d in range(days):
            recency = rnd.randint(0, 6)
            rows.append({"day": FIRST_DAY + timedelta(days=d), "user_id": u,
                         "recency_days": recency if d else None, "frequency": frequency,
                         "monetary": Decimal(purchases * 25).quantize(Decimal("0.01")),
                         "purchases": purchases, "interests": [], "last_event_at": None,
                         "tenure_days": 10 + d})  # fmt: skip
            frequency += rnd.randint(0, 4)
            buys = segment_of[u] != "CHURNING" and rnd.random() < (
                0.8 if frequency > 8 and recency < 4 else 0.25)
            purchases += int(buys)
    return rows


def write_rows(spark, path: str, rows: list[Row], schema: str, mode: str) -> None:
    cols = [c.split()[0] for c in schema.split(", ")]
    delta_io.write(spark.createDataFrame([tuple(r[c] for c in cols) for r in rows], schema),
                   path, mode=mode)


def write_training_inputs(spark, lake, days: int, segment_of: dict[int, str] = SEGMENT_OF,
                          segments: bool = True) -> list[Row]:
    """``user_features`` (``days`` days) and (``segments``) ``user_segments``; returns the
    features."""
    feats = feature_days(days, segment_of)
    write_rows(spark, lake.table_path(USER_FEATURES), feats, ddl(USER_FEATURES), "overwrite")
    if not segments:
        return feats
    segments = [{"user_id": u, "segment": s, "lifetime_value": Decimal("0.00"), "interests": [],
                 "updated_day": FIRST_DAY} for u, s in segment_of.items()]
    write_rows(spark, lake.table_path(USER_SEGMENTS), segments, ddl(USER_SEGMENTS), "overwrite")
    return feats


def training_set(feats: list[Row], segment_of: dict[int, str]
                 ) -> dict[str, list[tuple[list[float], float]]]:
    """Plain-Python training rows per segment: (features of day D, bought on D + 1)."""
    by = {(r["user_id"], r["day"]): r for r in feats}
    out: dict[str, list[tuple[list[float], float]]] = {}
    for (u, day), r in by.items():
        nxt = by.get((u, day + timedelta(days=1)))
        if nxt is not None:
            recency = r["recency_days"] if r["recency_days"] is not None else r["tenure_days"] + 1
            x = [float(recency), float(r["frequency"]), float(r["monetary"])]
            out.setdefault(segment_of[u], []).append((x, float(nxt["purchases"] > r["purchases"])))
    return out


def batch_events(i: int) -> list[Row]:
    """Batch ``i``'s valid events: 45 users' current features."""
    rnd = random.Random(40 + i)
    return [{"event_id": 1000 * i + j, "user_id": (u := rnd.randrange(USERS)),
             "segment": SEGMENT_OF[u], "recency_days": float(rnd.randint(0, 6)),
             "frequency": float(rnd.randint(1, 20)), "monetary": rnd.uniform(0, 100),
             "ts": 10_000 * i + j} for j in range(45)]  # fmt: skip


# ------------------------------------------------------------------ the reference
def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def expected_model(models_rows: list[Row], event: Row) -> Row | None:
    """The model that must score ``event``: the challenger when the user's CRC-32 bucket
    (0..9999) is below 10000 x its share, else the champion."""
    mine = {m["role"]: m for m in models_rows if m["segment"] == event["segment"]}
    if not mine:
        return None
    bucket = zlib.crc32(str(event["user_id"]).encode()) % 10_000
    challenger = mine.get("challenger")
    return challenger if challenger and bucket < challenger["traffic_share"] * 10_000 else (
        mine["champion"])


def log_loss(rows: list[tuple[list[float], float]], coefs: list[float], b: float) -> float:
    eps = 1e-12
    return -sum(y * math.log(max(p, eps)) + (1 - y) * math.log(max(1 - p, eps))
                for x, y in rows
                for p in [sigmoid(b + sum(c * v for c, v in zip(coefs, x, strict=True)))]
                ) / len(rows)  # fmt: skip


def assert_models_fit(model_rows: list[Row], feats: list[Row], share: float,
                      segment_of: dict[int, str] = SEGMENT_OF) -> None:
    """A champion and a challenger per segment but CHURNING; rows, positives and shares as
    the plain-Python training set says; each model fits its data better than the
    constant (base-rate) predictor."""
    data = training_set(feats, segment_of)
    assert {m["model_id"] for m in model_rows} == {
        f"{s}:{r}" for s in set(segment_of.values()) - {"CHURNING"}
        for r in ("champion", "challenger")}  # fmt: skip
    for m in model_rows:
        rows = data[m["segment"]]
        pos = sum(y for _, y in rows)
        assert (m["training_rows"], m["positives"]) == (len(rows), pos)
        want = share if m["role"] == "challenger" else 1 - share
        assert m["traffic_share"] == pytest.approx(want)
        rate = pos / len(rows)
        base = log_loss(rows, [0.0, 0.0, 0.0], math.log(rate / (1 - rate)))
        assert log_loss(rows, list(m["coefficients"]), m["intercept"]) < base, m


# ------------------------------------------------------------------ helpers
def rows_of(spark, lake, table: str, version: int | None = None) -> list[Row]:
    frame = delta_io.read(spark, lake.table_path(table), version)
    return [r.asDict(recursive=True) for r in frame.collect()]


def train(instance: DagsterInstance | None, share: float):
    """Materialize ``models`` (maxIter 5: the test's budget)."""
    config = {"challenger_share": share, "max_iter": 5}
    result = materialize(
        [models], instance=instance,
        resources={"pyspark": LakecastSparkResource(), "lake": LakeResource()},
        run_config={**QUIET, "ops": {MODELS: {"config": config}}},
    )  # fmt: skip
    assert result.success
    return result


def append_events(spark, lake, events: list[Row]) -> None:
    write_rows(spark, lake.table_path(SCORING_EVENTS), events, SCORING_EVENTS_SCHEMA, "append")


def run_scoring(instance: DagsterInstance, cursor: str | None,
                versions: dict[str, int]) -> tuple[dict[str, Row], str]:
    """Tick the sensor (one run request for ``versions``), run the job it requests;
    returns (its metadata per asset, the new cursor)."""
    from jobs.definitions import defs

    tick = SCORING_PIPELINE.sensor(build_sensor_context(instance=instance, cursor=cursor))
    assert isinstance(tick, SensorResult), tick
    (request,) = tick.run_requests
    assert json.loads(request.tags[VERSIONS_TAG]) == versions
    job = defs.resolve_job_def(SCORING_H.job_name)
    res = job.execute_in_process(instance=instance, tags=dict(request.tags))
    assert res.success
    meta = {m.asset_key.to_user_string(): {k: v.value for k, v in
                                           m.materialization.metadata.items()}
            for m in res.get_asset_materialization_events()}  # fmt: skip
    assert set(meta) == {PREDICTIONS, SCORING_UNMATCHED, PREDICTIONS_REJECTED}
    checks = {e.check_name: e.passed for e in res.get_asset_check_evaluations()}
    assert checks == {"counts_reconcile": True, "broadcast_versions_accepted": True,
                      "events_fresh": True}  # output_sample_recomputed: on request
    return meta, tick.cursor


def test_models_trained_twice_and_every_prediction_matches_its_model_version(spark, lake,
                                                                             capsys):
    feats_path = lake.table_path(USER_FEATURES)
    batches: list[list[Row]] = []
    metas: list[dict[str, Row]] = []
    trained: list[list[Row]] = []
    with DagsterInstance.ephemeral() as instance:
        cursor = None
        for i, share in enumerate(SHARES):
            # a day more of features the second time: retrained
            feats = write_training_inputs(spark, lake, days=3 + i, segments=i == 0)
            train(instance, share)
            assert delta_io.latest_version(lake.table_path(MODELS)) == i
            trained.append(rows_of(spark, lake, MODELS))
            assert_models_fit(trained[-1], feats, share)
            events = batch_events(i)
            if i == 0:  # invalid rows and a second copy of an event
                events = events + [e for e, _ in BAD] + [dict(events[3])]
            append_events(spark, lake, events)
            batches.append(events)
            meta, cursor = run_scoring(instance, cursor, {SCORING_EVENTS: i, MODELS: i})
            metas.append(meta)
        assert delta_io.latest_version(feats_path) == 1
        coefficients = [{m["model_id"]: m["coefficients"] for m in t} for t in trained]
        assert all(coefficients[0][k] != coefficients[1][k] for k in coefficients[0])

        # a bad models version (a challenger share > 1): the contract refuses it (the
        # pipeline would keep v1 in force; not run here: the test's time budget)
        bad = [{**m, "traffic_share": 1.5 if m["role"] == "challenger" else m["traffic_share"]}
               for m in trained[1]]
        write_rows(spark, lake.table_path(MODELS), bad, MODELS_SCHEMA, "overwrite")
        newest, refused = newest_versions_refused(SCORING_H, lake)
        assert newest == {MODELS: 2} and [r["version"] for r in refused] == [2]
        assert "models@v2" in refused[0]["reasons"][0] and "traffic_share=1.5" in str(refused)
        assert counts_reconcile(SCORING_H, lake)[0]

    # every prediction against the plain-Python score of its model version (time travel)
    applied = [0, 1]  # the models version each batch applied
    params = {v: rows_of(spark, lake, MODELS, v) for v in (0, 1)}
    preds = {p["event_id"]: p for p in rows_of(spark, lake, PREDICTIONS)}
    unmatched = sorted(r["event_id"] for r in rows_of(spark, lake, SCORING_UNMATCHED))
    bad_ids = {e["event_id"] for e, _ in BAD}
    want_unmatched, roles = [], Counter()
    for b, events in enumerate(batches):
        per_model: Counter[str] = Counter()
        for e in {e["event_id"]: e for e in events if e["event_id"] not in bad_ids}.values():
            model = expected_model(params[applied[b]], e)
            if model is None:
                want_unmatched.append(e["event_id"])
                continue
            p = preds[e["event_id"]]
            z = model["intercept"] + sum(c * e[f] for f, c in
                                         zip(model["features"], model["coefficients"],
                                             strict=True))  # fmt: skip
            assert p["model_version"] == applied[b]
            assert json.loads(p[VERSION_COLUMN]) == {MODELS: applied[b]}
            assert (p["model_id"], p["role"], p["user_id"]) == (
                model["model_id"], model["role"], e["user_id"])
            assert p["score"] == pytest.approx(sigmoid(z), rel=1e-9, abs=1e-12)
            assert p["prediction"] == (p["score"] >= 0.5)
            per_model[f"v{applied[b]}/{model['model_id']}"] += 1
            roles[(b, model["role"])] += 1
        # predictions per model version and per model, as each batch's metadata says
        m = metas[b][PREDICTIONS]
        assert m["predictions_by_model"] == dict(per_model)
        assert m["predictions_by_model_version"] == {str(applied[b]): sum(per_model.values())}
        assert m["model_versions"] == [applied[b]] and m["batch_rows"] == sum(per_model.values())
    assert len(preds) == sum(m[PREDICTIONS]["batch_rows"] for m in metas)
    assert all(roles[(b, r)] for b in range(2) for r in ("champion", "challenger")), roles
    assert unmatched == sorted(set(want_unmatched)) and unmatched
    rejected = sorted((r["reason"], json.loads(r["raw_record"])["event_id"])
                      for r in rows_of(spark, lake, PREDICTIONS_REJECTED))
    assert rejected == sorted([(why, e["event_id"]) for e, why in BAD]
                              + [("duplicate_event_id", batches[0][3]["event_id"])])
    # every table of the pipeline has the columns assets/columns.py declares for it (no
    # checkpoint yet, every 10 batches: the snapshot table's columns, SnapshotStore's, are
    # checked through enrichment_snapshots in tests/assets/test_columns.py)
    assert not column_mismatches(spark, lake, MODEL_TABLES - {"scoring_snapshots"})

    # `lakecast replay scoring`: the audit reproduces every prediction; with the newest
    # valid models (v1: v2 is refused) the first batch is scored by v1 too
    assert cli.main(["replay", "scoring", "--state", "original"]) == 0
    out = capsys.readouterr().out
    assert f"MATCH: batches 0..1 replayed {len(preds)} rows" in out, out
    assert cli.main(["replay", "scoring", "--state", "latest"]) == 0
    events_by_id = {e["event_id"]: e for events in batches for e in events
                    if e["event_id"] not in bad_ids}
    what_if = rows_of(spark, lake, f"{PREDICTIONS}_replay")
    assert sorted(p["event_id"] for p in what_if) == sorted(
        i for i, e in events_by_id.items() if expected_model(params[1], e) is not None)
    for p in what_if:
        e = events_by_id[p["event_id"]]
        model = expected_model(params[1], e)
        z = model["intercept"] + sum(c * e[f] for f, c in
                                     zip(model["features"], model["coefficients"],
                                         strict=True))  # fmt: skip
        assert (p["model_id"], p["model_version"]) == (model["model_id"], 1)
        assert p["score"] == pytest.approx(sigmoid(z), rel=1e-9, abs=1e-12)
    assert any(preds[p["event_id"]]["model_version"] == 0 for p in what_if)


def test_definitions_hold_the_models_asset_and_the_scoring_pipeline():
    from jobs.definitions import defs

    job = defs.resolve_job_def("scoring_microbatch")
    assert {k.to_user_string() for k in job.asset_layer.selected_asset_keys} == {
        PREDICTIONS, SCORING_UNMATCHED, PREDICTIONS_REJECTED}
    assert defs.resolve_sensor_def("scoring_sensor").job_name == "scoring_microbatch"
    graph = defs.resolve_asset_graph()
    parents = {t: {k.to_user_string() for k in graph.get(AssetKey(t)).parent_keys}
               for t in (PREDICTIONS, MODELS)}
    assert parents == {PREDICTIONS: {SCORING_EVENTS, MODELS},
                       MODELS: {USER_FEATURES, USER_SEGMENTS}}
    checks = {(k.asset_key.to_user_string(), k.name) for k in graph.asset_check_keys}
    assert {(PREDICTIONS, "counts_reconcile"), (PREDICTIONS, "broadcast_versions_accepted"),
            (PREDICTIONS, "events_fresh"), (PREDICTIONS, "output_sample_recomputed")} <= checks
    # the other factory pipeline is still there
    assert defs.resolve_sensor_def("fraud_sensor").job_name == "fraud_microbatch"


@pytest.mark.connect
def test_models_asset_trains_over_spark_connect(connect_lake, connect_spark):
    """The asset's training (:func:`train_models`, the whole of the asset but Dagster) on
    a Spark Connect session: pyspark.ml fits on the server. One segment with a model, to
    keep it short."""
    segment_of = {u: ("VIP", "CHURNING")[u % 2] for u in range(USERS)}
    feats = write_training_inputs(connect_spark, connect_lake, 3, segment_of)
    version, _ = train_models(connect_spark, connect_lake,
                              TrainingSpec(max_iter=5, challenger_share=0.25))
    assert version == 0
    assert_models_fit(rows_of(connect_spark, connect_lake, MODELS), feats, 0.25, segment_of)
