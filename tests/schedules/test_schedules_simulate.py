"""The simulator against timelines worked out by hand."""

import pytest

from zbkit.schedules import Costs, Event, Schedule, build_schedule, simulate


def test_1f1b_two_ranks_with_comm_by_hand():
    # rank 0: F0 F1 B0 B1; rank 1: F0 B0 F1 B1. F=1, B=I+W=3, comm=0.5 on every hop.
    s = build_schedule("1f1b", pp=2, microbatches=2)
    sim = simulate(s, Costs(F=1, I=2, W=1, comm=0.5))
    assert sim.events == [
        Event(0, 0, "F", 0, 0, 1),
        Event(0, 0, "F", 1, 1, 2),
        Event(0, 0, "B", 0, 6, 9),  # waits for rank 1's B0 (ends 5.5) + comm
        Event(0, 0, "B", 1, 10, 13),
        Event(1, 1, "F", 0, 1.5, 2.5),
        Event(1, 1, "B", 0, 2.5, 5.5),
        Event(1, 1, "F", 1, 5.5, 6.5),
        Event(1, 1, "B", 1, 6.5, 9.5),
    ]
    assert sim.makespan == 13
    assert sim.span == [13, 8] and sim.busy == [8, 8] and sim.idle == [5, 0]
    assert sim.bubble_rate == pytest.approx((13 - 2 * 4) / 13)
    assert sim.peak_memory == [2, 1]
    # one memory rule (schedules.events): growth lands at an action's start, shrinking at its end
    assert sim.memory[0] == [(0, 0), (0, 1), (1, 2), (9, 1), (13, 0)]
    assert sim.schedule is s and sim.costs.comm == 0.5


def test_split_backward_memory_by_hand():
    # zb-h1, p=2, m=2: rank 0 F0 F1 I0 W0 I1 W1, rank 1 F0 I0 F1 I1 W0 W1
    s = build_schedule("zb-h1", pp=2, microbatches=2)
    sim = simulate(s, Costs(mem_activation=2, mem_weight=0.5))
    held0 = [v for _, v in sim.memory[0]]
    assert held0 == [0, 2, 4, 2.5, 2, 0.5, 0]
    assert sim.peak_memory == [4, 2.5]
    assert [v for _, v in sim.memory[1]] == [0, 2, 0.5, 2.5, 1, 0.5, 0]


def test_per_stage_costs():
    s = Schedule.from_program([["0F0", "0B0"], ["1F0", "1B0"]])
    sim = simulate(s, [Costs(1, 1, 1), Costs(2, 2, 2)])
    assert [(e.start, e.end) for e in sim.events] == [(0, 1), (7, 9), (1, 3), (3, 7)]
    assert sim.bubble_rate == pytest.approx((9 - 6) / 9)  # busiest rank's ideal work: 6
    with pytest.raises(ValueError, match="one per stage"):
        simulate(s, [Costs()])


def test_costs_are_checked_and_parsed():
    with pytest.raises(ValueError, match="Costs.W must be a finite number >= 0"):
        Costs(W=-1)
    for bad in (float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError, match="Costs.F must be a finite number"):
            Costs(F=bad)
    assert Costs.parse("18.5,18.1,9.3,0.6") == Costs(18.5, 18.1, 9.3, 0.6)
    assert Costs.parse("1,1,1,0,2,0.5") == Costs(1, 1, 1, 0, 2, 0.5)
    with pytest.raises(ValueError, match="F,I,W"):
        Costs.parse("1,2")


def test_simulated_comm_waits_follow_the_plan():
    # 1f1b, p=2, m=2, comm 0.5: rank 1 waits for 0F0's activations (ready at 1 + 0.5);
    # rank 0 waits for 1B0's gradients after 0F1 (2 -> 4.5 + 0.5) and for 1B1's after 0B0
    sim = simulate(build_schedule("1f1b", pp=2, microbatches=2), Costs(comm=0.5))
    assert [tuple(c) for c in sim.comm] == [
        (0, "recv grad 0:0 <- rank 1", 2.0, 5.0),
        (0, "recv grad 0:1 <- rank 1", 7.0, 8.0),
        (1, "recv act 1:0 <- rank 0", 0.0, 1.5),
    ]
    # in general: each wait ends where an action that receives starts, and no rank waits on
    # receives longer than it idles
    for name in ("zb-h1", "zb-v", "interleaved-1f1b"):
        s = build_schedule(name, pp=4, microbatches=8)
        sim = simulate(s, Costs(F=1, I=1.5, W=0.5, comm=0.2))
        starts = {(e.rank, e.start) for e in sim.events}
        for c in sim.comm:
            assert (c.rank, c.end) in starts and c.end > c.start, (name, c)
        for rank in range(s.pp):
            waited = sum(c.end - c.start for c in sim.comm if c.rank == rank)
            first = min(e.start for e in sim.events if e.rank == rank)
            assert waited <= sim.idle[rank] + first + 1e-9, (name, rank)


def test_events_are_those_of_the_program_as_simulated():
    # events are made when first read: editing the schedule afterwards must not change
    # them (oracle: the events of a simulation read at once, and by-hand 1F1B times)
    costs = Costs(F=1.0, I=1.0, W=1.0)
    schedule = build_schedule("zb-h1", pp=2, microbatches=3)
    read_at_once = simulate(schedule, costs).events
    later = simulate(schedule, costs)
    schedule.program[0].reverse()
    schedule.program[1].clear()
    assert later.events == read_at_once
    assert len(later.events) == 18 and later.deltas == [costs.memory(e.kind) for e in read_at_once]
    assert read_at_once[0] == Event(0, 0, "F", 0, 0.0, 1.0)
    assert max(e.end for e in later.events) == later.makespan
