"""The Zero Bubble paper's own heuristic for one stage per rank, with its bubble budget.

`sweep` (in `_build_greedy`) is the paper's construction at a warm-up chosen from a list.
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

from zbkit.schedules._build_greedy import SPLIT, Slower, _tables, fastest_variant
from zbkit.schedules.action import Action
from zbkit.schedules.costs import Costs

_EPS = 1e-9


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
    dur, mem = _tables(costs)
    comm = [c.comm for c in costs]
    done = {k: [0] * p for k in SPLIT}  # actions of each kind placed, per stage
    end = {k: [[0.0] * m for _ in range(p)] for k in SPLIT}  # when each action ended
    busy_until = [0.0] * p
    held = [0.0] * p
    bubble = [0.0] * p  # idle time on each stage since its first forward
    first = [0.0] * p
    program: dict[int, list[Action]] = {s: [] for s in range(p)}
    work = [m * sum(dur[s].values()) for s in range(p)]  # a stage's span is work + bubble
    give_up += 1e-9 * max(1.0, give_up) if give_up < math.inf else 0.0

    def ready(s: int, kind: str, j: int) -> float:
        """When the input of (s, kind, j) arrives from another stage (0: none needed)."""
        if kind == "F" and s > 0:
            return end["F"][s - 1][j] + comm[s]
        if kind == "I" and s < p - 1:
            return end["I"][s + 1][j] + comm[s]
        return 0.0

    def put(s: int, kind: str) -> None:
        j = done[kind][s]
        start = max(busy_until[s], ready(s, kind, j))
        if done["F"][s]:
            bubble[s] += start - busy_until[s]
            if work[s] + bubble[s] > give_up:
                raise Slower(f"stage {s}: work {work[s]:.6g} + bubble {bubble[s]:.6g}")
        elif kind == "F":
            first[s] = start
        busy_until[s] = end[kind][s][j] = start + dur[s][kind]
        held[s] += mem[s][kind]
        done[kind][s] += 1
        program[s].append(Action(s, kind, j))

    def pending(s: int) -> bool:
        return done["W"][s] < done["I"][s]

    def make_room(s: int, kind: str) -> None:
        while held[s] + mem[s][kind] > memory_limit + _EPS:
            if not pending(s):
                raise ValueError(f"memory_limit={memory_limit:g}: stage {s} has no room for {kind}")
            put(s, "W")

    def fill_wait(s: int, arrival: float) -> None:
        """Ws into the wait for an input arriving at `arrival`; then maybe one that overruns."""
        while pending(s) and busy_until[s] + dur[s]["W"] <= arrival + _EPS:
            put(s, "W")
        if pending(s) and busy_until[s] < arrival - _EPS:
            room = max(bubble) - bubble[s]  # idle time this stage may still take for free
            if overrun or arrival - busy_until[s] > room:
                put(s, "W")

    # ---- warm-up: F_0 down, the derived forwards, then I_0 up ----
    for s in range(p):
        put(s, "F")
    extra = [0] * p  # forwards each stage runs before I_0
    back = end["F"][p - 1][0] + dur[p - 1]["I"]  # when I_0 ends on the stage below
    for s in reversed(range(p - 1)):
        arrival, t, h = back + comm[s], busy_until[s], held[s]
        while done["F"][s] + extra[s] < m and h + mem[s]["F"] <= memory_limit + _EPS:
            if (t + dur[s]["F"] > arrival) if early else (t >= arrival):
                break
            t, h, extra[s] = t + dur[s]["F"], h + mem[s]["F"], extra[s] + 1
        back = max(t, arrival) + dur[s]["I"]
    for s in range(1, p):  # each stage warms up less than the one before it
        while extra[s] > 0 and extra[s] >= extra[s - 1]:
            extra[s] -= 1
    for s in range(p):
        for _ in range(extra[s]):
            make_room(s, "F")
            put(s, "F")
    for s in reversed(range(p)):
        make_room(s, "I")
        put(s, "I")

    # ---- steady state: round i runs one more F down (where wanted), then I_i up ----
    for i in range(1, m):
        want = [done["F"][s] < m for s in range(p)]
        for s in range(p - 1) if skip else ():
            if not want[s] or done["F"][s] < done["F"][s + 1] + 2:
                continue
            # the next stage would send I's gradient back after its own F and I
            back = busy_until[s + 1] + dur[s + 1]["F"] + dur[s + 1]["I"] + comm[s]
            if busy_until[s] >= back:
                want[s] = False
                continue
            room, ws, n = held[s] + mem[s]["F"], 0.0, 0  # the Ws this F would need first
            while room > memory_limit + _EPS and done["W"][s] + n < done["I"][s]:
                room, ws, n = room + mem[s]["W"], ws + dur[s]["W"], n + 1
            if busy_until[s] + dur[s]["F"] + ws <= back:
                continue  # the F fits before the gradient arrives: run it
            if back - busy_until[s] <= max(bubble) - bubble[s]:
                want[s] = False  # waiting costs less idle time than the worst stage has
        for s in reversed(range(p - 1)):  # a forward is only useful if later stages run one
            want[s] = want[s] and want[s + 1]
        for s in range(p):
            if want[s]:
                make_room(s, "F")
                if s > 0:
                    fill_wait(s, ready(s, "F", done["F"][s]))
                put(s, "F")
        for s in reversed(range(p)):
            make_room(s, "I")
            if s < p - 1:
                fill_wait(s, ready(s, "I", i))
            if s == 0 and done["F"][s] == m:
                while pending(s):  # nothing else to do on the first stage: drain
                    put(s, "W")
            put(s, "I")

    # ---- cool-down: the Ws still owed ----
    for s in range(p):
        while pending(s):
            put(s, "W")
    assert all(done[k][s] == m for k in SPLIT for s in range(p)), f"counts {done}"
    return program, max(busy_until[s] - first[s] for s in range(p))


def best_heuristic(
    costs: list[Costs], m: int, memory_limit: float, give_up: float = math.inf
) -> dict[int, list[Action]]:
    """The fastest of the eight variants that fit `memory_limit`: ValueError if none does,
    `Slower` if none can end within `give_up`."""

    def build(early: bool, skip: bool, overrun: bool, beat: float):
        return heuristic(costs, m, memory_limit, early, skip, overrun, beat)

    return fastest_variant(itertools.product((True, False), repeat=3), build, give_up)
