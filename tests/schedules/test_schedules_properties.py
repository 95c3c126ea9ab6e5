"""The simulator's events re-checked, written out independently, against its rules
(docs/architecture.md, the KINDS table)."""

import random

import pytest

from zbkit.schedules import SCHEDULES, Costs, ScheduleError, build_schedule, simulate, validate
from zbkit.schedules.catalog import RECORDS

COSTS = [Costs(F=1.0, I=1.2, W=0.7, comm=0.1), Costs(F=2.0, I=1.0, W=1.5, comm=0.0)]


def chunks(costs, s):
    """The rule, written out: one Costs is a rank's share; each of its v stages takes 1/v
    of the times (a hop's comm stays)."""
    v = s.stages_per_rank
    return [Costs(F=costs.F / v, I=costs.I / v, W=costs.W / v, comm=costs.comm)] * s.num_stages


def check_events(sim, per_stage):
    s = sim.schedule
    last = s.num_stages - 1
    by_rank = {}
    for e in sim.events:
        by_rank.setdefault(e.rank, []).append(e)
    # when each action's output is there: its end, or its overlapped pair's end
    end = {}
    for events in by_rank.values():
        for i, e in enumerate(events):
            pair_end = events[i + 1].end if e.paired and e.kind == "F" else e.end
            end[e.stage, e.kind, e.microbatch] = pair_end

    def ready_at(e, rank, free):
        c = per_stage[e.stage]
        # the rule: F(s,j) <- F(s-1,j); I/B(s,j) <- F(s,j) and I/B(s+1,j); W <- I
        deps = []
        if e.kind == "F" and e.stage > 0:
            deps = [(e.stage - 1, "F")]
        elif e.kind == "W":
            deps = [(e.stage, "I")]
        elif e.kind in "IB":
            deps = [(e.stage, "F")] + ([(e.stage + 1, "IB")] if e.stage < last else [])
        ready = free
        for stage, kinds in deps:
            t = max(end.get((stage, k, e.microbatch), -1.0) for k in kinds)
            assert t >= 0, (e, stage, kinds)
            if s.stage_to_rank[stage] != rank:
                t += c.comm
            ready = max(ready, t)
        return ready

    for rank, events in by_rank.items():
        assert [(e.stage, e.kind, e.microbatch) for e in events] == [
            (a.stage, a.kind, a.microbatch) for a in s.actions(rank)
        ]  # an overlapped pair's halves are two events, each its own time (overlap = 0)
        free, i = 0.0, 0
        while i < len(events):
            e = events[i]
            c = per_stage[e.stage]
            duration = {"F": c.F, "I": c.I, "W": c.W, "B": c.I + c.W}
            assert e.end - e.start == pytest.approx(duration[e.kind])
            if e.paired:  # a pair starts when both halves are ready; its halves back to back
                b = events[i + 1]
                assert b.paired and b.start == pytest.approx(e.end)
                assert b.end - b.start == pytest.approx(duration[b.kind])
                ready = max(ready_at(e, rank, free), ready_at(b, rank, free))
                assert e.start == pytest.approx(ready), (e, b)
                free, i = b.end, i + 2
                continue
            # one action at a time, and as soon as possible
            assert e.start == pytest.approx(ready_at(e, rank, free)), e
            free, i = e.end, i + 1


@pytest.mark.parametrize("name", SCHEDULES)
def test_simulated_events_follow_the_rules(name):
    for p, m, costs in [(2, 4, COSTS[0]), (3, 6, COSTS[1]), (4, 8, COSTS[0])]:
        if RECORDS[name].largest is not None and 3 * p * m > 48:  # a proof: small sizes only
            continue
        kwargs = {"costs": costs} if RECORDS[name].searches == "always" else {}
        s = build_schedule(name, pp=p, microbatches=m, **kwargs)
        sim = simulate(s, costs)
        check_events(sim, chunks(costs, s))
        assert sim.makespan == pytest.approx(
            max(e.end for e in sim.events) - min(e.start for e in sim.events)
        )
        work = m * (costs.F + costs.I + costs.W)  # the same model whatever the schedule
        assert sim.bubble_rate == pytest.approx((max(sim.span) - work) / max(sim.span))
        assert sim.busy == pytest.approx([work] * p)


def test_random_swaps_either_validate_or_raise_schedule_error():
    rng = random.Random(0)
    outcomes = {"ok": 0, "error": 0}
    for _ in range(200):
        name = rng.choice(["1f1b", "zb-h1", "zb-h2", "zb-v", "interleaved-1f1b"])
        s = build_schedule(name, pp=rng.choice([2, 4]), microbatches=4)
        row = s.program[rng.randrange(s.pp)]
        i = rng.randrange(len(row) - 1)
        row[i], row[i + 1] = row[i + 1], row[i]
        try:
            validate(s)
        except ScheduleError as err:
            assert "<-- ERROR HERE" in str(err) and "rank" in str(err)
            outcomes["error"] += 1
            continue
        outcomes["ok"] += 1
        check_events(simulate(s, COSTS[0]), chunks(COSTS[0], s))
    assert outcomes["ok"] > 20 and outcomes["error"] > 20
