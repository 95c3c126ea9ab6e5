"""Refine a schedule on its critical path: defer the Ws that make an I or F wait.

A W depends on nothing downstream, so a construction puts it into any gap it finds. When
the gap is a little shorter than the W, the W overruns: the next action (say I_j, whose
input gradient arrived while the W ran) starts late, and if that I is on the critical path
every stage before it, and the rank that ends last, waits too. The paper repairs such
slips with an ILP; here a cheaper exact step does it for the common case:

  1. time the schedule (the simulator's engine) and walk back from the last action of
     the rank with the longest span, along what each action waited for: its input from
     another rank, or its own rank finishing the previous action;
  2. where the previous action is a W that started before the input arrived and ended
     after it, move that W to just after the waiting action (the W still runs, later,
     in a gap or in the cool-down);
  3. skip a rank whose new order would go over the memory limit, time the result, and
     repeat while the longest span does not grow; return the best schedule seen
     (shortest longest span, then smallest sum of spans).

A slip that repeats rank after rank (each stage's W overrunning I_j by a fraction of a
millisecond) shows one rank per round: fixing the worst rank first leaves the longest
span unchanged (the next rank's W now delays I_j by almost as much), so equal spans are
kept as steps, and the gain appears once the whole chain is fixed.

`best_sweep` (below) is the search that picks the construction's warm-up and W rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import cast

from zbkit.schedules.core.action import Action
from zbkit.schedules.core.costs import TOL, Costs, keyed_costs, running_peak
from zbkit.schedules.core.schedule import Schedule
from zbkit.schedules.search.heuristic import sweep
from zbkit.schedules.search.timeline import Timeline
from zbkit.schedules.sim import engine

# (fill, tail_fill) for `sweep`: a W goes into any gap / a gap half its size / only where it fits
_FILLS = [(0.0, 0.0), (0.5, 0.5), (0.0, 0.5), (0.25, 0.5), (2.0, 2.0)]
_REFINE_PASSES = 2
_REFINED = 2  # W-filling rules whose best warm-up gets refined


def plain_program(schedule: Schedule) -> Mapping[int, Sequence[Action]]:
    """`schedule.program` typed as zb-auto builds it: single actions, no overlapped pair."""
    return cast(Mapping[int, Sequence[Action]], schedule.program)


def _score(times: dict[int, list[tuple[float, float]]]) -> tuple[float, float]:
    """(longest rank span, sum of spans): the bubble rate's cost first, then a tie-break."""
    spans = [t[-1][1] - t[0][0] for t in times.values() if t]
    return max(spans), sum(spans)


def _better(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[0] - TOL or (a[0] <= b[0] + TOL and a[1] < b[1] - TOL)


def _fits(actions: list[Action], delta: dict[tuple[int, str], float], limit: float) -> bool:
    return running_peak(delta[a.stage, a.kind] for a in actions) <= limit + TOL


def _late_ws(
    schedule: Schedule,
    times: dict[int, list[tuple[float, float]]],
    costs: list[Costs],
) -> dict[int, list[int]]:
    """Per rank, positions of Ws on the critical path that overran an action's input."""
    program = {r: list(actions) for r, actions in plain_program(schedule).items()}
    timeline = Timeline(costs, schedule.stage_to_rank, schedule.microbatches)
    timeline.load(program, times)  # what each action waited for: the timeline's rule
    # (stage, kind, microbatch) -> (rank, position) of that action
    where = {(a.stage, a.kind, a.microbatch): (r, k)
             for r, actions in program.items() for k, a in enumerate(actions)}  # fmt: skip
    r = max(times, key=lambda q: times[q][-1][1] - times[q][0][0] if times[q] else -1.0)
    k = len(program[r]) - 1
    late: dict[int, list[int]] = {}
    while k >= 0:
        a = program[r][k]
        start = times[r][k][0]
        # when the inputs of `a` arrived, and from which action (the latest one)
        latest = timeline.latest_input(a.stage, a.kind, a.microbatch)
        arrival, source = -1.0, None
        if latest is not None:
            arrival, source = latest[0], where[latest[1], latest[2], a.microbatch]
        if k > 0 and source is not None:
            prev = program[r][k - 1]
            p_start, p_end = times[r][k - 1]
            if prev.kind == "W" and p_start < arrival - TOL and p_end > arrival + TOL:
                late.setdefault(r, []).append(k - 1)  # deferring it lets `a` start on arrival
                r, k = source
                continue
        if source is not None and arrival >= start - TOL:
            r, k = source  # `a` waited for its input: the path goes through the sender
        else:
            k -= 1  # `a` waited for its own rank: the path goes through the previous action
    return late


def defer_late_ws(
    schedule: Schedule, costs: list[Costs], memory_limit: float, rounds: int
) -> Schedule:
    """`schedule` with Ws on its critical path deferred while that shortens it (see above).

    Never slower than `schedule`; a rank it reorders stays under `memory_limit`.
    `rounds` bounds the number of engine runs (each one times the whole schedule).
    """
    durations, delta = keyed_costs(costs)
    comm = [c.comm for c in costs]
    best = schedule
    try:
        times = engine.run(best, durations, comm)
    except engine.Stuck:
        return schedule
    score = _score(times)
    current = best
    for _ in range(rounds):
        late = _late_ws(current, times, costs)
        if not late:
            break
        program = dict(plain_program(current))
        for r, positions in late.items():
            actions = list(program[r])
            for k in sorted(positions, reverse=True):  # from the end: positions stay valid
                actions.insert(k + 1, actions.pop(k))  # the W swaps with the action after it
            if _fits(actions, delta, memory_limit):
                program[r] = actions
        if program == current.program:
            break  # every move would go over the memory limit
        trial = Schedule(program, current.stage_to_rank, current.microbatches, current.name)
        try:
            times = engine.run(trial, durations, comm)
        except engine.Stuck:
            break
        trial_score = _score(times)
        if trial_score[0] > score[0] + TOL:
            break  # the path moved somewhere a deferred W now hurts
        # an equal longest span is kept as a step: the next rank's slip shows only now
        current = trial
        if _better(trial_score, score):
            best, score = trial, trial_score
    return best


# ---- the construction's warm-up, searched -------------------------------------------------


def _warmups(p: int, m: int, costs: list[Costs], limit: float) -> list[list[int]]:
    """Warm-up shapes to try: forwards per rank before its first I."""
    # how many activations fit under the limit (I leaves mem_weight behind, W frees it)
    cap = [m if c.memory("F") <= 0 else int((limit + TOL) // c.memory("F")) for c in costs]
    # microbatch 0 alone: F goes down, I comes back up; rank r starts at f_start[r] and
    # can run its I_0 at i_start[r], so (i_start - f_start) / F forwards fill the wait
    f_start, t = [], 0.0
    for s, c in enumerate(costs):
        f_start.append(t + (c.comm if s else 0.0))
        t = f_start[-1] + c.duration("F")
    i_start, t = [0.0] * p, t
    for s in reversed(range(p)):
        i_start[s] = t + (costs[s].comm if s < p - 1 else 0.0)
        t = i_start[s] + costs[s].duration("I")
    fits = [(i_start[r] - f_start[r]) / max(costs[r].duration("F"), TOL) for r in range(p)]
    shapes = [
        [p - r for r in range(p)],  # 1F1B's (and ZB-H1's): p - r
        [2 * (p - r) - 1 for r in range(p)],  # ZB-H2's: 2(p - r) - 1
        [math.floor(f + TOL) for f in fits],  # fill the wait for I_0 without delaying it
        [math.ceil(f - TOL) for f in fits],  # fill it without a gap (I_0 a little late)
        cap,  # as many as memory allows
    ]
    unique: list[list[int]] = []
    for shape in shapes:
        w = [max(1, min(x, c, m)) for x, c in zip(shape, cap, strict=True)]
        for r in range(1, p):  # rank r cannot be further ahead than rank r - 1
            w[r] = min(w[r], w[r - 1])
        if w not in unique:
            unique.append(w)
    return unique


def best_sweep(costs: list[Costs], m: int, limit: float) -> dict[int, list[Action]] | None:
    """`sweep` at its best warm-up and W-filling rule (None: no warm-up fits `limit`).

    Tries each warm-up shape with each W-filling rule, then refines the best warm-up of the
    two best rules: move one rank's warm-up by one while that helps (a local search;
    different rules get stuck in different places).
    """
    pp = len(costs)
    found: dict[tuple, float] = {}  # (warm-up, fill, tail_fill) -> cost

    def attempt(w: list[int], fill: float, tail: float) -> float:
        key = (tuple(w), fill, tail)
        if key not in found:
            try:
                found[key] = sweep(costs, m, limit, w, fill, tail, actions=False)[1]
            except ValueError:  # this warm-up does not fit the memory limit
                found[key] = math.inf
        return found[key]

    for w in _warmups(pp, m, costs, limit):
        for fill, tail in _FILLS:
            attempt(w, fill, tail)
    starts: dict[tuple, tuple] = {}
    for key in sorted(found, key=lambda k: found[k]):
        if found[key] < math.inf and key[1:] not in starts and len(starts) < _REFINED:
            starts[key[1:]] = key
    for w, fill, tail in starts.values():
        w = list(w)
        for _ in range(_REFINE_PASSES):
            improved = False
            for r in range(pp):
                for step in (1, -1):
                    trial = list(w)
                    trial[r] += step
                    ok = trial[r] >= 1 and (r == 0 or trial[r] <= trial[r - 1])
                    ok = ok and (r == pp - 1 or trial[r + 1] <= trial[r])
                    if ok and attempt(trial, fill, tail) < attempt(w, fill, tail) - TOL:
                        w, improved = trial, True
            if not improved:
                break
    best = min(found, key=lambda k: found[k])
    if found[best] == math.inf:
        return None
    return sweep(costs, m, limit, list(best[0]), best[1], best[2])[0]
