"""Hand-written schedules, one stage per rank unless said; each reads like its figure.

Rank r (0-based) of p ranks, m microbatches. Every function returns program[rank].
"""

from __future__ import annotations

from zbkit.schedules.core.action import Action


def gpipe(p: int, m: int) -> dict[int, list[Action]]:
    # all forwards, then all full backwards in reverse: peak memory m activations
    return {
        r: [Action(r, "F", j) for j in range(m)] + [Action(r, "B", j) for j in reversed(range(m))]
        for r in range(p)
    }


def one_f_one_b(p: int, m: int) -> dict[int, list[Action]]:
    program = {}
    for r in range(p):
        warmup = min(p - r, m)  # rank r holds at most p - r activations
        prog = [Action(r, "F", j) for j in range(warmup)]  # warm-up
        for j in range(m):  # steady state, then cool-down once the forwards run out
            prog.append(Action(r, "B", j))
            if warmup + j < m:
                prog.append(Action(r, "F", warmup + j))
        program[r] = prog
    return program


def zb_handcrafted(p: int, m: int, warmup_of, lag_of) -> dict[int, list[Action]]:
    """1F1B's shape with B split into I and a W that lags `lag_of(r)` microbatches behind."""
    program = {}
    for r in range(p):
        warmup, lag = min(warmup_of(r), m), lag_of(r)
        prog = [Action(r, "F", j) for j in range(warmup)]  # warm-up
        for j in range(m):  # steady: I_j, then the lagging W, then the next F
            prog.append(Action(r, "I", j))
            if j >= lag:
                prog.append(Action(r, "W", j - lag))
            if warmup + j < m:
                prog.append(Action(r, "F", warmup + j))
        # cool-down: the Ws still owed fill the tail that 1F1B leaves idle
        prog += [Action(r, "W", j) for j in range(max(0, m - lag), m)]
        program[r] = prog
    return program


def zb_h1(p: int, m: int) -> dict[int, list[Action]]:
    # same warm-up (so same peak memory) as 1F1B; W lags r behind
    return zb_handcrafted(p, m, lambda r: p - r, lambda r: r)


def zb_h2(p: int, m: int) -> dict[int, list[Action]]:
    # extra warm-up forwards fill the start-up bubble; W lags 2r behind to fill the tail
    return zb_handcrafted(p, m, lambda r: 2 * (p - r) - 1, lambda r: 2 * r)


def interleaved_1f1b(p: int, m: int, v: int) -> dict[int, list[Action]]:
    """Megatron's interleaved 1F1B: stage c*p + r on rank r (chunk c), m a multiple of p.

    Virtual microbatch k runs chunk (k // p) % v forwards (reversed for backwards) on
    microbatch (k // (p*v)) * p + k % p: groups of p microbatches sweep the chunks in turn.
    """
    total = m * v

    def action(k: int, kind: str, r: int) -> Action:
        chunk = (k // p) % v
        if kind == "B":
            chunk = v - 1 - chunk
        return Action(chunk * p + r, kind, (k // (p * v)) * p + k % p)

    program = {}
    for r in range(p):
        warmup = total if m == p else min((p - r - 1) * 2 + (v - 1) * p, total)
        prog = [action(k, "F", r) for k in range(warmup)]  # warm-up
        for i in range(total - warmup):  # steady: one forward, one backward
            prog += [action(warmup + i, "F", r), action(i, "B", r)]
        prog += [action(k, "B", r) for k in range(total - warmup, total)]  # cool-down
        program[r] = prog
    return program


def zb_v(p: int, m: int) -> dict[int, list[Action]]:
    """The paper's ZB-V (also torch's ScheduleZBVZeroBubble): rank r holds stage r (chunk 0,
    going down the V) and stage 2p-1-r (chunk 1, coming back up).

    Built for max(m, 2p-1) microbatches, then the extra ones are dropped, so small m works.
    """
    n = max(m, 2 * p - 1)
    program = {}
    for r in range(p):
        down, up = r, 2 * p - 1 - r
        count = {(down, k): 0 for k in "FIW"} | {(up, k): 0 for k in "FIW"}
        prog: list[Action] = []

        def emit(stage: int, kind: str, prog=prog, count=count) -> None:
            prog.append(Action.trusted(stage, kind, count[stage, kind]))  # ~10^5 at pp=64
            count[stage, kind] += 1

        # warm-up: fill the V's first arm, interleave the second, then start its backwards
        for _ in range(2 * (p - r) - 1):
            emit(down, "F")
        for _ in range(r):
            emit(up, "F")
            emit(down, "F")
        for _ in range(p - r):
            emit(up, "F")
            emit(up, "I")
            emit(up, "W")
        # steady: F-I-W on each chunk in turn
        while count[down, "F"] < n or count[up, "F"] < count[down, "F"]:
            if count[down, "F"] < n:
                emit(down, "F")
            emit(down, "I")
            emit(down, "W")
            emit(up, "F")
            emit(up, "I")
            emit(up, "W")
        # cool-down: input gradients first (they unblock other ranks), weights after
        for _ in range(r):
            emit(down, "I")
            emit(up, "I")
        for _ in range(p - r):
            emit(down, "I")
            emit(down, "W")
        while count[up, "W"] < count[up, "I"]:
            emit(up, "W")
        while count[down, "W"] < count[down, "I"]:
            emit(down, "W")
        program[r] = [a for a in prog if a.microbatch < m]
    return program
