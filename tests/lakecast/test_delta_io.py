"""Delta round trip through the factory's session and the Delta I/O layer."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import functions as F

from lakecast.delta import io as delta_io


def _frame(spark, rows):
    return spark.createDataFrame(pd.DataFrame(rows, columns=["id", "name", "score"]))


def test_round_trip_merge_time_travel_history_and_cdf(spark, lake):
    path = lake.table_path("people")
    assert delta_io.latest_version(path) is None

    v0 = delta_io.write(_frame(spark, [(1, "a", 1.0), (2, "b", 2.0)]), path, mode="overwrite")
    v1 = delta_io.write(_frame(spark, [(3, "c", 3.0)]), path)
    assert (v0, v1) == (0, 1)
    assert delta_io.table_properties(spark, path)[delta_io.CDF_PROPERTY] == "true"

    # MERGE: one changed row, one unchanged row, one new row
    res = delta_io.merge_upsert(
        spark, _frame(spark, [(1, "a", 1.0), (2, "b", 20.0), (4, "d", 4.0)]), path, keys=["id"]
    )
    assert (res.version, res.inserted, res.updated, res.deleted) == (2, 1, 1, 0)

    now = delta_io.read(spark, path).toPandas().sort_values("id").reset_index(drop=True)
    expected = pd.DataFrame(
        {"id": [1, 2, 3, 4], "name": list("abcd"), "score": [1.0, 20.0, 3.0, 4.0]}
    )
    pd.testing.assert_frame_equal(now, expected, check_dtype=False)

    # time travel
    assert delta_io.read(spark, path, version=0).count() == 2
    assert delta_io.read(spark, path, version=1).count() == 3

    # history, newest first, and cheap log reads agree with it
    hist = delta_io.history(spark, path)
    assert [h["version"] for h in hist] == [2, 1, 0]
    assert hist[0]["operation"] == "MERGE"
    assert delta_io.latest_version(path) == 2
    assert delta_io.commit_info(path, 2).operation == "MERGE"

    # Change Data Feed of the MERGE holds only the changed and inserted rows
    cdf = delta_io.read_changes(spark, path, 2, 2).select("id", "_change_type").toPandas()
    got = sorted(map(tuple, cdf.itertuples(index=False)))
    assert got == [(2, "update_postimage"), (2, "update_preimage"), (4, "insert")]

    # CDF between two versions spans both commits
    span = delta_io.read_changes(spark, path, 1, 2)
    assert span.select(F.countDistinct("_commit_version")).first()[0] == 2


def test_idempotent_write_with_txn(spark, lake):
    path = lake.table_path("txn")
    df = _frame(spark, [(1, "a", 1.0)])
    delta_io.write(df, path, txn=("app", 0))
    delta_io.write(df, path, txn=("app", 0))  # a retry: skipped by Delta
    delta_io.write(df, path, txn=("app", 1))
    assert delta_io.read(spark, path).count() == 2


def test_merge_without_changes_commits_nothing_new(spark, lake):
    path = lake.table_path("same")
    rows = [(1, "a", 1.0), (2, "b", 2.0)]
    first = delta_io.merge_upsert(spark, _frame(spark, rows), path, keys=["id"])
    assert first.created and first.inserted == 2
    again = delta_io.merge_upsert(spark, _frame(spark, rows), path, keys=["id"])
    assert again.changed == 0
    assert again.version == first.version == delta_io.latest_version(path)  # no empty commit
    assert delta_io.read_changes(spark, path, again.version, again.version).filter(
        "_change_type != 'insert' OR _commit_version > 0"
    ).count() == 0


# ----------------------------------------------------------------------------- direct reads
def _sorted(table, key="id"):
    return table.sort_by([(key, "ascending")])


def _assert_same_as_spark(spark, path, version):
    """table_files(...).read() equals Spark's own read of the version (rows and schema)."""
    files = delta_io.table_files(path, version)
    got = files.read()
    want = delta_io.read(spark, path, version=version).toArrow()
    assert got.schema.names == want.schema.names
    assert [f.type for f in got.schema] == [f.type for f in want.schema]
    assert files.num_rows == want.num_rows
    assert _sorted(got).to_pylist() == _sorted(want.cast(got.schema)).to_pylist()


def _typed(spark, ids, tag):
    return spark.range(*ids).select(
        F.col("id"), F.concat(F.lit(tag), F.col("id").cast("string")).alias("name"),
        (F.col("id") * 1.5).alias("score"),
        (F.col("id") * 0.01).cast("decimal(10,2)").alias("price"),
        F.expr("date_add(DATE'2026-01-01', cast(id % 30 as int))").alias("day"),
        F.expr("timestamp_seconds(1767225600 + id)").alias("ts"),
        (F.col("id") % 2 == 0).alias("even"),
        F.array(F.lit(tag), F.col("id").cast("string")).alias("tags"),
        F.when(F.col("id") % 7 == 0, None).otherwise(F.col("id")).alias("maybe"),
    )


def test_table_files_equal_spark_reads_after_merge_deletes_checkpoint_and_evolution(spark, lake):
    path = lake.table_path("direct")
    delta_io.write(_typed(spark, (0, 300), "a"), path, mode="overwrite")  # v0
    # v1: MERGE updating 1/10 of the rows, inserting 50 and deleting the rows gone from it
    src = _typed(spark, (20, 350), "a").withColumn(
        "name", F.when(F.col("id") % 10 == 0, F.lit("changed")).otherwise(F.col("name")))
    res = delta_io.merge_upsert(spark, src, path, keys=["id"], delete_missing=True)
    assert res.deleted == 20 and res.updated > 0 and res.inserted == 50
    for v in range(0, 2):
        _assert_same_as_spark(spark, path, v)
    # many small commits: Delta writes a checkpoint at version 10
    for i in range(2, 13):
        delta_io.write(_typed(spark, (1000 + 10 * i, 1005 + 10 * i), f"w{i}"), path)
        if i % 3 == 0:
            delta_io.delete(spark, path, f"id = {1000 + 10 * (i - 1)}")
    log = sorted(p.name for p in (Path(path) / "_delta_log").iterdir())
    assert any(".checkpoint." in n and n.endswith(".parquet") for n in log), log
    latest = delta_io.latest_version(path)
    assert latest is not None and latest > 10
    for v in (9, 10, latest):
        _assert_same_as_spark(spark, path, v)
    # schema evolution: a new column; older files have no such column (nulls)
    delta_io.write(_typed(spark, (5000, 5010), "e").withColumn("extra", F.lit("x")), path,
                   merge_schema=True)
    _assert_same_as_spark(spark, path, latest + 1)
    # the log before the checkpoint is gone (log cleanup): the checkpoint alone serves it
    for n in log:
        if n.endswith(".json") and int(n.split(".")[0]) < 10:
            (Path(path) / "_delta_log" / n).unlink()
    _assert_same_as_spark(spark, path, latest + 1)
    with pytest.raises(delta_io.DirectReadUnsupported, match="cannot load this version"):
        delta_io.table_files(path, 5)


def test_table_files_read_partitioned_tables_by_partition_and_verify_checksums(spark, lake):
    """Integer and string partition columns come from the log; a partition filter reads
    only its files; a file whose bytes no longer match Hadoop's checksum is refused."""
    path = lake.table_path("direct_partitioned")
    df = _typed(spark, (0, 120), "p").withColumn("bucket", F.col("id") % 3) \
        .withColumn("label", F.when(F.col("id") % 4 == 0, None)
                    .otherwise(F.concat(F.lit("l"), (F.col("id") % 2).cast("string"))))
    delta_io.write(df, path, mode="overwrite", partition_by=["bucket", "label"])
    delta_io.write(_typed(spark, (500, 510), "q").withColumn("bucket", F.lit(7).cast("long"))
                   .withColumn("label", F.lit("l9")), path)
    version = delta_io.latest_version(path)
    _assert_same_as_spark(spark, path, version)
    files = delta_io.table_files(path, version)
    got = files.read(["id", "bucket", "label"], {"bucket": 1})
    want = (delta_io.read(spark, path).where("bucket = 1").select("id", "bucket", "label")
            .toArrow())
    assert got.num_rows == want.num_rows == 40
    assert _sorted(got).to_pylist() == _sorted(want.cast(got.schema)).to_pylist()
    assert files.read(["id"], {"bucket": 7}).column("id").to_pylist() == list(range(500, 510))
    # past a Delta log checkpoint (its add actions hold partition values as a Parquet map)
    for i in range(10):
        delta_io.write(_typed(spark, (600 + i, 601 + i), "c").withColumn(
            "bucket", F.lit(8).cast("long")).withColumn("label", F.lit(f"c{i}")), path)
    log = [p.name for p in (Path(path) / "_delta_log").iterdir()]
    assert any(".checkpoint." in n and n.endswith(".parquet") for n in log), log
    _assert_same_as_spark(spark, path, delta_io.latest_version(path))
    assert delta_io.table_files(path, delta_io.latest_version(path)).read(
        ["id"], {"bucket": 8}).num_rows == 10
    # damage one file's bytes in place: Spark's checksum would catch it, so does the read
    victim = next(f for f, part in zip(files.files, files.partitions, strict=True)
                  if part["bucket"] == "7")
    with open(victim, "r+b") as fh:
        fh.seek(Path(victim).stat().st_size // 2)
        fh.write(b"\xde\xad\xbe\xef")
    with pytest.raises(delta_io.DeltaIOError, match="checksum error"):
        files.read(["id"], {"bucket": 7})
    assert files.read(["id"], {"bucket": 1}).num_rows == 40  # other files still read


@pytest.mark.parametrize("kind", ["deletion_vectors", "partitioned", "column_mapping"])
def test_table_files_refuses_what_it_cannot_read(spark, lake, kind):
    path = lake.table_path(f"unsafe_{kind}")
    df = _typed(spark, (0, 50), "u")
    if kind == "partitioned":
        delta_io.write(df, path, mode="overwrite", partition_by=["even"])
        match = "partition columns"
    else:
        delta_io.write(df, path, mode="overwrite")
        prop = ("'delta.enableDeletionVectors' = 'true'" if kind == "deletion_vectors" else
                "'delta.columnMapping.mode' = 'name', 'delta.minReaderVersion' = '2', "
                "'delta.minWriterVersion' = '5'")
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({prop})")
        delta_io.delete(spark, path, "id = 3")
        match = "deletion vectors" if kind == "deletion_vectors" else "column mapping"
    with pytest.raises(delta_io.DirectReadUnsupported, match=match):
        delta_io.table_files(path, delta_io.latest_version(path))
    # the broadcast source falls back to Spark and says so
    from lakecast import read_broadcast_elements
    from lakecast.delta.source import DeltaFilesElement

    (el,) = read_broadcast_elements(spark, {"t": path}, {})
    assert not isinstance(el, DeltaFilesElement)
    assert "read with Spark" in el.reason and el.num_rows == 49 + (kind == "partitioned")


def test_source_full_element_is_a_file_list_that_pickles_without_rows(spark, lake):
    import pickle

    from lakecast import read_broadcast_elements
    from lakecast.delta.source import DeltaFilesElement

    path = lake.table_path("files_element")
    delta_io.write(_typed(spark, (0, 2000), "f"), path, mode="overwrite")
    (el,) = read_broadcast_elements(spark, {"t": path}, {})
    assert isinstance(el, DeltaFilesElement) and el.kind == "full" and el.num_rows == 2000
    assert "initial load" in el.reason
    small = len(pickle.dumps(el))
    want = delta_io.read(spark, path).toArrow()
    assert el.schema == want.schema
    assert _sorted(el.rows).to_pylist() == _sorted(want).to_pylist()
    assert len(pickle.dumps(el)) == small < want.nbytes / 10  # rows never travel
    copy = pickle.loads(pickle.dumps(el))
    assert copy.num_rows == 2000 and _sorted(copy.rows).equals(_sorted(el.rows))


def test_arrow_append_is_exactly_once_merges_schema_and_reads_back_in_spark(spark, lake):
    import pyarrow as pa

    path = lake.table_path("arrow_out")
    first = pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["a", "b"]})
    assert delta_io.append_arrow(first, path, txn=("app", 0)) == 0  # created by delta-rs
    assert delta_io.append_arrow(first, path, txn=("app", 0)) is None  # a retry: skipped
    wider = pa.table({"id": pa.array([3], pa.int64()), "name": ["c"], "score": [3.5]})
    assert delta_io.append_arrow(wider, path, txn=("app", 1)) == 1
    # a Spark append after the delta-rs ones keeps the same exactly-once bookkeeping
    spark_rows = spark.createDataFrame([(4, "d", 4.0)], "id LONG, name STRING, score DOUBLE")
    assert delta_io.write(spark_rows, path, txn=("app", 1)) == 1  # txn 1 done: skipped
    assert delta_io.write(spark_rows, path, txn=("app", 2)) == 2
    got = delta_io.read(spark, path).toPandas().sort_values("id").reset_index(drop=True)
    want = pd.DataFrame({"id": [1, 2, 3, 4], "name": list("abcd"),
                         "score": [None, None, 3.5, 4.0]})
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    assert delta_io.table_properties(spark, path)[delta_io.CDF_PROPERTY] == "true"
    cdf = delta_io.read_changes(spark, path, 1, 2).toPandas()
    assert sorted(cdf.id) == [3, 4] and set(cdf._change_type) == {"insert"}
    with pytest.raises(delta_io.DeltaIOError, match="arrow_out"):  # names the table
        delta_io.append_arrow(pa.table({"id": ["not a number"]}), path, txn=("app", 3))


@pytest.mark.connect
def test_strings_of_map_in_arrow_over_connect_are_written_as_plain_strings(connect_spark,
                                                                           connect_lake):
    """Over Spark Connect, ``mapInArrow``'s string columns arrive as "string collate
    UTF8_BINARY"; written as they are, Delta records that in the table's schema and
    delta-rs (table maintenance, direct reads) refuses the table. ``write`` writes plain
    types: delta-rs opens the table and reads the rows back."""
    from deltalake import DeltaTable

    def tag(batches):
        import pyarrow as pa

        for b in batches:
            ids = b.column("id").to_pylist()
            yield pa.record_batch({"id": ids, "name": [f"n{i}" for i in ids],
                                   "tags": [[f"t{i}"] for i in ids]})

    frame = connect_spark.range(4).mapInArrow(tag, "id long, name string, tags array<string>")
    path = connect_lake.table_path("collated")
    delta_io.write(frame, path)
    table = DeltaTable(path)
    types = {f.name: f.type for f in table.schema().fields}
    assert types["name"].type == "string" and types["tags"].element_type.type == "string"
    rows = table.to_pyarrow_table().sort_by("id").to_pylist()
    assert rows == [{"id": i, "name": f"n{i}", "tags": [f"t{i}"]} for i in range(4)]
