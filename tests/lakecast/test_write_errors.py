"""A ``deltalake`` write failure reaches the user as one line naming the table, the kind
of failure and its fix, by cause (schema, concurrent commit, protocol, storage), with the
trace kept on the error's cause for the log."""

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaProtocolError

from lakecast.delta.arrow_write import append_arrow, overwrite_arrow, write_failure
from lakecast.delta.log import DeltaIOError


def test_rows_of_another_schema_name_the_table_and_the_fix(tmp_path: Path) -> None:
    path = str(tmp_path / "out")
    write_deltalake(path, pa.table({"id": pa.array([1], pa.int64())}))
    bad = pa.table({"id": pa.array(["one"], pa.string())})
    for write in (lambda: append_arrow(bad, path, merge_schema=False),
                  lambda: overwrite_arrow(bad, path)):
        with pytest.raises(DeltaIOError) as e:
            write()
        said = str(e.value)
        assert "\n" not in said and path in said, said
        assert "schema" in said and "function's output schema" in said, said
        assert e.value.__cause__ is not None  # the trace, for the log


@pytest.mark.parametrize("error,kind,fix", [
    (CommitFailedError("Transaction failed: conflict"), "concurrent commit conflict",
     "Run again"),
    (DeltaProtocolError("writer feature unsupported"), "unsupported table protocol",
     "write it with Spark"),
    (OSError("Permission denied"), "storage error", "writable"),
    (RuntimeError("something else"), "RuntimeError", "see the cause in the log"),
])
def test_each_cause_gets_its_own_fix(error: Exception, kind: str, fix: str) -> None:
    said = str(write_failure("appending 3 rows to the Delta table at /lake/out", error))
    assert said.startswith("appending 3 rows to the Delta table at /lake/out failed")
    assert f"({kind}: " in said and fix in said and "\n" not in said, said


def test_a_read_only_table_folder_is_a_storage_error(tmp_path: Path) -> None:
    import os

    if os.geteuid() == 0:  # root writes anywhere: a path under a file stands in
        target = tmp_path / "a_file"
        target.write_text("not a folder")
        path = str(target / "out")
    else:
        folder = tmp_path / "ro"
        folder.mkdir(mode=0o500)
        path = str(folder / "out")
    with pytest.raises(DeltaIOError) as e:
        append_arrow(pa.table({"id": [1]}), path)
    said = str(e.value)
    assert path in said and "\n" not in said, said
