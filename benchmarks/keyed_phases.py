"""Where a Lakecast batch of :mod:`benchmarks.keyed_state` spends its time: a probe, not
a benchmark (no target). The Lakecast side's batches at the benchmark's scale (100k events
over 200k keys), each step forced and timed on its own:

* ``read_events`` — the batch's events from the Change Data Feed, counted;
* ``state_read`` — :meth:`KeyedBroadcastRuntime.process` up to its lazy result (it reads
  the keyed state's metadata and plans the state join);
* ``job`` — the result persisted and counted: the state join, the shuffle and sort by key
  group, one Python call per event;
* ``write_output`` and ``commit_state`` — the output append and the state append.

``PYTHONPATH=. ../shared/tools/spark-lock .venv/bin/python -m benchmarks.keyed_phases``
writes ``benchmarks/results/keyed_state.phases.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

BATCHES, EVENTS, KEYS, SEED = 6, 100_000, 200_000, 7
ROOT = Path("var/bench/keyed_phases")
OUT = Path(__file__).resolve().parent / "results" / "keyed_state.phases.json"


class Laps:
    """Seconds between successive calls, by name."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self.mark = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = round(now - self.mark, 3)
        self.mark = now


def main() -> int:
    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir(parents=True)
    os.environ["LAKECAST_LAKE_ROOT"] = str(ROOT / "lake")
    os.environ["LAKECAST_CHECKPOINT_ROOT"] = str(ROOT / "checkpoints")
    from pyspark.sql import functions as F

    from benchmarks import keyed_state as ks
    from lakecast.delta import io as delta_io
    from lakecast.runtime.keyed import KeyedBroadcastRuntime
    from lakecast.spark import get_spark

    spark = get_spark({"spark.sql.shuffle.partitions": "8"}, app_name="keyed-phases")
    events_path = str(ROOT / "events")
    previous = ks.create_events_table(spark, events_path)
    appenders = ks.make_batches(spark, events_path, BATCHES, EVENTS, KEYS, SEED)
    state_path, output_path = str(ROOT / "state"), str(ROOT / "outputs")
    batches = []
    for i, append in enumerate(appenders):
        version = append()
        lap = Laps()

        runtime = KeyedBroadcastRuntime(spark, ks.CountAndLastKeyed(), {}, state_path,
                                        order_columns=("seq",), key_groups=128,
                                        parallelism=8, lineage=False)
        events = (delta_io.read_changes(spark, events_path, previous + 1, version)
                  .where(F.col("_change_type") == "insert")
                  .drop("_change_type", "_commit_version", "_commit_timestamp"))
        events.count()
        lap("read_events")
        result = runtime.process(events, batch_id=i, processing_time=i + 1).persist()
        lap("state_read")
        result.frame.count()
        lap("job")
        delta_io.write(result.main.select("key", "count", "last_amount"), output_path)
        lap("write_output")
        runtime.commit(result)
        lap("commit_state")
        result.unpersist()
        runtime.close()
        previous = version
        batches.append({"batch": i, "total_s": round(sum(lap.phases.values()), 3),
                        "phases_s": lap.phases})
        print(batches[-1], flush=True)
    spark.stop()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    OUT.write_text(json.dumps({"probe": "benchmarks.keyed_phases", "git_commit": commit,
                               "events_per_batch": EVENTS, "keys": KEYS,
                               "batches": batches}, indent=2) + "\n")
    print(f"-> {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
