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

from zbkit.schedules.action import Action

Key = tuple[int, str, int]  # (stage, kind, microbatch)


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
    """What a pass waits for (as the KINDS table says), plus the previous microbatch of the
    same stage and kind, so that each stage keeps its microbatches in order."""
    s, kind, j = key
    deps = [(s, kind, j - 1)] if j > 0 else []
    if kind == "F" and s > 0:
        deps.append((s - 1, "F", j))
    if kind == "I":
        deps += [(s, "F", j)] + ([(s + 1, "I", j)] if s < last else [])
    if kind == "W":
        deps.append((s, "I", j))
    return deps


def _fill_w(slot: dict[Key, int], rank_of: dict[int, int]) -> None:
    """Put each rank's W into its free slots, the oldest I's W first."""
    by_rank: dict[int, dict[int, Key]] = {}
    for key, t in slot.items():
        by_rank.setdefault(rank_of[key[0]], {})[t] = key
    for taken in by_rank.values():
        pending: list[Key] = []
        t = 0
        while taken or pending:
            if t in taken:
                stage, kind, j = taken.pop(t)
                if kind == "I":
                    pending.append((stage, "W", j))
            elif pending:
                slot[pending.pop(0)] = t
            t += 1


def _held(slot: dict[Key, int], rank_of: dict[int, int], p: int) -> dict[int, list[int]]:
    """Activations each rank holds in each slot, as the paper counts: from F until W."""
    span = max(slot.values()) + 1
    held = {r: [0] * span for r in range(p)}
    for (stage, kind, _), t in slot.items():
        held[rank_of[stage]][t] += {"F": 1, "I": 0, "W": -1}[kind]
    for row in held.values():
        for t in range(1, span):
            row[t] += row[t - 1]
    return held


def _move_earlier(slot, rank_of, keys, peak, held) -> None:
    """Each pass of `keys` (in slot order) to the earliest free slot its inputs allow; an F
    only where it keeps its rank's memory (`held`) at most `peak` (it holds longer)."""
    used = {(rank_of[s], t) for (s, _, _), t in slot.items()}
    last = len(rank_of) - 1
    for key in keys:
        t, r = slot[key], rank_of[key[0]]
        earliest = max((slot[d] + 1 for d in _deps(key, last) if d in slot), default=0)
        for u in range(earliest, t):
            if (r, u) in used or (key[1] == "F" and max(held[r][u:t]) + 1 > peak):
                continue
            used.discard((r, t))
            used.add((r, u))
            slot[key] = u
            if key[1] != "I":
                for v in range(u, t):
                    held[r][v] += 1 if key[1] == "F" else -1
            break


def v_schedule(p: int, m: int, variant: str) -> dict[int, list[Action]]:
    """`variant` is "v-half" or "v-min"; returns program[rank]."""
    rank_of = {s: (s if s < p else 2 * p - 1 - s) for s in range(2 * p)}
    # 1-2. the block, repeated every 6 slots; the W fill the free slots, oldest I first
    slot: dict[Key, int] = {
        (stage, kind, j): t + 6 * j
        for passes in _block(p, variant).values()
        for t, kind, stage in passes
        for j in range(m)
    }
    _fill_w(slot, rank_of)
    held = _held(slot, rank_of, p)
    peak = max(max(row) for row in held.values())  # the steady state's: the block's memory

    # 3. reorder the warm-up (before rank 0's first backward on its down stage) and the
    # cool-down (after its last forward there); the steady state keeps the block's pattern
    warm_end, cool_start = slot[0, "I", 0], slot[0, "F", m - 1]
    ends = [k for k in sorted(slot, key=slot.get) if not warm_end <= slot[k] <= cool_start]
    _move_earlier(slot, rank_of, ends, peak, held)
    # then the cool-down once more without the W: input gradients first (they unblock the
    # ranks below), the W back into the free slots after; kept if no rank goes over the peak
    again = {k: t for k, t in slot.items() if k[1] != "W"}
    cool = [k for k in sorted(again, key=again.get) if again[k] > cool_start and k[1] == "I"]
    _move_earlier(again, rank_of, cool, peak, held)
    _fill_w(again, rank_of)
    if max(max(row) for row in _held(again, rank_of, p).values()) <= peak:
        slot = again

    program: dict[int, list[Action]] = {r: [] for r in range(p)}
    for (stage, kind, j), _ in sorted(slot.items(), key=lambda item: item[1]):
        program[rank_of[stage]].append(Action(stage, kind, j))
    # invariant: six passes per rank and microbatch, every rank under the block's peak
    held = _held(slot, rank_of, p)
    for r, prog in program.items():
        assert len(prog) == 6 * m, f"{variant}: builder bug: rank {r} has {len(prog)} passes"
        assert max(held[r]) <= peak, f"{variant}: builder bug: rank {r} holds {max(held[r])}"
    return program
