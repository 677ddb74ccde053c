"""The soak's storage criterion (:func:`benchmarks.soak_parts.storage_bounded`) on
per-minute samples built here: a sawtooth whose floor holds is bounded, one whose floor
rises or whose live state grows is not, wherever the maintenance runs fall."""

from typing import Any

from benchmarks.soak_parts import storage_bounded

MIB = 2**20


def samples(floor: list[float], rise: float, state: list[float], phase: int = 0
            ) -> tuple[list[dict[str, Any]], list[float]]:
    """30 one-minute samples and the maintenance runs' ends: data bytes grow by ``rise``
    MiB a minute and drop to ``floor[k]`` when the k-th maintenance run ends (30 s after
    minute ``phase`` of every 10; before the first: ``floor[0]`` growing from minute 0);
    the log grows by 10 KiB a minute; ``state[k]``: the live state bytes meanwhile."""
    cuts = [60.0 * m + 30 for m in range(phase, 30, 10)]
    out = []
    for i in range(30):
        t = 60.0 * i
        k = sum(c <= t for c in cuts)
        since = (t - cuts[k - 1] - 30) / 60 if k else i
        data = floor[k] * MIB + since * rise * MIB
        log = 10 * 1024 * (i + 1)
        out.append({"t_s": t, "disk": data + log, "log": log, "state": state[k]})
    return out, cuts


def test_a_sawtooth_over_a_flat_floor_is_bounded_wherever_maintenance_falls() -> None:
    for phase in range(10):
        minute, cuts = samples([0.5, 2.0, 2.0, 2.0], 0.45, [300e3, 400e3, 405e3, 405e3], phase)
        result = storage_bounded(minute, "disk", "log", cuts, state="state")
        assert result["bounded"], (phase, result)
        assert result["data_floor_bytes"][-2:] == [2.0 * MIB, 2.0 * MIB], phase
        assert result["maintenance_ended_s"] == cuts
        assert result["log_bytes_last"] == 30 * 10 * 1024


def test_a_floor_still_rising_at_the_last_runs_is_not_bounded() -> None:
    """At phase 9 the last run ends after the last sample: two floors seen, 1 and 2 MiB."""
    minute, cuts = samples([0.5, 1.0, 2.0, 2.0], 0.45, [400e3] * 4, 9)
    result = storage_bounded(minute, "disk", "log", cuts)
    assert result["data_floor_bytes"] == [1.0 * MIB, 2.0 * MIB]
    assert not result["bounded"]


def test_a_rising_floor_is_not_bounded() -> None:
    for phase in (0, 5, 9):
        minute, cuts = samples([0.5, 1.0, 2.0, 3.0], 0.45, [400e3] * 4, phase)
        assert not storage_bounded(minute, "disk", "log", cuts, state="state")["bounded"]


def test_growing_live_state_is_not_bounded() -> None:
    minute, cuts = samples([0.5, 2.0, 2.0, 2.0], 0.45, [200e3, 400e3, 800e3, 1600e3], 3)
    assert not storage_bounded(minute, "disk", "log", cuts, state="state")["bounded"]
    assert storage_bounded(minute, "disk", "log", cuts)["bounded"]  # the files alone hold


def test_too_few_maintenance_runs_say_not_bounded() -> None:
    minute, cuts = samples([0.5, 2.0, 2.0, 2.0], 0.45, [1, 1, 1, 1], 3)
    assert not storage_bounded(minute, "disk", "log", [])["bounded"]
    assert not storage_bounded(minute[:12], "disk", "log", cuts[:1])["bounded"]
