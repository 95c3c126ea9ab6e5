"""DualPipeV: DeepSeek-V3's DualPipe folded onto the V placement (torch's ScheduleDualPipeV).

Rank r holds stage r (down the V, "chunk 0") and stage 2p-1-r (back up, "chunk 1"). Each
rank's program has eight phases; in the long middle one every step is an overlapped pair
(`Overlap`): a forward of one chunk issued together with a full backward of the other, so
one's communication hides behind the other's compute (what `Costs.overlap` models).

  1. 2(p-1-r) forwards of chunk 0            (the warm-up, deepest on rank 0)
  2. r+1 times: a forward of chunk 0, then of chunk 1
  3. p-1-r times: I of chunk 1, a W owed if any, a forward of chunk 1   (zero-bubble style)
  4. m-2p+r+1 times: (F chunk 0 + B chunk 1) then (F chunk 1 + B chunk 0), each a pair;
     the last rank runs its first such F and B apart (not overlapped: a smaller bubble)
  5. p-1-r times: B of chunk 1, then (F chunk 1 + B chunk 0)
  6. r+1 times: a backward of chunk 1, then of chunk 0; halfway through (on odd ranks just
     before the chunk-1 one, on even ranks just after it) they switch from B to I, so
     the rest leave their W for later
  7. p-1-r times: a W owed, then a backward of chunk 0 (I once switched, else B)
  8. r+1 Ws owed (oldest first)
Needs m >= 2p microbatches (as torch). Microbatches are numbered per (stage, kind) in
order; a B counts as both the I and the W of its microbatch.
"""

from __future__ import annotations

from collections import deque

from zbkit.schedules.core.action import Action, Overlap


def dualpipe_v(p: int, m: int) -> dict[int, list[Action | Overlap]]:
    """Every rank's program (module docstring)."""
    if m < 2 * p:
        raise ValueError(
            f"dualpipev: microbatches={m} must be at least the number of stages 2*pp = {2 * p} "
            f"(torch's ScheduleDualPipeV refuses fewer too); try {2 * p}"
        )
    return {r: _rank(p, m, r) for r in range(p)}


def _rank(p: int, m: int, r: int) -> list[Action | Overlap]:
    down, up = r, 2 * p - 1 - r  # chunk 0 and chunk 1 of this rank
    out: list[Action | Overlap] = []
    count: dict[tuple[int, str], int] = {}  # (stage, F or I) -> next microbatch
    owed: deque[tuple[int, int]] = deque()  # (stage, microbatch) of Ws not yet run

    def act(stage: int, kind: str) -> Action:
        key = (stage, "F" if kind == "F" else "I")  # a B takes the I's number
        j = count.get(key, 0)
        count[key] = j + 1
        if kind == "I":
            owed.append((stage, j))
        return Action(stage, kind, j)

    def put(stage: int, kind: str) -> None:
        out.append(act(stage, kind))

    def pair(forward: int, backward: int) -> None:
        out.append(Overlap(act(forward, "F"), act(backward, "B")))

    def w() -> None:
        if owed:
            out.append(Action(owed[0][0], "W", owed.popleft()[1]))

    for _ in range(2 * (p - 1 - r)):  # 1
        put(down, "F")
    for _ in range(r + 1):  # 2
        put(down, "F")
        put(up, "F")
    for _ in range(p - 1 - r):  # 3
        put(up, "I")
        w()
        put(up, "F")
    for i in range(m - 2 * p + r + 1):  # 4
        if i == 0 and r == p - 1:
            put(down, "F")
            put(up, "B")
        else:
            pair(down, up)
        pair(up, down)
    for _ in range(p - 1 - r):  # 5
        put(up, "B")
        pair(up, down)
    split = False  # 6: from B to I halfway
    steps = r + 1
    for i in range(steps):
        if i == steps // 2 and r % 2 == 1:
            split = True
        put(up, "I" if split else "B")
        if i == steps // 2 and r % 2 == 0:
            split = True
        put(down, "I" if split else "B")
    for _ in range(p - 1 - r):  # 7
        w()
        put(down, "I" if split else "B")
    for _ in range(r + 1):  # 8
        w()
    return out
