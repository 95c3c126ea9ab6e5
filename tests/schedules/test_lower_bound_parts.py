"""`lower_bound_parts`: the instant bound's pieces by name, the max of which is `lower_bound`.

Oracles: `lower_bound` itself, and two closed forms written out here (the busiest rank's
work, and the last stage's chain for one stage per rank).
"""

from __future__ import annotations

import pytest

from zbkit.schedules import Costs, lower_bound, lower_bound_parts

P, M = 4, 8
COSTS = Costs(F=1, I=1, W=0.5, mem_activation=1.0, mem_weight=0.3)


@pytest.mark.parametrize("placement", ["linear", "v"])
@pytest.mark.parametrize("limit", [3, 4.5, 5, 8])
def test_the_parts_max_is_lower_bound(placement: str, limit: float) -> None:
    parts = lower_bound_parts(
        pp=P, microbatches=M, costs=COSTS, memory_limit=limit, placement=placement
    )
    whole = lower_bound(pp=P, microbatches=M, costs=COSTS, memory_limit=limit, placement=placement)
    assert max(parts.values()) == pytest.approx(whole)
    assert "walk" in parts and ("V start" in parts) == (placement == "v")


def test_the_closed_forms_are_the_ones_written_here() -> None:
    parts = lower_bound_parts(pp=P, microbatches=M, costs=COSTS, memory_limit=5)
    c = COSTS
    assert parts["busy"] == pytest.approx(M * (c.F + c.I + c.W))  # 20
    # the last stage starts (p - 1)F late, runs m F and m I, its last I climbs p - 1 ranks
    assert parts["last stage"] == pytest.approx(
        (P - 1) * c.F + M * (c.F + c.I) + (P - 1) * c.I + c.W
    )


def test_no_walk_beyond_its_size_and_no_rank_0_forms_for_unequal_stages() -> None:
    big = lower_bound_parts(pp=8, microbatches=64, costs=COSTS, memory_limit=8)
    assert "walk" not in big  # 3 * 8 * 64 actions: more than the walk takes on
    mixed = [COSTS, COSTS, COSTS, Costs(F=2, I=2, W=1)]
    parts = lower_bound_parts(pp=P, microbatches=M, costs=mixed, memory_limit=5)
    assert "rank 0" not in parts and "last stage" not in parts
