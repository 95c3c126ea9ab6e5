"""Run a schedule's dependencies: each rank walks its program in order, one action at a time.

Dependencies (DESIGN.md): F(s,j) needs F(s-1,j); I or B of (s,j) needs F(s,j) and the input
gradient of (s+1,j), i.e. its I or B (the last stage needs only its F); W(s,j) needs I(s,j).
A wait on another rank costs `comm`. The same walk gives the simulator its times and the
validator its deadlock report (a rank whose next action waits on something never done).
"""

from __future__ import annotations

from collections.abc import Callable

from zbkit.schedules.action import KINDS, Action
from zbkit.schedules.schedule import Schedule

Key = tuple[str, int, int]  # (done_key, stage, microbatch): "F", "X" (input grad) or "W"


def dependencies(a: Action, last_stage: int) -> list[Key]:
    s, j = a.stage, a.microbatch
    if a.kind == "F":
        return [("F", s - 1, j)] if s > 0 else []
    if a.kind == "W":
        return [("X", s, j)]
    # I or B: own forward, and the gradient coming back from the next stage
    return [("F", s, j)] + ([("X", s + 1, j)] if s < last_stage else [])


class Stuck(Exception):
    """Ranks blocked for good: blocked[rank] = (position, action, the key it waits for)."""

    def __init__(self, blocked: dict[int, tuple[int, Action, Key]]) -> None:
        super().__init__("deadlock")
        self.blocked = blocked


def run(
    schedule: Schedule,
    duration: Callable[[Action], float],
    comm: Callable[[Action], float],
) -> dict[int, list[tuple[float, float]]]:
    """(start, end) of every action, per rank in program order; raises `Stuck`."""
    program, where = schedule.program, schedule.stage_to_rank
    last = schedule.num_stages - 1
    done: dict[Key, float] = {}
    waiting: dict[Key, list[int]] = {}  # key -> ranks whose next action needs it
    times: dict[int, list[tuple[float, float]]] = {r: [] for r in program}
    free = dict.fromkeys(program, 0.0)
    todo = sorted(program, reverse=True)
    while todo:
        r = todo.pop()
        actions, out = program[r], times[r]
        while len(out) < len(actions):
            a = actions[len(out)]
            start = free[r]
            blocked = None
            for key in dependencies(a, last):
                t = done.get(key)
                if t is None:
                    blocked = key
                    break
                if where[key[1]] != r:
                    t += comm(a)
                if t > start:
                    start = t
            if blocked is not None:
                waiting.setdefault(blocked, []).append(r)
                break
            end = start + duration(a)
            out.append((start, end))
            free[r] = end
            key = (KINDS[a.kind].done_key, a.stage, a.microbatch)
            done[key] = end
            todo.extend(waiting.pop(key, ()))
    stuck = {}
    for r, actions in program.items():
        pos = len(times[r])
        if pos < len(actions):
            a = actions[pos]
            need = next(k for k in dependencies(a, last) if k not in done)
            stuck[r] = (pos, a, need)
    if stuck:
        raise Stuck(stuck)
    return times
