"""The Zero Bubble paper's repo's own V scheduler (its `zbv.py`), written again for zb-auto.

Placement as ZB-V: rank r holds stage r (going down the V) and stage 2p-1-r (coming back
up). Each rank meets a microbatch twice per pass, a *leg*: forwards meet it on stage r
first (leg 0), backwards on stage 2p-1-r first (leg 0: the I nearest the loss). Leg 0 of
either pass flows from rank r-1 to rank r, leg 1 from rank r+1 to rank r, so one rule
serves both passes.

Time is counted as it is built, by the timeline every searched builder shares
(`timeline.Timeline`: an action starts when its rank is free and its inputs have arrived,
plus `comm` from another rank); a rank's bubble is the timeline's idle time, counted after
its first forward. This builder is the policy: which (rank, kind, leg) runs next. The
build has four phases:

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

from zbkit.schedules.core.action import Action
from zbkit.schedules.core.costs import TOL, Costs
from zbkit.schedules.core.placement import stage_to_rank
from zbkit.schedules.search.timeline import Slower, Timeline, fastest_variant


class _Build:
    """One build (phases 1-4) for one variant and one set of approved bubbles: a policy that
    picks (rank, kind, leg) and asks the timeline to place it."""

    def __init__(
        self, costs: list[Costs], m: int, limit: float, approved: list[float], give_up: float
    ):
        p = len(costs) // 2
        self.p, self.m, self.limit = p, m, limit
        where = stage_to_rank("v", p)
        # the reference reads the comm of the sending rank's first stage (the same for one
        # Costs; the simulator charges the receiving stage's): kept so the schedules agree
        self.tl = Timeline(costs, where, m, limit, give_up, hop=lambda t, s: costs[where[s]].comm)
        self.comm = self.tl.comm
        self.approved = approved
        self.most_approved = max(approved)

    # ---- the rank's bookkeeping ----

    def stage(self, r: int, kind: str, leg: int) -> int:
        """Leg 0 of the forwards runs on the down stage r, leg 0 of the backwards on the up
        stage 2p-1-r (nearest the loss); W follows its I."""
        return r if (leg == 0) == (kind == "F") else 2 * self.p - 1 - r

    def count(self, r: int, kind: str, leg: int) -> int:
        return self.tl.count[kind][self.stage(r, kind, leg)]

    def source(self, r: int, kind: str, leg: int) -> tuple[int, str, int, int] | None:
        """The action whose output (r, kind, leg)'s next microbatch needs from another rank."""
        j = self.count(r, kind, leg)
        if kind == "W":
            return None
        if leg == 0 and r > 0:
            return (r - 1, kind, 0, j)
        if leg == 1 and r < self.p - 1:
            return (r + 1, kind, 1, j)
        return None

    def ended(self, src: tuple[int, str, int, int] | None) -> float | None:
        """When (rank, kind, leg, j) ended (None: not placed)."""
        if src is None:
            return None
        return self.tl.end[src[1]][self.stage(*src[:3])][src[3]]

    def arrival(self, src: tuple[int, str, int, int] | None) -> float:
        """When `src`'s output arrives (-1 while it has not run). With no source the
        reference reads its last action's end (a quirk kept so the schedules agree)."""
        if src is None:
            src = (self.p - 1, "W", 1, self.m - 1)
        end = self.ended(src)
        return (-1.0 if end is None else end) + self.comm[src[0]]

    def worst_bubble(self, r: int = -1) -> float:
        if r < 0:
            return self.tl.worst
        return max(self.tl.worst, self.most_approved - self.approved[r])

    def put(self, r: int, kind: str, leg: int) -> None:
        tl, stage = self.tl, self.stage(r, kind, leg)
        j = tl.count[kind][stage]
        if j >= self.m:
            raise ValueError(f"rank {r}: no {kind} left on leg {leg}")
        if not tl.fits(stage, kind):
            raise ValueError(f"memory_limit={self.limit:g}: rank {r} has no room for {kind}")
        missing = [s for s, k in tl.inputs[kind][stage] if tl.end[k][s][j] is None]
        if missing:
            own = " own" if any(tl.where[s] == r for s in missing) else ""
            raise ValueError(f"rank {r}: {kind} {j} on leg {leg} before its{own} input")
        tl.place(stage, kind, j)

    def put_w(self, r: int) -> None:
        self.tl.place_w(r)

    def make_room(self, r: int, kind: str, leg: int) -> None:
        stage = self.stage(r, kind, leg)
        while not self.tl.fits(stage, kind):
            self.put_w(r)

    def fill_wait(self, r: int, kind: str, leg: int, overrun: bool) -> None:
        """Ws into the wait for (r, kind, leg)'s input; one more if `overrun` and the wait is
        longer than the room this rank has before its bubble reaches the worst rank's."""
        tl, src = self.tl, self.source(r, kind, leg)
        arrival = self.arrival(src)
        while src is not None and tl.pending[r]:
            w = tl.dur[tl.pending[r][0][0]]["W"]
            if arrival < tl.free[r] + w - TOL:
                break
            self.put_w(r)
        room = self.worst_bubble(r) - tl.idle[r]
        if tl.pending[r] and overrun and arrival - tl.free[r] > room + TOL:
            self.put_w(r)

    # ---- the four phases ----

    def run(self, fill_i: bool, fill_f: bool) -> None:
        p, m, count, tl = self.p, self.m, self.count, self.tl
        for r in range(p):
            self.put(r, "F", 0)
        for r in reversed(range(p)):  # warm-up: leg-0 Fs until the leg-1 input is due
            if r < p - 1:
                due = (self.ended((r + 1, "F", 1, 0)) or 0.0) + self.comm[r + 1]
                room = tl.mem[r]["F"] * (2 + 2 * r)
                while (
                    tl.held[r] + room <= self.limit + TOL
                    and tl.free[r] + tl.dur[r]["F"] <= due + TOL
                    and count(r, "F", 0) < m
                ):
                    for q in range(r + 1):
                        self.put(q, "F", 0)
            self.put(r, "F", 1)
        leg = 0
        for r in range(1, p):  # fill: no rank runs fewer forwards than the one before it
            while self._behind(r):
                for q in reversed(range(r, p)):
                    if count(q, "F", leg) < m:
                        self.put(q, "F", leg)
                leg = 1 - leg
        for _ in range(2 * m):
            self._round(fill_i, fill_f)
        tl.drain()

    def _behind(self, r: int) -> bool:
        c, m = self.count, self.m
        mine, before = c(r, "F", 0) + c(r, "F", 1), c(r - 1, "F", 0) + c(r - 1, "F", 1)
        return mine < before or c(r, "F", 1) <= c(r - 1, "F", 1) < m

    def _has_input(self, r: int, kind: str, leg: int) -> bool:
        return self.ended(self.source(r, kind, leg)) is not None

    def _round(self, fill_i: bool, fill_f: bool) -> None:
        p, m, count = self.p, self.m, self.count
        for r in range(p):
            self.make_room(r, "I", 0)
        up, down = [], []  # ranks whose I this round is on leg 1 / leg 0
        for r in range(p):
            if count(r, "I", 1) >= count(r, "I", 0):
                down.append(r)
            elif r == p - 1 or count(r, "I", 0) >= m or self._has_input(r, "I", 1):
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
        if c(r, "F", 1) >= m:
            return None
        if c(r, "F", 1) >= c(r, "F", 0) or r == p - 1:
            return 0 if c(r, "F", 1) >= c(r, "F", 0) else 1
        if self._has_input(r, "F", 1):
            return 1
        if c(r, "F", 0) < m and (r == 0 or self._has_input(r, "F", 0)):
            return 0
        return None


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
    approved, best = [-1.0] * p, None
    while True:
        build = _Build(costs, m, memory_limit, approved, give_up)
        try:
            build.run(fill_i, fill_f)
        except (ValueError, Slower):
            if best is None:
                raise
            break
        if best is None or build.tl.worst < best.tl.worst:
            best = build
        if approved[0] >= 0 and not build.tl.worst < max(approved):
            break
        approved = list(build.tl.idle)
        give_up = min(give_up, best.tl.span())
    return best.tl.program, best.tl.span()


def best_v_heuristic(
    costs: list[Costs], m: int, memory_limit: float, give_up: float = math.inf
) -> dict[int, list[Action]]:
    """The best of the four variants (smallest longest rank span): ValueError if none fits
    the limit, `Slower` if none can end within `give_up`."""

    def build(fill_i: bool, fill_f: bool, beat: float):
        return v_heuristic(costs, m, memory_limit, fill_i, fill_f, beat)

    return fastest_variant(itertools.product((True, False), repeat=2), build, give_up)
