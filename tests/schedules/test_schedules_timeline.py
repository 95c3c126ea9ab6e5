"""The searched builders' timeline (`timeline.Timeline`) keeps the simulator's rules.

Every searched builder places its actions through the timeline, and zb-auto then times the
result with the simulator: if the two disagreed, a builder would optimise one thing and be
scored on another. Random programs (any placement, any costs per stage, with `comm` and
`mem_weight`) are placed by the timeline one action at a time and then simulated: every
action ends at the same time, every rank peaks at the same memory, spans agree.
"""

from __future__ import annotations

import random

import pytest

from zbkit.schedules import Schedule, simulate, validate
from zbkit.schedules.core.costs import Costs
from zbkit.schedules.search.timeline import Slower, Timeline


def _random_costs(rng: random.Random, n: int) -> list[Costs]:
    return [
        Costs(
            F=rng.choice([0.0, rng.uniform(0.2, 2)]),
            I=rng.uniform(0.2, 2),
            W=rng.choice([0.0, rng.uniform(0.1, 1.5)]),
            comm=rng.choice([0.0, rng.uniform(0, 0.3)]),
            mem_activation=rng.uniform(0.5, 1.5),
            mem_weight=rng.choice([0.0, rng.uniform(0, 0.6)]),
        )
        for _ in range(n)
    ]


def _placement(rng: random.Random, p: int) -> list[int]:
    kind = rng.choice(["linear", "v", "looped", "random"])
    if kind == "linear":
        return list(range(p))
    if kind == "v":
        return [s if s < p else 2 * p - 1 - s for s in range(2 * p)]
    if kind == "looped":
        return [s % p for s in range(2 * p)]
    where = list(range(p)) + [rng.randrange(p) for _ in range(rng.randint(0, p))]
    rng.shuffle(where)  # every rank holds a stage, in any order along the pipeline
    return where


def _candidates(tl: Timeline, r: int) -> list[tuple[int, str]]:
    """(stage, kind) rank r may run next: inputs placed, work left (W: the oldest owed)."""
    out = []
    for s, where in enumerate(tl.where):
        if where != r:
            continue
        for kind in ("F", "I"):
            j = tl.count[kind][s]
            if j < tl.m and tl.arrival(s, kind, j) is not None:
                out.append((s, kind))
    return out + ([(-1, "W")] if tl.pending[r] else [])


def _random_build(seed: int) -> tuple[Timeline, list[Costs], list[float]]:
    """A random program placed by the timeline: the timeline, its costs, each rank's peak."""
    rng = random.Random(seed)
    p, m = rng.randint(1, 5), rng.randint(1, 6)
    where = _placement(rng, p)
    p = max(where) + 1
    costs = _random_costs(rng, len(where))
    tl = Timeline(costs, where, m)
    peak = [0.0] * p
    total = 3 * len(where) * m
    while tl.placed < total:
        r = rng.randrange(p)
        options = _candidates(tl, r)
        if not options:
            continue
        s, kind = rng.choice(options)
        if kind == "W":
            tl.place_w(r)
        else:
            tl.place(s, kind)
        peak[r] = max(peak[r], tl.held[r])
    return tl, costs, peak


@pytest.mark.parametrize("seed", range(200))
def test_the_timeline_places_actions_as_the_simulator_times_them(seed: int) -> None:
    tl, costs, peak = _random_build(seed)
    schedule = Schedule(tl.program, tl.where, tl.m)
    validate(schedule)  # the timeline only places an action once its inputs are placed
    sim = simulate(schedule, costs)
    for e in sim.events:  # the same times, to the last bit
        assert tl.end[e.kind][e.stage][e.microbatch] == e.end, (seed, e)
    ran = [r for r, actions in tl.program.items() if actions]
    assert tl.span() == max(sim.span[r] for r in ran)
    assert peak == pytest.approx(sim.peak_memory, abs=1e-12)
    assert all(h == pytest.approx(0.0, abs=1e-9) for h in tl.held)  # every W freed its I's


def test_the_timeline_gives_up_once_a_rank_must_end_slower() -> None:
    """A rank's span is its work plus its idle time, which only grows: once the sum passes
    the bound, the build raises `Slower` (what lets zb-auto stop a losing candidate)."""
    tl = Timeline([Costs()] * 2, [0, 1], m=2, give_up=7.5)  # each rank's work: 2 x (1+1+1)
    tl.place(0, "F")  # 0..1
    tl.place(1, "F")  # 1..2
    tl.place(1, "I")  # 2..3
    with pytest.raises(Slower, match=r"rank 0: work 6 \+ idle 2 by t=3"):
        tl.place(0, "I")  # waits from 1 to 3 for rank 1's gradient: at least 8 > 7.5


def test_make_room_runs_the_oldest_pending_w() -> None:
    """Memory is `Costs.memory`'s rule; to fit an action the timeline runs owed Ws, oldest
    first, and says when even that is not enough."""
    tl = Timeline([Costs(mem_weight=0.5)], [0], m=3, limit=2.0)
    for kind in ("F", "F", "I", "I"):
        tl.place(0, kind)
    assert tl.held == [1.0] and list(tl.pending[0]) == [(0, 0), (0, 1)]
    assert tl.fits(0, "F") and not tl.fits(0, "F", extra=0.5)
    tl.place(0, "F")  # holds 2.0: one more F needs both Ws run first
    assert not tl.fits(0, "F") and tl.make_room(0, "F")
    assert [str(a) for a in tl.program[0]][-2:] == ["0W0", "0W1"] and tl.held == [1.0]
    tl.place(0, "I")
    tl.drain()  # the cool-down: the last W
    assert tl.held == [0.0] and [str(a) for a in tl.program[0]][-2:] == ["0I2", "0W2"]
    small = Timeline([Costs()], [0], m=1, limit=0.5)  # no W owed: nothing can make room
    assert not small.make_room(0, "F")
