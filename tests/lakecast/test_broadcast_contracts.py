"""Table contracts of broadcast versions, the CDF-gap classification and the malformed flag:
the Spark-free logic (the pipeline-level behaviour is in tests/jobs/test_broadcast_validation.py).
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from jobs.storefront.enrichment import (
    FEATURE_FLAGS,
    FLAGS_CONTRACT,
    StorefrontEnrichment,
    check_vip_discount,
)
from lakecast import BroadcastTestHarness, Lookup
from lakecast.api.contracts import TableContract, check_version
from lakecast.api.element import BroadcastElement
from lakecast.delta.source import known_cdf_gap
from lakecast.errors import LakecastError

PRODUCTS = TableContract("dim_products", ("product_id",), ("category", "price"))


def _products(ids, categories=None) -> pa.Table:
    categories = categories or [f"c{i}" for i in range(len(ids))]
    return pa.table({"product_id": pa.array(ids, pa.int64()), "category": categories,
                     "price": [1.0] * len(ids)})


def test_a_good_version_passes():
    t = _products([1, 2, 3])
    assert check_version(PRODUCTS, t, t.schema, 7) == []


def test_duplicate_keys_are_named_with_the_fix():
    t = _products([1, 2, 1, 3, 3, 3])
    (why,) = check_version(PRODUCTS, t, t.schema, 4)
    assert why.startswith("dim_products@v4: 2 duplicate key(s): ")
    assert "product_id=1 (2 rows)" in why and "product_id=3 (3 rows)" in why
    assert why.endswith("write a version of dim_products with one row per product_id")


def test_null_keys_are_counted_and_not_reported_as_duplicates():
    t = _products([1, None, None, 2])
    (why,) = check_version(PRODUCTS, t, t.schema, 2)
    assert why == ("dim_products@v2: 2 row(s) with a null key (product_id); write a version "
                   "of dim_products without null product_id")


def test_a_missing_used_column_is_refused_from_the_schema_alone():
    schema = pa.schema([("product_id", pa.int64()), ("price", pa.float64())])
    (why,) = check_version(PRODUCTS, None, schema, 9)
    assert why == ("dim_products@v9: column(s) 'category' missing from the table's schema "
                   "(the function uses them); write a version of dim_products that has "
                   "column(s) 'category'")


def test_lookups_declare_their_contracts():
    fn = StorefrontEnrichment()
    contracts = {c.table: c for c in fn.table_contracts()}
    assert contracts["dim_products"] == TableContract(
        "dim_products", ("product_id",), ("category", "price"))
    assert contracts["user_segments"].key_columns == ("user_id",)
    assert contracts["user_segments"].columns == ("segment",)
    assert contracts[FEATURE_FLAGS] is FLAGS_CONTRACT
    assert all(c.on_invalid == "refuse_and_continue" for c in contracts.values())
    strict = Lookup("t", key={"k_event": "k"}, on_invalid="fail").contract
    assert (strict.key_columns, strict.columns, strict.on_invalid) == (("k",), (), "fail")
    with pytest.raises(ValueError, match="on_invalid"):
        TableContract("t", ("k",), on_invalid="ignore")  # type: ignore[arg-type]


def _flags(value, enabled=True) -> pa.Table:
    return pa.table({"flag": ["other", "vip_discount"], "enabled": [True, enabled],
                     "value": ["x", value]})


@pytest.mark.parametrize("value", ["ten", "", None, "-5", "150", "nan"])
def test_a_malformed_enabled_vip_discount_refuses_the_version(value):
    t = _flags(value)
    (why,) = check_version(FLAGS_CONTRACT, t, t.schema, 3)
    assert why == (f"feature_flags@v3: flag='vip_discount' has value={value!r}, not a percent "
                   "from 0 to 100; write a version of feature_flags whose vip_discount value "
                   "is a number (e.g. `lakecast flag set vip_discount 10`)")


def test_usable_or_disabled_vip_discount_values_pass():
    for t in (_flags("12.5"), _flags("0"), _flags("100"), _flags("ten", enabled=False)):
        assert check_vip_discount(t, FEATURE_FLAGS, 1) == []


def test_a_malformed_flag_in_state_fails_loudly_never_a_silent_zero():
    """Without the pipeline's gate (e.g. the harness), the function raises instead of
    reading the discount as 0."""
    fn = StorefrontEnrichment()
    h = BroadcastTestHarness(fn)
    h.process_broadcast_elements([
        BroadcastElement.of("dim_products", 0, [{"product_id": 1, "category": "a",
                                                 "price": 1.0}]),
        BroadcastElement.of("user_segments", 0, [{"user_id": 1, "segment": "VIP"}]),
        BroadcastElement.of(FEATURE_FLAGS, 5, [{"flag": "vip_discount", "enabled": True,
                                                "value": "ten"}]),
    ])
    with pytest.raises(LakecastError, match=r"feature_flags@v5: flag='vip_discount' has "
                                            r"value='ten'"):
        h.process_elements([{"event_id": 1, "user_id": 1, "product_id": 1}])


@pytest.mark.parametrize(("message", "gap"), [
    ("[DELTA_MISSING_CHANGE_DATA] Error getting change data for range [1 , 4] as change data "
     "was not recorded for version [2].", "not recorded"),
    ("An error occurred while calling o81.toArrow.\n: org.apache.spark.SparkException: "
     "[FAILED_READ_FILE.FILE_NOT_EXIST] Error while reading file x.parquet. File does not "
     "exist.", "vacuumed"),
    ("[DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE] Retrieving table changes between "
     "version 1 and 3 failed", "schema changed"),
    ("[DELTA_VERSION_NOT_FOUND] Cannot time travel Delta table to version 1.", "log"),
])
def test_known_cdf_gaps_are_recognised(message, gap):
    why = known_cdf_gap(RuntimeError(message))
    assert why is not None and gap in why


@pytest.mark.parametrize("message", [
    "[FAILED_READ_FILE.CANNOT_READ_FILE_FOOTER] Could not read footer for file x.parquet",
    "java.lang.OutOfMemoryError: Java heap space",
    "[INTERNAL_ERROR] something else",
    "Connection reset by peer",
])
def test_other_cdf_reader_errors_are_faults_not_gaps(message):
    assert known_cdf_gap(RuntimeError(message)) is None
