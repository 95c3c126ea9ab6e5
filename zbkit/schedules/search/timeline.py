"""One timeline for every searched builder: the rules once, the choice of the next action apart.

A builder of zb-auto (`greedy`, `sweep`, `heuristic`, the V heuristic) is a *policy*: it
only decides which action a rank runs next. What follows from that decision is the same for
all of them and lives here, in `Timeline`, read from the `KINDS` table and one cost table:

  readiness   when an action's inputs are there (`arrival`): the end of each action it
              waits for (`Kind.needs`), plus `comm` when that ran on another rank (the
              waiting stage's, as the simulator charges it; `hop` where a builder keeps
              the reading it was published with); `latest_input` names the input that
              came last (the refiner walks the critical path with it);
  placing     `place`: it starts when its rank is free and its inputs are there, and ends
              its duration later; the rank's free time moves to that end;
  memory      `held` per rank, changed by `Costs.memory` (the one memory rule); `fits`
              asks whether an action stays under the limit, `make_room` runs the oldest
              pending W until it does;
  pending Ws  each I leaves a W owed on its rank (`pending`, oldest first);
  giving up   a rank's span is its work plus its idle time, and idle time only grows: once
              that sum passes the bound, the build cannot win (`Slower`).

The simulator's engine (`engine.run`) walks a finished program by the same rules;
tests/schedules/test_schedules_timeline.py places random programs with both and compares.
`TOL` is the one tolerance the searches compare times and memory with.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from zbkit.schedules.core.action import PARTS, Action, waits_on
from zbkit.schedules.core.costs import TOL, Costs, beyond, cost_table

Program = dict[int, list[Action]]


class Slower(Exception):
    """A build gave up: a rank's span is sure to exceed the bound (the message says how)."""


def fastest_variant(
    variants: Iterable[tuple], build: Callable[..., tuple[Program, float]], give_up: float
) -> Program:
    """The program of `build(*variant, beat)` with the shortest longest rank span, each
    variant told to give up (`Slower`) once it must end slower than the best so far:
    ValueError if none fits, `Slower` if none can end within `give_up`; ties keep the first."""
    best: tuple[Program, float] | None = None
    why, slower = "", None
    for variant in variants:
        beat = min(give_up, best[1]) if best else give_up
        try:
            program, span = build(*variant, beat)
        except ValueError as err:
            why = str(err)
            continue
        except Slower as err:
            slower = err
            continue
        if best is None or span < best[1] - TOL * max(1.0, abs(span)):
            best = (program, span)
    if best is None:
        raise slower or ValueError(why)
    return best[0]


class Timeline:
    """The ranks' timelines as a policy places actions, one at a time (module docstring).

    Read-only for the policy: `end[kind][stage][j]` (None until placed), `count[kind][stage]`
    (placed so far), and per rank `free`, `held`, `first` (first start), `idle` (time waited
    since then), `pending` (the (stage, microbatch) of Ws owed, oldest first), `program`.
    """

    __slots__ = ("where", "m", "limit", "record", "dur", "mem", "comm", "hops", "inputs", "end",
                 "count", "free", "held", "first", "idle", "worst", "work", "bound",
                 "pending", "program", "placed", "_waits")  # fmt: skip

    def __init__(
        self,
        costs: Sequence[Costs],
        stage_to_rank: Sequence[int],
        m: int,
        limit: float = math.inf,
        give_up: float = math.inf,
        record: bool = True,
        hop: Callable[[int, int], float] | None = None,
    ) -> None:
        self.where, self.m, self.limit, self.record = list(stage_to_rank), m, limit, record
        n, p = len(self.where), max(self.where) + 1
        self.dur, self.mem = cost_table(costs, PARTS)
        self.comm = [c.comm for c in costs]
        self.inputs = {k: [waits_on(s, k, n) for s in range(n)] for k in PARTS}
        # what stage t waiting on stage s (on another rank) adds: by default the waiting
        # stage's comm, as the simulator charges it; `hop(t, s)` where a builder keeps its
        # own reading (the same for one Costs, whose comm every stage shares)
        cost = hop or (lambda t, s: self.comm[t])
        self.hops = {
            (t, s): cost(t, s) if self.where[s] != self.where[t] else 0.0
            for k in PARTS for t in range(n) for s, _ in self.inputs[k][t]
        }  # fmt: skip
        self.end: dict[str, list[list[float | None]]] = {
            k: [[None] * m for _ in range(n)] for k in PARTS
        }
        self.count = {k: [0] * n for k in PARTS}
        self.free = [0.0] * p
        self.held = [0.0] * p
        self.first: list[float | None] = [None] * p
        self.idle = [0.0] * p
        self.worst = 0.0  # the largest idle time of any rank
        self.work = [0.0] * p  # what each rank must compute: its span is work + idle
        for s, r in enumerate(self.where):
            self.work[r] += m * sum(self.dur[s].values())
        self.bound = beyond(give_up)
        self.pending: list[deque[tuple[int, int]]] = [deque() for _ in range(p)]
        self.program: Program = {r: [] for r in range(p)}
        self.placed = 0  # actions placed, all ranks
        # the inputs rule read once per (kind, stage), for the hot loop of `arrival`: the
        # end times of each input's stage and what arriving from there adds (comm or 0)
        self._waits = {
            k: [tuple((self.end[ik][s], self.hops[t, s]) for s, ik in self.inputs[k][t])
                for t in range(n)]
            for k in PARTS
        }  # fmt: skip

    def arrival(self, stage: int, kind: str, j: int) -> float | None:
        """When the inputs of (stage, kind, j) are all there (0.0: it needs none), or None
        while one of them is not placed yet."""
        t = 0.0
        for ends, comm in self._waits[kind][stage]:
            e = ends[j]
            if e is None:
                return None
            e += comm  # from another rank (0 on the same rank)
            if e > t:
                t = e
        return t

    def latest_input(self, stage: int, kind: str, j: int) -> tuple[float, int, str] | None:
        """(arrival, stage, kind) of the input of (stage, kind, j) that arrives last (the
        first of equals), all its inputs placed; None if it needs none. What a walk along
        the critical path follows (`refine`)."""
        latest, r = None, self.where[stage]
        for s, k in self.inputs[kind][stage]:
            e = self.end[k][s][j]
            assert e is not None, f"{s}{k}{j} is not placed"
            t = e + self.hops[stage, s] if self.where[s] != r else e
            if latest is None or t > latest[0]:
                latest = (t, s, k)
        return latest

    def load(
        self, program: dict[int, list[Action]], times: dict[int, list[tuple[float, float]]]
    ) -> None:
        """Take a finished program's end times (the engine's `run` gives the same as placing
        it here), to ask what each action waited for."""
        for r, actions in program.items():
            for a, (_, end) in zip(actions, times[r], strict=True):
                self.end[a.kind][a.stage][a.microbatch] = end

    def fits(self, stage: int, kind: str, extra: float = 0.0) -> bool:
        """Whether running (stage, kind) keeps its rank's memory (plus `extra`) under the limit."""
        return self.held[self.where[stage]] + self.mem[stage][kind] + extra <= self.limit + TOL

    def place(self, stage: int, kind: str, j: int | None = None, at: float | None = None) -> float:
        """Run (stage, kind, j) (j: the next microbatch of that kind) as early as its rank
        and its inputs allow; returns its end. An event-driven policy gives `at`, the event
        time it decided at, having asked `arrival` (inputs within `TOL` of it count as
        there). `Slower` if the rank's span must now pass the bound; ValueError if an input
        is not placed yet."""
        r = self.where[stage]
        j = self.count[kind][stage] if j is None else j
        free = self.free[r]
        if at is None:
            ready = self.arrival(stage, kind, j)
            if ready is None:
                raise ValueError(f"rank {r}: {stage}{kind}{j} placed before its inputs")
            start = free if free > ready else ready
        else:  # the policy asked `arrival` when it decided
            start = at
        if self.first[r] is None:
            self.first[r] = start
        else:  # idle time since the rank's first action only grows: so does work + idle
            idle = self.idle[r]
            if start > free:  # the gap first, then added: as the reference rounds it
                idle = self.idle[r] = idle + (start - free)
                if idle > self.worst:
                    self.worst = idle
            if self.work[r] + idle > self.bound:
                raise Slower(
                    f"rank {r}: work {self.work[r]:.6g} + idle {idle:.6g} by t={start:.6g}"
                )
        self.free[r] = end = start + self.dur[stage][kind]
        self.end[kind][stage][j] = end
        self.held[r] += self.mem[stage][kind]
        self.count[kind][stage] += 1
        self.placed += 1
        if kind == "I":
            self.pending[r].append((stage, j))
        if self.record:
            self.program[r].append(Action.trusted(stage, kind, j))
        return end

    def place_w(self, rank: int) -> float:
        """Run the rank's oldest pending W."""
        if not self.pending[rank]:
            raise ValueError(f"memory_limit={self.limit:g}: rank {rank} has no W to free memory")
        stage, j = self.pending[rank].popleft()
        return self.place(stage, "W", j)

    def make_room(self, stage: int, kind: str) -> bool:
        """Run the oldest pending Ws until (stage, kind) fits; False if it cannot."""
        r = self.where[stage]
        while not self.fits(stage, kind):
            if not self.pending[r]:
                return False
            self.place_w(r)
        return True

    def drain(self) -> None:
        """The cool-down: every rank runs the Ws it still owes."""
        for r, owed in enumerate(self.pending):
            while owed:
                self.place_w(r)

    def span(self) -> float:
        """The longest rank span (first start to last end): what zb-auto minimises."""
        return max(self.free[r] - (f or 0.0) for r, f in enumerate(self.first))
