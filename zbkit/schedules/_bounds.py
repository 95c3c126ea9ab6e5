"""Lower bounds on the longest rank span: no schedule under the memory limit does better.

zb-auto times its hand-written candidates first; when one of them reaches `lower_bound`
it is optimal for these costs and this limit, so the search stops there (the other rows
of `explain_auto` say "not run: ... reaches the lower bound").

Bounds on some rank's span (first start to last end), so on the longest one:
  - busy: a rank cannot finish before it has done all its work (any costs, any placement);
  - one round trip (`one_trip`, any costs, any placement): the last forward of a stage
    starts after its other m - 1, then goes down and back up and leaves a W; the first input
    gradient of a stage ends a round trip after its rank starts, and the stage's m Is and m
    Ws all come after it;
  - round trips (`round_trips`, any costs, any placement): a stage's microbatch holds its
    activation from its F's start to its I's end, at least the round trip down the pipeline
    and back; with room for only k activations, those intervals overlap k at a time, so some
    ceil(m / k) of them follow one another (any k + 1 that overlap would not fit);
  - rank 0, one stage per rank (`rank0`): idle time rank 0 cannot avoid at the start
    (waiting for microbatch 0's input gradient with at most `limit // M_B` forwards to run)
    and at the end (a round trip for the last input gradient, filled only with what it owes),
    both if it has more forwards than fit before the first I, else the longer one;
  - the last stage (`last_stage`): rank 0 starts, the last rank gets its first input
    (p-1)(F + comm) later, runs m F and m I, and its last I goes back up to rank 0, which
    still owes that microbatch's W;
  - rank 0 of the V (`v_start`): before the first forward of its second stage arrives,
    (2p-1) F and (2p-2) comm after its first F, rank 0 can only run first-stage forwards.
The last three assume every stage costs the same and one of the two placements.
And for any costs and placement, up to `CHAINS_MAX_ACTIONS`, a walk over every action
(`chains`, for schedules that run each stage's microbatches in order): first the orders
memory forces between two forwards of a rank (`_forced`: were b first, a could never fit),
then each action's earliest start from what it depends on, its rank's work that must come
first, and the wait memory forces on a forward (the input gradients, and Ws, that must have
run to make room);
then per rank, those earliest starts against what each action leaves to do (Jackson's bound
for one machine). It is what sees the V's two chunks sharing a rank's memory: under 0.75 p
the closed forms fell to 78% of the optimum, the walk keeps 90% (`benchmarks/exact.py`).
"""

from __future__ import annotations

import math

from zbkit.schedules._timeline import TOL
from zbkit.schedules.costs import Costs


def busy(stage_to_rank: list[int], m: int, costs: list[Costs]) -> float:
    """The busiest rank's work: m times F + I + W of each of its stages."""
    work = [0.0] * (max(stage_to_rank) + 1)
    for s, r in enumerate(stage_to_rank):
        work[r] += m * (costs[s].F + costs[s].I + costs[s].W)
    return max(work)


def _forwards_held(limit: float, c: Costs, m: int) -> int:
    """How many activations fit under `limit` (all of them if an F holds nothing)."""
    if c.mem_activation <= 0:
        return m
    return max(0, min(m, int((limit + TOL) // c.mem_activation)))


def _trips(stage_to_rank: list[int], costs: list[Costs]) -> list[float]:
    """Per stage s: the shortest time from F(s, j)'s start to I(s, j)'s end, every later
    stage's F and I in between (and a hop each way where the rank changes)."""
    trips, trip = [0.0] * len(costs), 0.0
    for s in reversed(range(len(stage_to_rank))):
        trip += costs[s].F + costs[s].I
        if s + 1 < len(stage_to_rank) and stage_to_rank[s + 1] != stage_to_rank[s]:
            trip += costs[s + 1].comm + costs[s].comm  # down to s + 1, and its I back up
        trips[s] = trip
    return trips


def one_trip(stage_to_rank: list[int], m: int, costs: list[Costs]) -> float:
    """A stage's rank around one round trip (any costs and placement): the last of its m
    forwards starts after the other m - 1, then its round trip and W; or the first of its
    input gradients ends a round trip after the rank's start at the earliest, and all m
    Is and Ws of the stage come from then on, one after another."""
    best = 0.0
    for s, trip in enumerate(_trips(stage_to_rank, costs)):
        c = costs[s]
        last_forward = (m - 1) * c.F + trip + c.W
        first_backward = trip - c.I + m * (c.I + c.W)
        best = max(best, last_forward, first_backward)
    return best


def round_trips(stage_to_rank: list[int], m: int, costs: list[Costs], limit: float) -> float:
    """The longest chain of round trips some stage's rank must run one after another, and the
    last one's W: F(s, j) starts, every later stage's F and I runs (a hop where the rank
    changes), I(s, j) ends; at most `_forwards_held` of them overlap."""
    best = 0.0
    for s, trip in enumerate(_trips(stage_to_rank, costs)):
        c = costs[s]
        k = _forwards_held(limit, c, m)
        if k == 0:  # not one activation fits: no schedule at all; the other bounds say so
            continue
        best = max(best, -(-m // k) * trip + c.W)
    return best


def rank0(p: int, m: int, c: Costs, limit: float) -> float:
    """Rank 0's span, one stage per rank: its work plus the idle time it cannot avoid."""
    k0 = _forwards_held(limit, c, m)
    first_i = p * c.F + (p - 1) * (c.I + 2 * c.comm)  # microbatch 0 down and back
    start_idle = max(0.0, first_i - k0 * c.F)
    # after its last F (holding r activations), rank 0 waits a round trip for the last
    # input gradient and fills it with r - 1 I's and the Ws still owed (`owed` deferred)
    trip = (p - 1) * (c.F + c.I + 2 * c.comm)
    fill = 0.0
    for r in range(1, k0 + 1):
        room = limit + TOL - r * c.mem_activation
        owed = m - r if c.mem_weight <= 0 else min(m - r, int(room // c.mem_weight))
        fill = max(fill, (r - 1) * c.I + (r - 1 + owed) * c.W)
    end_idle = max(0.0, trip - fill)
    if m <= k0:  # all forwards may run before the first I: the two waits may be one
        return m * (c.F + c.I + c.W) + max(start_idle, end_idle)
    return m * (c.F + c.I + c.W) + start_idle + end_idle


def last_stage(p: int, m: int, c: Costs) -> float:
    """Rank 0's span, one stage per rank, through the last stage's m F and m I."""
    return (p - 1) * (c.F + c.comm) + m * (c.F + c.I) + (p - 1) * (c.comm + c.I) + c.W


def v_start(p: int, m: int, c: Costs, limit: float) -> float:
    """Rank 0's span in the V: its work plus the wait for its second stage's first input."""
    arrives = (2 * p - 1) * c.F + (2 * p - 2) * c.comm
    # the second stage's forward needs room for one more activation
    ahead = _forwards_held(limit - c.mem_activation, c, m)
    return 2 * m * (c.F + c.I + c.W) + max(0.0, arrives - ahead * c.F)


def lower_bound(
    stage_to_rank: list[int],
    m: int,
    costs: list[Costs],
    limit: float,
    placement: str | None,
    walk: bool = True,
) -> float:
    """The best of the bounds above that apply to this placement (None: another one) and
    these costs; `walk=False`: the closed forms only, not `chains` (for many limits at once)."""
    bound = max(
        busy(stage_to_rank, m, costs),
        round_trips(stage_to_rank, m, costs, limit),
        one_trip(stage_to_rank, m, costs),
    )
    if walk and 3 * len(stage_to_rank) * m <= CHAINS_MAX_ACTIONS:
        bound = max(bound, chains(stage_to_rank, m, costs, limit))
    if placement not in ("linear", "v") or any(c != costs[0] for c in costs):
        return bound
    p, c = max(stage_to_rank) + 1, costs[0]
    if placement == "v":
        return max(bound, v_start(p, m, c, limit))
    return max(bound, rank0(p, m, c, limit), last_stage(p, m, c))


def gap_line(span: float, bound: float | None) -> str:
    """'optimal' or '<= 3.1% above optimal' for a longest rank span against its bound."""
    if bound is None:
        return "no certified bound (overlapped pairs save time the bounds do not count)"
    if span <= bound * (1 + 1e-9) + 1e-12:
        return f"optimal (it reaches the lower bound {bound:.6g})"
    return f"<= {(span - bound) / span:.1%} above optimal (lower bound {bound:.6g})"


# `chains` walks every action: beyond this many (F, I and W per stage and microbatch) the
# closed forms above are the bound (p=4, m=8 takes a few ms, 768 actions 0.1-0.15 s)
CHAINS_MAX_ACTIONS = 768


def chains(stage_to_rank: list[int], m: int, costs: list[Costs], limit: float) -> float:
    """The longest rank span of any schedule that runs each stage's microbatches in order
    (every builder's and torch's do), bounded through each action's earliest start, with
    the orders memory forces between forwards (`_forced`) added to the dependencies:
      - after what it depends on (with comm) and the rank's own work that must come first,
        run in series from the earliest of it;
      - a forward that would hold more than `limit` with what must have run before it waits
        until enough of its rank's input gradients (and their Ws, with mem_weight) that may
        run before it have: at least the x-th earliest end of those I's, and the rank's
        earlier work plus their time;
    then, per rank, its actions' earliest starts against what each leaves to do on the rank
    (Jackson's bound for one machine with heads and tails)."""
    from zbkit.schedules._cpsat import Model, by_rank, graph

    model = Model(stage_to_rank, m, costs)
    n, dur, rank, acts, pins = len(model.actions), model.dur, model.rank, model.actions, model.pins
    ranks = by_rank(model)
    memory = {r: _RankMemory(model, mine, costs) for r, mine in ranks.items()}
    edges = list(model.edges)
    while True:  # orders memory forces between forwards may force more
        preds, succs, topo = graph(n, edges)
        if topo is None:  # the forced orders contradict: no schedule fits at all
            return 0.0
        anc, desc = _reach(topo, preds), _reach(topo[::-1], succs)
        forced = _forced(model, memory, anc, desc, limit)
        if not forced:
            break
        edges += forced
    est = [0.0] * n
    for _ in range(n):  # a forward's wait reads I's later in the order: until nothing moves
        moved = False
        for a in topo:
            r = rank[a]
            start = max([pins[r]] + [est[b] + dur[b] + hop for b, hop in preds[a]])
            before = [(pins[r], 0.0)]  # the rank's first forward starts there
            before += sorted((est[b], dur[b]) for b in ranks[r] if anc[a] >> b & 1)
            start = max(start, _series(before)[0])
            if acts[a][1] == "F":
                start = max(start, _room(a, model, memory[r], anc, desc, est, limit, before))
                if start == math.inf:  # it never fits: no schedule, which builders report
                    return 0.0
            if start > est[a] + TOL:
                est[a], moved = start, True
        if not moved:
            break
    best = 0.0
    for r, mine in ranks.items():
        tail = _tails(model, topo, succs, r)  # a's start to the rank's last end, at least
        after = {a: tail[a] - dur[a] for a in mine}
        for q in sorted(set(after.values())):  # what runs from the latest head on, then q
            end, _ = _series(sorted((est[a], dur[a]) for a in mine if after[a] >= q - TOL))
            best = max(best, end - pins[r] + q)
    return best


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


def _room(a, model, memory: _RankMemory, anc, desc, est, limit, before) -> float:
    """When forward `a` can start at the earliest for memory: what must run before it
    (`before`: the rank's first start, then its earlier work, (earliest start, duration)
    sorted) and a itself hold more than `limit` unless enough I's (and Ws) that may run
    before it have: for each way to free enough, x I's (no earlier than the x earliest of
    them, each at least the shortest I) and y Ws, all in series with `before`; the cheapest
    way."""
    need = model.delta[a] + memory.held(anc[a]) - limit
    if need <= TOL:
        return 0.0
    later = anc[a] | desc[a]  # ran already, or cannot run before a
    heads = sorted(est[b] for b in _bits(memory.inputs & ~later))
    owed = sorted(est[w] for w in memory.owed(anc[a], later))
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
