"""zb-auto: the fastest of a list of named candidate schedules that fits a memory limit.

Each placement has its list of candidates (`CANDIDATES`), each with a one-line reason it is
there. zb-auto builds each candidate for the costs and the limit it is given, drops those
that go over the limit, times the rest with the simulator's engine and keeps the fastest
(longest rank span, then peak memory, then the list's order). The hand-written ones are
timed first: when one reaches a lower bound (`_bounds`: no schedule under the limit is
faster) the search stops there, and a greedy gives up once it must end slower than the
best so far. `explain_auto` returns the whole table: which candidate won, and what each
one scored or why it was left out ("not run: ZB-H1 reaches the lower bound ...").

- `placement="linear"` (default; stage s on rank s, limit p * M_B by default): the paper's
  microbatch-by-microbatch construction (`sweep`) for a few warm-up shapes and W-filling
  rules, refined rank by rank and then on its critical path (`_refine`); the event-driven
  greedy; the reference repo's heuristic (`_build_heuristic`); ZB-H1 and ZB-H2. With the
  paper's measured times it matches or beats the paper's own ZB-2p (limit 2p*M_B) in all
  12 of its settings (1.5B m=24 reaches a lower bound, so it is optimal there), and at
  p*M_B it ties ZB-H1, which there is optimal (see tests/schedules/test_schedules_auto.py
  for both bounds).
- `placement="v"` (stage s and 2p-1-s on rank s, limit 2p half-stage activations = 1F1B's
  peak by default): the paper's hand-written ZB-V (what `build_schedule("zb-v")` returns)
  and the greedy, which does better when the costs are unequal or the limit differs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from zbkit.schedules import _build_fixed as fixed
from zbkit.schedules import _engine
from zbkit.schedules._bounds import lower_bound
from zbkit.schedules._build_greedy import Slower, greedy
from zbkit.schedules._build_heuristic import best_heuristic
from zbkit.schedules._refine import best_sweep, defer_late_ws
from zbkit.schedules.action import KINDS, Action
from zbkit.schedules.costs import Costs
from zbkit.schedules.costs import per_stage as costs_per_stage
from zbkit.schedules.schedule import Schedule, ScheduleError
from zbkit.schedules.validate import check_actions

PLACEMENTS = ("linear", "v")

Program = dict[int, list[Action]]


@dataclass
class Problem:
    """What every candidate is built for."""

    pp: int
    m: int
    costs: list[Costs]  # one per stage
    limit: float  # peak memory per rank, in the units of Costs.mem_activation
    placement: str  # "linear" or "v"
    memo: dict = field(default_factory=dict)  # work shared between candidates (one search)
    beat: float = math.inf  # the best span so far: a builder may give up (`Slower`) above it

    @property
    def stage_to_rank(self) -> list[int]:
        if self.placement == "v":
            return [s if s < self.pp else 2 * self.pp - 1 - s for s in range(2 * self.pp)]
        return list(range(self.pp))


@dataclass(frozen=True)
class Candidate:
    name: str
    reason: str  # one line: where it wins, or what it guarantees
    build: Callable[[Problem], Program]  # raises ValueError if it cannot meet the limit
    handwritten: bool = False  # cheap: timed first, it may prove the others need not run


@dataclass(frozen=True)
class Tried:
    """One candidate's row in `AutoSearch`: its score, or why it was left out."""

    candidate: Candidate
    span: float | None  # longest rank span (None: not built, over the limit, or invalid)
    peak: float | None  # peak memory over the ranks (None: not built)
    note: str  # "fits", "over the limit", or why it could not be built or run


@dataclass
class AutoSearch:
    """zb-auto's result: the chosen schedule, the winning candidate and every row tried."""

    schedule: Schedule
    chosen: Candidate
    tried: list[Tried]  # every candidate of the placement, in CANDIDATES order
    memory_limit: float
    placement: str

    def __repr__(self) -> str:  # the table: what a notebook shows for `explain_auto(...)`
        lines = [f"zb-auto ({self.placement}), memory_limit={self.memory_limit:g}:"]
        width = max(len(t.candidate.name) for t in self.tried)
        for t in self.tried:
            mark = "->" if t.candidate is self.chosen else "  "
            span = "-" if t.span is None else f"{t.span:.6g}"
            peak = "-" if t.peak is None else f"{t.peak:.4g}"
            lines.append(
                f"{mark} {t.candidate.name:<{width}}  span {span:>9}  peak {peak:>6}  {t.note}"
            )
        lines.append(f"kept {self.chosen.name}: {self.chosen.reason}")
        return "\n".join(lines)


# ---- the candidates' builders -------------------------------------------------------------


def _construction(problem: Problem) -> Program:
    """The paper's construction (`sweep`) at its best warm-up and W-filling rule."""
    if "construction" not in problem.memo:  # the next candidate starts from it
        problem.memo["construction"] = best_sweep(problem.costs, problem.m, problem.limit)
    program = problem.memo["construction"]
    if program is None:
        raise ValueError(f"no warm-up fits memory_limit={problem.limit:g}")
    return program


def _deferred(problem: Problem) -> Program:
    # the construction lets a W overrun the gap before an I by a little; on the critical
    # path that slip repeats rank after rank: defer those Ws (one rank per round at worst)
    start = Schedule(_construction(problem), problem.stage_to_rank, problem.m)
    return defer_late_ws(start, problem.costs, problem.limit, 2 * problem.pp).program


def _heuristic(problem: Problem) -> Program:
    return best_heuristic(problem.costs, problem.m, problem.limit, give_up=problem.beat)


def _greedy(fill: float, hold: float) -> Callable[[Problem], Program]:
    def build(problem: Problem) -> Program:
        where, m, limit = problem.stage_to_rank, problem.m, problem.limit
        return greedy(where, m, problem.costs, limit, fill, hold, give_up=problem.beat)

    return build


def _fixed(fn: Callable[[int, int], Program]) -> Callable[[Problem], Program]:
    return lambda problem: fn(problem.pp, problem.m)


_KEPT = 16  # searches remembered (by their arguments), the oldest forgotten first
_RECENT: dict[tuple, AutoSearch] = {}


# Each reason says where the candidate was strictly the fastest (or ties, then what it
# guarantees), from 1200 (linear) and 800 (v) random settings: p 2..8, m 4..24, F, I in
# 0.5..2, W in 0.25..1.5, comm 0..0.2, M_W 0..0.5, limits 0.5..2 times the default.
_LINEAR = [
    Candidate(
        "construction",
        "the paper's sweep at its best warm-up and W rule: the usual winner",
        _construction,
    ),
    Candidate(
        "construction, late Ws deferred",
        "Ws that delay the critical path moved later: a little faster",
        _deferred,
    ),
    Candidate(
        "greedy fill=0 hold=0",
        "finishes when no warm-up fits; wins far from p..2p*M_B",
        _greedy(0.0, 0.0),
    ),
    Candidate(
        "greedy fill=0.5 hold=0",
        "a W waits for an I due within W/2: wins under p*M_B, W short",
        _greedy(0.5, 0.0),
    ),
    Candidate(
        "greedy fill=0 hold=0.5",
        "an F waits for an I due within F/2: wins under p*M_B, W long",
        _greedy(0.0, 0.5),
    ),
    Candidate("greedy fill=0.5 hold=0.5", "both waits: wins under p*M_B", _greedy(0.5, 0.5)),
    Candidate(
        "reference heuristic",
        "the paper's repo's zb.py: wins 55 of 300 between p and 2p*M_B, by up to 5%",
        _heuristic,
    ),
    Candidate(
        "ZB-H1",
        "hand-written, 1F1B's memory: fastest at p*M_B when I > F; never worse",
        _fixed(fixed.zb_h1),
        handwritten=True,
    ),
    Candidate(
        "ZB-H2",
        "hand-written: a guarantee only (zb-auto is never worse where it fits)",
        _fixed(fixed.zb_h2),
        handwritten=True,
    ),
]
_V = [
    Candidate(
        "paper's ZB-V",
        "build_schedule('zb-v'): wins ties, usually fastest at the 2p default",
        _fixed(fixed.zb_v),
        handwritten=True,
    ),
    Candidate(
        "greedy fill=0 hold=0", "a W fills any gap: the usual winner above 2p", _greedy(0.0, 0.0)
    ),
    Candidate(
        "greedy fill=0 hold=0.5", "rare (3 of 800): W short, limit above 2p", _greedy(0.0, 0.5)
    ),
    Candidate(
        "greedy fill=0 hold=1",
        "rare (1 of 800): kept so the old zb-v's search is unchanged",
        _greedy(0.0, 1.0),
    ),
    Candidate(
        "greedy fill=0.5 hold=0",
        "a W waits for an I due within W/2: wins with comm, small m",
        _greedy(0.5, 0.0),
    ),
    Candidate(
        "greedy fill=0.5 hold=0.5", "both waits, half: wins with comm when W < I", _greedy(0.5, 0.5)
    ),
    Candidate("greedy fill=0.5 hold=1", "rare (5 of 800): comm, I >= F", _greedy(0.5, 1.0)),
    Candidate(
        "greedy fill=1 hold=0",
        "a W waits for an I due within W: wins when W is short, F > I",
        _greedy(1.0, 0.0),
    ),
    Candidate(
        "greedy fill=1 hold=0.5",
        "wins under 2p with short W and few microbatches",
        _greedy(1.0, 0.5),
    ),
    Candidate(
        "greedy fill=1 hold=1", "both waits, whole: wins when I > F and m < 2p", _greedy(1.0, 1.0)
    ),
]
CANDIDATES: dict[str, list[Candidate]] = {"linear": _LINEAR, "v": _V}


# ---- the search ---------------------------------------------------------------------------


def search(
    pp: int,
    m: int,
    name: str = "zb-auto",
    costs: Costs | Sequence[Costs] | None = None,
    memory_limit: float | None = None,
    placement: str = "linear",
) -> AutoSearch:
    """The fastest candidate of `placement` under `memory_limit` (module docstring).

    Hand-written candidates are timed first; once the best so far reaches `lower_bound`
    the others are not run (no schedule can be faster). A greedy gives up as soon as it is
    sure to end slower than the best so far. Candidates are timed with the simulator's
    engine alone; only the winner is validated, the next one taken if it fails (a
    hand-written pattern that does not fit these sizes). The last few results are kept:
    the same question again (a slider moved back) is answered at once.
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"{name}: placement must be one of {PLACEMENTS}, got {placement!r}")
    stages = 2 * pp if placement == "v" else pp
    per_stage = costs_per_stage(costs, stages, name)
    if memory_limit is None:
        # 1F1B's rank 0 holds p microbatches of its whole model part: p stages, or 2p halves
        memory_limit = stages * max(c.mem_activation for c in per_stage)
    if not isinstance(memory_limit, int | float) or memory_limit <= 0:
        raise ValueError(f"{name}: memory_limit must be a number > 0, got {memory_limit!r}")
    key = (pp, m, name, tuple(per_stage), float(memory_limit), placement)
    if key not in _RECENT:
        _RECENT[key] = _search(Problem(pp, m, per_stage, memory_limit, placement), name)
        while len(_RECENT) > _KEPT:
            _RECENT.pop(next(iter(_RECENT)))  # the oldest
    _RECENT[key] = found = _RECENT.pop(key)  # now the newest
    # a copy: the caller may edit its schedule, the kept one must stay as found
    program = {r: list(actions) for r, actions in found.schedule.program.items()}
    copy = Schedule(program, list(found.schedule.stage_to_rank), m, name)
    return replace(found, schedule=copy, tried=list(found.tried))


def _search(problem: Problem, name: str) -> AutoSearch:
    candidates = CANDIDATES[problem.placement]
    where, m, limit = problem.stage_to_rank, problem.m, problem.limit
    bound = lower_bound(where, m, problem.costs, limit, problem.placement)
    reached = bound + 1e-9 * max(1.0, bound)  # a span this short is optimal
    durations = {(s, k): c.duration(k) for s, c in enumerate(problem.costs) for k in KINDS}
    delta = {(s, k): c.memory(k) for s, c in enumerate(problem.costs) for k in KINDS}
    comm = [c.comm for c in problem.costs]

    rows: dict[int, Tried] = {}
    scored: list[tuple[float, float, int, Schedule]] = []  # (span, peak, index, schedule)
    proof = None  # why the candidates not yet run need not be
    for i in sorted(range(len(candidates)), key=lambda i: not candidates[i].handwritten):
        candidate = candidates[i]
        if proof:
            rows[i] = Tried(candidate, None, None, f"not run: {proof}")
            continue
        problem.beat = min(scored)[0] if scored else math.inf
        try:
            schedule = Schedule(candidate.build(problem), where, m, name)
        except ValueError as err:  # it cannot meet this limit: say why in the table
            rows[i] = Tried(candidate, None, None, f"cannot build: {err}")
            continue
        except Slower as err:
            best = candidates[min(scored)[2]].name
            rows[i] = Tried(candidate, None, None, f"stopped: slower than {best} ({err})")
            continue
        peak = 0.0
        for actions in schedule.program.values():
            held = 0.0
            for a in actions:
                held += delta[a.stage, a.kind]
                peak = max(peak, held)
        if peak > limit + 1e-9:
            rows[i] = Tried(candidate, None, peak, "over the limit")
            continue
        try:
            times = _engine.run(schedule, durations, comm)
        except (_engine.Stuck, IndexError, KeyError) as err:  # not for these sizes
            rows[i] = Tried(candidate, None, peak, f"cannot run: {type(err).__name__}")
            continue
        span = max(t[-1][1] - t[0][0] for t in times.values() if t)
        rows[i] = Tried(candidate, span, peak, "fits")
        scored.append((span, peak, i, schedule))
        if span <= reached and _valid(schedule):
            proof = f"{candidate.name} reaches the lower bound {bound:.6g}"
    tried = [rows[i] for i in range(len(candidates))]
    for _, _, i, schedule in sorted(scored, key=lambda x: x[:3]):
        if proof or _valid(schedule):  # a proven one was validated already
            return AutoSearch(schedule, candidates[i], tried, limit, problem.placement)
        tried[i] = Tried(candidates[i], None, tried[i].peak, "invalid")
    why = "\n".join(f"  {t.candidate.name}: {t.note}" for t in tried)
    raise ValueError(f"{name}: no candidate fits memory_limit={limit:g}:\n{why}")


def _valid(schedule: Schedule) -> bool:
    """Whether a scored candidate is valid: the validator's checks without its deadlock walk,
    which the engine already made when it timed the candidate (a deadlock raises Stuck)."""
    try:
        check_actions(schedule)
    except ScheduleError:
        return False
    return True


def zb_auto(
    pp: int,
    m: int,
    name: str,
    costs: Costs | Sequence[Costs] | None = None,
    memory_limit: float | None = None,
    placement: str = "linear",
) -> Schedule:
    """The fastest of `CANDIDATES[placement]` under `memory_limit` (see `search`)."""
    return search(pp, m, name, costs, memory_limit, placement).schedule
