"""The soak's memory verdict (:func:`benchmarks.soak._memory`) on samples built here:
dagster dev's processes are judged over the whole soak, the Spark server's figures over
the samples of the server that ran last (the one restarted after the server kill)."""

from typing import Any

from benchmarks.soak import DAGSTER_JUDGED, SERVER_JUDGED, _memory


def rec(server: list[tuple[int, float]], dagster: float = 300.0, grow: float = 0.0
        ) -> dict[str, Any]:
    """20 s samples and minute samples (one per 3 samples) of ``(server pid, MiB)``;
    dagster dev's processes at ``dagster`` MiB growing by ``grow`` per sample."""
    samples, minute = [], []
    for i, (pid, mib) in enumerate(server):
        d = dagster + grow * i
        samples.append({"t_s": 20.0 * i, "spark_pid": pid, "spark_mib": mib + 100,
                        "runs_mib": 0.0, "dagster_other_mib": 10.0,
                        **{k: d for k in DAGSTER_JUDGED}})
        if i % 3 == 0:
            minute.append({"t_s": 20.0 * i, "spark_pid": pid, "driver_jvm_mib": mib,
                           "driver_live_heap_mib": mib / 4, "driver_heap_committed_mib": mib,
                           "python_workers_mib": 100.0})
    return {"samples": samples, "minute": minute}


def test_the_server_is_judged_on_the_restarted_server_only() -> None:
    # the killed server had grown to 2 GiB; the restarted one holds 800 MiB
    m = _memory(rec([(1, 2048.0)] * 9 + [(2, 800.0)] * 27))
    assert m["flat"] and m["server_pid"] == 2 and m["server_samples"] == 27
    assert m["server_samples_from_s"] == 180.0
    assert set(m["judged"]) == {*DAGSTER_JUDGED, *SERVER_JUDGED}
    assert m["figures"]["driver_jvm_mib"]["max"] == 800.0


def test_a_growing_restarted_server_is_not_flat() -> None:
    m = _memory(rec([(1, 800.0)] * 9 + [(2, 400.0 + 60 * i) for i in range(27)]))
    assert not m["flat"]
    assert {"spark_mib", "driver_jvm_mib", "driver_live_heap_mib"} <= set(m["not_flat"])


def test_growing_dagster_processes_are_not_flat() -> None:
    m = _memory(rec([(1, 800.0)] * 30, grow=30.0))
    assert not m["flat"] and set(m["not_flat"]) == set(DAGSTER_JUDGED)
