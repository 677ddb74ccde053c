"""A micro-batch pipeline of a pure enrich(Lookup...) in its three executions — task-local
state in the executor JVM (the default), broadcast joins (``execution="joins"``) and
task-local state in the Python workers (``jvm_lookups=False``, checkpointed) — writes, batch
by batch, the same rows, across a broadcast change and a refused version, and what pandas
computes from the table versions each batch planned."""

from __future__ import annotations

import json

import pandas as pd

from assets.tables import DIM_PRODUCTS, EVENTS, USER_SEGMENTS
from jobs.storefront.enrichment import validate_events
from lakecast import Lookup, enrich
from lakecast.build import broadcast_pipeline
from lakecast.delta import io as delta_io
from lakecast.pipeline.micro_batch import PipelineSpec
from lakecast.snapshots.runtime import SnapshottingRuntime
from tests.jobs import microbatch_lake as ml


def _spec(name: str) -> PipelineSpec:
    return PipelineSpec(name=name, events_table=EVENTS,
                        broadcast_tables=(DIM_PRODUCTS, USER_SEGMENTS),
                        output_table=f"{name}_enriched",
                        side_outputs={"unmatched": f"{name}_unmatched"},
                        rejected_table=f"{name}_rejected")


def _function():
    return enrich(
        Lookup(DIM_PRODUCTS, key="product_id",
               columns={"category": "product_category", "price": "product_price"},
               on_missing="unmatched"),
        Lookup(USER_SEGMENTS, key="user_id", columns=["segment"], defaults={"segment": "NEW"}),
    )


def _read(spark, lake, table: str) -> pd.DataFrame:
    df = delta_io.read(spark, lake.table_path(table)).toPandas()
    if "raw_record" in df.columns:  # rejected: (reason, raw_record JSON, batch_id)
        df["event_id"] = [json.loads(r).get("event_id") for r in df["raw_record"]]
        return df.sort_values(["event_id", "reason"]).reset_index(drop=True)
    return df.sort_values("event_id").reset_index(drop=True)


def test_a_pure_lookup_pipeline_writes_the_same_rows_in_each_execution_as_pandas(spark, lake):
    ml.build(spark, lake)
    options = {"tasks": {}, "joins": {"execution": "joins"}, "python": {"jvm_lookups": False}}
    pipelines = {
        name: broadcast_pipeline(spark, _spec(f"lookups_{name}"), _function(),
                                 table_path=lake.table_path,
                                 checkpoint_root=lake.checkpoint_root,
                                 validator=validate_events, **opts)
        for name, opts in options.items()
    }
    # the default keeps a pure lookup's state in the executor JVM: nothing to checkpoint
    assert {n: (p.runtime.state_engine, isinstance(p.runtime, SnapshottingRuntime))
            for n, p in pipelines.items()} == {
        "tasks": ("jvm", False), "joins": ("joins", False), "python": ("python", True)}
    results = {e: [] for e in pipelines}
    batches = [ml.events(0, 300, seed=31)]
    ml.write_events(spark, lake, batches[0])
    for e, p in pipelines.items():
        results[e] += p.run()
    # each batch names where its state lived and why
    engines = {e: (r[0].state_engine, r[0].state_engine_reason) for e, r in results.items()}
    assert engines["tasks"] == ("jvm", "a pure enrich(Lookup...): its state in the executor "
                                       "JVM"), engines
    assert engines["joins"][0] == "joins" and "execution='joins'" in engines["joins"][1]
    assert engines["python"] == ("python", "jvm_lookups=False"), engines
    # segments v1: user 1 REGULAR, user 5 VIP; products v1: product 2 twice (refused)
    segs2 = pd.DataFrame({"user_id": [1, 2, 3, 4, 5],
                          "segment": ["REGULAR", "REGULAR", "CHURNING", "VIP", "VIP"]})
    delta_io.write(spark.createDataFrame(segs2), lake.table_path(USER_SEGMENTS),
                   mode="overwrite")
    delta_io.write(spark.createDataFrame([(2, "p2b", "garden", 21.0)],
                                         "product_id LONG, name STRING, category STRING, "
                                         "price DOUBLE"), lake.table_path(DIM_PRODUCTS))
    batches.append(ml.events(1000, 300, seed=32))
    ml.write_events(spark, lake, batches[1])
    for e, p in pipelines.items():
        results[e] += p.run()

    assert [len(r) for r in results.values()] == [2, 2, 2]
    segments = [ml.segments_v1(), segs2]
    # pandas, from the events alone: the valid events (the validator's rules, rewritten in
    # ml.expected) and where each goes (products v0 in both batches: v1 is refused)
    models = [ml.expected(ev, segments[i], 10.0) for i, ev in enumerate(batches)]
    for i, (tasks, joins, python) in enumerate(zip(
            results["tasks"], results["joins"], results["python"], strict=True)):
        for other in (joins, python):
            assert other.state_version == tasks.state_version
            assert other.refused_versions == tasks.refused_versions
        m = models[i]
        want = {"events_in": len(batches[i]), "rejected": len(m["rejected"]),
                "processed": len(m["accepted"]), "output": len(m["enriched"]),
                "unmatched": len(m["unmatched"])}
        for r in (tasks, joins, python):
            assert {k: r.counts[k] for k in want} == want
        # the joins plan holds no state between batches; task-local state does (one
        # copy per executor JVM, or per Python task)
        assert joins.state_bytes_per_task == 0 < tasks.state_bytes_per_task
        assert python.state_bytes_per_task > 0
    assert results["joins"][1].state_version == {DIM_PRODUCTS: 0, USER_SEGMENTS: 1}
    assert [(r["table"], r["version"]) for r in results["joins"][1].refused_versions] == [
        (DIM_PRODUCTS, 1)]

    out = {e: {kind: _read(spark, lake, f"lookups_{e}_{kind}")
               for kind in ("enriched", "unmatched", "rejected")} for e in pipelines}
    for kind in ("enriched", "unmatched", "rejected"):
        for other in ("tasks", "python"):
            try:
                pd.testing.assert_frame_equal(out["joins"][kind], out[other][kind])
            except AssertionError as e:
                raise AssertionError(f"{other} {kind} differs from joins: {e}") from None

    # pandas: each batch's valid events against the versions it planned
    enriched, unmatched = out["joins"]["enriched"], out["joins"]["unmatched"]
    rejected = out["joins"]["rejected"]
    products = ml.products().rename(columns={"category": "product_category",
                                             "price": "product_price"})
    for i, ev in enumerate(batches):
        # every event is in one output once: enriched, unmatched or rejected
        ids = set(ev["event_id"])
        n_out = sum(int(t["event_id"].isin(ids).sum()) for t in (enriched, unmatched, rejected))
        assert n_out == len(ev)
        bad = rejected[rejected["event_id"].isin(ids)]
        assert sorted(zip(bad["event_id"], bad["reason"], strict=True)) == sorted(
            zip(models[i]["rejected"]["event_id"], models[i]["rejected"]["reason"],
                strict=True))
        valid = ev[ev["event_id"].isin(models[i]["accepted"]["event_id"])].drop_duplicates(
            "event_id")
        assert len(valid) == len(models[i]["accepted"])
        want = valid.merge(products[["product_id", "product_category", "product_price"]],
                           on="product_id", how="left", indicator="found")
        want = want.merge(segments[i], on="user_id", how="left")
        want["segment"] = want["segment"].fillna("NEW")
        hit = want[want["found"] == "both"].sort_values("event_id")
        got = enriched[enriched["event_id"].isin(valid["event_id"])]
        assert list(got["event_id"]) == list(hit["event_id"])
        assert list(got["segment"]) == list(hit["segment"])
        assert list(got["product_category"]) == list(hit["product_category"])
        assert list(got["product_price"]) == list(hit["product_price"])
        assert {json.dumps(json.loads(v), sort_keys=True) for v in got["_state_version"]} == {
            json.dumps({DIM_PRODUCTS: 0, USER_SEGMENTS: i}, sort_keys=True)}
        missed = unmatched[unmatched["event_id"].isin(valid["event_id"])]
        assert sorted(missed["event_id"]) == sorted(want[want["found"] == "left_only"]
                                                    ["event_id"])
