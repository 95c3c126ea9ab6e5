"""Notebook 03's exercises: schedules and bubbles (example of the pattern)."""

from __future__ import annotations

from typing import Any

from zbkit.exercises._core import exercise


@exercise("03.1", "the smallest m (an int) for which ZB-H2 has no bubble at p = 4, F = I = W = 1")
def smallest_zero_bubble_m(answer: Any) -> tuple[bool, str]:
    from zbkit.schedules import Costs, build_schedule, simulate

    def rate(m: int) -> float:
        return simulate(build_schedule("zb-h2", pp=4, microbatches=m), Costs(1, 1, 1)).bubble_rate

    m = next(m for m in range(1, 64) if rate(m) < 1e-9)
    if not isinstance(answer, int) or isinstance(answer, bool):
        return False, f"give a whole number of microbatches, got {answer!r}"
    if answer == m:
        return True, f"ZB-H2's bubble is 0 from m = {m} = 2p-1 on (m = {m - 1}: {rate(m - 1):.1%})."
    if answer < 1:
        return False, f"m counts microbatches: at least 1, got {answer}"
    if answer > m:
        return False, f"m = {answer} has no bubble, but a smaller m already has none: go down"
    return False, f"at m = {answer} the simulated bubble is {rate(answer):.1%}: go up"
