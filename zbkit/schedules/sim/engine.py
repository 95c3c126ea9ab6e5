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

from collections.abc import Mapping, Sequence

from zbkit.schedules.core.action import KINDS, Action, Overlap, Product
from zbkit.schedules.core.schedule import Schedule

_WHAT = {p: i for i, p in enumerate(Product)}


def tables() -> tuple[dict[str, int], dict[str, tuple[tuple[int, int], ...]]]:
    """From `KINDS` (read at each call, so a kind added to the table counts at once):
    makes[kind] = what finishing it makes available (an index into _WHAT; nothing others
    wait for = len(_WHAT)); needs[kind] = the (what, stage offset) it waits for."""
    makes = {k: _WHAT[kind.makes] if kind.makes else len(_WHAT) for k, kind in KINDS.items()}
    needs = {k: tuple((_WHAT[p], d) for p, d in kind.needs) for k, kind in KINDS.items()}
    return makes, needs


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
    steps = _per_kind_and_stage(n, m, duration, comm)
    ready_at: list[float | None] = [None] * ((len(_WHAT) + 1) * n * m)  # key -> when made
    waiting: dict[int, list[int]] = {}  # key -> ranks whose next item needs it
    times: dict[int, list[tuple[float, float]]] = {r: [] for r in program}
    free = dict.fromkeys(program, 0.0)
    todo = sorted(program, reverse=True)
    while todo:
        r = todo.pop()
        items, out = program[r], times[r]
        t_free, i, count = free[r], len(out), len(items)
        while i < count:
            item = items[i]
            halves = item.halves if type(item) is Overlap else (item,)
            # starts when every half's inputs are there: a pair waits for both
            start, blocked = t_free, -1
            for a in halves:
                j = a.microbatch
                needs, make, took = steps[a.kind][a.stage]
                for offset, ds, delay in needs:
                    t = ready_at[offset + j]
                    if t is None:
                        blocked = offset + j
                        break
                    if where[ds] != r:
                        t += delay
                    if t > start:
                        start = t
                if blocked >= 0:
                    break
            if blocked >= 0:
                waiting.setdefault(blocked, []).append(r)
                break
            # one action: `a`, `make` and `took` are its own
            t_free = start + (took if len(halves) == 1 else _pair_time(halves, steps, hidden))
            out.append((start, t_free))
            i += 1
            for a in halves:
                key = (make if len(halves) == 1 else steps[a.kind][a.stage][1]) + a.microbatch
                ready_at[key] = t_free
                if key in waiting:
                    todo.extend(waiting.pop(key))
        free[r] = t_free
    _check_all_ran(program, times, ready_at, n, m)
    return times


def _check_all_ran(
    program: Mapping[int, Sequence[Action | Overlap]],
    times: dict[int, list[tuple[float, float]]],
    ready_at: list[float | None],
    n: int,
    m: int,
) -> None:
    """Raise `Stuck` naming each rank that did not finish and what its next item awaits."""
    stuck = {}
    for r, items in program.items():
        pos = len(times[r])
        if pos < len(items):
            item = items[pos]
            need = next(
                k
                for k in dependencies(item, n - 1)
                if ready_at[k[0] * n * m + k[1] * m + k[2]] is None
            )
            stuck[r] = (pos, item, need)
    if stuck:
        raise Stuck(stuck)


# per kind, per stage: (what it waits for, the key it makes, its duration) - see below
_Steps = dict[str, list[tuple[tuple[tuple[int, int, float], ...], int, float]]]


def _per_kind_and_stage(
    n: int, m: int, duration: dict[tuple[int, str], float], comm: Sequence[float]
) -> _Steps:
    """The key arithmetic done once per (kind, stage), so the walk only adds the microbatch:
    steps[kind][stage] = (the keys it waits for less the microbatch, each with its stage and
    the delay when that stage is on another rank; the key it makes less the microbatch; its
    duration). What lies outside the pipeline (the first stage's input, the loss) is left out."""
    makes, needs = tables()
    nm = n * m
    return {
        k: [
            (
                tuple((w * nm + (s + d) * m, s + d, comm[s]) for w, d in need if 0 <= s + d < n),
                makes[k] * nm + s * m,
                duration[s, k],
            )
            for s in range(n)
        ]
        for k, need in needs.items()
    }


def _pair_time(halves: tuple[Action, ...], steps: _Steps, hidden: Sequence[float] | None) -> float:
    """An overlapped pair's duration: both halves less what overlapping hides (`hidden` of
    the forward's stage), at least the longer half."""
    f, b = halves
    times = (steps[f.kind][f.stage][2], steps[b.kind][b.stage][2])
    saved = hidden[f.stage] if hidden is not None else 0.0
    return max(sum(times) - saved, *times)
