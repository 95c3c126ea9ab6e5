"""The walk over every action (`chains`): a lower bound on the longest rank span of any
schedule that runs each stage's microbatches in order (every builder's and torch's do), for
any costs and placement; `bounds.lower_bound` takes it up to `CHAINS_MAX_ACTIONS` actions.

  1. orders memory forces between two forwards of a rank (`_forced`: were b first, a could
     never fit), added to the dependencies;
  2. each action's earliest start (`_walk`): after what it depends on (with comm) and its
     rank's work that must come first, run in series; a forward that would hold more than
     the limit waits until enough input gradients (and Ws) that may run before it have;
  3. up to `PROBE_MAX_ACTIONS`, probing (`_probe`): for two forwards of one rank on different
     stages, a microbatch apart at most, that nothing orders yet and where each order
     delays the forward it puts second (`_delays`), walk both orders; each action starts
     no earlier than the earlier of its two starts (and where one order cannot fit at
     all, the other is forced). One rank's choice of which chunk's forward
     to run first delays the other ranks either way, which steps 1-2 cannot see on the V
     (benchmarks/exact.py measures how much probing lifts the bound);
  4. per rank, those earliest starts against what each action leaves to do on the rank
     (Jackson's bound for one machine with heads and tails).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

from zbkit.schedules.core.costs import TOL, Costs
from zbkit.schedules.optimum.cpsat import Model, by_rank, graph

# the walk, steps 1, 2 and 4: beyond this many actions (F, I and W per stage and
# microbatch) the closed forms are the bound (p=4, m=8 takes a few ms, 768 actions 0.1 s)
CHAINS_MAX_ACTIONS = 768
# probing (step 3) walks twice per pair of forwards, rounds until nothing moves: the V at
# p=3, m=8 (144 actions) takes 0.1-0.25 s, p=4, m=8 (192) 0.15-0.4 s, 288 actions 0.9-2 s
PROBE_MAX_ACTIONS = 192
PROBE_ROUNDS = 16  # each round that moves raises some start; a cap keeps the time bounded


class _Walked(NamedTuple):
    """A walk's result: each action's earliest start, the dependencies it walked (with the
    orders it found forced) and what they give: ancestors and descendants as bitsets, a
    topological order, the successors (with each edge's hop)."""

    est: list[float]
    edges: list[tuple[int, int, float]]
    anc: list[int]
    desc: list[int]
    topo: list[int]
    succs: list[list[tuple[int, float]]]


def chains(stage_to_rank: list[int], m: int, costs: list[Costs], limit: float) -> float:
    """The bound of the module docstring's steps 1-4 (0.0 where no schedule fits at all,
    which builders report). Remembered: the explorer and the CLI ask again for each view."""
    return _chains(tuple(stage_to_rank), m, tuple(costs), float(limit))


@lru_cache(maxsize=64)
def _chains(where: tuple[int, ...], m: int, costs: tuple[Costs, ...], limit: float) -> float:
    model = Model(list(where), m, list(costs))
    ranks = by_rank(model)
    memory = {r: _RankMemory(model, mine, list(costs)) for r, mine in ranks.items()}
    walked = _walk(model, ranks, memory, list(model.edges), limit, None)
    if walked is not None and len(model.actions) <= PROBE_MAX_ACTIONS:
        walked = _probe(model, ranks, memory, limit, walked)
    if walked is None:  # the orders forced contradict, or a forward never fits
        return 0.0
    best = 0.0
    for r, mine in ranks.items():
        tail = _tails(model, walked.topo, walked.succs, r)  # a's start to the rank's last end
        after = {a: tail[a] - model.dur[a] for a in mine}
        for q in sorted(set(after.values())):  # what runs from the latest head on, then q
            heads = sorted((walked.est[a], model.dur[a]) for a in mine if after[a] >= q - TOL)
            best = max(best, _series(heads)[0] - model.pins[r] + q)
    return best


def _walk(model, ranks, memory, edges, limit, base: _Walked | None) -> _Walked | None:
    """Steps 1 and 2 from `base`'s earliest starts (each a bound already; zeros where None),
    `edges` its dependencies and more: the orders memory forces, then each action's earliest
    start, until nothing moves. None where no order fits."""
    n, dur, rank, acts, pins = len(model.actions), model.dur, model.rank, model.actions, model.pins
    while True:  # orders memory forces between forwards may force more
        preds, succs, topo = graph(n, edges)
        if topo is None:  # the orders contradict
            return None
        anc, desc = _reach(topo, preds), _reach(topo[::-1], succs)
        forced = _forced(model, memory, anc, desc, limit)
        if not forced:
            break
        edges = edges + forced
    est = [0.0] * n if base is None else list(base.est)
    mine = [_bits(anc[a] & memory[rank[a]].all) for a in range(n)]  # the rank's work before a
    # what a's start reads: its dependencies, its rank's work before it, and for a forward
    # every action of its rank (the input gradients and Ws that make room)
    reads = [sum(1 << b for b, _ in preds[a]) | anc[a] & memory[rank[a]].all for a in range(n)]
    for a in range(n):
        if acts[a][1] == "F":
            reads[a] |= memory[rank[a]].all
    # bitsets: what to look at once (all, or what the new edges change), what moved in the
    # last pass and in this one
    fresh = -1 if base is None else _changed(anc, desc, base)
    moved = 0
    for _ in range(n):  # a forward's wait reads I's later in the order: until nothing moves
        last, moved = moved, 0
        for a in topo:
            if not (fresh >> a & 1 or reads[a] & (last | moved)):
                continue  # nothing it reads moved since it was last looked at
            r = rank[a]
            start = max([pins[r], est[a]] + [est[b] + dur[b] + hop for b, hop in preds[a]])
            before = [(pins[r], 0.0)]  # the rank's first forward starts there
            before += sorted((est[b], dur[b]) for b in mine[a])
            start = max(start, _series(before)[0])
            if acts[a][1] == "F":
                start = max(start, _room(a, model, memory[r], anc[a], desc[a], est, limit, before))
                if start == math.inf:  # it never fits
                    return None
            if start > est[a] + TOL:
                est[a] = start
                moved |= 1 << a
        fresh = 0
        if not moved:
            break
    return _Walked(est, edges, anc, desc, topo, succs)


def _changed(anc: list[int], desc: list[int], base: _Walked) -> int:
    """The actions whose ancestors or descendants differ from `base`'s, as a bitset."""
    out = 0
    for a, (x, y) in enumerate(zip(anc, desc, strict=True)):
        if x != base.anc[a] or y != base.desc[a]:
            out |= 1 << a
    return out


def _probe(model, ranks, memory, limit, walked: _Walked) -> _Walked | None:
    """Step 3: for each pair of forwards of a rank on different stages, at most a
    microbatch apart, not yet ordered, walk a-before-b and b-before-a from the current
    earliest starts; every action then starts no earlier than the earlier of its two
    (whichever order a schedule picks, one of them holds); where one order does not fit,
    the other is forced. Rounds until nothing moves (at most `PROBE_ROUNDS`). None where
    neither order fits."""
    acts = model.actions
    pairs = [
        (a, b)
        for mine in ranks.values()
        for a in mine
        for b in mine
        if a < b
        and acts[a][1] == acts[b][1] == "F"
        and acts[a][0] != acts[b][0]
        and abs(acts[a][2] - acts[b][2]) <= 1
    ]
    for _ in range(PROBE_ROUNDS):
        moved = False
        for a, b in pairs:
            if walked.anc[a] >> b & 1 or walked.desc[a] >> b & 1:
                continue  # ordered already
            if not (_delays(model, memory, walked, limit, a, b) and
                    _delays(model, memory, walked, limit, b, a)):  # fmt: skip
                continue  # one order moves nothing where it starts: the min moves nothing
            first = _walk(model, ranks, memory, walked.edges + [(a, b, 0.0)], limit, walked)
            second = _walk(model, ranks, memory, walked.edges + [(b, a, 0.0)], limit, walked)
            if first is None or second is None:  # the order that fits is forced
                kept = second if first is None else first
                if kept is None:  # neither fits
                    return None
                walked, moved = kept, True
                continue
            est = [min(x, y) for x, y in zip(first.est, second.est, strict=True)]
            if any(x > y + TOL for x, y in zip(est, walked.est, strict=True)):
                walked, moved = walked._replace(est=est), True
        if not moved:
            break
    return walked


def _delays(model, memory, walked: _Walked, limit, a: int, b: int) -> bool:
    """Whether forward b would start later than its earliest start were a (of its rank)
    to run first: after a's end, after a and the rank's work before either in series, or
    holding a's activation too. Where it would not, probing the pair is skipped (that order
    most likely moves nothing at all; skipping a probe only leaves the bound lower)."""
    est, dur, r = walked.est, model.dur, model.rank[b]
    if est[a] + dur[a] > est[b] + TOL:
        return True
    anc_b = walked.anc[b] | walked.anc[a] | 1 << a
    before = [(model.pins[r], 0.0)] + sorted((est[x], dur[x]) for x in _bits(anc_b & memory[r].all))
    if _series(before)[0] > est[b] + TOL:
        return True
    return _room(b, model, memory[r], anc_b, walked.desc[b], est, limit, before) > est[b] + TOL


def _reach(order: list[int], edges: list[list[tuple[int, float]]]) -> list[int]:
    """Per action, a bitset of the actions it reaches backwards along `edges`, in `order`."""
    out = [0] * len(order)
    for a in order:
        bits = 0
        for b, _ in edges[a]:
            bits |= out[b] | (1 << b)
        out[a] = bits
    return out


def _series(heads: list[tuple[float, float]]) -> tuple[float, float]:
    """Actions (earliest start, duration), sorted, run one at a time: the earliest the last
    of them can end (each head plus all that start at or after it), and their sum."""
    end, total = 0.0, 0.0
    for head, d in reversed(heads):
        total += d
        end = max(end, head + total)
    return end, total


class _RankMemory:
    """One rank's actions as bitsets by (stage, kind), to weigh what a set of them holds, and
    what its input gradients and Ws free at most and take at least."""

    def __init__(self, model, mine: list[int], costs: list[Costs]) -> None:
        acts = model.actions
        self.masks: dict[tuple[int, str], int] = {}
        for x in mine:
            self.masks[acts[x][:2]] = self.masks.get(acts[x][:2], 0) | 1 << x
        # a stage's every action of a kind changes memory alike (its Costs)
        self.weight = {key: model.delta[model.index[(*key, 0)]] for key in self.masks}
        self.all = sum(self.masks.values())
        self.inputs = sum(bits for (_, k), bits in self.masks.items() if k == "I")
        # each W and the I it follows
        self.owes = {x: model.index[acts[x][0], "I", acts[x][2]] for x in mine if acts[x][1] == "W"}
        stages = [costs[s] for s, _ in self.masks]
        self.per_i = max(c.mem_activation - c.mem_weight for c in stages)
        self.per_w = max(c.mem_weight for c in stages)
        self.d_i, self.d_w = min(c.I for c in stages), min(c.W for c in stages)

    def held(self, bits: int) -> float:
        """What the rank's actions in `bits` (once all have started) add to its memory."""
        return sum(w * (bits & self.masks[key]).bit_count() for key, w in self.weight.items())

    def owed(self, before: int, later: int) -> list[int]:
        """The Ws not in `later` whose I is in `before` (each frees without another I)."""
        return [w for w, i in self.owes.items() if not later >> w & 1 and before >> i & 1]


def _room(a, model, memory: _RankMemory, anc_a, desc_a, est, limit, before) -> float:
    """When forward `a` can start at the earliest for memory: what must run before it
    (`before`: the rank's first start, then its earlier work, (earliest start, duration)
    sorted) and a itself hold more than `limit` unless enough I's (and Ws) that may run
    before it have: for each way to free enough, x I's (no earlier than the x earliest of
    them, each at least the shortest I) and y Ws, all in series with `before`; the cheapest
    way."""
    need = model.delta[a] + memory.held(anc_a) - limit
    if need <= TOL:
        return 0.0
    later = anc_a | desc_a  # ran already, or cannot run before a
    heads = sorted(est[b] for b in _bits(memory.inputs & ~later))
    owed = sorted(est[w] for w in memory.owed(anc_a, later))
    best = math.inf
    for x in range(len(heads) + 1):
        rest, y = need - x * memory.per_i, 0
        if rest > TOL:
            if memory.per_w <= 0:
                continue
            y = math.ceil(rest / memory.per_w - TOL)
            if y > len(owed) + x:
                continue
        # the Ws: the earliest owed ones, then those of the new I's (after the first I ends)
        ws = sorted(owed + [heads[0] + memory.d_i] * x)[:y]
        extra = [(h, memory.d_i) for h in heads[:x]] + [(h, memory.d_w) for h in ws]
        best = min(best, _series(sorted(before + extra))[0])
    return best  # inf: it never fits, no schedule at all


def _bits(bits: int) -> list[int]:
    """The positions set in `bits`."""
    out = []
    while bits:
        low = bits & -bits
        out.append(low.bit_length() - 1)
        bits ^= low
    return out


def _tails(model, topo: list[int], succs, r: int) -> list[float]:
    """Per action, the least time from its start to the end of rank r's last action that
    must follow it (-inf where none does)."""
    tail = [-math.inf] * len(model.actions)
    for a in reversed(topo):
        best = model.dur[a] if model.rank[a] == r else -math.inf
        for b, hop in succs[a]:
            if tail[b] > -math.inf:
                best = max(best, model.dur[a] + hop + tail[b])
        tail[a] = best
    return tail


def _forced(model, memory: dict[int, _RankMemory], anc, desc, limit) -> list[tuple]:
    """Orders memory forces between two forwards a and b of a rank that no dependency
    orders: were b to start first, a would start holding b, everything that must come before
    either, and itself; if no input gradients and Ws that may still run before a free
    enough of that, b comes after a (an edge a -> b). On the V this is what keeps rank 0
    from running more first-chunk forwards than leave room for its second chunk's first."""
    out = []
    for mem in memory.values():
        forwards = _bits(sum(bits for (_, k), bits in mem.masks.items() if k == "F"))
        for a in forwards:
            for b in forwards:
                if b == a or anc[a] >> b & 1 or desc[a] >> b & 1:
                    continue
                first = anc[a] | anc[b] | 1 << b  # all of it starts before a
                need = model.delta[a] + mem.held(first) - limit
                if need <= TOL:
                    continue
                later = first | desc[a]  # counted already, or cannot run before a
                free_i = (mem.inputs & ~later).bit_count()
                owed = len(mem.owed(first, later))
                if free_i * mem.per_i + (owed + free_i) * mem.per_w < need - TOL:
                    out.append((a, b, 0.0))
    return out
