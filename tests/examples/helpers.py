"""Helpers shared by the example tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from examples.common import HarnessDriver, Outputs, Step


def run_stepwise(driver: HarnessDriver, steps: Sequence[Step],
                 expected: Callable[[Sequence[Step]], Any],
                 actual: Callable[[Outputs], Any]) -> Outputs:
    """Run ``steps`` one by one, checking after each that the outputs so far equal the
    reference's outputs for the steps so far (so no output comes early or late)."""
    for i, step in enumerate(steps):
        driver.step(step)
        assert actual(driver.outputs) == expected(steps[: i + 1]), f"after step {i}"
    return driver.outputs
