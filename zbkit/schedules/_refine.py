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
"""

from __future__ import annotations

from zbkit.schedules import _engine
from zbkit.schedules.action import KINDS, Action
from zbkit.schedules.schedule import Schedule
from zbkit.schedules.simulate import Costs

_EPS = 1e-9


def _score(times: dict[int, list[tuple[float, float]]]) -> tuple[float, float]:
    """(longest rank span, sum of spans): the bubble rate's cost first, then a tie-break."""
    spans = [t[-1][1] - t[0][0] for t in times.values() if t]
    return max(spans), sum(spans)


def _better(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[0] - _EPS or (a[0] <= b[0] + _EPS and a[1] < b[1] - _EPS)


def _fits(actions: list[Action], delta: dict[tuple[int, str], float], limit: float) -> bool:
    held = 0.0
    for a in actions:
        held += delta[a.stage, a.kind]
        if held > limit + _EPS:
            return False
    return True


def _late_ws(
    schedule: Schedule,
    times: dict[int, list[tuple[float, float]]],
    comm: list[float],
) -> dict[int, list[int]]:
    """Per rank, positions of Ws on the critical path that overran an action's input."""
    program, where = schedule.program, schedule.stage_to_rank
    last = schedule.num_stages - 1
    # (what, stage, microbatch) -> (rank, position) of the action that provides it
    makes = _engine.tables()[0]
    provider = {
        (makes[a.kind], a.stage, a.microbatch): (r, k)
        for r, actions in program.items()
        for k, a in enumerate(actions)
    }
    r = max(times, key=lambda q: times[q][-1][1] - times[q][0][0] if times[q] else -1.0)
    k = len(program[r]) - 1
    late: dict[int, list[int]] = {}
    while k >= 0:
        a = program[r][k]
        start = times[r][k][0]
        # when the inputs of `a` arrived, and from which action (the latest one)
        arrival, source = -1.0, None
        for need in _engine.dependencies(a, last):
            q, i = provider[need]
            t = times[q][i][1] + (comm[a.stage] if where[need[1]] != r else 0.0)
            if t > arrival:
                arrival, source = t, (q, i)
        if k > 0 and source is not None:
            prev = program[r][k - 1]
            p_start, p_end = times[r][k - 1]
            if prev.kind == "W" and p_start < arrival - _EPS and p_end > arrival + _EPS:
                late.setdefault(r, []).append(k - 1)  # deferring it lets `a` start on arrival
                r, k = source
                continue
        if source is not None and arrival >= start - _EPS:
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
    durations = {(s, k): c.duration(k) for s, c in enumerate(costs) for k in KINDS}
    delta = {(s, k): c.memory(k) for s, c in enumerate(costs) for k in KINDS}
    comm = [c.comm for c in costs]
    best = schedule
    try:
        times = _engine.run(best, durations, comm)
    except _engine.Stuck:
        return schedule
    score = _score(times)
    current = best
    for _ in range(rounds):
        late = _late_ws(current, times, comm)
        if not late:
            break
        program = dict(current.program)
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
            times = _engine.run(trial, durations, comm)
        except _engine.Stuck:
            break
        trial_score = _score(times)
        if trial_score[0] > score[0] + _EPS:
            break  # the path moved somewhere a deferred W now hurts
        # an equal longest span is kept as a step: the next rank's slip shows only now
        current = trial
        if _better(trial_score, score):
            best, score = trial, trial_score
    return best
