"""zb-auto's candidates: what each is built for (`Problem`), and the named list per placement.

Each `Candidate` has a name, a one-line reason it is in the list (where it won, or what it
guarantees) and a builder; `auto.search` times them and keeps the fastest that fits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from zbkit.schedules.core.action import Action
from zbkit.schedules.core.costs import Costs
from zbkit.schedules.core.placement import stage_to_rank
from zbkit.schedules.core.schedule import Schedule
from zbkit.schedules.named import fixed
from zbkit.schedules.optimum.exact import cp_sat, prove
from zbkit.schedules.search.greedy import Moves, Waits, greedy
from zbkit.schedules.search.heuristic import best_heuristic
from zbkit.schedules.search.refine import best_sweep, defer_late_ws, plain_program
from zbkit.schedules.search.timeline import Slower
from zbkit.schedules.search.v_heuristic import best_v_heuristic

PLACEMENTS = ("linear", "v")

Program = Mapping[int, Sequence[Action]]


@dataclass(frozen=True)
class Problem:
    """What every candidate is built for."""

    pp: int
    m: int
    costs: list[Costs]  # one per stage
    limit: float  # peak memory per rank, in the per-stage costs' memory units (summed)
    placement: str  # "linear" or "v"

    @property
    def stage_to_rank(self) -> list[int]:
        return stage_to_rank(self.placement, self.pp)


@dataclass(frozen=True)
class SoFar:
    """What one search has found when it builds the next candidate: handed in, never
    written back (what a builder finds out, it returns in its `Built`)."""

    beat: float = math.inf  # the best span so far: a builder may give up (`Slower`) above it
    best: Schedule | None = None  # the schedule of that span (the solver starts from it)
    # work this one search's candidates share, kept by the search: the construction the
    # deferred candidate starts from, and where greedies stopped
    scratch: dict = field(default_factory=dict, compare=False)


class Built(NamedTuple):
    """A candidate's program, and the lower bound its builder proved (the solver's), else 0."""

    program: Program
    proven: float = 0.0


Builder = Callable[[Problem, SoFar], "Program | Built"]


@dataclass(frozen=True)
class Candidate:
    name: str
    reason: str  # one line: where it wins, or what it guarantees
    build: Builder  # raises ValueError if it cannot meet the limit
    handwritten: bool = False  # cheap: timed first, it may prove the others need not run

    def built(self, problem: Problem, so_far: SoFar | None = None) -> Built:
        """Its program for `problem`, given what the search found so far (nothing: first)."""
        out = self.build(problem, SoFar() if so_far is None else so_far)
        return out if isinstance(out, Built) else Built(out)


# ---- the candidates' builders -------------------------------------------------------------


def _construction(problem: Problem, so_far: SoFar) -> Program:
    """The paper's construction (`sweep`) at its best warm-up and W-filling rule."""
    if "construction" not in so_far.scratch:  # the next candidate starts from it
        so_far.scratch["construction"] = best_sweep(problem.costs, problem.m, problem.limit)
    program = so_far.scratch["construction"]
    if program is None:
        raise ValueError(f"no warm-up fits memory_limit={problem.limit:g}")
    return program


def _deferred(problem: Problem, so_far: SoFar) -> Program:
    # the construction lets a W overrun the gap before an I by a little; on the critical
    # path that slip repeats rank after rank: defer those Ws (one rank per round at worst)
    start = Schedule(_construction(problem, so_far), problem.stage_to_rank, problem.m)
    return plain_program(defer_late_ws(start, problem.costs, problem.limit, 2 * problem.pp))


def _heuristic(problem: Problem, so_far: SoFar) -> Program:
    return best_heuristic(problem.costs, problem.m, problem.limit, give_up=so_far.beat)


# the reference V scheduler walks every action in Python, 4 to 12 builds (~3 us an action
# each): above this many actions it is left out. It was needed at p <= 16 (the paper's
# p=16 settings: +0.06-0.12% without it); at p = 24 and 32 the greedies beat it by 0.04-0.16%
V_HEURISTIC_MAX_ACTIONS = 30_000


def _v_heuristic(problem: Problem, so_far: SoFar) -> Program:
    actions = 6 * problem.pp * problem.m
    if actions > V_HEURISTIC_MAX_ACTIONS:
        raise ValueError(
            f"not run: {actions} actions > {V_HEURISTIC_MAX_ACTIONS} (too slow in Python; "
            "at this size the greedies have matched or beaten it)"
        )
    return best_v_heuristic(problem.costs, problem.m, problem.limit, give_up=so_far.beat)


# zb-auto proves small settings itself where CP-SAT is installed: a solve of at most this
# many actions (F, I and W per stage and microbatch) on one worker, capped in CP-SAT's
# deterministic seconds (a cap gives the same schedule on a busy machine, unlike a time
# limit, which only guards). Measured (benchmarks/exact.py's grid, started from the best
# candidate): linear settings of 96 actions (p=4, m=8) prove in under 0.4 s; the V's of 96
# (p=2, m=8) in 1-3 s, all 9 within the cap (the paper's times under 1.5 needs 3: the
# greedies' 47.3 -> 44.6 at 2, the optimum 43.05 at 3); at 144 actions (the V at p=3, m=8)
# 5 would find better orders in 3-11 s, too long for every build: left to `solve`.
EXACT_MAX_ACTIONS = 96  # either placement
EXACT_WORK = 3.0
EXACT_SECONDS = 20.0


def _exact(problem: Problem, so_far: SoFar) -> Built:
    """The exact optimum (`exact.prove`), started from the best candidate so far."""
    actions, most = 3 * len(problem.stage_to_rank) * problem.m, EXACT_MAX_ACTIONS
    if actions > most:
        raise ValueError(
            f"not run: {actions} actions > {most} (too slow to prove on every build; "
            "zbkit.schedules.solve proves larger settings)"
        )
    try:
        cp_sat()
    except ImportError:
        raise ValueError("not run: needs CP-SAT (pip install 'zbkit[exact]')") from None
    found = prove(
        problem.stage_to_rank, problem.m, problem.costs, problem.limit, problem.placement,
        warm=so_far.best, time_limit=EXACT_SECONDS, work=EXACT_WORK,
    )  # fmt: skip
    program = {r: list(found.schedule.actions(r)) for r in found.schedule.program}
    return Built(program, found.lower_bound)


def _greedy(
    fill: float, hold: float, defer: float = 0.0, lead: float = math.inf, feed: float = 0.0
) -> Builder:
    waits = Waits(fill, hold, defer, lead, feed)

    def build(problem: Problem, so_far: SoFar) -> Program:
        # the variants often move alike until they stop (a warm-up that no wait test
        # touches): a variant some earlier stopped run covers would stop there too, since
        # the best span, what they stop above, only shrinks during a search
        stops = so_far.scratch.setdefault("greedy stops", [])
        for other, moves, beat, why in stops:
            if so_far.beat <= beat and moves.covers(waits):
                raise Slower(
                    f"makes the same moves as greedy {other} until that one stopped: {why}"
                )
        moves = Moves()
        try:
            return greedy(problem.stage_to_rank, problem.m, problem.costs, problem.limit, waits,
                          give_up=so_far.beat, moves=moves)  # fmt: skip
        except Slower as err:
            stops.append((str(waits), moves, so_far.beat, err))
            raise

    return build


def _fixed(fn: Callable[[int, int], Program]) -> Builder:
    return lambda problem, so_far: fn(problem.pp, problem.m)


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
    # the feed wait: 100 more random linear settings (the same ranges), where it beat every
    # candidate of the list in 12 (the tight limits: the proven optima keep Ws back for an F)
    Candidate(
        "greedy fill=1 hold=0 feed=2",
        "a W also waits for an F due within 2W: beat the rest in 12 of 100, by up to 11%",
        _greedy(1.0, 0.0, feed=2.0),
    ),
    Candidate(
        "greedy fill=0.5 hold=0.5 feed=2",
        "with hold: beat the list with the one above in 7 of 100 more, by up to 9%",
        _greedy(0.5, 0.5, feed=2.0),
    ),
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
    Candidate(
        "exact (CP-SAT)",
        "the proven optimum of small settings (<= 96 actions) where OR-Tools is installed",
        _exact,
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
    # the defer wait: 200 random V settings (the same ranges), where zb-auto without these
    # three was beaten by one of them in 54 (27%), by 2.5% on average and up to 10%
    Candidate(
        "greedy fill=0.5 hold=0 defer=1",
        "a first-chunk F waits for a second-chunk F due within F: wins 24 of 200 (V)",
        _greedy(0.5, 0.0, 1.0),
    ),
    Candidate(
        "greedy fill=1 hold=0 defer=0.5",
        "the same within F/2, a W waits for an I within W: wins 18 of 200",
        _greedy(1.0, 0.0, 0.5),
    ),
    Candidate(
        "greedy fill=0 hold=0 defer=0.5",
        "defer alone, within F/2: wins 12 of 200",
        _greedy(0.0, 0.0, 0.5),
    ),
    # the lead cap: 200 more random V settings, where zb-auto with the three above was
    # beaten by one of these three in 33 (16%), by up to 14%
    Candidate(
        "greedy fill=1 hold=0 lead=1.5",
        "at most 1.5(p - r) first-chunk Fs ahead of the second: beat the above in 20 of 200",
        _greedy(1.0, 0.0, lead=1.5),
    ),
    Candidate(
        "greedy fill=0.5 hold=0 defer=0.5 lead=1",
        "at most p - r ahead, and the defer wait: 10 more of 200",
        _greedy(0.5, 0.0, 0.5, 1.0),
    ),
    Candidate(
        "greedy fill=0 hold=0 lead=1.5",
        "the cap alone: 3 more of 200",
        _greedy(0.0, 0.0, lead=1.5),
    ),
    # the feed wait: 100 more random V settings, where these two beat the list above in 15
    Candidate(
        "greedy fill=0.5 hold=0 defer=0.5 lead=1 feed=2",
        "a W also waits for an F due within 2W: beat the above in 10 of 100, by up to 4%",
        _greedy(0.5, 0.0, 0.5, 1.0, 2.0),
    ),
    Candidate(
        "greedy fill=1 hold=0 lead=1.5 feed=0.5",
        "the same within W/2: 5 more of 100",
        _greedy(1.0, 0.0, lead=1.5, feed=0.5),
    ),
    Candidate(
        "greedy fill=1 hold=0.5 defer=0.5 lead=1 feed=2",
        "every wait and the cap: beat the list with the above in 4 of 100 more, up to 6%",
        _greedy(1.0, 0.5, 0.5, 1.0, 2.0),
    ),
    Candidate(
        "reference V heuristic",
        "the paper's repo's zbv.py: so zb-auto is never slower than it (e.g. 74 vs 76)",
        _v_heuristic,
    ),
    Candidate(
        "exact (CP-SAT)",
        "the proven optimum of small settings (<= 96 actions) where OR-Tools is installed",
        _exact,
    ),
]
CANDIDATES: dict[str, list[Candidate]] = {"linear": _LINEAR, "v": _V}
