"""V-Half and V-Min: V-shaped schedules with controllable memory (Qi et al., "Pipeline
Parallelism with Controllable Memory", NeurIPS 2024), built the paper's way.

Placement as ZB-V: rank r holds stage r (going down the V) and stage 2p-1-r (coming back up).
Time is counted in slots of one pass (the paper builds with F = I = W); `simulate` then gives
real times for any costs ("squeezing").

1. Building block: one microbatch's four F/I passes per rank, at fixed slots (`_block`). The
   offsets between neighbouring ranks set the block's lifespan on each rank, and lifespan / 6
   is the activations a rank holds at the peak: offsets of 1-2 slots instead of ZB-V's wider
   ones give about 1/2 (V-Half) and 1/3 (V-Min) of 1F1B's memory.
2. Repeating: microbatch j's block starts 6j slots later (six passes per rank and
   microbatch: F, I, W on two stages); the W go into the free slots, oldest I first.
3. Reordering: in the warm-up and the cool-down, where memory is below its peak, each pass
   moves to the earliest free slot its inputs allow, as long as no rank's memory rises
   above the steady state's peak; then the cool-down's I once more ahead of the W.

Against the paper (tests/schedules/test_schedules_v.py): the peak is exactly its table's,
(p+2)//2 (V-Half) and (p+4)//3 (V-Min) whole-rank microbatches, counted as the paper does
(held until W). The bubble at F = I = W is within its 2p/3 (F+I+W) for V-Min; for V-Half
within its p/2 (F+I+W) up to p = 10 and about p/2 - 5 slots more beyond: this greedy
reordering is simpler than the reference's, and the paper's figure is an approximation.
"""

from __future__ import annotations

from bisect import bisect
from itertools import accumulate

from zbkit.schedules.core.action import PARTS, Action, waits_on
from zbkit.schedules.core.costs import Costs
from zbkit.schedules.core.placement import stage_to_rank

Key = tuple[int, str, int]  # (stage, kind, microbatch)
Line = list[Key | None]  # one rank's passes by slot (None: a free slot)
Slots = dict[tuple[int, str], list[int]]  # slot[stage, kind][microbatch]: when that pass runs
# activations held, as the paper counts them (held from F until W): the one memory rule,
# `Costs.memory`, with an activation and what I leaves for W both one unit (F +1, I 0, W -1)
HOLDS = {k: Costs(mem_activation=1.0, mem_weight=1.0).memory(k) for k in PARTS}

# Speed: pp=64, m=512 is 200k passes, so each step works on whole lists (a rank's timeline,
# a stage's slots) with comprehensions, slices and itertools, not pass by pass in a loop.


def _block(p: int, variant: str) -> dict[int, list[tuple[int, str, int]]]:
    """Rank r's passes of microbatch 0 as (slot, kind, stage): the paper's V-shape blocks.

    The gap g shifts the backward half so that no two passes of a rank collide modulo 6
    (without it V-Min collides when 3 divides p, V-Half when p is even)."""
    blocks = {}
    for r in range(p):
        down, up = r, 2 * p - 1 - r
        if variant == "v-min":  # every offset 1 slot: the shortest lifespan, about 4p slots
            g = 2 if p % 3 == 0 else 0
            slots = [(r, "F", down), (2 * p - 1 - r, "F", up)]
            slots += [(2 * p + g + r, "I", up), (4 * p + g - 1 - r, "I", down)]
        else:  # v-half: 2 slots going down, 1 coming up: about 6p slots
            g = 3 if p % 2 == 0 else 0
            slots = [(2 * r, "F", down), (3 * p - 2 - r, "F", up)]
            slots += [(3 * p + g + 2 * r - 1, "I", up), (6 * p + g - 2 - r, "I", down)]
        blocks[r] = slots
    return blocks


def _deps(key: Key, last: int) -> list[Key]:
    """What a pass waits for (the timeline's rule, from the KINDS table), plus the previous
    microbatch of the same stage and kind, so that each stage keeps its microbatches in order."""
    s, kind, j = key
    deps = [(s, kind, j - 1)] if j > 0 else []
    return deps + [(d, k, j) for d, k in waits_on(s, kind, last + 1)]


def _fill_w(slot: Slots, lines: list[Line]) -> None:
    """Put each rank's W into its free slots, the oldest I's W first: the k-th W goes to the
    first free slot after both its I and the (k-1)-th W. Pads the lines to one length."""
    for line in lines:
        backs = [(t, key) for t, key in enumerate(line) if key and key[1] == "I"]
        free = [t for t, key in enumerate(line) if key is None]
        free += range(len(line), len(line) + len(backs))  # past the end every slot is free
        # the k-th W takes free[n_k], n_k = max(n_(k-1) + 1, f_k) where free[f_k] is the first
        # free slot after its I; unrolled, n_k = k + max(f_l - l for l <= k): a running max
        firsts = [bisect(free, t) - k for k, (t, _) in enumerate(backs)]
        ts = [free[k + most] for k, most in enumerate(accumulate(firsts, max))]
        ws = [(stage, "W", j) for _, (stage, _, j) in backs]
        line += [None] * (max(ts, default=-1) + 1 - len(line))
        for t, w in zip(ts, ws, strict=True):
            line[t] = w
        for stage in {w[0] for w in ws}:  # W of one stage in microbatch order, as their I
            slot[stage, "W"] = [t for t, w in zip(ts, ws, strict=True) if w[0] == stage]
    span = max(map(len, lines))
    for line in lines:
        line += [None] * (span - len(line))


def _held(lines: list[Line]) -> list[list[float]]:
    """Activations each rank holds in each slot (`HOLDS`)."""
    return [list(accumulate([HOLDS[key[1]] if key else 0.0 for key in line])) for line in lines]


def _by_slot(lines: list[Line], start: int, stop: int | None = None) -> list[Key]:
    """The passes in slots start..stop-1 in slot order (by rank within a slot: passes in one
    slot never wait for each other, so their order does not matter)."""
    return [
        key
        for column in zip(*(line[start:stop] for line in lines), strict=True)
        for key in column
        if key
    ]


def _move_earlier(slot, lines, rank_of, keys, peak, held) -> None:
    """Each pass of `keys` (in slot order) to the earliest free slot its inputs allow; an F
    only where it keeps its rank's memory (`held`) at most `peak` (it holds longer)."""
    last = len(rank_of) - 1
    for key in keys:
        stage, kind, j = key
        t, line, row = slot[stage, kind][j], lines[rank_of[stage]], held[rank_of[stage]]
        earliest = max([slot[s, k][i] + 1 for s, k, i in _deps(key, last)], default=0)
        if kind == "F":  # held one slot longer from u on: u after the last slot at the peak
            seen = row[earliest:t]
            if peak in seen:
                earliest = t - seen[::-1].index(peak)
        if None in line[earliest:t]:
            u = line.index(None, earliest, t)
            line[u], line[t] = key, None
            slot[stage, kind][j] = u
            if HOLDS[kind]:
                row[u:t] = [h + HOLDS[kind] for h in row[u:t]]


def v_schedule(p: int, m: int, variant: str) -> dict[int, list[Action]]:
    """`variant` is "v-half" or "v-min"; returns program[rank]."""
    rank_of = stage_to_rank("v", p)
    # 1-2. the block, repeated every 6 slots; the W fill the free slots, oldest I first
    blocks = _block(p, variant)
    span = 6 * (m - 1) + 1 + max(t for passes in blocks.values() for t, _, _ in passes)
    lines: list[Line] = [[None] * span for _ in range(p)]
    slot: Slots = {}
    for r, passes in blocks.items():
        for t, kind, stage in passes:
            lines[r][t : t + 6 * m : 6] = [(stage, kind, j) for j in range(m)]
            slot[stage, kind] = list(range(t, t + 6 * m, 6))
    _fill_w(slot, lines)
    held = _held(lines)
    peak = max(map(max, held))  # the steady state's: the block's memory

    # 3. reorder the warm-up (before rank 0's first backward on its down stage) and the
    # cool-down (after its last forward there); the steady state keeps the block's pattern
    warm_end, cool_start = slot[0, "I"][0], slot[0, "F"][m - 1]
    ends = _by_slot(lines, 0, warm_end) + _by_slot(lines, cool_start + 1)
    _move_earlier(slot, lines, rank_of, ends, peak, held)
    # then the cool-down once more without the W: input gradients first (they unblock the
    # ranks below), the W back into the free slots after; kept if no rank goes over the peak
    again = {key: list(ts) for key, ts in slot.items() if key[1] != "W"}
    again_lines = [[k if k and k[1] != "W" else None for k in line] for line in lines]
    cool = [k for k in _by_slot(again_lines, cool_start + 1) if k[1] == "I"]
    _move_earlier(again, again_lines, rank_of, cool, peak, held)
    _fill_w(again, again_lines)
    if max(map(max, _held(again_lines))) <= peak:
        lines = again_lines

    make = Action.trusted  # 200k actions at pp=64: checked whole below and by check_counts
    program = {r: [make(*key) for key in line if key] for r, line in enumerate(lines)}
    # invariant: six passes per rank and microbatch, every rank under the block's peak
    for r, row in enumerate(_held(lines)):
        n = len(program[r])
        assert n == 6 * m, f"{variant}: builder bug: rank {r} has {n} passes"
        assert max(row) <= peak, f"{variant}: builder bug: rank {r} holds {max(row)}"
    return program
