"""Iterations back to back, with and without the optimizer step's synchronisation.

Oracles: the rule every simulated action obeys (it starts when its rank is free and its
inputs exist, never later), the zero-bubble rate m / (m (F+I+W)), and one iteration's
numbers.
"""

from __future__ import annotations

import pytest

from zbkit.schedules import SCHEDULES, Costs, build_schedule, simulate
from zbkit.schedules.core.action import KINDS
from zbkit.schedules.sim.simulate import repeated
from zbkit.schedules.throughput import rank_costs, throughput

ONE = Costs(1, 1, 1)
COSTS = [ONE, Costs(1, 1.5, 0.5, comm=0.2), Costs(1.85, 1.81, 0.93, comm=0.06)]
NAMES = [n for n in SCHEDULES if n != "dualpipev"] + ["dualpipev"]


def built(name: str, pp: int = 4, m: int = 8):
    return build_schedule(name, pp=pp, microbatches=m)


def test_zb_h2_wins_only_when_the_optimizer_step_does_not_synchronise() -> None:
    p, m = 4, 8
    rate = {}
    for name in ("1f1b", "zb-h1", "zb-h2"):
        for sync in (True, False):
            rate[name, sync] = simulate(
                built(name, p, m), ONE, iterations=3, optimizer_sync=sync
            ).throughput
    # without the sync ZB-H2 reaches the zero-bubble rate and beats ZB-H1, which beats 1F1B
    assert rate["zb-h2", False] == pytest.approx(m / (m * (1 + 1 + 1)))
    assert rate["zb-h2", False] > rate["zb-h1", False] > rate["1f1b", False]
    # with it, ZB-H2 gains nothing over ZB-H1: both repeat one makespan apart
    assert rate["zb-h2", True] == pytest.approx(rate["zb-h1", True])
    assert rate["zb-h1", True] == pytest.approx(m / simulate(built("zb-h1"), ONE).makespan)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("costs", COSTS, ids=["equal", "I>W comm", "paper"])
def test_every_action_starts_as_soon_as_its_rank_and_inputs_allow(name: str, costs) -> None:
    sch = built(name)
    for sync in (True, False):
        sim = simulate(sch, costs, iterations=3, optimizer_sync=sync)
        m = sch.microbatches
        ends = {(e.stage, e.kind, e.microbatch): e.end for e in sim.events}
        per_rank: dict[int, list] = {}
        for e in sim.events:
            per_rank.setdefault(e.rank, []).append(e)
        iteration_end = [max(e.end for e in sim.events if e.microbatch // m == i) for i in range(3)]
        for rank, events in per_rank.items():
            free = 0.0
            for e in events:
                if e.paired:
                    free = e.end
                    continue  # a pair's halves share one start: checked by its own tests
                ready = free
                for product, src in KINDS[e.kind].needs_of(e.stage, sch.num_stages):
                    producer = next(
                        k
                        for k, kind in KINDS.items()
                        if kind.makes == product and (src, k, e.microbatch) in ends  # fmt: skip
                    )
                    t = ends[src, producer, e.microbatch]
                    if sch.stage_to_rank[src] != rank:
                        t += costs.comm
                    ready = max(ready, t)
                i = e.microbatch // m
                if sync and i > 0:  # the optimizer step waits for every rank
                    ready = max(ready, iteration_end[i - 1])
                assert e.start == pytest.approx(ready), (name, sync, e)
                free = e.end


@pytest.mark.parametrize("name", NAMES)
def test_one_iteration_is_what_it_always_was_and_the_steady_state_settles(name: str) -> None:
    sch = built(name)
    for costs in COSTS:
        one = simulate(sch, costs)
        same = simulate(sch, costs, iterations=1, optimizer_sync=False)
        assert (one.makespan, one.bubble_rate, one.peak_memory) == (
            same.makespan,
            same.bubble_rate,
            same.peak_memory,
        )
        assert one.period == one.makespan and one.throughput == pytest.approx(8 / one.makespan)
        synced = simulate(sch, costs, iterations=3)
        assert synced.period == pytest.approx(one.makespan)
        assert synced.makespan == pytest.approx(3 * one.makespan)
        assert synced.peak_memory == one.peak_memory  # iterations do not pile up memory
        assert len(synced.events) == 3 * len(one.events)
        free = [simulate(sch, costs, iterations=k, optimizer_sync=False).period for k in (2, 3, 5)]
        assert free == pytest.approx([free[0]] * 3)  # settled by the second iteration
        assert free[0] <= one.makespan + 1e-9  # overlapping never slows


def test_throughput_compares_like_for_like_with_1f1b() -> None:
    for name in ("zb-h1", "zb-h2", "zb-v", "interleaved-1f1b", "v-half"):
        sch = built(name)
        tp = throughput(sch, ONE)
        # 1F1B's stage on rank r does what all of the schedule's stages on rank r do: one
        # Costs is a rank's share, so that is ONE again, whatever the chunks per rank
        base = rank_costs(sch, ONE)
        assert all(c.F == c.I == c.W == 1 and c.mem_activation == 1 for c in base)
        f1 = simulate(built("1f1b"), ONE)
        # a list of per-stage costs is summed per rank
        halves = [Costs(F=0.5, I=1, W=0.25)] * sch.num_stages
        v = sch.stages_per_rank
        summed = Costs(F=0.5 * v, I=v, W=0.25 * v, mem_activation=v)
        assert rank_costs(sch, halves) == [summed] * sch.pp
        assert tp.baseline_synced == pytest.approx(8 / f1.makespan)
        assert tp.speedup(True) == pytest.approx(tp.synced / tp.baseline_synced)
        assert tp.speedup(False) >= 1.0, name  # every zero-bubble refinement gains
        # the CLI and the explorer hand over the one iteration they simulated already
        assert throughput(sch, ONE, simulated=simulate(sch, ONE)) == tp
    assert throughput(built("1f1b"), ONE).speedup(True) == pytest.approx(1.0)
    assert "1.375x" in str(throughput(built("zb-h2"), ONE))


def test_bad_iterations_are_named() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="iterations must be an int >= 1"):
            simulate(built("1f1b"), ONE, iterations=bad)
    with pytest.raises(ValueError, match="iterations >= 2"):
        throughput(built("1f1b"), ONE, iterations=1)
    two = simulate(built("1f1b"), ONE, iterations=2)
    with pytest.raises(ValueError, match="takes a simulation of one iteration"):
        throughput(built("1f1b"), ONE, simulated=two)
    twice = repeated(built("zb-h1", 2, 2), 2)
    assert twice.microbatches == 4 and str(twice.program[0][-1]) == "0W3"
