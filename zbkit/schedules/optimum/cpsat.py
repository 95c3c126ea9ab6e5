"""The exact solver's model for CP-SAT (OR-Tools): `exact.prove` builds, solves and reads it
back; `exact`'s docstring gives the formulation.

`Model` holds the actions, their durations, memory deltas, ranks, dependencies (`graph`) and
where each rank's first forward starts (engine-free; `bounds.chains` walks it too);
`Built` is the CP-SAT model of it (intervals, one rank's never overlapping, a memory reservoir
per rank, the objective), with the warm start (`hint`) and the search (`solve`); `schedule_of`
reads a schedule back from the solver's times, `warm_value` caps the goal with a given
schedule's value where it is one of the schedules solved over.
"""

from __future__ import annotations

import math

from zbkit.schedules.core.action import PARTS, Action, waits_on
from zbkit.schedules.core.costs import TOL, Costs
from zbkit.schedules.core.schedule import Schedule
from zbkit.schedules.sim.simulate import Simulation

# the solver works on whole multiples of a time unit (`scale`): a value within this fraction
# of its bound is proven optimal (coarser than `TOL`: the units round real costs down)
SOLVER_GAP = 1e-6


class Model:
    """The actions, their durations, memory deltas, ranks and dependencies."""

    def __init__(self, where: list[int], m: int, costs: list[Costs]) -> None:
        self.where, self.m, self.costs = where, m, costs
        self.actions = [(s, k, j) for s in range(len(where)) for k in PARTS for j in range(m)]
        self.index = {a: i for i, a in enumerate(self.actions)}
        self.dur = [costs[s].duration(k) for s, k, _ in self.actions]
        self.delta = [costs[s].memory(k) for s, k, _ in self.actions]
        self.rank = [where[s] for s, _, _ in self.actions]
        # (before, after, gap): after starts >= before's end + gap
        self.edges: list[tuple[int, int, float]] = []
        for s, k, j in self.actions:
            a = self.index[s, k, j]
            for ds, dk in waits_on(s, k, len(where)):  # the readiness rule, from `KINDS`
                self._edge((ds, dk, j), a, ds, s)
            if j > 0:  # in order on the stage
                self._edge((s, k, j - 1), a, s, s)
        preds, succs, topo = graph(len(self.actions), self.edges)
        assert topo is not None  # dependencies never close a cycle
        self.topo = topo  # one order respecting every dependency
        # each rank's first forward where the simulator starts it: rank 0's at 0, the others'
        # as soon as the stage before has sent microbatch 0 (stage s is rank s's)
        self.pins = [0.0]
        for s in range(1, max(where) + 1):
            prev = self.index[s - 1, "F", 0]
            self.pins.append(self.pins[-1] + self.dur[prev] + self.hop(s - 1, s))

    def hop(self, src: int, dst: int) -> float:
        """What a tensor from stage `src` to stage `dst` adds to the wait (the waiting
        stage's comm, as the simulator charges it; nothing on one rank)."""
        return self.costs[dst].comm if self.where[src] != self.where[dst] else 0.0

    def _edge(self, before: tuple, after: int, src: int, dst: int) -> None:
        self.edges.append((self.index[before], after, self.hop(src, dst)))


def graph(n: int, edges: list[tuple[int, int, float]]):
    """Predecessors and successors (with each edge's hop) of n actions, and one topological
    order, None where the edges close a cycle."""
    preds: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    succs: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for a, b, hop in edges:
        preds[b].append((a, hop))
        succs[a].append((b, hop))
    indeg = [len(p) for p in preds]
    order, ready = [], [a for a in range(n) if indeg[a] == 0]
    while ready:
        a = ready.pop()
        order.append(a)
        for b, _ in succs[a]:
            indeg[b] -= 1
            if indeg[b] == 0:
                ready.append(b)
    return preds, succs, (order if len(order) == n else None)


def by_rank(model: Model) -> dict[int, list[int]]:
    by_rank: dict[int, list[int]] = {}
    for a, r in enumerate(model.rank):
        by_rank.setdefault(r, []).append(a)
    return by_rank


def value_of(sim: Simulation, objective: str) -> float:
    """A simulated schedule's objective: its longest rank span, or its makespan."""
    return max(sim.span) if objective == "span" else sim.makespan


def warm_value(warm: Schedule, sim: Simulation, objective: str, model: Model, limit: float):
    """`warm`'s objective (`sim`: its simulation), a little above (a cap the warm start itself
    meets), or None where it is no cap on the optimum: its actions not this formulation's,
    or over the limit."""
    if {(e.stage, e.kind, e.microbatch) for e in sim.events} != set(model.actions):
        return None
    if max(sim.peak_memory) > limit + TOL or not in_order(warm):
        return None  # not one of the schedules solved over: it may beat their optimum
    value = value_of(sim, objective)
    return value + SOLVER_GAP * max(1.0, value)


def in_order(schedule: Schedule) -> bool:
    """Whether every stage runs each kind's microbatches in order, as the model does."""
    for r in schedule.program:
        last: dict[tuple[int, str], int] = {}
        for a in schedule.actions(r):
            if last.get((a.stage, a.kind), -1) > a.microbatch:
                return False
            last[a.stage, a.kind] = a.microbatch
    return True


def schedule_of(model: Model, times: list[float], m: int) -> Schedule:
    """Each rank's actions in the order the solver timed them (ties: dependencies first)."""
    topo = {a: i for i, a in enumerate(model.topo)}
    program: dict[int, list[Action]] = {}
    for a in sorted(range(len(model.actions)), key=lambda a: (times[a], topo[a])):
        s, k, j = model.actions[a]
        program.setdefault(model.rank[a], []).append(Action(s, k, j))
    return Schedule(program, list(model.where), m, "zb-opt")


def scale(values: list[float], most: int = 10**6) -> tuple[int, bool]:
    """The smallest power of ten up to `most` that makes every value whole, and True; or
    (`most`, False) where none does (the values are then rounded: a relaxation)."""
    s = 1
    while s <= most:
        if all(abs(v * s - round(v * s)) <= TOL * max(1.0, v * s) for v in values):
            return s, True
        s *= 10
    return most, False


class Built:
    """The CP-SAT model of `Model` under a memory limit: an interval per action (its start a
    whole number of 1/`unit`), no two of a rank's overlapping, a reservoir per rank (each
    action's memory delta at its start) under the limit, the objective's `goal`."""

    def __init__(
        self, model: Model, limit: float, objective: str, floor: float, cap: float | None
    ) -> None:
        from ortools.sat.python import cp_model

        comms = [c.comm for c in model.costs]
        self.unit, exact = scale([*model.dur, *comms])
        # rounded down where no unit is exact: every real order fits, its goal no larger
        whole = round if exact else math.floor
        dur = [whole(d * self.unit) for d in model.dur]
        pin = [whole(p * self.unit) for p in model.pins]
        horizon = sum(dur) + len(dur) * whole(max(comms) * self.unit)
        cp = self.cp = cp_model.CpModel()
        self.start = [cp.new_int_var(0, horizon, f"t{a}") for a in range(len(dur))]
        for a, b, hop in model.edges:
            cp.add(self.start[b] >= self.start[a] + dur[a] + whole(hop * self.unit))
        for s, at in enumerate(pin):
            cp.add(self.start[model.index[s, "F", 0]] == at)
        mem, mem_exact = scale([*model.delta, limit])
        held = [round(d * mem) for d in model.delta]
        for acts in by_rank(model).values():
            boxes = [cp.new_fixed_size_interval_var(self.start[a], dur[a], f"i{a}") for a in acts]
            cp.add_no_overlap(boxes)
            slack = 0 if mem_exact else len(acts)  # rounding: every real order still fits
            most = math.floor(limit * mem + TOL * max(1.0, limit * mem)) + slack
            cp.add_reservoir_constraint(
                [self.start[a] for a in acts], [held[a] for a in acts],
                -sum(abs(held[a]) for a in acts), most,
            )  # fmt: skip
        top = horizon if cap is None else min(horizon, math.ceil(cap * self.unit))
        self.goal = cp.new_int_var(0, top, "goal")
        for a, r in enumerate(model.rank):
            zero = pin[r] if objective == "span" else 0
            cp.add(self.goal >= self.start[a] + dur[a] - zero)
        # a valid cut the search would otherwise have to prove: the instant lower bound
        cp.add(self.goal >= min(top, math.floor(floor * self.unit * (1 - TOL))))
        cp.minimize(self.goal)

    def hint(self, model: Model, sim: Simulation) -> None:
        """Start the search from a schedule's simulated times (`sim`, of one of the orders
        solved over: a schedule to prove, or beat)."""
        start = {(e.stage, e.kind, e.microbatch): e.start for e in sim.events}
        for a, var in enumerate(self.start):
            self.cp.add_hint(var, round(start[model.actions[a]] * self.unit))

    def solve(self, seconds: float, workers: int, work: float | None):
        """Run CP-SAT: `seconds` of wall time at most, or `work` deterministic seconds on
        one worker (the same answer on a busy machine). Returns the solver and its status."""
        from ortools.sat.python import cp_model

        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = float(seconds)
        solver.parameters.random_seed = 0
        # the stronger no-overlap reasoning: the V at p=3, m=8 with the paper's times under
        # 4.5 (an optimum 0.005 above the busy bound) proves in 17 s with it, not in 60 without
        solver.parameters.use_strong_propagation_in_disjunctive = True
        if work is not None:
            solver.parameters.num_workers = 1
            solver.parameters.max_deterministic_time = float(work)
        else:
            solver.parameters.num_workers = workers
        return solver, solver.solve(self.cp)
