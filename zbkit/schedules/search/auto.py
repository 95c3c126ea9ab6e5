"""zb-auto: the fastest of a list of named candidate schedules that fits a memory limit.

Each placement has its list of candidates (`CANDIDATES`), each with a one-line reason it is
there. zb-auto builds each candidate for the costs and the limit it is given, drops those
that go over the limit, times the rest with the simulator's engine and keeps the fastest
(longest rank span, then peak memory, then the list's order). The hand-written ones are
timed first: when one reaches a lower bound (`optimum.bounds`: no schedule under the limit is
faster) the search stops there, and a greedy gives up once it must end slower than the
best so far. `explain_auto` returns the whole table: which candidate won, and what each
one scored or why it was left out ("not run: ZB-H1 reaches the lower bound ...").

- `placement="linear"` (default; stage s on rank s, limit p * M_B by default): the paper's
  microbatch-by-microbatch construction (`heuristic.sweep`) for a few warm-up shapes and
  W-filling rules, refined rank by rank and then on its critical path (`refine`); the
  event-driven greedy; the reference repo's heuristic (`heuristic`); ZB-H1 and ZB-H2.
  tests/schedules/test_schedules_auto.py holds it to the paper's ZB-1p and ZB-2p.
- `placement="v"` (stage s and 2p-1-s on rank s, limit 2p half-stage activations = 1F1B's
  peak by default): the paper's hand-written ZB-V (what `build_schedule("zb-v")` returns),
  the greedy, which does better when the costs are unequal or the limit differs, and the
  reference repo's V scheduler (`v_heuristic`), so zb-auto is never slower than it
  (tests/schedules/test_schedules_v_reference.py).
- where CP-SAT is installed, the exact optimum of small settings (`candidates`), started
  from the best candidate so far; what it proves raises the search's bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from zbkit.schedules.core.costs import (
    TOL,
    Costs,
    beyond,
    keyed_costs,
    one_f_one_b_peak,
    running_peak,
)
from zbkit.schedules.core.costs import per_stage as costs_per_stage
from zbkit.schedules.core.recent import Recent
from zbkit.schedules.core.schedule import Proof, Schedule, ScheduleError
from zbkit.schedules.optimum.bounds import gap_line, lower_bound
from zbkit.schedules.search.candidates import CANDIDATES, PLACEMENTS, Candidate, Problem, SoFar
from zbkit.schedules.search.timeline import Slower
from zbkit.schedules.sim import engine
from zbkit.schedules.sim.validate import check_actions


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
    lower_bound: float = 0.0  # certified: no schedule under the limit is faster (`optimum.bounds`)

    @property
    def span(self) -> float:
        """The chosen schedule's longest rank span."""
        return next(t.span for t in self.tried if t.candidate is self.chosen) or 0.0

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
        lines.append(f"how far from optimal: {gap_line(self.span, self.lower_bound)}")
        return "\n".join(lines)


_RECENT: Recent[AutoSearch] = Recent()  # searches remembered by their arguments


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
    where = Problem(pp, m, [], 0.0, placement).stage_to_rank
    per_stage = costs_per_stage(costs, where, name)  # one Costs: a rank's share, split
    if memory_limit is None:  # 1F1B's rank 0: p microbatches of its whole model part
        memory_limit = one_f_one_b_peak(where, per_stage)
    if not isinstance(memory_limit, int | float) or memory_limit <= 0:
        raise ValueError(f"{name}: memory_limit must be a number > 0, got {memory_limit!r}")
    key = (pp, m, name, tuple(per_stage), float(memory_limit), placement)
    found = _RECENT.get(key, lambda: _search(Problem(pp, m, per_stage, memory_limit, placement),
                                             name))  # fmt: skip
    # a copy: the caller may edit its schedule, the kept one must stay as found; it carries
    # what the search proved of it (`bound_for` reads it)
    program = {r: list(actions) for r, actions in found.schedule.program.items()}
    proof = Proof.of(program, per_stage, found.memory_limit, found.lower_bound)
    copy = Schedule(program, list(found.schedule.stage_to_rank), m, name, proof=proof)
    return replace(found, schedule=copy, tried=list(found.tried))


def _search(problem: Problem, name: str) -> AutoSearch:
    candidates = CANDIDATES[problem.placement]
    where, m, limit = problem.stage_to_rank, problem.m, problem.limit
    bound = lower_bound(where, m, problem.costs, limit, problem.placement)
    reached = beyond(bound)  # a span this short is optimal
    durations, delta = keyed_costs(problem.costs)
    comm = [c.comm for c in problem.costs]

    rows: dict[int, Tried] = {}
    scored: list[tuple[float, float, int, Schedule]] = []  # (span, peak, index, schedule)
    proof = None  # why the candidates not yet run need not be
    scratch: dict = {}  # work this search's candidates share (`SoFar.scratch`)
    for i in sorted(range(len(candidates)), key=lambda i: not candidates[i].handwritten):
        candidate = candidates[i]
        if proof:
            rows[i] = Tried(candidate, None, None, f"not run: {proof}")
            continue
        beat, _, _, best = min(scored) if scored else (math.inf, 0, 0, None)
        try:
            built = candidate.built(problem, SoFar(beat, best, scratch))
            program = built.program
            schedule = Schedule(program, where, m, name)
        except ValueError as err:  # it cannot meet this limit, or is left out: say why
            why = str(err)
            rows[i] = Tried(
                candidate,
                None,
                None,
                why if why.startswith("not run: ") else f"cannot build: {why}",
            )
            continue
        except Slower as err:
            leader = candidates[min(scored)[2]].name
            rows[i] = Tried(candidate, None, None, f"stopped: slower than {leader} ({err})")
            continue
        peak = max(
            (running_peak(delta[a.stage, a.kind] for a in actions) for actions in program.values()),
            default=0.0,
        )
        if peak > limit + TOL:
            rows[i] = Tried(candidate, None, peak, "over the limit")
            continue
        try:
            times = engine.run(schedule, durations, comm)
        except engine.Stuck as err:  # a pattern that deadlocks at these sizes
            rows[i] = Tried(candidate, None, peak, f"cannot run: {type(err).__name__}")
            continue
        span = max(t[-1][1] - t[0][0] for t in times.values() if t)
        rows[i] = Tried(candidate, span, peak, "fits")
        scored.append((span, peak, i, schedule))
        if built.proven > bound:  # the solver proved more than the instant bound
            bound, reached = built.proven, beyond(built.proven)
        if span <= reached and _valid(schedule):
            proof = f"{candidate.name} reaches the lower bound {bound:.6g}"
    tried = [rows[i] for i in range(len(candidates))]
    for _, _, i, schedule in sorted(scored, key=lambda x: x[:3]):
        if proof or _valid(schedule):  # a proven one was validated already
            return AutoSearch(schedule, candidates[i], tried, limit, problem.placement, bound)
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
