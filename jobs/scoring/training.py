"""The ``models`` asset: logistic-regression models trained in batch with Spark MLlib and
written as a new version of the broadcast table ``models`` (scored by :mod:`jobs.scoring.pipeline`).

Training rows come from ``user_features`` (one row per user and day): the features
:data:`jobs.scoring.pipeline.FEATURES` of day D (a user without events yet gets ``recency_days =
tenure_days + 1``) and the label "purchased on day D + 1" (``purchases`` grew from D to
D + 1), for every pair of consecutive days; the user's segment comes from
``user_segments``. Per segment, :class:`pyspark.ml.classification.LogisticRegression`
(``max_iter`` iterations) trains a champion (``champion_reg``) and a challenger
(``challenger_reg``) that gets ``challenger_share`` of the segment's users; the fits run
in a few driver threads at once. A segment
whose rows all have one label (or fewer than ``min_rows``) gets no model. The same code
runs on a classic session and over Spark Connect (Spark 4's pyspark.ml fits remotely).

The whole table is overwritten in one commit: each training is one Delta version, the
``model_version`` of the predictions it makes. :func:`train_models` is the same without
Dagster.
"""

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dagster import AssetExecutionContext, AssetSpec, Config, MaterializeResult, asset
from pydantic import Field

from assets.columns import COLUMN_SCHEMA, column_metadata, describe
from assets.tables import USER_FEATURES, USER_SEGMENTS
from dagster_lakecast import LakecastSparkResource, LakeResource
from jobs.scoring.pipeline import CHALLENGER, CHAMPION, FEATURES, MODELS, SCORING_EVENTS
from lakecast.config import Settings
from lakecast.delta import io as delta_io
from lakecast.spark import activate, persisted_frames

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "MODELS_SCHEMA", "SCORING_EVENTS_SCHEMA", "SCORING_EVENTS_SPEC", "TrainingSpec", "models",
    "train_models", "training_rows",
]  # fmt: skip

MODELS_SCHEMA = (
    "model_id string, segment string, role string, traffic_share double, "
    "features array<string>, coefficients array<double>, intercept double, "
    "reg_param double, max_iter int, training_rows bigint, positives bigint, "
    "features_day date, trained_at timestamp"
)

SCORING_EVENTS_SCHEMA = (
    "event_id bigint, user_id bigint, segment string, recency_days double, "
    "frequency double, monetary double, ts bigint"
)
#: the events table, appended by its producer (not by Dagster)
SCORING_EVENTS_SPEC = AssetSpec(
    SCORING_EVENTS, group_name="scoring", kinds={"delta"},
    metadata=column_metadata(SCORING_EVENTS),
    description="Events table of the scoring pipeline (append-only, written by its "
    "producer): a user's segment and feature values to score.",
)  # fmt: skip


@dataclass(frozen=True)
class TrainingSpec:
    """How the models of one training are fitted."""

    max_iter: int = 10
    champion_reg: float = 0.01
    challenger_reg: float = 0.1
    challenger_share: float = 0.2
    min_rows: int = 10
    #: fits run at once (threads of the driver)
    parallel_fits: int = 4


def training_rows(spark: "SparkSession", settings: Settings) -> "DataFrame":
    """``user_id, segment, <features>, label`` for every user and pair of consecutive
    feature days (see the module docstring)."""
    from pyspark.sql import functions as F

    feats = delta_io.read(spark, settings.table_path(USER_FEATURES))
    segments = delta_io.read(spark, settings.table_path(USER_SEGMENTS)).select(
        "user_id", "segment")
    following = feats.select("user_id", F.date_sub("day", 1).alias("day"),
                             F.col("purchases").alias("next_purchases"))
    values = {
        "recency_days": F.coalesce(F.col("recency_days"), F.col("tenure_days") + 1),
        "frequency": F.col("frequency"),
        "monetary": F.col("monetary"),
    }
    return feats.join(following, ["user_id", "day"]).join(segments, "user_id").select(
        "user_id", "segment", "day",
        *(values[f].cast("double").alias(f) for f in FEATURES),
        (F.col("next_purchases") > F.col("purchases")).cast("double").alias("label"),
    )  # fmt: skip


def train_models(spark: "SparkSession", settings: Settings, spec: TrainingSpec | None = None,
                 log: Any = None) -> tuple[int, list[dict[str, Any]]]:
    """Fit champion and challenger per segment and overwrite ``models`` with them in one
    commit; returns (the new Delta version, the rows written)."""
    spec = spec or TrainingSpec()
    from pyspark.ml.classification import LogisticRegression
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    trained_at = datetime.now(UTC).replace(tzinfo=None)
    assembler = VectorAssembler(inputCols=list(FEATURES), outputCol="features_vector")
    with persisted_frames() as persist:
        data = persist(assembler.transform(training_rows(spark, settings)))
        stats = data.groupBy("segment").agg(F.count("*").alias("n"), F.sum("label").alias("pos"),
                                            F.max("day").alias("day")).collect()
        tasks = []
        for s in sorted(stats, key=lambda r: r["segment"]):
            n, pos = int(s["n"]), int(s["pos"] or 0)
            if n < spec.min_rows or pos in (0, n):
                if log is not None:
                    log.warning(f"{MODELS}: segment {s['segment']!r} gets no model "
                                f"({n} rows, {pos} positive)")
                continue
            tasks += [(s, n, pos, CHAMPION, spec.champion_reg, 1.0 - spec.challenger_share),
                      (s, n, pos, CHALLENGER, spec.challenger_reg, spec.challenger_share)]

        def fit(task: tuple[Any, int, int, str, float, float]) -> dict[str, Any]:
            s, n, pos, role, reg, share = task
            activate(spark)  # Connect: the fitted model is read through the active session
            lr = LogisticRegression(featuresCol="features_vector", labelCol="label",
                                    maxIter=spec.max_iter, regParam=reg)
            model = lr.fit(data.filter(F.col("segment") == s["segment"]))
            return {
                "model_id": f"{s['segment']}:{role}", "segment": s["segment"], "role": role,
                "traffic_share": share, "features": list(FEATURES),
                "coefficients": [float(c) for c in model.coefficients.toArray()],
                "intercept": float(model.intercept), "reg_param": reg,
                "max_iter": spec.max_iter, "training_rows": n, "positives": pos,
                "features_day": s["day"], "trained_at": trained_at,
            }  # fmt: skip

        # the fits are small: their Spark jobs overlap (latency, not cores, bounds them)
        with ThreadPoolExecutor(max_workers=max(1, spec.parallel_fits)) as pool:
            rows = list(pool.map(fit, tasks))
    columns = [c.split()[0] for c in MODELS_SCHEMA.split(", ")]
    frame = spark.createDataFrame([tuple(r[c] for c in columns) for r in rows], MODELS_SCHEMA)
    version = delta_io.write(frame, settings.table_path(MODELS), mode="overwrite")
    return version, rows


class ModelsConfig(Config):
    """How one training fits its models."""

    max_iter: int = Field(default=10, description="LogisticRegression maxIter")
    champion_reg: float = Field(default=0.01, description="regParam of the champions")
    challenger_reg: float = Field(default=0.1, description="regParam of the challengers")
    challenger_share: float = Field(
        default=0.2, description="share of each segment's users scored by its challenger")
    min_rows: int = Field(default=10, description="fewer training rows: no model")


@asset(
    name=MODELS,
    group_name="scoring",
    deps=[USER_FEATURES, USER_SEGMENTS],
    kinds={"spark", "delta"},
    description="Broadcast table of the scoring pipeline: per segment a champion and a "
    "challenger logistic regression (Spark MLlib), one Delta version per training.",
    metadata=column_metadata(MODELS),
)
def models(context: AssetExecutionContext, config: ModelsConfig, pyspark: LakecastSparkResource,
           lake: LakeResource) -> MaterializeResult:
    """Train the models and write them as a new version of ``models``."""
    spark, settings = pyspark.spark_session, lake.settings()
    spec = TrainingSpec(config.max_iter, config.champion_reg, config.challenger_reg,
                        config.challenger_share, config.min_rows)
    version, rows = train_models(spark, settings, spec, context.log)
    schema = describe(delta_io.read(spark, settings.table_path(MODELS)).schema, MODELS)
    return MaterializeResult(metadata={
        "delta_version": version,
        "dagster/row_count": len(rows),
        "models": sorted(r["model_id"] for r in rows),
        "training_rows": {r["segment"]: r["training_rows"] for r in rows},
        COLUMN_SCHEMA: schema,
    })  # fmt: skip
