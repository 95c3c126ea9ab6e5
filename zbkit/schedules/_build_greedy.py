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
within `hold * F` (`fill * W`). zb-auto tries a few such policies (named in
`_candidates.CANDIDATES`) and keeps the fastest, timed by the simulator's engine.

`sweep` is the paper's own construction for one stage per rank (zb-auto): it visits
microbatches in order and stages in dependency order, so it knows exactly when each input
arrives and puts Ws into the gaps that leaves (see its docstring).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from zbkit.schedules.action import Action
from zbkit.schedules.simulate import Costs

_EPS = 1e-9
SPLIT = ("F", "I", "W")
Program = dict[int, list[Action]]  # the kinds these schedulers emit: the backward split, never a B


class Slower(Exception):
    """`greedy` gave up: a rank's span is sure to exceed `give_up` (the message says how)."""


@dataclass
class Moves:
    """The `fill` and `hold` values for which `greedy` makes the same moves as a run did
    (each an open interval): every wait test that run made comes out the same for them.
    A run that stopped (`Slower`) stops at the same point, or earlier, for any such
    variant with the same or a smaller `give_up`: that variant need not be run."""

    fill: tuple[float, float] = (-math.inf, math.inf)
    hold: tuple[float, float] = (-math.inf, math.inf)

    def covers(self, fill: float, hold: float) -> bool:
        return _inside(fill, self.fill) and _inside(hold, self.hold)


def _inside(x: float, interval: tuple[float, float]) -> bool:
    lo, hi = interval  # a margin: a value at an end may round either way, so run it
    return (lo == -math.inf or lo + _EPS * max(1.0, abs(lo)) < x) and (
        hi == math.inf or x < hi - _EPS * max(1.0, abs(hi))
    )


def _narrow(interval: tuple[float, float], at: float, waited: bool) -> tuple[float, float]:
    """A wait test waits for values above `at`: keep the side this run's value was on."""
    lo, hi = interval
    return (max(lo, at), hi) if waited else (lo, min(hi, at))


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
        if best is None or span < best[1] - _EPS * max(1.0, abs(span)):
            best = (program, span)
    if best is None:
        raise slower or ValueError(why)
    return best[0]


def _tables(costs: list[Costs]) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Per stage and kind: duration and memory change, from `Costs` (looked up ~10^4 times
    per schedule, so read once)."""
    return (
        [{k: c.duration(k) for k in SPLIT} for c in costs],
        [{k: c.memory(k) for k in SPLIT} for c in costs],
    )


def greedy(
    stage_to_rank: list[int],
    m: int,
    costs: list[Costs],
    memory_limit: float,
    fill: float = 0.0,
    hold: float = 0.0,
    give_up: float = math.inf,
    moves: Moves | None = None,
) -> dict[int, list[Action]]:
    """The policy above; raises `Slower` once some rank's span must exceed `give_up`.
    `moves` (optional) is narrowed to the fill and hold values that would move the same."""
    moves = Moves() if moves is None else moves
    n = len(stage_to_rank)
    p = max(stage_to_rank) + 1
    last = n - 1
    dur, mem = _tables(costs)
    program: dict[int, list[Action]] = {r: [] for r in range(p)}
    # forwards are tried from the stage nearest the loss first: it brings the backward sooner
    f_order = {
        r: sorted((s for s in range(n) if stage_to_rank[s] == r), reverse=True) for r in range(p)
    }
    f_end: list[list[float | None]] = [[None] * m for _ in range(n)]  # when F(s, j) ended
    # when I(s, j) ended (the input gradient exists)
    x_end: list[list[float | None]] = [[None] * m for _ in range(n)]
    next_f = [0] * n
    # room kept free for carrying a new microbatch through the rank's later stages (ZB-V's
    # second chunk): without it, first-chunk forwards could fill memory and starve the V
    reserve = [
        sum(mem[t]["F"] for t in range(s + 1, n) if stage_to_rank[t] == stage_to_rank[s])
        for s in range(n)
    ]
    ready_i: dict[int, list] = {r: [] for r in range(p)}  # heap of (ready, j, -s)
    pending_w: dict[int, deque] = {r: deque() for r in range(p)}
    free = [0.0] * p
    held = [0.0] * p
    left = len(SPLIT) * n * m
    # a rank's span is its work plus its idle time, and idle time only grows: once that sum
    # passes `give_up` the schedule cannot win, whatever follows (idle = start - first - busy)
    work = [0.0] * p
    for s, r in enumerate(stage_to_rank):
        work[r] += m * sum(dur[s].values())
    first: list[float | None] = [None] * p
    busy = [0.0] * p
    give_up += 1e-9 * max(1.0, give_up) if give_up < math.inf else 0.0
    # (when, rank): a rank is looked at only when something it may wait for happens (its
    # own action ends, an input arrives, an I becomes ready); in between it would decide
    # the same as before. Ranks woken at the same time decide in rank order.
    times: list[tuple[float, int]] = [(0.0, r) for r in range(p)]
    now: list[int] = []  # ranks still to decide at time `t`, a heap
    t = 0.0

    def wake(when: float, r: int) -> None:
        heapq.heappush(times, (when, r))
        if when <= t + _EPS and now and r > now[0] and r not in now:
            heapq.heappush(now, r)  # woken for the current time by a zero-length action

    def arrive(t: float, src: int, dst: int) -> float:
        return t + (costs[src].comm if stage_to_rank[src] != stage_to_rank[dst] else 0.0)

    def offer_i(s: int, j: int) -> None:
        # I(s, j) can be queued once F(s, j) and I(s+1, j) have known end times
        f = f_end[s][j]
        if f is None:
            return
        if s == last:
            ready = f
        else:
            x = x_end[s + 1][j]
            if x is None:
                return
            ready = max(f, arrive(x, s + 1, s))
        heapq.heappush(ready_i[stage_to_rank[s]], (ready, j, -s))
        wake(ready, stage_to_rank[s])

    def run(r: int, a: Action, t: float) -> None:
        nonlocal left
        start = first[r]
        if start is None:
            first[r] = t
        elif work[r] + t - start - busy[r] > give_up:
            idle = t - start - busy[r]
            raise Slower(f"rank {r}: work {work[r]:.6g} + idle {idle:.6g} by t={t:.6g}")
        end = t + dur[a.stage][a.kind]
        busy[r] += end - t
        program[r].append(a)
        free[r] = end
        held[r] += mem[a.stage][a.kind]
        left -= 1
        wake(end, r)
        s, j = a.stage, a.microbatch
        if a.kind == "F":
            f_end[s][j] = end
            if s < last:
                wake(arrive(end, s, s + 1), stage_to_rank[s + 1])
            offer_i(s, j)
        elif a.kind == "I":
            x_end[s][j] = end
            pending_w[r].append((s, j))
            if s > 0:
                offer_i(s - 1, j)

    def next_forward(r: int, t: float) -> Action | None:
        for s in f_order[r]:
            j = next_f[s]
            if j >= m:
                continue
            if s > 0:
                f = f_end[s - 1][j]
                if f is None or arrive(f, s - 1, s) > t + _EPS:
                    continue
            if held[r] + mem[s]["F"] + reserve[s] > memory_limit + _EPS:
                continue
            return Action.trusted(s, "F", j)
        return None

    def decide(r: int, t: float) -> None:
        heap = ready_i[r]
        if heap and heap[0][0] <= t + _EPS:
            _, j, neg_s = heapq.heappop(heap)
            return run(r, Action.trusted(-neg_s, "I", j), t)
        # an I already on its way (the next stage started it) is on the critical path:
        # with hold/fill > 0, do not start an F/W that would still run when it arrives
        soon = heap[0][0] - t if heap else None
        f = next_forward(r, t)
        if f is not None:
            if soon is not None and dur[f.stage]["F"] > 0:
                # hold waits when hold * F - eps > soon, i.e. for hold above `at`
                wait = hold > 0 and soon < hold * dur[f.stage]["F"] - _EPS
                moves.hold = _narrow(moves.hold, (soon + _EPS) / dur[f.stage]["F"], wait)
                if wait:
                    return
            next_f[f.stage] += 1
            return run(r, f, t)
        if pending_w[r]:
            s, j = pending_w[r][0]
            if soon is not None and dur[s]["W"] > 0:
                wait = fill > 0 and soon < fill * dur[s]["W"] - _EPS
                moves.fill = _narrow(moves.fill, (soon + _EPS) / dur[s]["W"], wait)
                if wait:
                    return
            pending_w[r].popleft()
            return run(r, Action.trusted(s, "W", j), t)

    while left and times:
        t, r = heapq.heappop(times)
        now.append(r)
        while times and times[0][0] <= t + _EPS:
            r = heapq.heappop(times)[1]
            if r not in now:
                now.append(r)
        heapq.heapify(now)
        while now:
            r = now[0]  # stays in `now` while it decides: `wake` adds only later ranks
            if free[r] <= t + _EPS:
                decide(r, t)
            heapq.heappop(now)
    if left:
        raise ValueError(
            f"memory_limit={memory_limit:g} is too small to finish: a rank cannot run its next "
            f"forward and has nothing to free; it must be at least "
            f"{max(_minimum(stage_to_rank, costs, r) for r in range(p)):g}"
        )
    return program


def _minimum(stage_to_rank: list[int], costs: list[Costs], rank: int) -> float:
    """A rank must at least hold one microbatch's activations of all its stages at once."""
    return sum(costs[s].memory("F") for s, r in enumerate(stage_to_rank) if r == rank)


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
    busy_until = [0.0] * p  # when each stage's rank is free again
    held = [0.0] * p  # memory held now
    done = {k: [0] * p for k in SPLIT}  # actions of each kind placed so far, per stage
    f_end = [[0.0] * m for _ in range(p)]
    i_end = [[0.0] * m for _ in range(p)]
    first = [0.0] * p  # when each stage's first F starts
    program: dict[int, list[Action]] = {s: [] for s in range(p)}
    dur, mem = _tables(costs)

    def put(s: int, kind: str, ready: float) -> None:
        j = done[kind][s]
        start = busy_until[s] if busy_until[s] > ready else ready
        busy_until[s] = end = start + dur[s][kind]
        held[s] += mem[s][kind]
        done[kind][s] = j + 1
        if actions:
            program[s].append(Action.trusted(s, kind, j))
        if kind == "F":
            f_end[s][j] = end
            if j == 0:
                first[s] = start
        elif kind == "I":
            i_end[s][j] = end

    def pending(s: int) -> bool:
        return done["W"][s] < done["I"][s]

    def fill_gap(s: int, ready: float) -> None:
        w, share = dur[s]["W"], fill if done["F"][s] < m else tail
        while pending(s):
            gap = ready - busy_until[s]
            if gap <= _EPS or (w > gap + _EPS and gap < share * w):
                return
            put(s, "W", 0.0)

    def make_room(s: int, kind: str) -> bool:
        while held[s] + mem[s][kind] > memory_limit + _EPS:
            if not pending(s):
                return False
            put(s, "W", 0.0)
        return True

    for i in range(m):
        for s in range(p):  # down: forwards
            target = min(m, i + warmup[s])
            while done["F"][s] < target and (s == 0 or done["F"][s] < done["F"][s - 1]):
                j = done["F"][s]
                ready = f_end[s - 1][j] + costs[s].comm if s else 0.0
                fill_gap(s, ready)
                if not make_room(s, "F"):
                    break
                put(s, "F", ready)
            if done["F"][s] <= i:  # I_i needs F_i
                raise ValueError(
                    f"memory_limit={memory_limit:g} leaves stage {s} no room for forward {i}"
                )
        for s in reversed(range(p)):  # up: input gradients
            ready = f_end[s][i]
            if s < p - 1:
                ready = max(ready, i_end[s + 1][i] + costs[s].comm)
            fill_gap(s, ready)
            if not make_room(s, "I"):
                raise ValueError(f"memory_limit={memory_limit:g} too small for stage {s}'s I")
            put(s, "I", ready)
    for s in range(p):  # cool-down: the Ws still owed
        while pending(s):
            put(s, "W", 0.0)
    return program, max(busy_until[s] - first[s] for s in range(p))
