"""The soak's storage criterion (:func:`benchmarks.soak_parts.storage_bounded`) on
per-minute samples built here: a sawtooth whose floor holds is bounded, one whose floor
rises or whose live state grows is not, whatever the phase of the teeth."""

from typing import Any

from benchmarks.soak_parts import storage_bounded

MIB = 2**20


def samples(floor: list[float], rise: float, state: list[float], phase: int = 0
            ) -> list[dict[str, Any]]:
    """30 one-minute samples: data bytes grow by ``rise`` MiB a minute and drop to the
    window's ``floor`` at each maintenance run (minute ``phase`` of every 10); the log
    grows by 10 KiB a minute; ``state`` gives the live state bytes per window."""
    out = []
    for i in range(30):
        window, minute = divmod(i, 10)
        since = (minute - phase) % 10
        data = floor[window] * MIB + since * rise * MIB
        log = 10 * 1024 * (i + 1)
        out.append({"disk": data + log, "log": log, "state": state[window]})
    return out


def test_a_sawtooth_over_a_flat_floor_is_bounded_at_any_phase() -> None:
    for phase in range(10):
        minute = samples([0.5, 2.0, 2.0], 0.45, [300e3, 400e3, 405e3], phase)
        result = storage_bounded(minute, "disk", "log", 10, state="state")
        assert result["bounded"], (phase, result)
        assert result["data_floor_bytes"][1:] == [2.0 * MIB, 2.0 * MIB]
        assert result["log_bytes_last"] == 30 * 10 * 1024


def test_a_rising_floor_is_not_bounded() -> None:
    minute = samples([0.5, 2.0, 3.0], 0.45, [400e3, 400e3, 400e3])
    assert not storage_bounded(minute, "disk", "log", 10, state="state")["bounded"]


def test_growing_live_state_is_not_bounded() -> None:
    minute = samples([0.5, 2.0, 2.0], 0.45, [200e3, 400e3, 800e3])
    assert not storage_bounded(minute, "disk", "log", 10, state="state")["bounded"]
    assert storage_bounded(minute, "disk", "log", 10)["bounded"]  # the files alone hold


def test_too_short_a_run_says_not_bounded() -> None:
    minute = samples([0.5, 2.0, 2.0], 0.45, [1, 1, 1])[:15]
    assert not storage_bounded(minute, "disk", "log", 10)["bounded"]
