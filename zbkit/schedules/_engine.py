"""Run a schedule's dependencies: each rank walks its program in order, one action at a time.

What an action waits for comes from the `KINDS` table (`Kind.needs`): F(s,j) needs the
forward output of (s-1,j); I or B of (s,j) need F(s,j) and the input gradient of (s+1,j)
(the last stage only its F); W(s,j) needs I(s,j). A wait on another rank costs `comm`.
The same walk gives the simulator its times and the validator its deadlock report (a rank
whose next action waits on something never done).

Inner loops use integer keys (what, stage, microbatch) -> what*n*m + stage*m + microbatch,
what = the index of the product in `_WHAT` (0 forward output, 1 input gradient); a kind
that makes nothing others wait for (W) books `len(_WHAT)`. A 24k-action schedule must
simulate in a few tens of milliseconds for a slider to feel live.
"""

from __future__ import annotations

from collections.abc import Sequence

from zbkit.schedules.action import KINDS, Action, Overlap, Product
from zbkit.schedules.schedule import Schedule

_WHAT = {p: i for i, p in enumerate(Product)}


def tables() -> tuple[dict[str, int], dict[str, tuple[tuple[int, int], ...]]]:
    """From `KINDS` (read at each call, so a kind added to the table counts at once):
    done[kind] = what finishing it makes available (an index into _WHAT; nothing others
    wait for = len(_WHAT)); needs[kind] = the (what, stage offset) it waits for."""
    done = {k: _WHAT[kind.makes] if kind.makes else len(_WHAT) for k, kind in KINDS.items()}
    needs = {k: tuple((_WHAT[p], d) for p, d in kind.needs) for k, kind in KINDS.items()}
    return done, needs


def dependencies(item: Action | Overlap, last_stage: int) -> list[tuple[int, int, int]]:
    """(what, stage, microbatch) that `item` waits for (both halves of an overlapped pair:
    it starts when both are ready); what as in the module docstring."""
    stages = last_stage + 1
    return [
        (_WHAT[p], s, a.microbatch)
        for a in item.halves
        for p, s in a.info.needs_of(a.stage, stages)
    ]


class Stuck(Exception):
    """Ranks blocked for good: blocked[rank] = (position, action, (what, stage, mb) awaited)."""

    def __init__(
        self, blocked: dict[int, tuple[int, Action | Overlap, tuple[int, int, int]]]
    ) -> None:
        super().__init__("deadlock")
        self.blocked = blocked


def run(
    schedule: Schedule,
    duration: dict[tuple[int, str], float],
    comm: Sequence[float],
    hidden: Sequence[float] | None = None,
) -> dict[int, list[tuple[float, float]]]:
    """(start, end) of every program item, per rank in order; raises `Stuck`.

    `duration[stage, kind]`; `comm[stage]` is added when an action of that stage waits on
    another rank. An overlapped pair (`Overlap`) starts when both halves are ready and
    takes both durations less `hidden[forward's stage]` (at least the longer half); what
    both make is there when it ends. Indices must be in range (run `validate` first).
    """
    program, where = schedule.program, schedule.stage_to_rank
    n, m = schedule.num_stages, schedule.microbatches
    last, nm = n - 1, n * m
    made, needs = tables()
    # per kind, with the key arithmetic done once: (what * n*m, stage offset) it waits for,
    # what * n*m it makes, and its duration per stage
    wait_on = {k: tuple((w * nm, d) for w, d in v) for k, v in needs.items()}
    makes = {k: w * nm for k, w in made.items()}
    dur = {k: [duration[s, k] for s in range(n)] for k in needs}
    done: list[float | None] = [None] * ((len(_WHAT) + 1) * nm)
    waiting: dict[int, list[int]] = {}  # key -> ranks whose next action needs it
    times: dict[int, list[tuple[float, float]]] = {r: [] for r in program}
    free = dict.fromkeys(program, 0.0)
    todo = sorted(program, reverse=True)
    while todo:
        r = todo.pop()
        actions, out = program[r], times[r]
        t_free, i, count = free[r], len(out), len(actions)
        while i < count:
            a = actions[i]
            if type(a) is Overlap:  # rare: the general walk, both halves at once
                span = _pair(a, t_free, done, where, r, comm, m, wait_on, dur, hidden)
                if isinstance(span, int):
                    waiting.setdefault(span, []).append(r)
                    break
                out.append(span)
                t_free = span[1]
                i += 1
                for h in a.halves:
                    key = makes[h.kind] + h.stage * m + h.microbatch
                    done[key] = t_free
                    if key in waiting:
                        todo.extend(waiting.pop(key))
                continue
            s, kind, j = a.stage, a.kind, a.microbatch
            start = t_free
            blocked = -1
            for base, d in wait_on[kind]:
                ds = s + d
                if ds < 0 or ds > last:
                    continue  # outside the pipeline: the first stage's input, the loss
                key = base + ds * m + j
                t = done[key]
                if t is None:
                    blocked = key
                    break
                if where[ds] != r:
                    t += comm[s]
                if t > start:
                    start = t
            if blocked >= 0:
                waiting.setdefault(blocked, []).append(r)
                break
            t_free = start + dur[kind][s]
            out.append((start, t_free))
            i += 1
            key = makes[kind] + s * m + j
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


def _pair(pair, t_free, done, where, r, comm, m, wait_on, dur, hidden):
    """An overlapped pair's (start, end), or the key it is blocked on (an int)."""
    start = t_free
    for a in pair.halves:
        s, j = a.stage, a.microbatch
        for base, d in wait_on[a.kind]:
            ds = s + d
            if ds < 0 or ds >= len(where):
                continue
            t = done[base + ds * m + j]
            if t is None:
                return base + ds * m + j
            if where[ds] != r:
                t += comm[s]
            start = max(start, t)
    f, b = pair.forward, pair.backward
    halves = (dur[f.kind][f.stage], dur[b.kind][b.stage])
    saved = hidden[f.stage] if hidden is not None else 0.0
    return (start, start + max(sum(halves) - saved, *halves))
