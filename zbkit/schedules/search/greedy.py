"""A greedy list scheduler in the spirit of the Zero Bubble paper's heuristic (Qi et al. 2024).

Time moves from event to event (an action ends, or its output arrives on another rank).
Whenever a rank is free it picks, in this order:
  1. an I whose inputs are there (it unblocks the previous stage: the critical path),
  2. an F whose input is there, if one more activation still fits under `memory_limit`
     (warm-up then runs as many forwards as memory and the first I allow),
  3. a W: it depends on nothing, so it fills what would otherwise be a bubble, and it
     frees memory when the limit stops the next F.
An I is on the critical path (every stage before it waits), so `hold` > 0 (`fill` > 0)
makes a rank wait instead of starting an F (a W) that would delay an I known to arrive
within `hold * F` (`fill * W`); `feed` > 0 makes a W wait for a forward due within
`feed * W` too (on the last stage an F is the critical path: its I follows at once; the
proven optima under tight limits keep Ws back for it). Where a rank holds two stages (the
V), `defer` > 0 makes it wait rather than start a first-chunk forward when a later stage's
forward is due within `defer * F` (that one takes its microbatch to the loss, and so the
input gradients back, sooner), and `lead` caps how many first-chunk forwards a rank runs
ahead of its second chunk (`lead` times half the stages between them: p - r on rank r of
the V for 1), where first-chunk activations would fill the memory the second chunk needs.
Both are what the proven optima do under tight limits. zb-auto tries a few such policies
(named in `candidates.CANDIDATES`) and keeps the fastest, timed by the simulator's engine.

What the picked action then does (when it starts and ends, the memory it holds, the W it
leaves owed) is the timeline's (`timeline.Timeline`), as for every searched builder;
`sweep` (`heuristic`) is the paper's own construction for one stage per rank.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from zbkit.schedules.core.action import PARTS, Action
from zbkit.schedules.core.costs import TOL, Costs, least_peak
from zbkit.schedules.search.timeline import Timeline

__all__ = ["Moves", "greedy"]


@dataclass(frozen=True)
class Waits:
    """The greedy's settings (module docstring), taken by name: how long a pick waits for an
    I (`hold`), an F (`feed`) or a later stage's forward (`defer`) rather than run a W or a
    first-chunk forward, and how far first chunks may run ahead (`lead`)."""

    fill: float = 0.0
    hold: float = 0.0
    defer: float = 0.0
    lead: float = math.inf
    feed: float = 0.0

    def __str__(self) -> str:  # "fill=0.5 hold=0 feed=2": what the candidates are called
        text = f"fill={self.fill:g} hold={self.hold:g}"
        text += f" defer={self.defer:g}" if self.defer else ""
        text += f" lead={self.lead:g}" if self.lead < math.inf else ""
        return text + (f" feed={self.feed:g}" if self.feed else "")


@dataclass
class Moves:
    """The `fill`, `hold`, `defer`, `lead` and `feed` values for which `greedy` makes the same
    moves as a run did (each an open interval): every wait or cap test that run made comes out the
    same for them.
    A run that stopped (`Slower`) stops at the same point, or earlier, for any such
    variant with the same or a smaller `give_up`: that variant need not be run."""

    fill: tuple[float, float] = (-math.inf, math.inf)
    hold: tuple[float, float] = (-math.inf, math.inf)
    defer: tuple[float, float] = (-math.inf, math.inf)
    lead: tuple[float, float] = (-math.inf, math.inf)
    feed: tuple[float, float] = (-math.inf, math.inf)

    def covers(self, waits: Waits) -> bool:
        return (
            _inside(waits.fill, self.fill)
            and _inside(waits.hold, self.hold)
            and _inside(waits.defer, self.defer)
            and _inside(waits.lead, self.lead)
            and _inside(waits.feed, self.feed)
        )


def _inside(x: float, interval: tuple[float, float]) -> bool:
    lo, hi = interval  # a margin: a value at an end may round either way, so run it
    return (lo == -math.inf or lo + TOL * max(1.0, abs(lo)) < x) and (
        hi == math.inf or x < hi - TOL * max(1.0, abs(hi))
    )


def _narrow(interval: tuple[float, float], at: float, waited: bool) -> tuple[float, float]:
    """A wait test waits for values above `at`: keep the side this run's value was on."""
    lo, hi = interval
    return (max(lo, at), hi) if waited else (lo, min(hi, at))


class _Greedy:
    """The event loop of `greedy`: which rank decides when, and what it picks (`decide`);
    the timeline places what it picks."""

    def __init__(self, tl: Timeline, moves: Moves, waits: Waits) -> None:
        self.tl, self.moves = tl, moves
        self.fill, self.hold, self.defer = waits.fill, waits.hold, waits.defer
        self.lead, self.feed = waits.lead, waits.feed
        where, n, p = tl.where, len(tl.where), len(tl.free)
        # each stage's next stage on the same rank (the V's second chunk), if any
        self.later = [next((t for t in range(s + 1, n) if where[t] == where[s]), None)
                      for s in range(n)]  # fmt: skip
        # forwards are tried from the stage nearest the loss first: it brings the backward sooner
        self.f_order = [sorted((s for s in range(n) if where[s] == r), reverse=True)
                        for r in range(p)]  # fmt: skip
        # room kept free for carrying a new microbatch through the rank's later stages (ZB-V's
        # second chunk): without it, first-chunk forwards could fill memory and starve the V
        self.reserve = [sum(tl.mem[t]["F"] for t in range(s + 1, n) if where[t] == where[s])
                        for s in range(n)]  # fmt: skip
        self.ready_i: list[list[tuple[float, int, int]]] = [[] for _ in range(p)]  # (ready, j, -s)
        # (when, rank): a rank is looked at only when something it may wait for happens (its
        # own action ends, an input arrives, an I becomes ready); in between it would decide
        # the same as before. Ranks woken at the same time decide in rank order.
        self.times: list[tuple[float, int]] = [(0.0, r) for r in range(p)]
        self.now: list[int] = []  # ranks still to decide at time `t`, a heap
        self.t = 0.0

    def wake(self, when: float, r: int) -> None:
        heapq.heappush(self.times, (when, r))
        now = self.now
        if when <= self.t + TOL and now and r > now[0] and r not in now:
            heapq.heappush(now, r)  # woken for the current time by a zero-length action

    def offer_i(self, s: int, j: int) -> None:
        """Queue I(s, j) on its rank once its inputs' end times are known."""
        ready = self.tl.arrival(s, "I", j)
        if ready is not None:
            r = self.tl.where[s]
            heapq.heappush(self.ready_i[r], (ready, j, -s))
            self.wake(ready, r)

    def run(self, r: int, s: int, kind: str, j: int | None = None) -> None:
        tl = self.tl
        end = tl.place(s, kind, j, at=self.t)
        self.wake(end, r)
        j = tl.count[kind][s] - 1 if j is None else j
        if kind == "F":
            if s + 1 < len(tl.where):  # its output arrives at the next stage
                self.wake(tl.arrival(s + 1, "F", j) or end, tl.where[s + 1])
            self.offer_i(s, j)
        elif kind == "I" and s > 0:
            self.offer_i(s - 1, j)

    def next_forward(self, r: int) -> int | None:
        """The stage of the forward rank r may start now, if any."""
        tl = self.tl
        for s in self.f_order[r]:
            if tl.count["F"][s] >= tl.m:
                continue
            ready = tl.arrival(s, "F", tl.count["F"][s])
            if ready is None or ready > self.t + TOL:
                continue
            if tl.fits(s, "F", self.reserve[s]) and not self.too_far_ahead(s):
                return s
        return None

    def too_far_ahead(self, s: int) -> bool:
        """Whether stage s already runs `lead` times half the stages to its rank's next one
        forwards ahead of that one (at least one): the V's first chunk ahead of its second
        (with lead 1, p - r on rank r); narrows `moves` to this answer."""
        t = self.later[s]
        ahead = 0 if t is None else self.tl.count["F"][s] - self.tl.count["F"][t]
        if t is None or ahead < 1:
            return False
        at = 2 * ahead / (t - s)  # lead values up to this hold the stage back
        stop = self.lead <= at + TOL
        self.moves.lead = _narrow(self.moves.lead, at, not stop)
        return stop

    def forward_due(self, r: int, after: int = -1) -> float | None:
        """How soon the input of rank r's next forward of a stage after `after` arrives (all
        of them by default; for `defer`, the V's second chunk: it takes the microbatch to
        the loss), if it is on its way and would fit."""
        tl, best = self.tl, None
        for t in self.f_order[r]:
            if t <= after or tl.count["F"][t] >= tl.m:
                continue
            ready = tl.arrival(t, "F", tl.count["F"][t])
            if ready is not None and ready > self.t + TOL and tl.fits(t, "F", self.reserve[t]):
                best = ready - self.t if best is None else min(best, ready - self.t)
        return best

    def waits(self, soon: float | None, length: float, share: float, which: str) -> bool:
        """Whether to wait rather than start an action of `length` that would still run when
        an I due in `soon` arrives (`share` of its length); narrows `moves` to this answer."""
        if soon is None or length <= 0:
            return False
        wait = share > 0 and soon < share * length - TOL
        setattr(self.moves, which, _narrow(getattr(self.moves, which), (soon + TOL) / length, wait))
        return wait

    def decide(self, r: int) -> None:
        tl, t, heap = self.tl, self.t, self.ready_i[r]
        if heap and heap[0][0] <= t + TOL:  # 1. an I whose inputs are there
            _, j, neg_s = heapq.heappop(heap)
            return self.run(r, -neg_s, "I", j)
        # an I already on its way (the next stage started it) is on the critical path:
        # with hold/fill > 0, do not start an F/W that would still run when it arrives
        soon = heap[0][0] - t if heap else None
        s = self.next_forward(r)  # 2. a forward that fits
        if s is not None:
            if self.waits(soon, tl.dur[s]["F"], self.hold, "hold"):
                return None
            later = self.forward_due(r, after=s)
            if not self.waits(later, tl.dur[s]["F"], self.defer, "defer"):
                self.run(r, s, "F")
            return None
        if tl.pending[r]:  # 3. a W
            s, j = tl.pending[r][0]
            if self.waits(soon, tl.dur[s]["W"], self.fill, "fill"):
                return None
            if not self.waits(self.forward_due(r), tl.dur[s]["W"], self.feed, "feed"):
                tl.pending[r].popleft()
                self.run(r, s, "W", j)
        return None

    def loop(self) -> None:
        tl, times, now = self.tl, self.times, self.now
        total = len(PARTS) * len(tl.where) * tl.m  # an F, an I and a W per stage and microbatch
        while tl.placed < total and times:
            t, r = heapq.heappop(times)
            self.t = t
            now.append(r)
            while times and times[0][0] <= t + TOL:
                r = heapq.heappop(times)[1]
                if r not in now:
                    now.append(r)
            heapq.heapify(now)
            while now:
                r = now[0]  # stays in `now` while it decides: `wake` adds only later ranks
                if tl.free[r] <= t + TOL:
                    self.decide(r)
                heapq.heappop(now)


def greedy(
    stage_to_rank: list[int],
    m: int,
    costs: list[Costs],
    memory_limit: float,
    waits: Waits = Waits(),
    *,
    give_up: float = math.inf,
    moves: Moves | None = None,
) -> dict[int, list[Action]]:
    """The policy above with these `waits`; raises `Slower` once some rank's span must exceed
    `give_up`. `moves` (optional) is narrowed to the waits that would move the same."""
    # an input from another rank arrives the sender's comm later here (the simulator
    # charges the receiver's: the same for one Costs; kept so zb-auto's results stay)
    tl = Timeline(costs, stage_to_rank, m, memory_limit, give_up, hop=lambda t, s: costs[s].comm)
    moves = Moves() if moves is None else moves
    _Greedy(tl, moves, waits).loop()
    if tl.placed < len(PARTS) * len(stage_to_rank) * m:
        raise ValueError(
            f"memory_limit={memory_limit:g} is too small to finish: a rank cannot run its next "
            f"forward and has nothing to free; it must be at least "
            f"{least_peak(stage_to_rank, costs):g}"
        )
    return tl.program
