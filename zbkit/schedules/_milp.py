"""The exact solver's model: the order of F, I and W as a MILP for HiGHS (`exact.prove` builds,
solves and reads it back; `exact`'s docstring gives the formulation).

`Model` holds the actions, their durations, memory deltas, ranks and must-precede closure;
the functions add the model's parts to a `highspy.Highs`: the order binaries with their big-H
rows (`order`), each action's start window (`windows`), the rank-in-series cuts (`sequence`),
the memory rows (`memory`), the objective (`objective_of`), the warm start (`warm_start`), and
read a schedule back from the solver's times (`schedule_of`).
"""

from __future__ import annotations

from zbkit.schedules.action import Action
from zbkit.schedules.costs import Costs
from zbkit.schedules.schedule import Schedule
from zbkit.schedules.simulate import simulate

KINDS3 = ("F", "I", "W")


class Model:
    """The actions, their durations, memory deltas, ranks and must-precede closure."""

    def __init__(self, where: list[int], m: int, costs: list[Costs]) -> None:
        self.where, self.m, self.costs = where, m, costs
        last = len(where) - 1
        self.actions = [(s, k, j) for s in range(len(where)) for k in KINDS3 for j in range(m)]
        self.index = {a: i for i, a in enumerate(self.actions)}
        self.dur = [costs[s].duration(k) for s, k, _ in self.actions]
        self.delta = [costs[s].memory(k) for s, k, _ in self.actions]
        self.rank = [where[s] for s, _, _ in self.actions]
        # (before, after, gap): after starts >= before's end + gap
        self.edges: list[tuple[int, int, float]] = []
        for s, k, j in self.actions:
            a = self.index[s, k, j]
            if k == "F" and s > 0:
                self._edge((s - 1, "F", j), a, s - 1, s)
            if k == "I":
                self._edge((s, "F", j), a, s, s)
                if s < last:
                    self._edge((s + 1, "I", j), a, s + 1, s)
            if k == "W":
                self._edge((s, "I", j), a, s, s)
            if j > 0:  # in order on the stage
                self._edge((s, k, j - 1), a, s, s)
        self.succ: list[list[int]] = [[] for _ in self.actions]
        for a, b, _ in self.edges:
            self.succ[a].append(b)
        self.succ = [sorted(bs) for bs in self.succ]
        self.topo = self._topo(self.succ)  # one order respecting every dependency
        self.after = self._closure()

    def hop(self, src: int, dst: int) -> float:
        """What a tensor from stage `src` to stage `dst` adds to the wait (the waiting
        stage's comm, as the simulator charges it; nothing on one rank)."""
        return self.costs[dst].comm if self.where[src] != self.where[dst] else 0.0

    def _edge(self, before: tuple, after: int, src: int, dst: int) -> None:
        self.edges.append((self.index[before], after, self.hop(src, dst)))

    def _closure(self) -> list[set[int]]:
        """after[a]: every action that must come after a (dependencies, transitively)."""
        out: list[set[int]] = [set() for _ in self.actions]
        for a in reversed(self.topo):
            for b in self.succ[a]:
                out[a] |= {b} | out[b]
        return out

    @staticmethod
    def _topo(succ: list[list[int]]) -> list[int]:
        indeg = [0] * len(succ)
        for bs in succ:
            for b in bs:
                indeg[b] += 1
        order, ready = [], [a for a, d in enumerate(indeg) if d == 0]
        while ready:
            a = ready.pop()
            order.append(a)
            for b in succ[a]:
                indeg[b] -= 1
                if indeg[b] == 0:
                    ready.append(b)
        return order


def order(h, model: Model, t, release, latest) -> dict[tuple[int, int], object]:
    """before[a, b]: 1 when a runs before b on their rank (a constant where a dependency or
    the windows decide, else a binary with its two big-H constraints, each H as small as
    the windows allow)."""
    before: dict[tuple[int, int], object] = {}
    for acts in by_rank(model).values():
        for i, a in enumerate(acts):
            for b in acts[i + 1 :]:
                if b in model.after[a]:
                    before[a, b], before[b, a] = 1, 0
                    continue
                if a in model.after[b]:
                    before[a, b], before[b, a] = 0, 1
                    continue
                # can a run first (end before b's latest start), can b?
                a_first = release[a] + model.dur[a] <= latest[b] + 1e-9
                b_first = release[b] + model.dur[b] <= latest[a] + 1e-9
                if a_first and not b_first:
                    h.addConstr(t[b] - t[a] >= model.dur[a])
                    before[a, b], before[b, a] = 1, 0
                elif b_first and not a_first:
                    h.addConstr(t[a] - t[b] >= model.dur[b])
                    before[a, b], before[b, a] = 0, 1
                else:
                    y = h.addBinary()
                    h_ab = max(0.0, latest[a] + model.dur[a] - release[b])
                    h_ba = max(0.0, latest[b] + model.dur[b] - release[a])
                    h.addConstr(t[b] - t[a] + h_ab * (1 - y) >= model.dur[a])
                    h.addConstr(t[a] - t[b] + h_ba * y >= model.dur[b])
                    before[a, b], before[b, a] = y, 1 - y
    return before


def by_rank(model: Model) -> dict[int, list[int]]:
    by_rank: dict[int, list[int]] = {}
    for a, r in enumerate(model.rank):
        by_rank.setdefault(r, []).append(a)
    return by_rank


def windows(model: Model, pins: list[float], cap: float, objective: str):
    """release[a] and latest[a]: bounds on a's start in every schedule whose goal is at
    most `cap`: longest paths through the dependencies, and the work of a's rank that must
    come before a (after it) run in series."""
    n, rank, dur = len(model.actions), model.rank, model.dur
    preds: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    succs: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for a, b, hop in model.edges:
        preds[b].append((a, hop))
        succs[a].append((b, hop))
    ahead = [sum(dur[b] for b in range(n) if rank[b] == rank[a] and a in model.after[b])
             for a in range(n)]  # fmt: skip
    behind = [sum(dur[b] for b in model.after[a] if rank[b] == rank[a]) for a in range(n)]
    release = [0.0] * n
    for a in model.topo:
        heads = [release[b] + dur[b] + hop for b, hop in preds[a]]
        release[a] = max([pins[rank[a]] + ahead[a], *heads])
    latest = [0.0] * n
    for a in reversed(model.topo):
        end = (pins[rank[a]] if objective == "span" else 0.0) + cap - behind[a]
        tails = [latest[b] - hop for b, hop in succs[a]]
        latest[a] = min([end, *tails]) - dur[a]
    return release, latest


def sequence(h, model: Model, t, before: dict, goal, pins: list[float], objective: str):
    """Valid cuts the big-H rows miss in the relaxation: the actions a rank runs before a
    run in series from its first forward, so a starts after all of them; those after a run
    in series after it, so the rank's span ends after all of them."""
    for r, acts in by_rank(model).items():
        zero = pins[r] if objective == "span" else 0.0  # where the goal counts from
        for a in acts:
            head = t[a] - pins[r]
            tail = goal - t[a] - model.dur[a] + zero
            rhs_head, rhs_tail = 0.0, 0.0
            for b in acts:
                if b == a:
                    continue
                ba, ab = before[b, a], before[a, b]
                if isinstance(ba, int | float):
                    rhs_head += model.dur[b] * ba
                    rhs_tail += model.dur[b] * ab
                else:
                    head = head - model.dur[b] * ba
                    tail = tail - model.dur[b] * ab
            h.addConstr(head >= rhs_head)
            h.addConstr(tail >= rhs_tail)


def memory(h, model: Model, before: dict, limit: float) -> None:
    """Right after each action that grows its rank's memory, the rank holds at most `limit`;
    and so right before every other one (implied for whole orders, not in the relaxation,
    where it caps the forwards that may run ahead of a backward)."""
    for a, r in enumerate(model.rank):
        held = max(model.delta[a], 0.0)
        for b, rb in enumerate(model.rank):
            if rb == r and b != a and model.delta[b] != 0:
                held = held + model.delta[b] * before[b, a]
        if isinstance(held, int | float):
            if held > limit + 1e-9:
                raise ValueError(f"solve: memory_limit={limit:g} is below what any order holds")
            continue
        h.addConstr(held <= limit)


def objective_of(h, model: Model, t, where: list[int], objective: str, cap: float):
    goal = h.addVariable(lb=0.0, ub=cap)
    for a, r in enumerate(model.rank):
        end = t[a] + model.dur[a]
        if objective == "makespan":
            h.addConstr(goal >= end)
        else:  # the rank's span: from its first forward, pinned, to its last end
            first = model.index[where.index(r), "F", 0]
            h.addConstr(goal - end + t[first] >= 0)
    return goal


def warm_value(warm: Schedule, per, objective: str, model: Model, limit: float):
    """`warm`'s objective, a little above (a cap the warm start itself meets), or None where
    it is no cap on the optimum: its actions not this formulation's, or over the limit."""
    sim = simulate(warm, per, check=False)
    if {(e.stage, e.kind, e.microbatch) for e in sim.events} != set(model.actions):
        return None
    if max(sim.peak_memory) > limit + 1e-9 or not _inorder(warm):
        return None  # not one of the schedules solved over: it may beat their optimum
    value = max(sim.span) if objective == "span" else sim.makespan
    return value + 1e-6 * max(1.0, value)


def _inorder(schedule: Schedule) -> bool:
    """Whether every stage runs each kind's microbatches in order, as the model does."""
    for r in schedule.program:
        last: dict[tuple[int, str], int] = {}
        for a in schedule.actions(r):
            if last.get((a.stage, a.kind), -1) > a.microbatch:
                return False
            last[a.stage, a.kind] = a.microbatch
    return True


def warm_start(h, highspy, model, t, before, goal, warm: Schedule, per) -> None:
    """Start the branch and bound from `warm` (its simulated times and order): the solver
    then only has to prove it, or find better. Skipped where its actions are not this
    formulation's (B or overlapped pairs)."""
    sim = simulate(warm, per, check=False)
    start = {(e.stage, e.kind, e.microbatch): e.start for e in sim.events}
    if set(start) != set(model.actions):
        return
    values = [0.0] * h.getNumCol()
    for a, var in enumerate(t):
        values[var.index] = start[model.actions[a]]
    for (a, b), y in before.items():
        if not isinstance(y, int) and hasattr(y, "index") and a < b:
            values[y.index] = 1.0 if start[model.actions[a]] < start[model.actions[b]] else 0.0
    values[goal.index] = max(sim.span)  # the objective variable: an upper bound is enough
    solution = highspy.HighsSolution()
    solution.col_value = values
    solution.value_valid = True  # a complete primal solution
    h.setSolution(solution)


def schedule_of(model: Model, times: list[float], m: int) -> Schedule:
    """Each rank's actions in the order the solver timed them (ties: dependencies first)."""
    topo = {a: i for i, a in enumerate(model.topo)}
    program: dict[int, list[Action]] = {}
    for a in sorted(range(len(model.actions)), key=lambda a: (times[a], topo[a])):
        s, k, j = model.actions[a]
        program.setdefault(model.rank[a], []).append(Action(s, k, j))
    return Schedule(program, list(model.where), m, "zb-opt")
