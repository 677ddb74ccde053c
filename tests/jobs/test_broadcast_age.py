"""``dagster_lakecast.broadcast_age``: the age of the applied broadcast versions, against the commit
times ``deltalake`` reports for the same table (no Spark)."""

import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from dagster_lakecast.broadcast_age import broadcast_age


@pytest.fixture
def three_versions(tmp_path: Path) -> tuple[str, dict[int, float]]:
    """A table with versions 0, 1, 2 committed apart, and their commit times (s) as
    ``deltalake``'s history gives them."""
    path = str(tmp_path / "dim")
    for i in range(3):
        write_deltalake(path, pa.table({"k": [i], "v": [f"v{i}"]}), mode="append")
        time.sleep(0.05)
    times = {int(h["version"]): h["timestamp"] / 1000.0 for h in DeltaTable(path).history()}
    assert sorted(times) == [0, 1, 2]
    return path, times


def test_applied_version_behind_the_newest(three_versions: tuple[str, dict[int, float]]) -> None:
    path, times = three_versions
    at = times[2] + 5.0
    meta = broadcast_age(lambda _t: path, {"dim": 0}, at)
    assert meta["broadcast_versions_behind"] == 2
    assert meta["broadcast_age_seconds"] == pytest.approx(at - times[0], abs=1e-3)
    # stale since version 1 (the first newer one) committed
    assert meta["broadcast_stale_seconds"] == pytest.approx(at - times[1], abs=1e-3)
    row = meta["broadcast_age"].value["dim"]
    assert (row["version"], row["newest_version"], row["versions_behind"]) == (0, 2, 2)


def test_versions_committed_after_the_output_do_not_count(
    three_versions: tuple[str, dict[int, float]],
) -> None:
    path, times = three_versions
    at = (times[0] + times[1]) / 2  # the batch's output committed before version 1
    meta = broadcast_age(lambda _t: path, {"dim": 0}, at)
    assert meta["broadcast_versions_behind"] == 0
    assert meta["broadcast_stale_seconds"] == 0.0
    assert meta["broadcast_age_seconds"] == pytest.approx(at - times[0], abs=1e-3)


def test_newest_applied_and_tables_without_versions(
    three_versions: tuple[str, dict[int, float]],
) -> None:
    path, times = three_versions
    at = times[2] + 1.0
    meta = broadcast_age(lambda t: path, {"dim": 2, "flags": None}, at)
    assert meta["broadcast_versions_behind"] == 0
    assert meta["broadcast_stale_seconds"] == 0.0
    assert meta["broadcast_age_seconds"] == pytest.approx(1.0, abs=1e-3)
    assert set(meta["broadcast_age"].value) == {"dim"}
