"""The Zero Bubble paper's construction (`sweep`) and its repo's heuristic (`heuristic`), for
one stage per rank: two policies over one timeline (`timeline.Timeline`), which places each
action they pick, holds its memory, keeps the Ws owed and runs them to make room.

`sweep` is the paper's construction at a warm-up chosen from a list (see its docstring).
The reference implementation (sail-sg/zero-bubble-pipeline-parallelism, its `zb.py`)
adds three ideas that the sweep leaves out, and this builder follows them:

  1. the warm-up is derived, not chosen: each stage, walked from the last one up, runs
     forwards until I_0's input gradient would arrive (or until one more forward would
     end after it), then the counts are trimmed so each stage warms up less than the one
     before it;
  2. a stage may skip its forward in a round when the next stage is two or more forwards
     behind it and the forward would delay the input gradient coming back (the next
     stage's F + I + comm): it spends that time on Ws or waits, and a stage only runs a
     forward when every later stage does (the forward's output is needed there);
  3. each stage keeps its bubble (idle time since its first forward); a W that would
     overrun the wait for an input runs anyway when the wait is longer than the room
     the stage has before its bubble reaches the worst stage's, and otherwise only if
     `overrun` says so. Idle time is then spread over the stages instead of piling up.

The three switches (`early`, `skip`, `overrun`) give eight variants; `best_heuristic`
builds all and keeps the one with the shortest longest rank span. A stage's span is its
work plus its bubble, and the bubble only grows: a variant stops (`Slower`) as soon as it
must end slower than `give_up` or than the best variant so far.
"""

from __future__ import annotations

import itertools
import math

from zbkit.schedules.core.action import Action
from zbkit.schedules.core.costs import TOL, Costs
from zbkit.schedules.search.timeline import Timeline, fastest_variant

__all__ = ["best_heuristic", "heuristic", "sweep"]


def _fill_gap(tl: Timeline, s: int, ready: float, share: float) -> None:
    """sweep's W rule: pending Ws into the wait for an input arriving at `ready`; a W that
    overruns it only if the wait is at least `share` of the W."""
    w = tl.dur[s]["W"]
    while tl.pending[s]:
        gap = ready - tl.free[s]
        if gap <= TOL or (w > gap + TOL and gap < share * w):
            return
        tl.place_w(s)


def sweep(
    costs: list[Costs],
    m: int,
    memory_limit: float,
    warmup: list[int],
    fill: float = 0.0,
    tail_fill: float | None = None,
    actions: bool = True,
) -> tuple[dict[int, list[Action]], float]:
    """The paper's construction, microbatch by microbatch; one stage per rank (rank = stage).

    Round i goes down the pipeline, each stage running forwards until it is `warmup[s]`
    ahead of i (round 0 is the warm-up: `warmup[s]` forwards before the first I; later
    rounds add one F each), then up the pipeline, each stage running I_i. Stages are
    visited in dependency order, so when an F or I is placed the time its input arrives
    is already known, and Ws go exactly into the gaps: while the F/I would wait, the
    oldest pending W runs if it fits the wait, or if the wait is at least `fill` * W (a W
    that overruns delays the F/I a little, but is done now rather than at the end).
    `tail_fill` replaces `fill` once a stage has run all its forwards (the cool-down).
    Ws also run whenever the next action would go over `memory_limit`.

    Returns (program per rank, cost); cost is the longest rank span (first start to last
    end), the same number `simulate` computes for the program. `actions=False` skips
    building the program (a search only needs the cost) and returns it empty.
    """
    p = len(costs)
    tail = fill if tail_fill is None else tail_fill
    tl = Timeline(costs, range(p), m, memory_limit, record=actions)
    done_f = tl.count["F"]
    for i in range(m):
        for s in range(p):  # down: forwards
            target = min(m, i + warmup[s])
            while done_f[s] < target and (s == 0 or done_f[s] < done_f[s - 1]):
                ready = tl.arrival(s, "F", done_f[s]) or 0.0
                _fill_gap(tl, s, ready, fill if done_f[s] < m else tail)
                if not tl.make_room(s, "F"):
                    break
                tl.place(s, "F")
            if done_f[s] <= i:  # I_i needs F_i
                raise ValueError(
                    f"memory_limit={memory_limit:g} leaves stage {s} no room for forward {i}"
                )
        for s in reversed(range(p)):  # up: input gradients
            _fill_gap(tl, s, tl.arrival(s, "I", i) or 0.0, fill if done_f[s] < m else tail)
            if not tl.make_room(s, "I"):
                raise ValueError(f"memory_limit={memory_limit:g} too small for stage {s}'s I")
            tl.place(s, "I", i)
    tl.drain()  # cool-down: the Ws still owed
    return tl.program, tl.span()


# ---- the reference repo's heuristic ---------------------------------------------------------


def _room(tl: Timeline, s: int, kind: str) -> None:
    if not tl.make_room(s, kind):
        raise ValueError(f"memory_limit={tl.limit:g}: stage {s} has no room for {kind}")


def _fill_wait(tl: Timeline, s: int, arrival: float, overrun: bool) -> None:
    """Ws into the wait for an input arriving at `arrival`; then maybe one that overruns
    (idea 3: when the wait is longer than the idle time this stage may still take for free)."""
    while tl.pending[s] and tl.free[s] + tl.dur[s]["W"] <= arrival + TOL:
        tl.place_w(s)
    if tl.pending[s] and tl.free[s] < arrival - TOL:
        room = tl.worst - tl.idle[s]
        if overrun or arrival - tl.free[s] > room:
            tl.place_w(s)


def _warmup(tl: Timeline, early: bool) -> None:
    """Idea 1: F_0 down, the forwards each stage fits before I_0's gradient comes back
    (each stage fewer than the one before it), then I_0 up."""
    p, m, dur, mem, comm, done_f = len(tl.free), tl.m, tl.dur, tl.mem, tl.comm, tl.count["F"]
    for s in range(p):
        tl.place(s, "F")
    extra = [0] * p  # forwards each stage runs before I_0
    back = (tl.end["F"][p - 1][0] or 0.0) + dur[p - 1]["I"]  # when I_0 ends on the stage below
    for s in reversed(range(p - 1)):
        arrival, t, h = back + comm[s], tl.free[s], tl.held[s]
        while done_f[s] + extra[s] < m and h + mem[s]["F"] <= tl.limit + TOL:
            if (t + dur[s]["F"] > arrival) if early else (t >= arrival):
                break
            t, h, extra[s] = t + dur[s]["F"], h + mem[s]["F"], extra[s] + 1
        back = max(t, arrival) + dur[s]["I"]
    for s in range(1, p):  # each stage warms up less than the one before it
        while extra[s] > 0 and extra[s] >= extra[s - 1]:
            extra[s] -= 1
    for s in range(p):
        for _ in range(extra[s]):
            _room(tl, s, "F")
            tl.place(s, "F")
    for s in reversed(range(p)):
        _room(tl, s, "I")
        tl.place(s, "I")


def _skips(tl: Timeline, s: int) -> bool:
    """Idea 2: whether stage s, two or more forwards ahead of the next, skips its forward
    this round (it would delay the input gradient coming back and waiting costs less)."""
    nxt, dur, done = s + 1, tl.dur, tl.count
    # the next stage would send I's gradient back after its own F and I
    back = tl.free[nxt] + dur[nxt]["F"] + dur[nxt]["I"] + tl.comm[s]
    if tl.free[s] >= back:
        return True
    room, ws, n = tl.held[s] + tl.mem[s]["F"], 0.0, 0  # the Ws this F would need first
    while room > tl.limit + TOL and done["W"][s] + n < done["I"][s]:
        room, ws, n = room + tl.mem[s]["W"], ws + dur[s]["W"], n + 1
    if tl.free[s] + dur[s]["F"] + ws <= back:
        return False  # the F fits before the gradient arrives: run it
    return back - tl.free[s] <= tl.worst - tl.idle[s]  # waiting costs less idle time


def _round(tl: Timeline, i: int, skip: bool, overrun: bool) -> None:
    """Steady state, round i: one more F down (where wanted), then I_i up."""
    p, m, done_f = len(tl.free), tl.m, tl.count["F"]
    want = [done_f[s] < m for s in range(p)]
    for s in range(p - 1) if skip else ():
        if want[s] and done_f[s] >= done_f[s + 1] + 2 and _skips(tl, s):
            want[s] = False
    for s in reversed(range(p - 1)):  # a forward is only useful if later stages run one
        want[s] = want[s] and want[s + 1]
    for s in range(p):
        if want[s]:
            _room(tl, s, "F")
            if s > 0:
                _fill_wait(tl, s, tl.arrival(s, "F", done_f[s]) or 0.0, overrun)
            tl.place(s, "F")
    for s in reversed(range(p)):
        _room(tl, s, "I")
        if s < p - 1:
            _fill_wait(tl, s, tl.arrival(s, "I", i) or 0.0, overrun)
        if s == 0 and done_f[s] == m:
            while tl.pending[s]:  # nothing else to do on the first stage: drain
                tl.place_w(s)
        tl.place(s, "I")


def heuristic(
    costs: list[Costs],
    m: int,
    memory_limit: float,
    early: bool,
    skip: bool,
    overrun: bool,
    give_up: float = math.inf,
) -> tuple[dict[int, list[Action]], float]:
    """The schedule of the module docstring for one variant, and its longest rank span.

    `early`: a warm-up forward may start before I_0's gradient arrives if it ends after
    it (rather than only those that end before). `skip`: idea 2. `overrun`: in idea 3,
    a W that overruns a short wait runs anyway. Raises ValueError if the limit is too small,
    `Slower` once a stage's span must exceed `give_up`.
    """
    p = len(costs)
    tl = Timeline(costs, range(p), m, memory_limit, give_up)
    _warmup(tl, early)
    for i in range(1, m):
        _round(tl, i, skip, overrun)
    tl.drain()  # cool-down: the Ws still owed
    assert all(n == m for counts in tl.count.values() for n in counts), f"counts {tl.count}"
    return tl.program, tl.span()


def best_heuristic(
    costs: list[Costs], m: int, memory_limit: float, give_up: float = math.inf
) -> dict[int, list[Action]]:
    """The fastest of the eight variants that fit `memory_limit`: ValueError if none does,
    `Slower` if none can end within `give_up`."""

    def build(early: bool, skip: bool, overrun: bool, beat: float):
        return heuristic(costs, m, memory_limit, early, skip, overrun, beat)

    return fastest_variant(itertools.product((True, False), repeat=3), build, give_up)
