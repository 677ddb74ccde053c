"""An Enrichment that overrides only ``transform`` / ``output_schema`` (the tutorial's
shape) keeps its lookups in the executor JVM and runs its transform vectorized after them
(:mod:`lakecast.runtime.lookup_transform`), on real Spark and Delta: the same rows, side
outputs and lineage as the Python workers and as pandas, version after version; what it
cannot do there fails with a clear error."""

from __future__ import annotations

import logging

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from lakecast import BroadcastRuntime, Enrichment
from lakecast.api.descriptors import MapStateDescriptor
from lakecast.delta import io as delta_io
from tests.lakecast.test_joins import _events, _function, _reference, _rows
from tests.lakecast.test_jvm_lookups import _users, _version_json, write_tables


@pytest.fixture
def tables(spark, tmp_path):
    return write_tables(spark, tmp_path)


class Priced(Enrichment):
    """The lookups of ``_function`` and, per event, ``spend`` = product price x 2 plus the
    user's ltv, and ``vip`` (the segment is VIP): columns the transform adds."""

    def transform(self, batch: pa.RecordBatch, ctx) -> pa.RecordBatch:
        spend = pc.add(pc.multiply(batch.column("product_price"), 2.0), batch.column("ltv"))
        vip = pc.fill_null(pc.equal(batch.column("segment"), "VIP"), False)
        return batch.append_column("spend", spend).append_column("vip", vip)

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        return super().output_schema(input_schema).append(
            pa.field("spend", pa.float64())).append(pa.field("vip", pa.bool_()))


def priced() -> Priced:
    base = _function()
    return Priced(base.lookups, on_missing=base.on_missing)


def priced_model(want: pd.DataFrame) -> pd.DataFrame:
    """pandas: :class:`Priced`'s columns over the lookups' expected rows."""
    return want.assign(spend=want["product_price"] * 2.0 + want["ltv"],
                       vip=want["segment"].eq("VIP").fillna(False))


class Rescaled(Priced):
    """:class:`Priced` that also replaces a column it got (``ltv`` x 10, in place): a
    column of the input that the transform makes, so it comes back from Python."""

    def transform(self, batch: pa.RecordBatch, ctx) -> pa.RecordBatch:
        out = super().transform(batch, ctx)
        i = out.schema.get_field_index("ltv")
        return out.set_column(i, "ltv", pc.multiply(out.column("ltv"), 10.0))


class Narrow(Rescaled):
    """:class:`Rescaled` declaring the columns its transform reads: it gets only them
    (only they go to the Python workers on the JVM path); every other column passes by."""

    transform_reads = ("product_price", "ltv", "segment")

    def transform(self, batch: pa.RecordBatch, ctx) -> pa.RecordBatch:
        assert batch.schema.names == list(self.transform_reads)
        return super().transform(batch, ctx)


@pytest.mark.parametrize("jvm, cls", [(True, Priced), (False, Priced), (True, Rescaled),
                                      (True, Narrow), (False, Narrow)],
                         ids=["jvm", "python", "jvm-replaces-a-column", "jvm-reads-three",
                              "python-reads-three"])
def test_a_transforming_enrichment_equals_pandas_on_both_paths(any_spark, tables, jvm, cls):
    spark = any_spark
    pdf, events = _events(spark)
    base = _function()
    runtime = BroadcastRuntime(spark, cls(base.lookups, on_missing=base.on_missing), tables,
                               jvm_lookups=jvm)
    assert runtime.state_engine == ("jvm" if jvm else "python")
    if jvm:
        assert "transform vectorized" in runtime.state_engine_reason
    products = delta_io.read(spark, tables["dim_products"]).toPandas()
    try:
        for version in (0, 2, 3):
            pinned = {"dim_users": version, "dim_products": 0}
            result = runtime.process(events, until=pinned)
            out = result.collect()
            want_main, want_unmatched = _reference(
                pdf, _users(spark, tables["dim_users"], version), products)
            main = _rows(out.main)
            assert list(main.columns)[-3:] == ["spend", "vip", "_state_version"]
            assert set(main["_state_version"]) == {_version_json(pinned)}
            want = priced_model(want_main)
            if issubclass(cls, Rescaled):
                want = want.assign(ltv=want["ltv"] * 10.0)
            pd.testing.assert_frame_equal(main.drop(columns=["_state_version"]), want,
                                          check_dtype=False)
            assert sorted(out.sides["unmatched"].column("event_id").to_pylist()) == \
                want_unmatched
            assert result.metrics().rows_in == len(pdf)
    finally:
        runtime.close()


def test_the_split_is_said_once_in_the_log(spark, tables, caplog):
    class SaidOnce(Priced):
        pass

    caplog.set_level(logging.INFO, logger="lakecast.runtime.engine")
    base = _function()
    for _ in range(2):
        BroadcastRuntime(spark, SaidOnce(base.lookups, on_missing=base.on_missing),
                         tables).close()
    said = [r.getMessage() for r in caplog.records if "SaidOnce: its lookups" in r.getMessage()]
    assert len(said) == 1 and "process_batch" in said[0]


FLAGS = MapStateDescriptor("flags")


class ReadsState(Priced):
    def transform(self, batch: pa.RecordBatch, ctx) -> pa.RecordBatch:
        ctx.get_broadcast_state(FLAGS)
        return super().transform(batch, ctx)


class DropsRows(Priced):
    def transform(self, batch: pa.RecordBatch, ctx) -> pa.RecordBatch:
        return super().transform(batch, ctx).slice(0, max(batch.num_rows - 1, 0))


class ChangesOnRealRows(Priced):
    """Returns ``ltv`` as it got it on the planning probe (null rows), changes it on rows
    with values: the fast path kept ``ltv`` in the JVM, so this must fail, not be lost."""

    def transform(self, batch: pa.RecordBatch, ctx) -> pa.RecordBatch:
        out = super().transform(batch, ctx)
        if batch.column("ltv").null_count == batch.num_rows:
            return out
        i = out.schema.get_field_index("ltv")
        return out.set_column(i, "ltv", pc.add(out.column("ltv"), 1.0))


class ReadsUnknown(Priced):
    transform_reads = ("segment", "price")


@pytest.mark.parametrize("cls, match", [
    (ReadsState, "ReadsState.transform reads the broadcast state 'flags'.*jvm_lookups=False"),
    (DropsRows, r"DropsRows.transform returned \d+ rows for a batch of \d+: transform keeps"),
    (ChangesOnRealRows, "ChangesOnRealRows.transform changed the column 'ltv'.*"
                        "jvm_lookups=False"),
    (ReadsUnknown, r"ReadsUnknown.transform_reads names \['price'\], which the enriched "
                   "batch does not have"),
])
def test_what_the_jvm_path_cannot_do_is_a_clear_error(spark, tables, cls, match):
    _, events = _events(spark)
    base = _function()
    runtime = BroadcastRuntime(spark, cls(base.lookups, on_missing=base.on_missing), tables)
    assert runtime.state_engine == "jvm"
    try:
        with pytest.raises(Exception, match=match) as err:  # when planned, or when it runs
            runtime.process(events, until={"dim_users": 0, "dim_products": 0}).collect()
        print(str(err.value)[:600])
    finally:
        runtime.close()
