"""ZB-V and the automatic schedule, both built by the schedulers in `_build_greedy`.

zb-auto runs the paper's microbatch-by-microbatch construction (`sweep`) for a few warm-up
shapes (forwards per rank before its first I: 1F1B's p - r, ZB-H2's 2(p - r) - 1, "enough
to cover the wait for the first input gradient", "all that memory allows") and W-filling
rules, refines the best warm-up rank by rank, defers the Ws that delay its critical path
(`_refine`), adds the hand-written ZB-H1/ZB-H2 when they fit the memory limit, and keeps
the one `simulate` finds fastest. So it is never worse than those, and it never holds
more than `memory_limit`.

With the paper's measured times it matches or beats the paper's own ZB-2p (limit 2p*M_B)
in all 12 of its settings (1.5B m=24 reaches a lower bound, so it is optimal there), and
at p*M_B it ties ZB-H1, which there is optimal (see tests/schedules/test_schedules_auto.py
for both bounds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from zbkit.schedules import _build_fixed as fixed
from zbkit.schedules import _engine
from zbkit.schedules._build_greedy import greedy, sweep
from zbkit.schedules._refine import defer_late_ws
from zbkit.schedules.action import KINDS
from zbkit.schedules.schedule import Schedule, ScheduleError
from zbkit.schedules.simulate import Costs
from zbkit.schedules.validate import validate

_POLICIES = [(fill, hold) for fill in (0.0, 0.5, 1.0) for hold in (0.0, 0.5, 1.0)]
# the greedy policies that ever won for zb-auto over a grid of limits and costs
_AUTO_POLICIES = [(0.0, 0.0), (0.5, 0.0), (0.0, 0.5), (0.5, 0.5)]
# (fill, tail_fill) for `sweep`: a W goes into any gap / a gap half its size / only where it fits
_FILLS = [(0.0, 0.0), (0.5, 0.5), (0.0, 0.5), (0.25, 0.5), (2.0, 2.0)]
_REFINE_PASSES = 2
_REFINED = 2  # W-filling rules whose best warm-up gets refined


def _costs(costs: Costs | Sequence[Costs] | None, stages: int, name: str) -> list[Costs]:
    if costs is None:
        return [Costs()] * stages
    if isinstance(costs, Costs):
        return [costs] * stages
    costs = list(costs)
    if len(costs) != stages or not all(isinstance(c, Costs) for c in costs):
        raise ValueError(f"{name}: costs must be a Costs or a list of {stages} (one per stage)")
    return costs


def _best(candidates: list[Schedule], costs: list[Costs], limit: float) -> Schedule:
    """The fastest candidate under `limit`: longest rank span first, then peak memory.

    Candidates are timed with the simulator's engine alone (no validation, no summary:
    this runs for every candidate); only the winner is validated, the next one taken if
    it fails (a hand-written pattern that does not fit these sizes).
    """
    durations = {(s, k): c.duration(k) for s, c in enumerate(costs) for k in KINDS}
    delta = {(s, k): c.memory(k) for s, c in enumerate(costs) for k in KINDS}
    comm = [c.comm for c in costs]
    scored = []
    for index, schedule in enumerate(candidates):
        peak = 0.0
        for actions in schedule.program.values():
            held = 0.0
            for a in actions:
                held += delta[a.stage, a.kind]
                peak = max(peak, held)
        if peak > limit + 1e-9:
            continue
        try:
            times = _engine.run(schedule, durations, comm)
        except (_engine.Stuck, IndexError, KeyError):  # deadlocks, or not for these sizes
            continue
        span = max(t[-1][1] - t[0][0] for t in times.values() if t)
        scored.append((span, peak, index, schedule))
    for *_, schedule in sorted(scored, key=lambda x: x[:3]):
        try:
            validate(schedule)
        except ScheduleError:
            continue
        return schedule
    raise ValueError("no candidate schedule fits: builder bug")  # greedy raises before this


def zb_v(
    pp: int,
    m: int,
    name: str,
    costs: Costs | Sequence[Costs] | None = None,
    memory_limit: float | None = None,
) -> Schedule:
    """ZB-V: stage s and stage 2p-1-s on rank s (a V); 1F1B's peak memory by default."""
    placement = [s if s < pp else 2 * pp - 1 - s for s in range(2 * pp)]
    per_stage = _costs(costs, 2 * pp, name)
    if memory_limit is None:
        # 1F1B's rank 0 holds p microbatches of its whole model part = 2p half-size chunks
        memory_limit = 2 * pp * max(c.mem_activation for c in per_stage)
    # the paper's hand-written V first (it wins ties), then the greedy policies, which do
    # better when the costs are unequal or the memory limit differs
    candidates = [Schedule(fixed.zb_v(pp, m), placement, m, name)]
    candidates += [
        Schedule(greedy(placement, m, per_stage, memory_limit, fill, hold), placement, m, name)
        for fill, hold in _POLICIES
    ]
    return _best(candidates, per_stage, memory_limit)


def _warmups(p: int, m: int, costs: list[Costs], limit: float) -> list[list[int]]:
    """Warm-up shapes to try: forwards per rank before its first I."""
    # how many activations fit under the limit (I leaves mem_weight behind, W frees it)
    cap = [m if c.mem_activation <= 0 else int((limit + 1e-9) // c.mem_activation) for c in costs]
    # microbatch 0 alone: F goes down, I comes back up; rank r starts at f_start[r] and
    # can run its I_0 at i_start[r], so (i_start - f_start) / F forwards fill the wait
    f_start, t = [], 0.0
    for s, c in enumerate(costs):
        f_start.append(t + (c.comm if s else 0.0))
        t = f_start[-1] + c.F
    i_start, t = [0.0] * p, t
    for s in reversed(range(p)):
        i_start[s] = t + (costs[s].comm if s < p - 1 else 0.0)
        t = i_start[s] + costs[s].I
    fits = [(i_start[r] - f_start[r]) / max(costs[r].F, 1e-12) for r in range(p)]
    shapes = [
        [p - r for r in range(p)],  # 1F1B's (and ZB-H1's): p - r
        [2 * (p - r) - 1 for r in range(p)],  # ZB-H2's: 2(p - r) - 1
        [math.floor(f + 1e-9) for f in fits],  # fill the wait for I_0 without delaying it
        [math.ceil(f - 1e-9) for f in fits],  # fill it without a gap (I_0 a little late)
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


def zb_auto(
    pp: int,
    m: int,
    name: str,
    costs: Costs | Sequence[Costs] | None = None,
    memory_limit: float | None = None,
) -> Schedule:
    """Automatic zero-bubble schedule under `memory_limit` (default pp * mem_activation).

    Tries the paper's construction (`sweep`) with several warm-up shapes and W-filling
    rules, refines the best warm-up rank by rank and then its critical path (deferring Ws
    that delay it), adds the event-driven greedy's policies and ZB-H1/ZB-H2, and keeps the
    fastest that fits (timed by the simulator's engine).
    """
    placement = list(range(pp))
    per_stage = _costs(costs, pp, name)
    if memory_limit is None:
        memory_limit = pp * max(c.mem_activation for c in per_stage)
    if not isinstance(memory_limit, int | float) or memory_limit <= 0:
        raise ValueError(f"{name}: memory_limit must be a number > 0, got {memory_limit!r}")
    found: dict[tuple, float] = {}  # (warm-up, fill, tail_fill) -> cost

    def attempt(w: list[int], fill: float, tail: float) -> float:
        key = (tuple(w), fill, tail)
        if key not in found:
            try:
                found[key] = sweep(per_stage, m, memory_limit, w, fill, tail, actions=False)[1]
            except ValueError:  # this warm-up does not fit the memory limit
                found[key] = math.inf
        return found[key]

    for w in _warmups(pp, m, per_stage, memory_limit):
        for fill, tail in _FILLS:
            attempt(w, fill, tail)
    # refine the best warm-up of the two best W-filling rules: move one rank's warm-up
    # by one while that helps (a local search; different rules get stuck in different places)
    starts: dict[tuple, tuple] = {}
    for key in sorted(found, key=found.get):
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
                    if ok and attempt(trial, fill, tail) < attempt(w, fill, tail) - 1e-9:
                        w, improved = trial, True
            if not improved:
                break
    best = min(found, key=found.get)
    candidates = []
    if found[best] < math.inf:
        program = sweep(per_stage, m, memory_limit, list(best[0]), best[1], best[2])[0]
        candidates.append(Schedule(program, placement, m, name))
        # the construction lets a W overrun the gap before an I by a little; on the critical
        # path that slip repeats rank after rank: defer those Ws (one rank per round at worst)
        candidates.append(defer_late_ws(candidates[0], per_stage, memory_limit, 2 * pp))
    # the event-driven greedy does better far from the construction's sweet spot (limits
    # under p*M_B, or so large that all forwards fit), and it is the only one that can
    # finish when the limit is too tight for a warm-up (it raises if nothing fits at all)
    for fill, hold in _AUTO_POLICIES:
        try:
            program = greedy(placement, m, per_stage, memory_limit, fill, hold)
        except ValueError:
            if candidates:
                break
            raise
        candidates.append(Schedule(program, placement, m, name))
    for handcrafted in (fixed.zb_h1, fixed.zb_h2):
        candidates.append(Schedule(handcrafted(pp, m), placement, m, name))
    return _best(candidates, per_stage, memory_limit)
