"""Notebook 03's exercises: schedules, bubbles and what sets them.

Each checker simulates the schedules the exercise names (or reads zbkit's closed form) with
one `Costs` for every schedule, a rank's share of the model, and compares.
"""

from __future__ import annotations

import math
from typing import Any

from zbkit.exercises._core import exercise, is_count, is_number, schedule_name
from zbkit.schedules import Costs, Schedule, build_schedule, formulas, simulate
from zbkit.schedules.core.costs import TOL
from zbkit.schedules.paper import TABLE6

UNIT = Costs(F=1, I=1, W=1)  # the notebook's `unit`
TIE = TOL  # simulated times are sums of floats: closer than this is a tie

# exercise 03.2's schedules, and exercise 03.3's row of the paper's Table 6 (1.5B, p=8, m=24)
COMPARED = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "zb-v")
PAPER_ROW = Costs(*TABLE6["1.5B"][3][24][:3], comm=TABLE6["1.5B"][3][24][3])


def hops(schedule: Schedule) -> int:
    """Rank-to-rank messages one microbatch's forward makes (its backward makes as many)."""
    s2r = schedule.stage_to_rank
    return sum(a != b for a, b in zip(s2r, s2r[1:], strict=False))


def _rate(name: str, pp: int, m: int, costs: Costs = UNIT, **options: Any) -> float:
    return simulate(build_schedule(name, pp=pp, microbatches=m, **options), costs).bubble_rate


def _rank0_wait(pp: int, costs: Costs = UNIT) -> float:
    """How long rank 0 waits, from its first forward's start, for microbatch 0's input
    gradient: the forward down every stage and the input gradient back up (the simulator's
    answer, with microbatches to spare)."""
    sim = simulate(build_schedule("zb-h2", pp=pp, microbatches=4 * pp), costs)
    return min(e.start for e in sim.events if e.rank == 0 and e.kind == "I")


@exercise("03.1", "the smallest m (an int) for which ZB-H2 has no bubble at p = 4, F = I = W = 1")
def smallest_zero_bubble_m(answer: Any) -> tuple[bool, str]:
    def rate(m: int) -> float:
        return _rate("zb-h2", 4, m)

    m = next(m for m in range(1, 64) if rate(m) < TIE)
    wait = _rank0_wait(4)
    if not is_count(answer):
        return False, f"give a whole number of microbatches, got {answer!r}"
    if answer < 1:
        return False, f"m counts microbatches: at least 1, got {answer}"
    if answer == m:
        return True, (
            f"ZB-H2's bubble is 0 from m = {m} = 2p-1 on (m = {m - 1}: {rate(m - 1):.1%}). "
            f"Rank 0 waits {wait:g} time units for microbatch 0's input gradient: its forward "
            "goes down p stages and its I comes back up p-1. No W is ready before that I, so "
            f"only forwards can fill the wait, one unit each: {m} warm-up forwards."
        )
    if answer > m:
        return False, (
            f"m = {answer} has no bubble, but fewer microbatches have none either. Count how "
            "long rank 0 waits for microbatch 0's input gradient to come back (down p stages, "
            "back up p-1): the warm-up needs just enough forwards to fill that wait."
        )
    return False, (
        f"at m = {answer} the simulated bubble is {rate(answer):.1%}: rank 0 runs out of "
        "forwards before microbatch 0's input gradient has come back (down p stages, back up "
        "p-1), and no W is ready before that I. Count the wait in time units: each warm-up "
        "forward fills one."
    )


@exercise("03.2", "the name (a str, e.g. 'zb-h1') of the schedule whose bubble rate rises most")
def most_hurt_by_comm(answer: Any) -> tuple[bool, str]:
    slow = Costs(F=1, I=1, W=1, comm=0.2)
    rise = {n: _rate(n, 4, 8, slow) - _rate(n, 4, 8) for n in COMPARED}
    worst = max(rise, key=rise.__getitem__)
    name, why = schedule_name(answer, COMPARED, "the seven")
    if name is None:
        return False, why
    if name != worst:
        return False, (
            f"{name}'s bubble rate rises {100 * rise[name]:.1f} points; another's rises more. "
            f"A hop costs {slow.comm:g} in every schedule: what differs is how long the actions "
            "beside it are (a chunk does 1/v of a stage's work), how many hops a microbatch "
            "makes, and whether idle time was already there to hide a wait in."
        )
    sch = build_schedule(worst, pp=4, microbatches=8)
    chunk = UNIT.share(sch.stages_per_rank)
    linear = build_schedule("interleaved-1f1b", pp=4, microbatches=8)
    return True, (
        f"{worst}: +{100 * rise[worst]:.1f} points (1f1b +{100 * rise['1f1b']:.1f}). A hop "
        f"costs {slow.comm:g} whatever the chunk, and {worst}'s chunks do F = {chunk.F:g}: "
        f"each hop is {slow.comm / chunk.F:.0%} of a forward, against {slow.comm / UNIT.F:.0%} "
        "for one stage per rank. Interleaved 1F1B's chunks are as short "
        f"(+{100 * rise['interleaved-1f1b']:.1f}), but {worst}'s bubble was "
        f"{_rate(worst, 4, 8):.1%}: no idle time left to hide a wait in. Its placement does "
        f"save messages: {hops(sch)} hops a microbatch each way against interleaved 1F1B's "
        f"{hops(linear)} (the V turns on one rank)."
    )


@exercise("03.3", "ZB-H1's closed-form bubble rate (a fraction such as 0.15) for 1.5B, m = 24")
def closed_form_leaves_out_comm(answer: Any) -> tuple[bool, str]:
    pp, m = 8, 24
    form = formulas.bubble("zb-h1", pp, m, 1, PAPER_ROW)
    assert form is not None  # W <= min(F, I) and m >= p
    no_comm = Costs(F=PAPER_ROW.F, I=PAPER_ROW.I, W=PAPER_ROW.W)
    simulated, quiet = _rate("zb-h1", pp, m, PAPER_ROW), _rate("zb-h1", pp, m, no_comm)
    if not is_number(answer):
        return False, f"give a rate as a number such as 0.15, got {answer!r}"
    if 1 < answer <= 100 and math.isclose(answer / 100, form.rate, abs_tol=5e-4):
        return False, f"{answer} looks like a percent: give the fraction, {answer / 100:.4f}"
    if math.isclose(answer, form.rate, abs_tol=5e-4):
        return True, (
            f"{form.formula} = {form.bubble:.1f} ms of idle against m(F+I+W) = "
            f"{m * (no_comm.F + no_comm.I + no_comm.W):.1f} ms of work: {form.rate:.4f}. The "
            f"simulator with comm = 0 says {quiet:.4f} too; with the row's {PAPER_ROW.comm} ms a "
            f"hop it says {simulated:.4f}: the difference is communication, which the closed "
            "form leaves out."
        )
    if math.isclose(answer, simulated, abs_tol=5e-4):
        return False, (
            f"{simulated:.4f} is the simulator's, with {PAPER_ROW.comm} ms a hop; the closed "
            "form (p-1)(F+I-W) counts compute only"
        )
    one_f1b = formulas.bubble("1f1b", pp, m, 1, PAPER_ROW)
    if one_f1b is not None and math.isclose(answer, one_f1b.rate, abs_tol=5e-4):
        return False, f"{one_f1b.rate:.4f} is 1F1B's (p-1)(F+I+W); ZB-H1's subtracts W"
    return False, (
        f"{answer} is not what the closed form gives: it counts compute only, the bubble "
        "(p-1)(F+I-W) against the work m(F+I+W), rate = bubble / (bubble + work), with the "
        "row's F, I and W in ms"
    )


@exercise("03.4", "the smallest stages_per_rank v (an int) that beats ZB-H1's makespan")
def interleaving_beats_zb_h1(answer: Any) -> tuple[bool, str]:
    def makespan(v: int) -> float:
        sch = build_schedule("interleaved-1f1b", pp=4, microbatches=8, stages_per_rank=v)
        return simulate(sch, UNIT).makespan

    h1 = simulate(build_schedule("zb-h1", pp=4, microbatches=8), UNIT).makespan
    v = next(v for v in range(1, 17) if makespan(v) < h1 - TIE)
    if not is_count(answer):
        return False, f"give a whole number of chunks per rank, got {answer!r}"
    if answer < 1:
        return False, f"a rank holds at least one chunk, got {answer}"
    if answer == v:
        sch = build_schedule("interleaved-1f1b", pp=4, microbatches=8, stages_per_rank=v)
        one = build_schedule("1f1b", pp=4, microbatches=8)
        before = "a tie" if abs(makespan(v - 1) - h1) <= TIE else "slower"
        return True, (
            f"v = {v}: makespan {makespan(v):g} against ZB-H1's {h1:g} (v = {v - 1}: "
            f"{makespan(v - 1):g}, {before}): the bubble (p-1)(F+I+W)/v shrinks with v. "
            f"The price: {hops(sch)} hops a microbatch each way against 1F1B's {hops(one)}; "
            f"ZB-H1 gets to {h1:g} with 1F1B's {hops(one)}, by moving W."
        )
    idle_h1 = (4 - 1) * (UNIT.F + UNIT.I - UNIT.W)  # ZB-H1's closed form, m >= p

    def idle(v: int) -> float:  # interleaving's, (p-1)(F+I+W)/v: the same work on both
        return (4 - 1) * (UNIT.F + UNIT.I + UNIT.W) / v

    if answer > v:
        return False, (
            f"v = {answer} beats it ({makespan(answer):g}), but a smaller v does too: both "
            "schedules do the same work, so compare their idle time, (p-1)(F+I+W)/v against "
            f"ZB-H1's (p-1)(F+I-W) = {idle_h1:g}, and find the first v below it"
        )
    if abs(makespan(answer) - h1) <= TIE:
        return False, (
            f"v = {answer} ties: makespan {makespan(answer):g}, ZB-H1's too. Its idle time "
            f"(p-1)(F+I+W)/v = {idle(answer):g} equals ZB-H1's (p-1)(F+I-W) = {idle_h1:g}; "
            "strictly shorter needs less idle"
        )
    return False, (
        f"v = {answer}: makespan {makespan(answer):g} against ZB-H1's {h1:g}. Both do the same "
        f"work, so the idle time decides: (p-1)(F+I+W)/v = {idle(answer):g} against ZB-H1's "
        f"(p-1)(F+I-W) = {idle_h1:g}. Only more chunks shrink interleaving's idle time"
    )


@exercise("03.5", "the smallest m (an int) for which 1F1B's bubble rate at p = 4 is below 10%")
def enough_microbatches(answer: Any) -> tuple[bool, str]:
    pp = 4

    def rate(m: int) -> float:
        return _rate("1f1b", pp, m)

    m = next(m for m in range(1, 256) if rate(m) < 0.1 - TIE)
    rough = next(m for m in range(1, 256) if (pp - 1) / m < 0.1 - TIE)  # (p-1)/m, large m
    if not is_count(answer):
        return False, f"give a whole number of microbatches, got {answer!r}"
    if answer < 1:
        return False, f"m counts microbatches: at least 1, got {answer}"
    if answer == m:
        bubble = (pp - 1) * (UNIT.F + UNIT.I + UNIT.W)
        return True, (
            f"m = {m}: {rate(m):.2%} = (p-1)/(m+p-1) = {pp - 1}/{m + pp - 1}; m = {m - 1} "
            f"gives {rate(m - 1):.2%}, not below. The bubble stays (p-1)(F+I+W) = {bubble:g} "
            "units whatever m is; only the work around it grows."
        )
    if answer == rough:
        return False, (
            f"{rough} comes from (p-1)/m, the large-m approximation; the rate is "
            f"(p-1)/(m+p-1), a little lower ({rate(rough):.2%} at m = {rough})"
        )
    bubble = (pp - 1) * (UNIT.F + UNIT.I + UNIT.W)
    if answer > m:
        return False, (
            f"m = {answer} gives {rate(answer):.2%}; a smaller m is below 10% too. Solve "
            "(p-1)/(m+p-1) < 1/10 for the first whole m"
        )
    return False, (
        f"m = {answer} gives {rate(answer):.2%}: the bubble (p-1)(F+I+W) = {bubble:g} units "
        f"stays whatever m is, and the work m(F+I+W) = {answer * bubble / (pp - 1):g} is not yet "
        "more than nine times it, which a rate below 1/10 needs"
    )
