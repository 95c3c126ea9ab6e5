"""The Zero Bubble paper's repo's own V scheduler (its `zbv.py`), written again for zb-auto.

Placement as ZB-V: rank r holds stage r (going down the V) and stage 2p-1-r (coming back
up). Each rank meets a microbatch twice per pass, a *leg*: forwards meet it on stage r
first (leg 0), backwards on stage 2p-1-r first (leg 0: the I nearest the loss). Leg 0 of
either pass flows from rank r-1 to rank r, leg 1 from rank r+1 to rank r, so one rule
serves both passes.

Time is counted as it is built: each action starts when its rank is free and its input has
arrived (the input's end plus `comm`); a rank's bubble is its idle time after its first
forward. The build has four phases:

  1. warm-up: one leg-0 F on every rank; then, from the last rank up, the leg-0 Fs that
     fit before the rank's first leg-1 input arrives (memory allowing), then its leg-1 F;
  2. fill: leg-0 and leg-1 Fs, alternating, until each rank has run at least as many as
     the rank before it (so the steady state never waits for a missing forward);
  3. steady state, 2m rounds: every rank runs one I (leg 1 when its input is there, which
     unblocks the rank above; else leg 0), then one F (leg 1 when its input is there);
     before each, pending Ws fill the wait for the input, and one more W runs when the
     wait is longer than the room the rank has before its bubble reaches the worst
     rank's (always before a leg-1 I; before a leg-0 I or an F only if `fill_i` /
     `fill_f` says so); Ws also run whenever memory would pass the limit;
  4. cool-down: the Ws still owed.

A second build then repeats with each rank's bubble from the first one "approved" (the
room test above also allows a rank what it was already granted), as long as the worst
bubble shrinks. `best_v_heuristic` runs the four (fill_i, fill_f) variants and keeps the
one with the smallest worst span, as the reference does.
"""

from __future__ import annotations

import itertools
import math
from collections import deque

from zbkit.schedules._build_greedy import SPLIT, Slower, _tables, fastest_variant
from zbkit.schedules.action import Action
from zbkit.schedules.costs import Costs

_EPS = 1e-9
_BEFORE = {("F", 1): ("F", 0), ("I", 0): ("F", 1), ("I", 1): ("I", 0)}  # on the same rank


def _own_input(key: tuple[int, str, int]) -> tuple[int, str, int] | None:
    """(rank, kind, leg) of what `key`'s action needs first on its own rank, or None."""
    before = _BEFORE.get(key[1:])
    return None if before is None else (key[0], *before)


class _Build:
    """One build (phases 1-4) for one variant and one set of approved bubbles."""

    def __init__(
        self, costs: list[Costs], m: int, limit: float, approved: list[float], give_up: float
    ):
        p = len(costs) // 2
        self.p, self.m, self.limit, self.give_up = p, m, limit, give_up
        dur, mem = _tables(costs)
        # per rank and leg: the stage it is, and its durations and memory changes
        self.stage = {
            (r, k, leg): (r if (leg == 0) == (k == "F") else 2 * p - 1 - r)
            for r in range(p)
            for k in SPLIT
            for leg in (0, 1)
        }
        self.dur = {key: dur[s][key[1]] for key, s in self.stage.items()}
        self.mem = {key: mem[s][key[1]] for key, s in self.stage.items()}
        self.comm = [costs[r].comm for r in range(p)]
        self.count = {key: 0 for key in self.stage}
        self.end: dict[tuple[int, str, int, int], float] = {}  # (rank, kind, leg, j) -> end
        self.free = [0.0] * p  # when each rank is next free
        self.held = [0.0] * p
        self.bubble = [0.0] * p
        self.worst = 0.0  # the largest bubble
        self.work = [
            m * sum(self.dur[r, k, leg] for k in SPLIT for leg in (0, 1)) for r in range(p)
        ]
        self.first = [0.0] * p
        self.pending: list[deque] = [deque() for _ in range(p)]  # legs of the Ws owed
        self.order: list[list[tuple[int, str, int]]] = [[] for _ in range(p)]  # (stage, kind, j)
        self.approved = approved
        self.most_approved = max(approved)
        # per (rank, kind, leg), read once per action: stage, duration, memory change, and
        # the key prefix of what it needs on its own rank (None: nothing)
        self.info = {
            key: (
                self.stage[key],
                self.dur[key],
                self.mem[key],
                (key[0], "I", key[2]) if key[1] == "W" else _own_input(key),
            )
            for key in self.stage
        }
        self.started = [False] * p  # whether the rank ran its first forward

    # ---- the rank's bookkeeping ----

    def source(self, r: int, kind: str, leg: int) -> tuple[int, str, int, int] | None:
        """The action whose output (r, kind, leg)'s next microbatch needs from another rank."""
        j = self.count[r, kind, leg]
        if kind == "W":
            return None
        if leg == 0 and r > 0:
            return (r - 1, kind, 0, j)
        if leg == 1 and r < self.p - 1:
            return (r + 1, kind, 1, j)
        return None

    def arrival(self, src: tuple[int, str, int, int] | None) -> float:
        """When `src`'s output arrives (-1 while it has not run). With no source the
        reference reads its last action's end (a quirk kept so the schedules agree)."""
        if src is None:
            src = (self.p - 1, "W", 1, self.m - 1)
        return self.end.get(src, -1.0) + self.comm[src[0]]

    def worst_bubble(self, r: int = -1) -> float:
        if r < 0:
            return self.worst
        return max(self.worst, self.most_approved - self.approved[r])

    def put(self, r: int, kind: str, leg: int) -> None:
        key = (r, kind, leg)
        stage, dur, mem, before = self.info[key]
        j = self.count[key]
        if j >= self.m:
            raise ValueError(f"rank {r}: no {kind} left on leg {leg}")
        if self.held[r] + mem > self.limit + _EPS:
            raise ValueError(f"memory_limit={self.limit:g}: rank {r} has no room for {kind}")
        end = self.end
        if before is not None and before + (j,) not in end:
            raise ValueError(f"rank {r}: {kind} {j} on leg {leg} before its own input")
        free = start = self.free[r]
        if kind != "W" and (r > 0 if leg == 0 else r < self.p - 1):
            src = (r - 1 if leg == 0 else r + 1, kind, leg, j)
            ready = end.get(src)
            if ready is None:
                raise ValueError(f"rank {r}: {kind} {j} on leg {leg} before its input")
            ready += self.comm[src[0]]
            if ready > start:
                start = ready
        if self.started[r]:
            if start > free:
                bubble = self.bubble[r] = self.bubble[r] + start - free
                if bubble > self.worst:
                    self.worst = bubble
                if self.work[r] + bubble > self.give_up:
                    raise Slower(f"rank {r}: work {self.work[r]:.6g} + bubble {bubble:.6g}")
        elif kind == "F":
            self.first[r] = start
            self.started[r] = leg == 0 or self.started[r]
        self.free[r] = end[r, kind, leg, j] = start + dur
        self.held[r] += mem
        self.count[key] = j + 1
        if kind == "I":
            self.pending[r].append(leg)
        self.order[r].append((stage, kind, j))

    def put_w(self, r: int) -> None:
        if not self.pending[r]:
            raise ValueError(f"memory_limit={self.limit:g}: rank {r} has no W to free memory")
        self.put(r, "W", self.pending[r].popleft())

    def make_room(self, r: int, kind: str, leg: int) -> None:
        while self.held[r] + self.mem[r, kind, leg] > self.limit + _EPS:
            self.put_w(r)

    def fill_wait(self, r: int, kind: str, leg: int, overrun: bool) -> None:
        """Ws into the wait for (r, kind, leg)'s input; one more if `overrun` and the wait is
        longer than the room this rank has before its bubble reaches the worst rank's."""
        src = self.source(r, kind, leg)
        arrival = self.arrival(src)
        while src is not None and self.pending[r]:
            w = self.dur[r, "W", self.pending[r][0]]
            if arrival < self.free[r] + w - _EPS:
                break
            self.put_w(r)
        room = self.worst_bubble(r) - self.bubble[r]
        if self.pending[r] and overrun and arrival - self.free[r] > room + _EPS:
            self.put_w(r)

    # ---- the four phases ----

    def run(self, fill_i: bool, fill_f: bool) -> None:
        p, m, count = self.p, self.m, self.count
        for r in range(p):
            self.put(r, "F", 0)
        for r in reversed(range(p)):  # warm-up: leg-0 Fs until the leg-1 input is due
            if r < p - 1:
                due = self.end[r + 1, "F", 1, 0] + self.comm[r + 1]
                room = self.mem[r, "F", 0] * (2 + 2 * r)
                while (
                    self.held[r] + room <= self.limit + _EPS
                    and self.free[r] + self.dur[r, "F", 0] <= due + _EPS
                    and count[r, "F", 0] < m
                ):
                    for q in range(r + 1):
                        self.put(q, "F", 0)
            self.put(r, "F", 1)
        leg = 0
        for r in range(1, p):  # fill: no rank runs fewer forwards than the one before it
            while self._behind(r):
                for q in reversed(range(r, p)):
                    if count[q, "F", leg] < m:
                        self.put(q, "F", leg)
                leg = 1 - leg
        for _ in range(2 * m):
            self._round(fill_i, fill_f)
        for r in range(p):
            while self.pending[r]:
                self.put_w(r)

    def _behind(self, r: int) -> bool:
        c, m = self.count, self.m
        mine, before = c[r, "F", 0] + c[r, "F", 1], c[r - 1, "F", 0] + c[r - 1, "F", 1]
        return mine < before or c[r, "F", 1] <= c[r - 1, "F", 1] < m

    def _round(self, fill_i: bool, fill_f: bool) -> None:
        p, m, count = self.p, self.m, self.count
        for r in range(p):
            self.make_room(r, "I", 0)
        up, down = [], []  # ranks whose I this round is on leg 1 / leg 0
        for r in range(p):
            if count[r, "I", 1] >= count[r, "I", 0]:
                down.append(r)
            elif r == p - 1 or count[r, "I", 0] >= m or self.source(r, "I", 1) in self.end:
                up.append(r)
            else:
                down.append(r)
        for r, leg in [(r, 1) for r in reversed(up)] + [(r, 0) for r in down]:
            self.fill_wait(r, "I", leg, overrun=leg == 1 or fill_i)
            self.put(r, "I", leg)
        for r in range(p):
            f_leg = self._next_forward(r)
            if f_leg is None:
                continue
            self.make_room(r, "F", f_leg)
            self.fill_wait(r, "F", f_leg, overrun=fill_f)
            self.put(r, "F", f_leg)

    def _next_forward(self, r: int) -> int | None:
        c, m, p = self.count, self.m, self.p
        if c[r, "F", 1] >= m:
            return None
        if c[r, "F", 1] >= c[r, "F", 0] or r == p - 1:
            return 0 if c[r, "F", 1] >= c[r, "F", 0] else 1
        if self.source(r, "F", 1) in self.end:
            return 1
        if c[r, "F", 0] < m and (r == 0 or self.source(r, "F", 0) in self.end):
            return 0
        return None

    def span(self) -> float:
        return max(self.free[r] - self.first[r] for r in range(self.p))

    def program(self) -> dict[int, list[Action]]:
        return {r: [Action(*a) for a in actions] for r, actions in enumerate(self.order)}


def v_heuristic(
    costs: list[Costs],
    m: int,
    memory_limit: float,
    fill_i: bool,
    fill_f: bool,
    give_up: float = math.inf,
) -> tuple[dict[int, list[Action]], float]:
    """One variant, rebuilt with approved bubbles while its worst bubble shrinks: the
    program with the smallest worst bubble (earliest on ties) and its longest rank span.
    ValueError if the first build cannot meet `memory_limit`; `Slower` if it must end
    slower than `give_up` (a rebuild that must is dropped)."""
    p = len(costs) // 2
    give_up += 1e-9 * max(1.0, give_up) if give_up < math.inf else 0.0
    approved, best = [-1.0] * p, None
    while True:
        build = _Build(costs, m, memory_limit, approved, give_up)
        try:
            build.run(fill_i, fill_f)
        except (ValueError, Slower):
            if best is None:
                raise
            break
        if best is None or build.worst < best.worst:
            best = build
        if approved[0] >= 0 and not build.worst < max(approved):
            break
        approved = list(build.bubble)
        give_up = min(give_up, best.span() + 1e-9 * max(1.0, best.span()))
    return best.program(), best.span()


def best_v_heuristic(
    costs: list[Costs], m: int, memory_limit: float, give_up: float = math.inf
) -> dict[int, list[Action]]:
    """The best of the four variants (smallest longest rank span): ValueError if none fits
    the limit, `Slower` if none can end within `give_up`."""

    def build(fill_i: bool, fill_f: bool, beat: float):
        return v_heuristic(costs, m, memory_limit, fill_i, fill_f, beat)

    return fastest_variant(itertools.product((True, False), repeat=2), build, give_up)
