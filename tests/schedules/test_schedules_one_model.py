"""One `Costs` is one model: every schedule, whatever its chunks per rank, runs the same work.

Issue 22's oracle: with one `Costs(1, 1, 1)` at p=4, m=8 the chunked schedules are no slower
than the one-chunk schedules they refine (ZB-V and interleaved ZB against ZB-H1, interleaved
1F1B, V-Half and V-Min against 1F1B), every rank is busy m(F+I+W) whatever its chunks, and
memory reads in one unit: 1F1B's rank 0 and ZB-V both peak at p, V-Half and V-Min below.
"""

from __future__ import annotations

import pytest

from zbkit.schedules import Costs, build_schedule, simulate
from zbkit.schedules.core.costs import MEMORY_UNIT, per_stage

P, M = 4, 8
ONE = Costs(1, 1, 1)
REFINES = {  # chunked schedule -> the one-chunk schedule it refines
    "zb-v": "zb-h1",
    "interleaved-zb": "zb-h1",
    "interleaved-1f1b": "1f1b",
    "v-half": "1f1b",
    "v-min": "1f1b",
}


def _sim(name: str, costs: Costs = ONE):
    return simulate(build_schedule(name, pp=P, microbatches=M), costs)


@pytest.mark.parametrize("chunked", sorted(REFINES))
def test_chunked_schedules_are_no_slower_than_what_they_refine(chunked: str) -> None:
    sim, base = _sim(chunked), _sim(REFINES[chunked])
    assert sim.schedule.stages_per_rank == 2 and base.schedule.stages_per_rank == 1
    assert sim.makespan <= base.makespan, (chunked, sim.makespan, base.makespan)
    # the same work on every rank: m (F + I + W) of the rank's share, in two halves
    assert sim.busy == pytest.approx([M * 3.0] * P) == base.busy


def test_the_numbers_a_learner_compares():
    spans = {name: _sim(name).makespan for name in ("1f1b", "zb-h1", "zb-v", "interleaved-1f1b")}
    assert spans == {"1f1b": 33, "zb-h1": 27, "zb-v": 25.5, "interleaved-1f1b": 28.5}
    assert _sim("zb-v").bubble_rate == 0.0


def test_memory_in_one_unit():
    one_f_one_b, zb_v = _sim("1f1b").peak_memory, _sim("zb-v").peak_memory
    assert one_f_one_b[0] == P and zb_v == [P] * P  # the same as 1F1B's rank 0
    assert max(_sim("v-min").peak_memory) < max(_sim("v-half").peak_memory) < P
    # a chunk's share: 1/v of the times and the memory, a hop's comm kept
    costs = Costs(F=2, I=3, W=1, comm=0.5, mem_activation=1, mem_weight=0.4)
    zbv = build_schedule("zb-v", pp=P, microbatches=M)
    half = Costs(F=1, I=1.5, W=0.5, comm=0.5, mem_activation=0.5, mem_weight=0.2)
    assert per_stage(costs, zbv.stage_to_rank) == [half] * 2 * P
    # a list is per stage, as given
    assert simulate(zbv, [half] * 2 * P).makespan == simulate(zbv, costs).makespan
    assert per_stage([costs] * 2 * P, zbv.stage_to_rank) == [costs] * 2 * P


def test_the_rule_is_said_where_a_learner_looks():
    assert "rank's share" in Costs.__doc__ and "share(v)" in Costs.__doc__
    from zbkit.viz import plot_memory

    title = plot_memory(_sim("zb-v")).axes[0].get_title(loc="left")
    assert MEMORY_UNIT in title and "chunk" not in title
