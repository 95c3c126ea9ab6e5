"""Costs read back from events: on a simulation they must give back its own costs."""

import pytest

from zbkit.schedules import Costs, build_schedule, simulate
from zbkit.schedules.measure import by_key, hop_latency, input_producer, measured_costs


@pytest.mark.parametrize("name", ["zb-h1", "zb-h2", "zb-v"])  # split: I and W apart
def test_measured_costs_and_hop_latency_recover_the_simulated_ones(name):
    schedule = build_schedule(name, pp=3, microbatches=6)
    costs = [Costs(F=1.0 + s, I=2.0, W=0.5, comm=0.25) for s in range(schedule.num_stages)]
    sim = simulate(schedule, costs)
    assert hop_latency(sim.events) == pytest.approx(0.25)
    assert measured_costs(sim.events, schedule.num_stages, comm=0.25) == costs


def test_unsplit_backward_counts_half_to_i_and_w():
    sim = simulate(build_schedule("1f1b", pp=3, microbatches=6), Costs(F=1, I=2, W=2))
    assert [(c.I, c.W) for c in measured_costs(sim.events, 3)] == [(2.0, 2.0)] * 3


def test_every_consumer_starts_after_its_producer_in_a_simulation():
    sim = simulate(build_schedule("zb-h2", pp=4, microbatches=8), Costs(comm=0.1))
    keyed, last = by_key(sim.events), 3
    pairs = [(input_producer(e, keyed, last), e) for e in sim.events]
    pairs = [(src, e) for src, e in pairs if src is not None]
    # every F but stage 0's and every I but the last stage's reads another stage's tensors
    assert len(pairs) == 8 * 3 * 2
    assert all(e.start >= src.end + 0.1 - 1e-12 for src, e in pairs)


def test_a_stage_missing_from_the_events_is_named():
    sim = simulate(build_schedule("1f1b", pp=2, microbatches=2), Costs())
    with pytest.raises(ValueError, match="no F of stage 2"):
        measured_costs(sim.events, 3)
