"""Looped schedules: v stages per rank, stage c*p + r on rank r (chunk c), as torch ships them.

Rank r (0-based) of p ranks, m microbatches, v stages per rank. Every function returns
program[rank], action for action torch's `pipeline_order` with its idle (None) cells dropped
(tests/schedules/test_schedules_looped.py builds torch's own schedule objects to check).
"""

from __future__ import annotations

from zbkit.schedules.core.action import Action


def looped_bfs(p: int, m: int, v: int) -> dict[int, list[Action]]:
    """Breadth-first PP (Lamy-Poirier 2022; torch's ScheduleLoopedBFS): each chunk runs all m
    forwards before the next chunk starts, then the chunks' full backwards in reverse.

    GPipe looped v times round the ranks: peak memory m*v stage activations per rank.
    """
    program = {}
    for r in range(p):
        chunks = [c * p + r for c in range(v)]  # this rank's stages, first to last
        prog = [Action(s, "F", j) for s in chunks for j in range(m)]  # forwards, chunk by chunk
        # backwards: last chunk first, newest microbatch first (its gradient arrives first)
        prog += [Action(s, "B", j) for s in reversed(chunks) for j in reversed(range(m))]
        program[r] = prog
        assert len(prog) == 2 * m * v, f"looped-bfs: rank {r} has {len(prog)} actions"
    return program


def rounds_of(p: int, m: int) -> tuple[int, int]:
    """torch's grouping of microbatches: (rounds, microbatches per round); m must be a multiple
    of rounds = max(1, m // p), so a round holds p microbatches when m is a multiple of p."""
    rounds = max(1, m // p)
    return rounds, m // rounds


def interleaved_zb(p: int, m: int, v: int) -> dict[int, list[Action]]:
    """torch's ScheduleInterleavedZeroBubble (the Zero Bubble paper's ZB1P on interleaved
    stages): interleaved 1F1B's order with B split into I and a W lagging r steps behind, so
    each rank's W fill the bubble that waiting for the first input gradient leaves.

    Microbatches go in rounds of `per_round` (see `rounds_of`): the k-th forward on a rank is
    on chunk (k // per_round) % v, the k-th input gradient on the chunks in reverse.
    """
    _, per_round = rounds_of(p, m)
    total = m * v  # forwards per rank (and input gradients, and weight gradients)
    program = {}
    for r in range(p):
        count = {(c * p + r, k): 0 for c in range(v) for k in "FIW"}
        prog: list[Action] = []

        def emit(stage: int, kind: str, prog=prog, count=count) -> None:
            prog.append(Action(stage, kind, count[stage, kind]))  # microbatches in order per stage
            count[stage, kind] += 1

        def forward_stage(k: int, r=r) -> int:
            return ((k // per_round) % v) * p + r

        def backward_stage(k: int, r=r) -> int:
            return (v - 1 - (k // per_round) % v) * p + r

        # warm-up: one round on every chunk but the last, plus one forward per rank below
        warmup = min((v - 1) * per_round + (p - 1 - r), total)
        for k in range(warmup):
            emit(forward_stage(k), "F")
        # steady (F, I, W) then cool-down (I, W): rank r's first r input gradients go without
        # their W (1F1B-like), after that each step also does the W of the step r earlier
        for j in range(total):
            if warmup + j < total:
                emit(forward_stage(warmup + j), "F")
            emit(backward_stage(j), "I")
            if j >= r:
                emit(backward_stage(j - r), "W")
        # the W still owed, in the order of their I
        for j in range(max(0, total - r), total):
            emit(backward_stage(j), "W")
        assert all(n == m for n in count.values()), f"interleaved-zb: rank {r} did {count}"
        program[r] = prog
    return program
