"""The exact optimum of a small schedule: the order of F, I and W, solved by CP-SAT (OR-Tools).

The Zero Bubble paper's formulation, in zbkit's units (`Costs`' rule, `MEMORY_UNIT`):
every action a = (stage, kind, microbatch) gets a start time t[a] >= 0;
- dependencies: F(s, j) after F(s-1, j) ends (+ comm across ranks), I(s, j) after F(s, j) and
  after I(s+1, j) (+ comm), W(s, j) after I(s, j);
- one action at a time per rank (the paper: for two actions of a rank, a binary says which
  goes first, with big-M rows; here: each action an interval, a rank's never overlapping);
- memory: what a rank holds (each action's delta counted from its start) stays under the
  limit at all times (a reservoir per rank);
- microbatches in order on every stage (as every builder and torch order them), and each
  rank's first forward pinned where the simulator starts it, so the order the solver finds
  simulates to the solver's value.
Objective "span": the longest rank span (zb-auto's, the paper's: what sets the steady state
when iterations overlap); "makespan": one iteration's length. The solver's proven bound says
how far from the best possible any schedule of these sizes is.

CP-SAT reasons on the intervals themselves (no-overlap and reservoir propagation, clause
learning). Times are whole numbers of the smallest unit that makes
every cost exact (`cpsat.scale`; rounded down where none does, a relaxation: the bound
stays certified, and the schedule is simulated with the real costs). The search starts from
a given schedule (`solve` hands in zb-auto's), whose value also caps the goal, and the instant
`lower_bound` is a cut.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from zbkit.schedules.core.costs import TOL, Costs, least_peak, one_f_one_b_peak, per_stage
from zbkit.schedules.core.placement import stage_to_rank
from zbkit.schedules.core.schedule import Proof, Schedule
from zbkit.schedules.optimum import bounds, cpsat
from zbkit.schedules.optimum.bounds import gap_line
from zbkit.schedules.optimum.cpsat import SOLVER_GAP
from zbkit.schedules.sim.simulate import Simulation, simulate

__all__ = [
    "Solution",
    "bound_for",
    "cp_sat",
    "gap_line",
    "lower_bound",
    "lower_bound_parts",
    "prove",
    "setting",
]

OBJECTIVES = ("span", "makespan")


@dataclass(frozen=True)
class Solution:
    """What `solve` found: the schedule, its value as `simulate` measures it, and the bound."""

    schedule: Schedule
    objective: str  # "span" (the longest rank span) or "makespan"
    value: float  # the schedule's objective, simulated
    lower_bound: float  # proven: no in-order schedule of these sizes does better
    optimal: bool  # value reaches the bound
    seconds: float  # the solver's wall time

    @property
    def gap(self) -> float:
        """How far above the bound the value is, as a fraction of the value (0: optimal)."""
        return (self.value - self.lower_bound) / self.value if self.value > 0 else 0.0

    def __str__(self) -> str:
        proof = "optimal (proven)" if self.optimal else f"<= {self.gap:.1%} above optimal"
        return f"{self.objective} {self.value:.6g}, bound {self.lower_bound:.6g}: {proof}"


def lower_bound(
    *,
    pp: int,
    microbatches: int,
    costs: Costs | Sequence[Costs] | None = None,
    memory_limit: float | None = None,
    placement: str = "linear",
) -> float:
    """A certified lower bound on the longest rank span of any schedule of these sizes that
    runs each stage's microbatches in order (every builder's but GPipe's and looped BFS's
    backwards, torch's alike), for any size and fast (no solver): the busiest rank's
    work, the round trips a stage's microbatches make one after another when only k
    activations fit, for equal stages the idle time a rank cannot avoid at the start and
    end under the limit, and up to 768 actions a walk of every action's earliest start with
    the waits memory forces (`bounds.py`, `walk.py`; up to 192 actions it also walks both
    orders of each pair of a rank's forwards on different stages: under half a second)."""
    where, per, limit = setting(pp, microbatches, costs, memory_limit, placement, "lower_bound")
    return bounds.lower_bound(where, microbatches, per, limit, placement)


def lower_bound_parts(
    *,
    pp: int,
    microbatches: int,
    costs: Costs | Sequence[Costs] | None = None,
    memory_limit: float | None = None,
    placement: str = "linear",
) -> dict[str, float]:
    """`lower_bound`'s pieces by name, each a certified bound on its own; `lower_bound` is
    their max. "busy": the busiest rank's work; "round trips" and "one trip": a stage's
    microbatches going down the pipeline and back, as many at once as fit the limit; "walk":
    every action's earliest start (none above 768 actions); for equal stages, "rank 0" and
    "last stage" (linear) or "V start" (the V): the idle time rank 0 cannot avoid."""
    where, per, limit = setting(pp, microbatches, costs, memory_limit, placement, "lower_bound")
    parts = {
        "busy": bounds.busy(where, microbatches, per),
        "round trips": bounds.round_trips(where, microbatches, per, limit),
        "one trip": bounds.one_trip(where, microbatches, per),
    }
    if 3 * len(where) * microbatches <= bounds.CHAINS_MAX_ACTIONS:
        parts["walk"] = bounds.chains(where, microbatches, per, limit)
    if any(c != per[0] for c in per):  # the closed forms for rank 0 assume equal stages
        return parts
    p, c = max(where) + 1, per[0]
    if placement == "v":
        parts["V start"] = bounds.v_start(p, microbatches, c, limit)
    else:
        parts["rank 0"] = bounds.rank0(p, microbatches, c, limit)
        parts["last stage"] = bounds.last_stage(p, microbatches, c)
    return parts


def setting(
    pp: int,
    microbatches: int,
    costs: Costs | Sequence[Costs] | None,
    memory_limit: float | None,
    placement: str,
    who: str,
) -> tuple[list[int], list[Costs], float]:
    """Where the stages live, each stage's costs (`Costs`' rule) and the memory limit
    (1F1B's rank-0 peak unless given), as every entry point here reads its arguments; a
    ValueError naming what to change where a size or the limit cannot be."""
    for label, value in (("pp", pp), ("microbatches", microbatches)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{who}: {label} must be an int >= 1, got {value!r}")
    if placement not in ("linear", "v"):
        raise ValueError(f"{who}: placement must be 'linear' or 'v', got {placement!r}")
    where = stage_to_rank(placement, pp)
    per = per_stage(costs, where, who)
    if memory_limit is None:
        return where, per, one_f_one_b_peak(where, per)
    if not isinstance(memory_limit, int | float) or isinstance(memory_limit, bool):
        raise ValueError(f"{who}: memory_limit must be a number, got {memory_limit!r}")
    least = least_peak(where, per)
    if memory_limit < least - TOL:
        raise ValueError(
            f"{who}: memory_limit={memory_limit:g} is below what any order holds: a rank "
            f"holds one microbatch's activations of all its stages at once ({least:g}); "
            "raise it"
        )
    return where, per, float(memory_limit)


def bound_for(
    schedule: Schedule,
    costs: Costs | Sequence[Costs] | None = None,
    simulated: Simulation | None = None,
) -> float | None:
    """A certified lower bound on the longest rank span of any schedule with `schedule`'s
    placement and sizes that holds no more memory than it does; None where zbkit has none
    (overlapped pairs save time, which the bounds do not count). `simulated`: the schedule's
    simulation with these costs, if the caller has it (else it is simulated here)."""
    sim = simulated if simulated is not None else simulate(schedule, costs, check=False)
    per, where, m = sim.per_stage, schedule.stage_to_rank, schedule.microbatches
    paired = any(len(item.halves) == 2 for row in schedule.program.values() for item in row)
    if paired and any(c.overlap for c in per):
        return None
    placement = next((p for p in ("linear", "v") if where == stage_to_rank(p, schedule.pp)), None)
    # the walk (`bounds.chains`) counts on each stage's microbatches in order (GPipe's and
    # looped BFS's backwards run last-first)
    walk = cpsat.in_order(schedule)
    bound = bounds.lower_bound(where, m, per, max(sim.peak_memory), placement, walk=walk)
    peak = max(sim.peak_memory)
    proof = schedule.proof  # what zb-auto or the solver proved of this very program, if any
    proven = proof.lower_bound if proof is not None and proof.holds(schedule, per, peak) else 0.0
    return max(bound, proven)


# CP-SAT's parallel workers: at most the machine's cores, and 8 (its portfolio's sweet spot)
_WORKERS = max(1, min(8, os.cpu_count() or 1))


def cp_sat():
    try:  # the whole name, so a module marked missing in sys.modules reads as missing
        import ortools.sat.python.cp_model as cp_model
    except ImportError:
        raise ImportError(
            "zbkit.schedules.solve needs OR-Tools' CP-SAT: pip install 'zbkit[exact]'"
        ) from None
    return cp_model


def prove(
    where: list[int],
    m: int,
    per: list[Costs],
    limit: float,
    placement: str,
    objective: str = "span",
    time_limit: float = 60.0,
    warm: Schedule | None = None,
    work: float | None = None,
) -> Solution:
    """`solve` for per-stage costs, started from `warm` (a schedule of these sizes, or None);
    `work` caps the search in CP-SAT's deterministic seconds on one worker (a cap, unlike a
    time limit, gives the same answer on a busy machine)."""
    cp_sat()
    pp = max(where) + 1
    model = cpsat.Model(where, m, per)
    if max(model.delta) > limit + TOL:  # one forward alone is over the limit
        raise ValueError(f"solve: memory_limit={limit:g} is below what any order holds")
    floor = bounds.lower_bound(where, m, per, limit, placement)
    # the warm start, where it is one of the orders solved over: its value caps the goal,
    # its times start the search, and it stays if the search comes back with nothing better
    kept, cap = None, None
    if warm is not None:
        sim = simulate(warm, per, check=False)
        cap = cpsat.warm_value(warm, sim, objective, model, limit)
        kept = (warm, sim) if cap is not None else None
    built = cpsat.Built(model, limit, objective, floor, cap)
    if kept is not None:
        built.hint(model, kept[1])
    started = time.perf_counter()
    solver, status = built.solve(time_limit, _WORKERS, work)
    seconds = time.perf_counter() - started
    name = solver.status_name(status)
    if name not in ("OPTIMAL", "FEASIBLE"):
        if name == "INFEASIBLE":
            raise ValueError(
                f"solve: no schedule fits memory_limit={limit:g} for pp={pp}, "
                f"microbatches={m}; raise it"
            )
        if kept is None:
            raise ValueError(
                f"solve: no schedule found within time_limit={time_limit:g} s for pp={pp}, "
                f"microbatches={m} (CP-SAT: {name}); give it longer"
            )
    unit = built.unit
    bound = solver.best_objective_bound / unit if name != "UNKNOWN" else floor
    best, value = None, float("inf")
    if name in ("OPTIMAL", "FEASIBLE"):
        best = cpsat.schedule_of(model, [solver.value(x) for x in built.start], m)
        value = cpsat.value_of(simulate(best, per), objective)
    if kept is not None and cpsat.value_of(kept[1], objective) < value - TOL:
        program = {r: list(kept[0].actions(r)) for r in kept[0].program}
        best = Schedule(program, list(where), m, "zb-opt")
        value = cpsat.value_of(kept[1], objective)
    assert best is not None
    bound = min(value, max(bound, floor))
    tol = SOLVER_GAP * max(1.0, value)
    if objective == "span":  # the bound is on the longest rank span: `bound_for`'s question
        best = replace(best, proof=Proof.of(best.program, per, limit, bound))
    return Solution(best, objective, value, bound, value - bound <= tol, seconds)
