"""Run a schedule's dependencies: each rank walks its program in order, one action at a time.

Dependencies (DESIGN.md): F(s,j) needs F(s-1,j); I or B of (s,j) needs F(s,j) and the input
gradient of (s+1,j), i.e. its I or B (the last stage needs only its F); W(s,j) needs I(s,j).
A wait on another rank costs `comm`. The same walk gives the simulator its times and the
validator its deadlock report (a rank whose next action waits on something never done).

Inner loops use integer keys (what, stage, microbatch) -> what*n*m + stage*m + microbatch,
what = 0 forward done, 1 input gradient done (I or B), 2 weight gradient done: a 24k-action
schedule must simulate in a few tens of milliseconds for a slider to feel live.
"""

from __future__ import annotations

from collections.abc import Sequence

from zbkit.schedules.action import Action
from zbkit.schedules.schedule import Schedule

_DONE = {"F": 0, "I": 1, "B": 1, "W": 2}  # what finishing each kind makes available


def dependencies(a: Action, last_stage: int) -> list[tuple[int, int, int]]:
    """(what, stage, microbatch) that `a` waits for; what as in the module docstring."""
    s, j = a.stage, a.microbatch
    if a.kind == "F":
        return [(0, s - 1, j)] if s > 0 else []
    if a.kind == "W":
        return [(1, s, j)]
    return [(0, s, j)] + ([(1, s + 1, j)] if s < last_stage else [])


class Stuck(Exception):
    """Ranks blocked for good: blocked[rank] = (position, action, (what, stage, mb) awaited)."""

    def __init__(self, blocked: dict[int, tuple[int, Action, tuple[int, int, int]]]) -> None:
        super().__init__("deadlock")
        self.blocked = blocked


def run(
    schedule: Schedule,
    duration: dict[tuple[int, str], float],
    comm: Sequence[float],
) -> dict[int, list[tuple[float, float]]]:
    """(start, end) of every action, per rank in program order; raises `Stuck`.

    `duration[stage, kind]`; `comm[stage]` is added when an action of that stage waits on
    another rank. Indices must be in range (run `validate` first).
    """
    program, where = schedule.program, schedule.stage_to_rank
    n, m = schedule.num_stages, schedule.microbatches
    last, nm = n - 1, n * m
    done: list[float | None] = [None] * (3 * nm)
    waiting: dict[int, list[int]] = {}  # key -> ranks whose next action needs it
    times: dict[int, list[tuple[float, float]]] = {r: [] for r in program}
    free = dict.fromkeys(program, 0.0)
    todo = sorted(program, reverse=True)
    while todo:
        r = todo.pop()
        actions, out = program[r], times[r]
        t_free = free[r]
        while len(out) < len(actions):
            a = actions[len(out)]
            s, kind, j = a.stage, a.kind, a.microbatch
            # at most two dependencies: (key, stage it lives on)
            if kind == "F":
                d1, s1, d2 = (s - 1) * m + j if s else -1, s - 1, -1
                s2 = s1
            elif kind == "W":
                d1, s1, d2, s2 = nm + s * m + j, s, -1, s
            else:
                d1, s1 = s * m + j, s
                d2, s2 = (nm + (s + 1) * m + j, s + 1) if s < last else (-1, s)
            start = t_free
            blocked = -1
            for d, ds in ((d1, s1), (d2, s2)):
                if d < 0:
                    continue
                t = done[d]
                if t is None:
                    blocked = d
                    break
                if where[ds] != r:
                    t += comm[s]
                if t > start:
                    start = t
            if blocked >= 0:
                waiting.setdefault(blocked, []).append(r)
                break
            t_free = start + duration[s, kind]
            out.append((start, t_free))
            key = _DONE[kind] * nm + s * m + j
            done[key] = t_free
            if key in waiting:
                todo.extend(waiting.pop(key))
        free[r] = t_free
    stuck = {}
    for r, actions in program.items():
        pos = len(times[r])
        if pos < len(actions):
            a = actions[pos]
            need = next(
                k for k in dependencies(a, last) if done[k[0] * nm + k[1] * m + k[2]] is None
            )
            stuck[r] = (pos, a, need)
    if stuck:
        raise Stuck(stuck)
    return times
