"""Column descriptions of every Delta table the Dagster assets stand for — the one list.

Assets declare ``dagster/column_schema`` from it (:func:`column_schema`: the UI shows
the columns before the first materialization), and materializations report the table's
actual Spark schema with these descriptions (:func:`describe`). A test compares both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dagster import TableColumn, TableSchema

from assets.tables import (
    DIM_PRODUCTS,
    DIM_USERS,
    EVENTS,
    RAW_PRODUCTS,
    RAW_USERS,
    USER_FEATURES,
    USER_SEGMENTS,
)

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

COLUMN_SCHEMA = "dagster/column_schema"

Column = tuple[str, str, str]  # name, Spark type (simpleString), description

_RAW_EVENT: tuple[Column, ...] = (
    ("event_id", "bigint", "Event id, unique per event (exact duplicates are malformed rows)."),
    ("user_id", "bigint", "The user who acted (null or unknown in malformed rows)."),
    ("product_id", "bigint", "The product acted on (unknown ids in malformed rows)."),
    ("event_type", "string", "view, add_to_cart or purchase."),
    ("amount", "double", "Amount in the shop's currency (a purchase's price paid)."),
    ("event_time", "string", "When it happened, UTC, as 'yyyy-MM-dd HH:mm:ss' text."),
    ("device", "string", "web, ios or android."),
    ("ingest_day", "string", "UTC day the producer appended it (yyyy-MM-dd); the Delta "
                             "table's physical partition column, not a Dagster partition."),
)  # fmt: skip

_ENRICHMENT: tuple[Column, ...] = (
    ("event_ts", "timestamp", "event_time parsed as a UTC timestamp."),
    ("product_category", "string", "The product's category in dim_products (broadcast state)."),
    ("product_price", "decimal(10,2)", "The product's price in dim_products (broadcast state)."),
    ("segment", "string", "The user's segment in user_segments (NEW when not segmented yet)."),
    ("vip_discount_pct", "double", "Percent off for VIP users while the vip_discount feature "
                                   "flag is enabled, else 0."),
    ("_state_version", "string", "JSON {table: Delta version} of the broadcast state that "
                                 "enriched the row (lineage; time travel reproduces it)."),
)  # fmt: skip

#: alerts of the fraud pipeline (jobs/fraud.py): BLOCK alerts and REVIEW alerts alike
_FRAUD_ALERT: tuple[Column, ...] = (
    ("rule_id", "string", "The fraud_rules rule that fired."),
    ("user_id", "string", "The user whose transactions fired it (the pipeline's key)."),
    ("small_tx_id", "bigint", "The small transaction (amount < small_below) that armed "
                              "the rule."),
    ("large_tx_id", "bigint", "The large transaction (amount > large_above, within "
                              "window_ms, at a merchant new to the user) that fired it."),
    ("merchant", "string", "Merchant of the large transaction."),
    ("amount", "double", "Amount of the large transaction."),
    ("ts", "bigint", "Event time of the large transaction (epoch ms, UTC)."),
    ("_state_version", "string", "JSON {table: Delta version} of the fraud_rules version "
                                 "the alert's batch applied (lineage; time travel "
                                 "reproduces it)."),
)  # fmt: skip

#: a micro-batch pipeline's progress log (jobs/maintenance.py maintains it)
_PROGRESS: tuple[Column, ...] = (
        ("batch_id", "bigint", "The micro-batch this row is about."),
        ("kind", "string", "plan (written before the batch runs) or commit (after its "
                           "outputs are written); a restore row marks a rewind."),
        ("events_start", "bigint", "The batch reads events versions after this one (-1: "
                                   "from the start)."),
        ("events_end", "bigint", "... up to and including this events version."),
        ("broadcast_versions", "string", "JSON {table: Delta version}: the batch's broadcast "
                                         "state version."),
        ("counts", "string", "JSON counts of a committed batch (events in, per output)."),
        ("recorded_at_ms", "bigint", "When the row was written (epoch ms, UTC)."),
        ("output_versions", "string", "JSON {output table: Delta version} after the commit "
                                      "(what a rewind rolls the outputs back to)."),
        ("refused", "string", "JSON list of broadcast versions refused at planning, with "
                              "their reasons."),
    )
#: a keyed pipeline's state table (lakecast.runtime.keyed_store), maintained by its
#: <name>_maintenance_job (jobs/factory_maintenance.py)
_KEYED_STATE: tuple[Column, ...] = (
    ("_key_group", "int", "The key's group (-1: the __meta__ row)."),
    ("_key", "string", "The key as canonical JSON."),
    ("_state", "binary", "The key's states and timers as typed JSON (null: deleted)."),
    ("_next_event_timer", "bigint", "The key's next event-time timer (ms)."),
    ("_next_proc_timer", "bigint", "The key's next processing-time timer (ms)."),
    ("_expires_at", "bigint", "When the key's next TTL entry expires (ms)."),
    ("_batch", "bigint", "The batch that wrote the row."),
)
#: events of the scoring pipeline (jobs/scoring.py)
_SCORING_EVENT: tuple[Column, ...] = (
    ("event_id", "bigint", "Event id (a second copy within a batch is rejected)."),
    ("user_id", "bigint", "The user to score (decides champion or challenger)."),
    ("segment", "string", "The user's segment: picks the models."),
    ("recency_days", "double", "Days since the user's last event (null, NaN or "
                               "negative: rejected)."),
    ("frequency", "double", "The user's accepted events to date (idem)."),
    ("monetary", "double", "The user's purchase amounts to date (idem)."),
    ("ts", "bigint", "Event time, epoch ms, UTC (null: rejected)."),

)  # fmt: skip

#: a broadcast pipeline's snapshot table (lakecast.snapshots.store.SnapshotStore)
_SNAPSHOTS: tuple[Column, ...] = (
        ("checkpoint_id", "bigint", "The checkpoint (also the table's partition column)."),
        ("kind", "string", "checkpoint (header), manifest (one per task and state) or entry."),
        ("task", "int", "The task whose state a manifest row describes."),
        ("state", "string", "The broadcast state's descriptor name."),
        ("seq", "bigint", "Order of an entry row within its state content."),
        ("key", "string", "An entry's key (typed JSON; never pickled)."),
        ("value", "binary", "An entry's value, or Arrow IPC bytes of a table state."),
        ("content_hash", "string", "Hash of a state's content: stored once however many "
                                   "tasks hold it."),
        ("n_entries", "bigint", "Entries of the state a manifest row describes."),
        ("meta", "string", "JSON: the header's state version and batch, or a manifest's "
                           "details."),
        ("created_at_ms", "bigint", "When the checkpoint was taken (epoch ms, UTC)."),
)  # fmt: skip

COLUMNS: dict[str, tuple[Column, ...]] = {
    RAW_USERS: (
        ("user_id", "bigint", "User id (null in malformed rows)."),
        ("name", "string", "Display name."),
        ("email", "string", "E-mail address."),
        ("country", "string", "ISO 3166 alpha-2 country code."),
        ("signup_ts", "string", "Sign-up time, UTC, as 'yyyy-MM-dd HH:mm:ss' text "
                                "(unparsable in malformed rows)."),
    ),
    RAW_PRODUCTS: (
        ("product_id", "bigint", "Product id (null in malformed rows)."),
        ("name", "string", "Product name."),
        ("category", "string", "Catalog category."),
        ("price", "double", "List price (negative or NaN in malformed rows)."),
    ),
    EVENTS: _RAW_EVENT,
    DIM_USERS: (
        ("user_id", "bigint", "User id, unique and not null."),
        ("name", "string", "Display name."),
        ("email", "string", "E-mail address."),
        ("country", "string", "ISO 3166 alpha-2 country code."),
        ("signup_ts", "timestamp", "Sign-up time (UTC)."),
        ("signup_date", "date", "Sign-up day (UTC)."),
    ),
    DIM_PRODUCTS: (
        ("product_id", "bigint", "Product id, unique and not null."),
        ("name", "string", "Product name."),
        ("category", "string", "Catalog category."),
        ("price", "decimal(10,2)", "List price, >= 0."),
    ),
    USER_FEATURES: (
        ("day", "date", "The partition day the features are computed as of (end of day, UTC)."),
        ("user_id", "bigint", "User id (users signed up by the day)."),
        ("recency_days", "int", "Days from the last event's day to the day (null: no event yet)."),
        ("frequency", "bigint", "Accepted events up to the end of the day."),
        ("monetary", "decimal(18,2)", "Sum of purchase amounts to date (lifetime value)."),
        ("purchases", "bigint", "Purchases to date."),
        ("interests", "array<string>", "Top 3 categories by event count (ties by name)."),
        ("last_event_at", "timestamp", "Time of the last accepted event (null: none)."),
        ("tenure_days", "int", "Days from sign-up to the day."),
    ),
    USER_SEGMENTS: (
        ("user_id", "bigint", "User id (users signed up by the newest segmented day)."),
        ("segment", "string", "VIP, NEW, CHURNING or REGULAR (rules: assets/transforms.py)."),
        ("lifetime_value", "decimal(18,2)", "Sum of purchase amounts to date (monetary)."),
        ("interests", "array<string>", "Top 3 categories by event count (ties by name)."),
        ("updated_day", "date", "The partition day that last changed this user's record "
                                "(segment, lifetime_value or interests)."),
    ),
    "enriched_events": (*_RAW_EVENT, *_ENRICHMENT),
    "enrichment_unmatched": (
        *_RAW_EVENT,
        ("event_ts", "timestamp", "event_time parsed as a UTC timestamp."),
        ("_state_version", "string", "JSON {table: Delta version} of the broadcast state "
                                     "that found no match."),
        ("_unmatched_reason", "string", "missing_state (no product at that state version) "
                                        "or hold_timeout (held until LAKECAST_HOLD_TIMEOUT "
                                        "passed, the product never arrived)."),
    ),
    "enrichment_rejected": (
        ("reason", "string", "Why the event was rejected (e.g. null_user_id, bad_event_time, "
                             "duplicate_event_id)."),
        ("raw_record", "string", "The raw event as JSON."),
        ("batch_id", "int", "The micro-batch that read it (enrichment progress log)."),
    ),
    # the fraud pipeline (jobs/fraud.py: declared through jobs/factory.py) and its inputs
    "fraud_rules": (
        ("rule_id", "string", "Rule id, one row per rule (the broadcast state's key)."),
        ("small_below", "double", "A transaction below this amount is small: it arms the "
                                  "rule for its user."),
        ("large_above", "double", "A transaction above this amount fires an armed rule "
                                  "(within window_ms, at a merchant new to the user)."),
        ("window_ms", "bigint", "How long a small transaction keeps the rule armed (event "
                                "time, ms, > 0)."),
        ("action", "string", "BLOCK (alerts go to fraud_alerts) or REVIEW (fraud_review)."),
        ("enabled", "boolean", "false: the rule does not fire and its armed flags are "
                               "dropped, until a version enables it again."),
    ),
    "transactions": (
        ("tx_id", "bigint", "Transaction id (a second copy within a batch is rejected)."),
        ("user_id", "string", "The paying user: the fraud pipeline's key (null: rejected)."),
        ("amount", "double", "Amount paid (null, NaN or negative: rejected)."),
        ("merchant", "string", "Where it was paid (null: rejected)."),
        ("ts", "bigint", "When it happened: event time, epoch ms, UTC (null: rejected)."),
    ),
    "fraud_alerts": _FRAUD_ALERT,
    "fraud_review": _FRAUD_ALERT,
    "fraud_rejected": (
        ("reason", "string", "Why the transaction was rejected: null_tx_id, null_user_id, "
                             "null_merchant, null_ts, nan_amount, negative_amount or "
                             "duplicate_tx_id."),
        ("raw_record", "string", "The raw transaction as JSON."),
        ("batch_id", "int", "The micro-batch that read it (the fraud pipeline's progress "
                            "log)."),
    ),
    # the scoring pipeline (jobs/scoring.py: declared through jobs/factory.py) and its inputs
    "models": (
        ("model_id", "string", "<segment>:<role>, one row per model (the broadcast state's "
                               "key)."),
        ("segment", "string", "The user segment the model scores (user_segments)."),
        ("role", "string", "champion or challenger (at most one of each per segment)."),
        ("traffic_share", "double", "Share of the segment's users the model scores (the "
                                    "challenger's: users whose CRC-32 bucket is below it)."),
        ("features", "array<string>", "Feature columns, in coefficient order."),
        ("coefficients", "array<double>", "Logistic-regression coefficient per feature."),
        ("intercept", "double", "Logistic-regression intercept."),
        ("reg_param", "double", "regParam the model was fitted with."),
        ("max_iter", "int", "maxIter the model was fitted with."),
        ("training_rows", "bigint", "(user, day) rows of the segment it was fitted on."),
        ("positives", "bigint", "Of those, rows whose user purchased the next day."),
        ("features_day", "date", "Newest user_features day of its training rows."),
        ("trained_at", "timestamp", "When the training ran (UTC)."),
    ),
    "scoring_events": _SCORING_EVENT,
    "scoring_unmatched": (
        *_SCORING_EVENT,
        ("_state_version", "string", "JSON {table: Delta version} of the models version "
                                     "that had no model for the event's segment."),
    ),
    "predictions": (
        ("event_id", "bigint", "The scored event."),
        ("user_id", "bigint", "The scored user."),
        ("segment", "string", "The user's segment (the event's)."),
        ("ts", "bigint", "Event time, epoch ms, UTC."),
        ("model_id", "string", "The model that scored it (models.model_id)."),
        ("role", "string", "champion or challenger."),
        ("model_version", "bigint", "The Delta version of models the batch applied (time "
                                    "travel to it gives the parameters used)."),
        ("score", "double", "P(purchase next day): sigmoid(intercept + coefficients . "
                            "features)."),
        ("prediction", "boolean", "score >= 0.5."),
        ("_state_version", "string", "JSON {table: Delta version} of the broadcast state "
                                     "that scored the row (lineage)."),
    ),
    "predictions_rejected": (
        ("reason", "string", "Why the event was rejected: null_event_id, null_user_id, "
                             "null_segment, null_ts, bad_<feature> or duplicate_event_id."),
        ("raw_record", "string", "The raw event as JSON."),
        ("batch_id", "int", "The micro-batch that read it (the scoring pipeline's progress "
                            "log)."),
    ),
    # the pipeline's own tables (assets of the maintenance job: jobs/maintenance.py)
    "enrichment_progress": _PROGRESS,
    "fraud_progress": _PROGRESS,
    "fraud_keyed_state": _KEYED_STATE,
    "enrichment_snapshots": _SNAPSHOTS,
    "scoring_progress": _PROGRESS,
    "scoring_snapshots": _SNAPSHOTS,
}  # fmt: skip


def column_schema(table: str) -> TableSchema:
    """The declared schema of ``table``, with a description per column."""
    return TableSchema(columns=[TableColumn(name=n, type=t, description=d)
                                for n, t, d in COLUMNS[table]])  # fmt: skip


def column_metadata(table: str) -> dict[str, Any]:
    """Definition metadata for ``table``'s asset: its declared column schema."""
    return {COLUMN_SCHEMA: column_schema(table)}


def describe(schema: StructType, table: str | None = None) -> TableSchema:
    """A Dagster ``TableSchema`` of a Spark schema, described from :data:`COLUMNS`
    (a column not listed there has no description)."""
    known = {n: d for n, _, d in COLUMNS.get(table or "", ())}
    return TableSchema(columns=[
        TableColumn(name=f.name, type=f.dataType.simpleString(), description=known.get(f.name))
        for f in schema.fields
    ])  # fmt: skip


def schemas(*tables: str) -> dict[str, TableSchema]:
    """The declared schema of each of ``tables`` that :data:`COLUMNS` lists (a pipeline
    declaration's ``columns``)."""
    return {t: column_schema(t) for t in tables if t in COLUMNS}
