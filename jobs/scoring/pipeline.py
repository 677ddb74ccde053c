"""The model-scoring pipeline (issue 17, seed 002 "ML model distribution"), declared
through the factory.

The broadcast table ``models`` holds logistic-regression models trained in batch by the
``models`` asset (:mod:`jobs.scoring.training`): per segment one champion and at most one
challenger (model_id, segment, role, traffic_share, features, coefficients, intercept,
...). Events of ``scoring_events`` (event_id, user_id, segment, the feature values, ts)
are scored by :class:`ModelScorer` with their segment's model: a user goes to the
challenger when :func:`challenger_bucket` (CRC-32 of the user id, in [0, 1)) is below the
challenger's ``traffic_share``, else to the champion (a deterministic split: a user
always meets the same model of a models version). Each prediction (``predictions``)
carries model_id, role, ``model_version`` (the Delta version of ``models`` its batch
applied), the score (sigmoid of intercept + coefficients . features) and the 0.5
decision. Events of a segment without a model go to ``scoring_unmatched``, invalid
events to ``predictions_rejected`` with their reason.

Every models version must pass :data:`MODELS_CONTRACT`; a bad one is refused and the
pipeline keeps scoring with the last good version. Each batch's materialization of
``predictions`` counts its predictions per model version and model
(:func:`predictions_metadata`, the declaration's metadata hook).
"""

from __future__ import annotations

import math
import os
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa

from assets.columns import COLUMNS, schemas
from dagster_lakecast import (
    CheckpointPolicy,
    DagsterNames,
    PipelineDeclaration,
    PipelineHooks,
    declare_pipeline,
)
from lakecast.api.contracts import TableContract
from lakecast.api.descriptors import UNMATCHED, MapStateDescriptor, OutputTag
from lakecast.api.functions import BroadcastProcessFunction, Context, ReadOnlyContext
from lakecast.config import Settings
from lakecast.delta import io as delta_io
from lakecast.pipeline.batch_result import BatchResult
from lakecast.pipeline.micro_batch import REASON_COLUMN
from lakecast.pipeline.progress import MAIN_COUNT

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "CHALLENGER", "CHAMPION", "FEATURES", "MODELS", "MODELS_CONTRACT", "MODEL_COLUMNS",
    "PREDICTIONS", "PREDICTIONS_REJECTED", "SCORING", "SCORING_EVENTS", "SCORING_PIPELINE",
    "SCORING_UNMATCHED", "ModelScorer", "challenger_bucket", "predictions_metadata", "route",
    "score", "validate_scoring_events",
]  # fmt: skip

MODELS = "models"
SCORING_EVENTS = "scoring_events"
PREDICTIONS = "predictions"
SCORING_UNMATCHED = "scoring_unmatched"
PREDICTIONS_REJECTED = "predictions_rejected"
CHAMPION, CHALLENGER = "champion", "challenger"
#: the per-user features the models use (columns of user_features and of scoring_events)
FEATURES = ("recency_days", "frequency", "monetary")
#: the models table's columns besides model_id that the scorer reads
MODEL_COLUMNS = ("segment", "role", "traffic_share", "features", "coefficients", "intercept")
MODEL_STATE = MapStateDescriptor(MODELS, str, dict)

PREDICTION_SCHEMA = pa.schema([
    ("event_id", pa.int64()), ("user_id", pa.int64()), ("segment", pa.string()),
    ("ts", pa.int64()), ("model_id", pa.string()), ("role", pa.string()),
    ("model_version", pa.int64()), ("score", pa.float64()), ("prediction", pa.bool_()),
])  # fmt: skip


def challenger_bucket(user_id: int) -> float:
    """The user's place in [0, 1) for the champion/challenger split (CRC-32 of the id)."""
    return (zlib.crc32(str(user_id).encode()) % 10_000) / 10_000


def route(models: Iterable[Mapping[str, Any]], segment: str, user_id: int
          ) -> Mapping[str, Any] | None:
    """The model of ``segment`` that scores ``user_id`` (``None``: the segment has none)."""
    champion = challenger = None
    for m in models:
        if m["segment"] == segment:
            if m["role"] == CHALLENGER:
                challenger = m
            else:
                champion = m
    if challenger is not None and challenger_bucket(user_id) < challenger["traffic_share"]:
        return challenger
    return champion


def score(model: Mapping[str, Any], event: Mapping[str, Any]) -> float:
    """P(label = 1): the logistic function of intercept + coefficients . features."""
    z = model["intercept"] + sum(
        c * float(event[f]) for f, c in zip(model["features"], model["coefficients"], strict=True)
    )
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def check_models(rows: pa.Table, table: str, version: int) -> list[str]:
    """Row check of ``models``: known roles, one champion per segment and at most one
    challenger, shares in [0, 1], known features with one finite coefficient each."""
    reasons = []
    roles: Counter[tuple[str, str]] = Counter()
    for r in rows.to_pylist():
        where = f"{table}@v{version}: model_id={r['model_id']!r}"
        roles[(r["segment"], r["role"])] += 1
        if r["role"] not in (CHAMPION, CHALLENGER):
            reasons.append(f"{where} has role={r['role']!r} (not {CHAMPION} or {CHALLENGER})")
        share = r["traffic_share"]
        if share is None or not 0.0 <= share <= 1.0:
            reasons.append(f"{where} has traffic_share={share!r} (must be in [0, 1])")
        feats, coefs = r["features"] or [], r["coefficients"] or []
        unknown = sorted(set(feats) - set(FEATURES))
        if unknown or len(feats) != len(coefs) or not feats:
            reasons.append(f"{where} has features {feats} (known: {list(FEATURES)}) and "
                           f"{len(coefs)} coefficient(s): one per known feature needed")
        values = [*coefs, r["intercept"]]
        if any(v is None or not math.isfinite(v) for v in values):
            reasons.append(f"{where} has a null or non-finite coefficient or intercept")
    for segment in {s for s, _ in roles}:
        if roles[(segment, CHAMPION)] != 1 or roles[(segment, CHALLENGER)] > 1:
            reasons.append(
                f"{table}@v{version}: segment={segment!r} has {roles[(segment, CHAMPION)]} "
                f"champion(s) and {roles[(segment, CHALLENGER)]} challenger(s) (needs exactly "
                "one champion, at most one challenger)")
    return [f"{why}; write a version of {table} that fixes it" for why in reasons]


#: a refused version leaves the last good models in force (the scorer is not keyed)
MODELS_CONTRACT = TableContract(MODELS, ("model_id",), MODEL_COLUMNS, checks=(check_models,))


class ModelScorer(BroadcastProcessFunction):
    """Scores each event with its segment's champion or challenger (see the module)."""

    def state_descriptors(self) -> list[MapStateDescriptor]:
        return [MODEL_STATE]

    def table_contracts(self) -> list[TableContract]:
        return [MODELS_CONTRACT]

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        return PREDICTION_SCHEMA

    def output_tags(self) -> list[OutputTag]:
        return [UNMATCHED]

    def process_broadcast_element(self, value: Any, ctx: Context) -> None:
        ctx.get_broadcast_state(MODEL_STATE).apply(value, key_columns="model_id")

    def process_element(self, value: Any, ctx: ReadOnlyContext) -> Iterator[dict[str, Any]]:
        model = route(ctx.get_broadcast_state(MODEL_STATE).values(), value["segment"],
                      value["user_id"])
        if model is None:
            ctx.output(UNMATCHED, value)
            return
        p = score(model, value)
        yield {"event_id": value["event_id"], "user_id": value["user_id"],
               "segment": value["segment"], "ts": value["ts"], "model_id": model["model_id"],
               "role": model["role"], "model_version": ctx.state_version().get(MODELS),
               "score": p, "prediction": p >= 0.5}


def validate_scoring_events(events: DataFrame) -> DataFrame:
    """Add ``_reason`` (null = valid): null ids, segment or ts; a null, NaN or negative
    feature; a second copy of an ``event_id`` within the batch."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    reason = F.when(F.col("event_id").isNull(), "null_event_id")
    for column in ("user_id", "segment", "ts"):
        reason = reason.when(F.col(column).isNull(), f"null_{column}")
    for f in FEATURES:
        bad = F.col(f).isNull() | F.isnan(f) | (F.col(f) < 0)
        reason = reason.when(bad, f"bad_{f}")
    first = Window.partitionBy("event_id").orderBy(F.to_json(F.struct(*events.columns)))
    copy = F.col("event_id").isNotNull() & (F.row_number().over(first) > 1)
    return events.withColumn(
        REASON_COLUMN, F.coalesce(reason, F.when(copy, F.lit("duplicate_event_id"))).cast("string")
    )


def batch_predictions(settings: Settings, result: BatchResult) -> pa.Table | None:
    """``model_version`` and ``model_id`` of the rows ``result``'s batch appended to
    ``predictions``: the files its commit added, read without Spark (``None``: a lake not
    on the local filesystem)."""
    import pyarrow.parquet as pq

    columns = ["model_version", "model_id"]
    if not result.counts.get(MAIN_COUNT):
        return PREDICTION_SCHEMA.empty_table().select(columns)
    path = settings.table_path(PREDICTIONS)
    if "://" in path:
        return None
    version = result.output_versions[PREDICTIONS]
    added = [a["add"]["path"] for a in delta_io.commit_actions(path, version) if "add" in a]
    return pa.concat_tables(
        [pq.read_table(os.path.join(path, unquote(name)), columns=columns) for name in added])


def predictions_metadata(settings: Settings, result: BatchResult
                         ) -> dict[str, dict[str, Any]]:
    """The metadata hook: the batch's predictions per model version
    (``predictions_by_model_version``: {version: rows}) and per model
    (``predictions_by_model``: {"v<version>/<model_id>": rows})."""
    rows = batch_predictions(settings, result)
    if rows is None:
        return {PREDICTIONS: {"predictions_by_model_version": "not read (lake not local)"}}
    pairs = zip(rows.column("model_version").to_pylist(), rows.column("model_id").to_pylist(),
                strict=True) if rows.num_rows else iter(())
    by_model = Counter(f"v{v}/{m}" for v, m in pairs)
    by_version: Counter[str] = Counter()
    for key, n in by_model.items():
        by_version[key.split("/", 1)[0][1:]] += n
    return {PREDICTIONS: {"predictions_by_model_version": dict(sorted(by_version.items())),
                          "predictions_by_model": dict(sorted(by_model.items())),
                          "model_versions": sorted(int(v) for v in by_version)}}


# The declaration: about 20 lines (README, "Declare a pipeline").
SCORING = PipelineDeclaration(
    name="scoring",
    function=ModelScorer,
    events_table=SCORING_EVENTS,
    broadcast_tables=(MODELS,),
    output_table=PREDICTIONS,
    side_outputs={UNMATCHED.name: SCORING_UNMATCHED},
    rejected_table=PREDICTIONS_REJECTED,
    validator=validate_scoring_events,
    timestamp_column="ts",
    parallelism=2,
    checkpoint=CheckpointPolicy(every=10),
    dagster=DagsterNames(
        columns=schemas(*COLUMNS),  # each table's declared columns (assets/columns.py)
        description="Events scored with the broadcast models: champion or challenger per "
        "user.",
        descriptions={
            PREDICTIONS: "Scores of scoring_events: model_id, role and model_version (the "
            "models version applied) per row.",
            SCORING_UNMATCHED: "Side output: events of a segment without a model.",
        },
    ),
    hooks=PipelineHooks(metadata=predictions_metadata),
)
SCORING_PIPELINE = declare_pipeline(SCORING)
