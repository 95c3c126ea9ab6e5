"""`bubble_rate(events)` is the simulator's own formula, so a measured trace compares with it."""

import pytest

from zbkit.schedules import SCHEDULES, Costs, Event, bubble_rate, build_schedule, simulate


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("costs", [Costs(F=1, I=1, W=1), Costs(F=1.0, I=1.5, W=0.5, comm=0.2)])
def test_bubble_rate_of_events_equals_the_simulation(name, costs):
    options = {"costs": costs} if name == "zb-auto" else {}
    schedule = build_schedule(name, pp=4, microbatches=8, **options)
    sim = simulate(schedule, costs)
    assert bubble_rate(sim.events) == pytest.approx(sim.bubble_rate, abs=1e-12)


def test_bubble_rate_uses_the_busiest_rank_and_the_longest_span():
    # rank 0 busy 3 over span 4, rank 1 busy 1 over span 1: (4 - 3) / 4
    events = [
        Event(0, 0, "F", 0, 0.0, 1.0),
        Event(0, 0, "I", 0, 2.0, 4.0),
        Event(1, 1, "F", 0, 1.0, 2.0),
    ]
    assert bubble_rate(events) == pytest.approx(0.25)
    assert bubble_rate([]) == 0.0
